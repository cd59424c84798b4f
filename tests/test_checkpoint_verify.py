"""Checkpoints are what `status` says they are: checksums verified (and cached, so a second `status` does not hash
again), and a run whose checkpoints are all corrupt is refused by resume, on the host and in the trainer, instead of
training its completed steps again from step 1. The corruption is injected for real: one byte flipped, same size,
mtime set back."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO
from launch_support import cli, metrics_steps

from verl_runtime import rundir

QUICKSTART = REPO / "examples" / "quickstart.yaml"
SHORT = ["--set", "data.max_response_length=8", "--set", "trainer.test_freq=-1", "--set", "trainer.save_freq=1",
         "--set", "trainer.keep_last=2"]


def train(cwd, *settings):
    """`python -m verl_runtime train` of the quickstart as a user runs it, in cwd (its run: cwd/runs/quickstart)."""
    args = [sys.executable, "-m", "verl_runtime", "train", str(QUICKSTART), *SHORT]
    for setting in settings:
        args += ["--set", setting]
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-step quickstart run with checkpoints step_1 and step_2; each test works on its own copy."""
    home = tmp_path_factory.mktemp("finished")
    done = train(home, "trainer.total_training_steps=2")
    assert done.returncode == 0, done.stderr
    return home / "runs" / "quickstart"


@pytest.fixture
def run(finished, tmp_path):
    shutil.copytree(finished, tmp_path / "runs" / "quickstart")
    return tmp_path / "runs" / "quickstart"


def corrupt(path):
    """Flip one byte in the middle of path, keeping its size and its mtime: only a checksum tells."""
    before = os.stat(path)
    with open(path, "r+b") as handle:
        handle.seek(before.st_size // 2)
        byte = handle.read(1)
        handle.seek(before.st_size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size and os.stat(path).st_mtime_ns == before.st_mtime_ns


def state_files(run):
    return [path / rundir.STATE_FILE for _, path in rundir.checkpoint_dirs(run)]


@pytest.mark.slow
def test_status_verifies_checksums_once_and_again_after_a_change(run, monkeypatch):
    hashed = []
    real = rundir._sha256
    monkeypatch.setattr(rundir, "_sha256", lambda path: hashed.append(path.parent.name) or real(path))

    first = cli("status", "quickstart", "--runs-dir", run.parent)
    assert first.exit_code == 0, first.output
    assert "checkpoints: step_1, step_2\n" in first.output and "unusable" not in first.output
    assert sorted(hashed) == ["step_1", "step_2"]

    hashed.clear()
    assert "checkpoints: step_1, step_2\n" in cli("status", "quickstart", "--runs-dir", run.parent).output
    assert hashed == [], "a second status reads the verified checksums from the cache"

    corrupt(run / "checkpoints" / "step_2" / rundir.STATE_FILE)
    hashed.clear()
    again = cli("status", "quickstart", "--runs-dir", run.parent)
    assert hashed == ["step_2"], "the changed file is hashed again (its ctime moved), the other one is not"
    assert "checkpoints: step_1\n" in again.output
    assert ("warning: checkpoint step_2 is unusable (state.pt does not match its checksum (corrupt)): "
            "a resume passes over it") in again.output


@pytest.mark.slow
def test_corrupt_checkpoints_are_corrupt_in_status_and_resume_refuses_them(run):
    for state in state_files(run):
        corrupt(state)

    status = cli("status", "quickstart", "--runs-dir", run.parent)
    assert status.exit_code == 0, status.output
    assert "checkpoints:" not in status.output, "no checkpoint is called valid"
    for name in ("step_1", "step_2"):
        assert (f"warning: checkpoint {name} is unusable (state.pt does not match its checksum (corrupt)): "
                "no checkpoint is left to resume from") in status.output
    listed = json.loads(cli("status", "quickstart", "--runs-dir", run.parent, "--json").output)
    assert listed["checkpoints"] == [] and set(listed["unusable_checkpoints"]) == {"step_1", "step_2"}

    # The host refuses before it launches anything.
    resumed = cli("run", "--resume", "quickstart", "--runs-dir", run.parent, "--target", "local")
    assert resumed.exit_code == 2
    assert resumed.output.count("\n") == 1 and resumed.output.startswith(
        "error: every checkpoint of run quickstart is unusable (step_2: state.pt does not match its checksum "
        "(corrupt); step_1: ")
    assert "--set trainer.resume=disable" in resumed.output and "verl-deploy runs rm quickstart" in resumed.output
    assert not (run / rundir.LAUNCH_RECORD).exists(), "nothing was launched"

    # The trainer's own entrypoint refuses too: one line, exit 2, the completed steps kept.
    again = train(run.parent.parent, "trainer.total_training_steps=3")
    assert again.returncode == 2
    [line] = again.stderr.splitlines()
    assert line.startswith(f"error: every checkpoint of {os.path.join('runs', 'quickstart')} is unusable (step_2: ")
    assert "trainer.resume=disable" in line and "Traceback" not in again.stdout + again.stderr
    assert metrics_steps(run) == [1, 2]
    failed = cli("status", "quickstart", "--runs-dir", run.parent)
    assert failed.output.startswith("quickstart  direct  failed  ")
    assert failed.output.rstrip().endswith(line), "status says why it failed"

    # Starting over is deliberate: trainer.resume=disable trains from step 1.
    over = train(run.parent.parent, "trainer.total_training_steps=1", "trainer.resume=disable")
    assert over.returncode == 0, over.stderr
    assert metrics_steps(run) == [1]


@pytest.mark.slow
def test_a_corrupt_newest_checkpoint_is_passed_over_for_an_older_valid_one(run):
    corrupt(run / "checkpoints" / "step_2" / rundir.STATE_FILE)
    again = train(run.parent.parent, "trainer.total_training_steps=3")
    assert again.returncode == 0, again.stderr
    warnings = [line for line in again.stdout.splitlines() if line.startswith("[WARN] checkpoint")]
    assert warnings == [f"[WARN] checkpoint {os.path.join('runs', 'quickstart', 'checkpoints', 'step_2')} is unusable "
                        "(state.pt does not match its checksum (corrupt)): resuming from step_1"]
    assert metrics_steps(run) == [1, 2, 3]


def test_the_cache_lives_beside_the_checkpoints_not_in_them(tmp_path):
    """The cache file is no checkpoint file: a checkpoint written after it, and its manifest, never list it."""
    step = tmp_path / rundir.CHECKPOINTS_DIR / "step_1"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"weights")
    rundir.write_manifest(step, 1)
    assert [why for _, _, why in rundir.checked_checkpoints(tmp_path)] == [None]
    cache = tmp_path / rundir.CHECKPOINTS_DIR / rundir.VERIFIED_FILE
    assert list(json.loads(cache.read_text())) == ["step_1"]
    assert rundir.checkpoint_dirs(tmp_path) == [(1, step)]
    assert set(json.loads((step / rundir.MANIFEST_FILE).read_text())["files"]) == {"state.pt"}

    # A cache that lies (a fingerprint of other bytes) is not believed: the fingerprint holds the file's ctime.
    (step / "state.pt").write_bytes(b"weightz")
    assert [why for _, _, why in rundir.checked_checkpoints(tmp_path)] == ["state.pt does not match its checksum (corrupt)"]
    assert json.loads(cache.read_text()) == {}


def test_a_read_only_cache_is_no_error(tmp_path):
    step = tmp_path / rundir.CHECKPOINTS_DIR / "step_1"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"weights")
    rundir.write_manifest(step, 1)
    (tmp_path / rundir.CHECKPOINTS_DIR / rundir.VERIFIED_FILE).mkdir()  # cannot be replaced by a file
    assert [why for _, _, why in rundir.checked_checkpoints(tmp_path)] == [None]
    assert not list((tmp_path / rundir.CHECKPOINTS_DIR).glob("*.tmp"))
