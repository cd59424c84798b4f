"""Faults of the machine are one line (#23): a read-only runs directory, one the user may not write, a full disk at
launch, at a checkpoint and at a metrics write. Each fault is made for real: a small tmpfs, a read-only bind mount, a
directory owned by another user (entered without root's capability to override file permissions). The trainer and
the CLI run as a user runs them, in processes of their own.

A quickstart checkpoint of builtin:tiny is about 1.7 MB: a 3 MiB disk holds the first one but not a second beside it.
"""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, require
from verl_runtime import rundir
from verl_runtime.metrics import read_metrics

QUICKSTART = REPO / "examples" / "quickstart.yaml"
IS_ROOT = os.geteuid() == 0
# uid 0 without the capabilities that bypass file permissions: the kernel checks ownership and modes as for any
# user (a real non-root user cannot run this venv's interpreter, which lives under /root).
NOT_ROOT = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]


@pytest.fixture
def disk(tmp_path):
    """A tmpfs of the size asked for, mounted for the test: disk(size) -> its path; disk.resize(size) grows it."""
    require(IS_ROOT, "mounting a tmpfs needs root")
    mounted = []

    class Disk:
        def __call__(self, size: str) -> Path:
            path = tmp_path / f"disk{len(mounted)}"
            path.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
            mounted.append(path)
            return path

        def resize(self, path: Path, size: str) -> None:
            subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)

    yield Disk()
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def read_only(tmp_path):
    """A directory bind-mounted read-only onto itself."""
    require(IS_ROOT, "a read-only bind mount needs root")
    path = tmp_path / "ro"
    path.mkdir()
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def not_ours(tmp_path):
    """A directory owned by nobody (0755), and the command prefix of a user who is not its owner."""
    require(IS_ROOT, "a directory of another user needs root to make")
    require(subprocess.run([*NOT_ROOT, "true"]).returncode == 0, "setpriv cannot drop capabilities here")
    path = tmp_path / "nobodys"
    path.mkdir()
    os.chown(path, 65534, 65534)
    os.chmod(path, 0o755)
    return path


def fill(path: Path, leave_kib: int = 0) -> None:
    """Fill a tmpfs but for leave_kib KiB."""
    free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
    with open(path / "filler", "wb") as handle:
        handle.write(b"\0" * max(free - leave_kib * 1024, 0))


def train(run_dir, *sets, prefix=(), module="verl_runtime"):
    """`python -m verl_runtime train examples/quickstart.yaml --set trainer.run_dir=... --set ...`."""
    args = ["train", str(QUICKSTART), "--set", f"trainer.run_dir={run_dir}"]
    for item in sets:
        args += ["--set", item]
    if module == "verl_runtime.main_ppo":  # verl's command line: Hydra-style overrides on our YAML
        args = ["--config-path", str(QUICKSTART.parent), "--config-name", QUICKSTART.name,
                f"trainer.run_dir={run_dir}", *sets]
    return subprocess.run([*prefix, sys.executable, "-m", module, *args], capture_output=True, text=True,
                          cwd=REPO, timeout=600)


def verl_deploy(*args, prefix=()):
    return subprocess.run([*prefix, sys.executable, "-m", "verl_deploy", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, timeout=600)


def assert_one_line(result, code, *fragments) -> str:
    """The process ended with `code` and said why in exactly one `error:` line, without a traceback."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == code, result.stdout[-2000:] + result.stderr[-2000:]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr
    for fragment in fragments:
        assert str(fragment) in errors[0], errors[0]
    return errors[0]


def temp_files(root: Path) -> list[Path]:
    return [p for p in Path(root).rglob("*") if ".tmp" in p.name]


def steps_of(run_dir) -> list[int]:
    return [record["step"] for record in read_metrics(run_dir)]


# --- the trainer's entrypoints -----------------------------------------------------------------------------------

@pytest.mark.parametrize("module", ["verl_runtime", "verl_runtime.main_ppo"])
def test_a_read_only_runs_directory_is_one_line(read_only, module):
    result = train(read_only / "q", "trainer.total_training_steps=2", module=module)
    assert_one_line(result, 2, read_only / "q", "read-only file system", "trainer.run_dir", "--runs-dir")
    assert not any(read_only.iterdir())


def test_a_runs_directory_of_another_user_is_one_line(not_ours):
    result = train(not_ours / "q", "trainer.total_training_steps=2", prefix=NOT_ROOT)
    assert_one_line(result, 2, not_ours / "q", "permission denied", "writable")
    assert not any(not_ours.iterdir())


@pytest.mark.slow
def test_a_full_disk_at_a_checkpoint_keeps_the_last_one_and_the_run_resumes(disk):
    root = disk("3m")
    run_dir = root / "q"
    steps = ("trainer.total_training_steps=3", "trainer.save_freq=1")

    result = train(run_dir, *steps)

    first = run_dir / rundir.CHECKPOINTS_DIR / "step_1"
    line = assert_one_line(result, 2, "checkpoint step_2", "no space left on device", first, "resumes")
    assert line in (run_dir / rundir.TRAIN_LOG).read_text()  # the log says why the run ended, too
    assert [p.name for _, p in rundir.checkpoint_dirs(run_dir)] == ["step_1"]
    assert rundir.checkpoint_problem(first, deep=True) is None
    assert steps_of(run_dir) == [1, 2]  # every completed step's record, none torn
    assert temp_files(root) == []

    disk.resize(root, "16m")  # room again: the same command goes on from the kept checkpoint
    again = train(run_dir, *steps)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"Resumed from {first} (step 1)" in again.stdout
    assert steps_of(run_dir) == [1, 2, 3]
    assert rundir.checkpoint_problem(run_dir / rundir.CHECKPOINTS_DIR / "step_3", deep=True) is None


@pytest.mark.slow
def test_a_full_disk_at_a_metrics_write_keeps_whole_lines(disk):
    root = disk("1m")
    fill(root, leave_kib=48)  # room for the config, the logs and a few steps' records
    run_dir = root / "q"

    result = train(run_dir, "trainer.total_training_steps=200", "data.batch_size=2")

    metrics = run_dir / rundir.METRICS_FILE
    line = assert_one_line(result, 2, metrics, "no space left on device", "are kept")
    data = metrics.read_bytes()
    assert data.endswith(b"\n")
    lines = data.decode().splitlines()
    assert [json.loads(text)["step"] for text in lines] == list(range(1, len(lines) + 1))
    assert len(lines) >= 2 and f"before step {len(lines) + 1}" in line
    assert temp_files(root) == []


def test_the_console_log_on_a_full_disk_warns_once_and_the_console_goes_on(disk, capsys):
    from verl_runtime.__main__ import _tee_console

    root = disk("64k")
    log_path = root / rundir.TRAIN_LOG
    fill(root)
    with _tee_console(log_path):
        for i in range(50):
            print(f"step {i} " + "x" * 1000, flush=True)  # the log's buffer fills, then the disk refuses it
        print("still here", flush=True)
    out = capsys.readouterr().out
    assert "still here" in out
    assert out.count("[WARN] cannot write") == 1 and str(log_path) in out and "No space left on device" in out


def test_torch_s_write_error_on_a_full_disk_is_recognised(disk):
    import torch

    from verl_runtime.errors import DiskFull, machine_fault

    root = disk("64k")
    target = root / "state.pt"
    for by_path in (True, False):
        try:
            if by_path:  # torch keeps no OSError: its "unexpected pos" alone says the write was cut short
                torch.save({"w": torch.zeros(100_000)}, target)
            else:  # as checkpoints write: to a file object, whose OSError torch's error (or the close's) keeps
                with open(target, "wb") as handle:
                    torch.save({"w": torch.zeros(100_000)}, handle)
        except (RuntimeError, OSError) as exc:
            assert isinstance(machine_fault(exc, target), DiskFull), repr(exc)
            assert by_path is False or "unexpected pos" in str(exc)
        else:
            pytest.fail("torch.save wrote 400 kB to a 64 kB disk")
        target.unlink()


# --- the host: verl-deploy run ---------------------------------------------------------------------------------

def launch(runs_dir, target="local", *extra, prefix=()):
    return verl_deploy("run", QUICKSTART, "--target", target, "--runs-dir", runs_dir,
                       "--set", "trainer.total_training_steps=2", *extra, prefix=prefix)


def test_a_local_launch_into_a_read_only_runs_directory_is_one_line(read_only):
    result = launch(read_only)
    assert_one_line(result, 2, read_only, "read-only file system", "--runs-dir")


def test_a_local_launch_into_a_runs_directory_of_another_user_is_one_line(not_ours):
    result = launch(not_ours, prefix=NOT_ROOT)
    assert_one_line(result, 2, not_ours, "permission denied", "--runs-dir")
    assert not any(not_ours.iterdir())


def test_a_local_launch_on_a_full_disk_is_one_line_and_leaves_nothing(disk):
    root = disk("64k")
    fill(root)
    result = launch(root)
    assert_one_line(result, 2, root, "no space left on device", "--runs-dir")
    assert [p.name for p in root.iterdir()] == ["filler"]  # no run directory, no .launch.json.*.tmp


def test_a_local_run_whose_full_disk_left_it_no_room_to_say_why_is_said_on_the_terminal(disk):
    from verl_deploy.launchers.local import unsaid_full_disk

    root = disk("4m")
    run_dir = root / "r1"
    run_dir.mkdir()
    log = run_dir / rundir.CONSOLE_LOG
    log.write_text("[INFO] an earlier start\nerror: an earlier start's error\nstep 1/40 | score 0.1\n")
    offset = len("[INFO] an earlier start\nerror: an earlier start's error\n")
    assert unsaid_full_disk(run_dir, log, offset) is None  # room left: whatever stopped it, not the disk

    fill(root)
    line = unsaid_full_disk(run_dir, log, offset)  # this start's lines hold no error: it had no room for one
    assert line == (f"error: the disk holding {run_dir} is full (0 bytes free), so the run could not write why it "
                    "stopped: free space there (or move the runs with --runs-dir), then `verl-deploy run --resume r1`")
    with open(log, "a") as handle:  # the page tmpfs had allocated still took the run's own line
        handle.write("error: checkpoint step_2: no space left on device\n")
    assert unsaid_full_disk(run_dir, log, offset) is None  # said once, by the run


def test_a_launch_record_on_a_full_disk_keeps_the_old_one_and_no_temp_file(disk):
    from verl_deploy import runs

    root = disk("64k")
    run_dir = root / "r1"
    runs.write_record(run_dir, {"target": "local", "run_id": "r1"})
    fill(root)
    with pytest.raises(OSError):
        runs.write_record(run_dir, {"detail": "x" * 100_000})
    assert runs.read_record(run_dir) == {"target": "local", "run_id": "r1"}
    assert temp_files(root) == []


@pytest.fixture
def empty_image(docker_client):
    """An image with nothing in it: a launch that fails on the host never starts it."""
    import io
    import tarfile

    buffer = io.BytesIO()
    tarfile.open(fileobj=buffer, mode="w").close()
    tag = "verl-deploy-tests/machine-faults:empty"
    subprocess.run(["docker", "import", "-", tag], input=buffer.getvalue(), check=True, capture_output=True)
    yield tag
    with contextlib.suppress(Exception):
        docker_client.images.remove(tag, force=True)


@pytest.mark.docker
@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_a_docker_launch_where_the_host_cannot_write_is_one_line(fault, request, empty_image, docker_client):
    if fault == "read-only":
        runs_dir, said = request.getfixturevalue("read_only"), "read-only file system"
    else:
        disk = request.getfixturevalue("disk")
        runs_dir, said = disk("64k"), "no space left on device"
        fill(runs_dir)
    before = {c.id for c in docker_client.containers.list(all=True)}
    result = launch(runs_dir, "docker", "--image", empty_image)
    assert_one_line(result, 2, runs_dir, said, "--runs-dir")
    assert {c.id for c in docker_client.containers.list(all=True)} == before
    assert temp_files(runs_dir) == [] and [p.name for p in runs_dir.iterdir()] in ([], ["filler"])
