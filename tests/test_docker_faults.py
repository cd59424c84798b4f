"""`run --target docker` when things go wrong, each fault injected for real against the engine: secrets kept out
of the engine's records, a hardened container, a run that outlives its containers and an engine that does not
answer, out of memory, bad sizes, Ctrl-C before the start, a root caller, a run directory another trainer holds."""

import hashlib
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest
from launch_support import QUICKSTART, cli, containers, metrics_steps, wait_for

from verl_deploy.sizes import parse_gpus
from verl_deploy import runs
from verl_deploy.launchers.docker import (
    PIDS_LIMIT, DockerLauncher, LaunchInterrupted, container_options, docker_run_args, secrets_dir, without_ulimits,
)
from verl_deploy.launchers.jobspec import RUN_ID_LABEL, build_spec
from verl_runtime import rundir

pytestmark = pytest.mark.docker
TOKEN, WANDB_KEY = "hf_testvalue", "wandb_testvalue_42"
SHORT = ["--set", "data.max_response_length=8", "--set", "trainer.test_freq=-1", "--shm-size", "1g"]
LONG = ["--set", "trainer.num_epochs=100", "--set", "trainer.save_freq=1"]  # runs until stopped
CALLER = (os.getuid(), os.getgid())
CONTAINER_USER = f"{os.getuid() or 1000}:{os.getgid() or 1000}"  # a root caller's container runs as 1000


def files_holding(root: Path, *texts: str) -> list[Path]:
    """Files under root whose bytes contain one of texts (grep -r)."""
    return [p for p in Path(root).rglob("*") if p.is_file() and any(t.encode() in p.read_bytes() for t in texts)]


def owners(root: Path) -> set[tuple[int, int]]:
    return {(p.lstat().st_uid, p.lstat().st_gid) for p in [Path(root), *Path(root).rglob("*")]}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --- one detached run with secrets, followed from start to resume -------------------------------------------------

@dataclass
class Live:
    runs: Path
    run_id: str

    @property
    def run_dir(self) -> Path:
        return self.runs / self.run_id


@pytest.fixture(scope="module")
def live(tmp_path_factory, cpu_image, docker_client):
    """A detached run started with an HF token and a W&B key in the caller's environment, training."""
    run = Live(tmp_path_factory.mktemp("faults") / "runs", "dock-live")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_TOKEN", TOKEN)
        env.setenv("WANDB_API_KEY", WANDB_KEY)
        started = cli("run", QUICKSTART, "--target", "docker", "--image", cpu_image, "--runs-dir", run.runs,
                      "--run-id", run.run_id, "--detach", *LONG, *SHORT)
    assert started.exit_code == 0, started.output
    assert wait_for(lambda: len(metrics_steps(run.run_dir)) >= 1)
    yield run
    for container in containers(docker_client, run.run_id):
        container.remove(force=True)
    shutil.rmtree(secrets_dir(run.run_id), ignore_errors=True)


@pytest.mark.slow
def test_the_container_is_hardened(live, docker_client, cpu_image):
    [container] = containers(docker_client, live.run_id)
    host = container.attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges"]
    assert host["PidsLimit"] == PIDS_LIMIT
    assert host["ReadonlyRootfs"] is True and host["Tmpfs"]["/tmp"] == "rw,exec,nosuid,nodev,mode=1777"
    assert host["Init"] is True and container.attrs["Config"]["User"] == CONTAINER_USER
    assert container.exec_run(["touch", "/workspace/x"]).exit_code != 0, "the root file system is read-only"
    assert container.exec_run(["touch", "/tmp/x"]).exit_code == 0
    # Nothing in the image can gain privileges (no-new-privileges aside): no setuid or setgid file. (Debian's
    # setgid directories /var/mail and /var/local stay: on a directory the bit only passes its group on.)
    found = docker_client.containers.run(cpu_image, entrypoint=["find"], user="0:0", remove=True,
                                         command=["/", "-xdev", "-type", "f", "-perm", "/6000"])
    assert found == b""


@pytest.mark.slow
def test_secrets_reach_the_container_as_files_and_nowhere_else(live, docker_client):
    [container] = containers(docker_client, live.run_id)
    inspected = json.dumps(docker_client.api.inspect_container(container.id))
    assert TOKEN not in inspected and WANDB_KEY not in inspected and "HF_TOKEN=" not in inspected
    engine_files = Path(docker_client.info()["DockerRootDir"]) / "containers" / container.id
    assert engine_files.is_dir() and not files_holding(engine_files, TOKEN, WANDB_KEY)
    assert TOKEN not in container.logs().decode()

    host_dir = secrets_dir(live.run_id)
    assert not host_dir.is_relative_to(live.runs)
    assert stat.S_IMODE(host_dir.stat().st_mode) == 0o700
    assert sorted(p.name for p in host_dir.iterdir()) == ["HF_TOKEN", "WANDB_API_KEY"]
    uid = int(CONTAINER_USER.split(":")[0])
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 and p.stat().st_uid == uid for p in host_dir.iterdir())

    # The container's user reads them as the runtime does (verl_runtime.secrets): the token through HF_TOKEN_PATH.
    read = container.exec_run(["python", "-c", (
        "import hashlib; from verl_runtime.secrets import load_secret_files\n"
        "env = {}; load_secret_files(env); digest = lambda s: hashlib.sha256(s.encode()).hexdigest()\n"
        "print(env['HF_TOKEN_PATH'], digest(open(env['HF_TOKEN_PATH']).read()), digest(env['WANDB_API_KEY']))"
    )])
    assert read.exit_code == 0, read.output
    assert read.output.decode().split() == ["/run/secrets/HF_TOKEN", sha256(TOKEN), sha256(WANDB_KEY)]


@pytest.mark.slow
def test_the_engine_wins_over_the_record_and_a_second_launch_refuses(live, cpu_image):
    runs.record_finished(live.run_dir, 0)  # a record that says it ended, while its container runs
    status = json.loads(cli("status", live.run_id, "--runs-dir", live.runs, "--json").output)
    assert status["state"] == "running" and status["exit_code"] is None

    again = cli("run", QUICKSTART, "--resume", live.run_id, "--target", "docker", "--image", cpu_image,
                "--runs-dir", live.runs, *SHORT)
    assert again.exit_code == 2, again.output
    [line] = again.output.strip().splitlines()
    assert line.startswith(f"error: run {live.run_id} is ") and f"verl-deploy stop {live.run_id}" in line


@pytest.mark.slow
def test_stop_records_the_end_and_leaves_nothing_but_the_run_dir(live, docker_client):
    assert cli("stop", live.run_id, "--runs-dir", live.runs).exit_code == 0
    assert not containers(docker_client, live.run_id)
    assert not docker_client.networks.list(filters={"label": f"{RUN_ID_LABEL}={live.run_id}"})
    assert not secrets_dir(live.run_id).exists()
    assert not files_holding(live.run_dir, TOKEN, WANDB_KEY)
    assert owners(live.run_dir) == {CALLER}, "handed back to the caller once it ended"

    # The run outlives its container: state, metrics and checkpoints from the run directory, logs from train.log.
    status = json.loads(cli("status", live.run_id, "--runs-dir", live.runs, "--json").output)
    assert status["state"] == "stopped" and status["exit_code"] in (130, 143), status
    assert status["checkpoints"] and status["last_metrics"]["step"] == metrics_steps(live.run_dir)[-1]
    listed = json.loads(cli("runs", "--target", "docker", "--runs-dir", live.runs, "--json").output)
    assert [(r["run_id"], r["state"]) for r in listed] == [(live.run_id, "stopped")]
    logs = cli("logs", live.run_id, "--runs-dir", live.runs)
    assert logs.exit_code == 0 and re.search(r"^step +1/", logs.output, re.M), logs.output


@pytest.mark.slow
def test_an_unreachable_engine_shows_the_recorded_runs_as_unknown(live, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    listed = cli("runs", "--target", "docker", "--runs-dir", live.runs)
    assert listed.exit_code == 0, listed.output
    header, row = listed.stdout.splitlines()  # `runs` is a table: a header, then a row per run
    assert header.startswith("RUN") and row.split()[:4] == [live.run_id, "docker", "verl-deploy", "unknown"]
    [warning] = listed.stderr.splitlines()
    assert warning.startswith("warning: Docker engine not reachable (")
    assert warning.endswith("): docker runs shown as last recorded")

    status = cli("status", live.run_id, "--runs-dir", live.runs)
    assert status.exit_code == 0 and status.stdout.startswith(f"{live.run_id}  docker  unknown")
    assert "the Docker engine is unreachable; last recorded: stopped" in status.stdout


@pytest.mark.slow
def test_a_resumed_run_trains_on_and_is_the_callers_again(live, docker_client, cpu_image):
    done = metrics_steps(live.run_dir)[-1]
    resumed = cli("run", QUICKSTART, "--resume", live.run_id, "--target", "docker", "--image", cpu_image,
                  "--runs-dir", live.runs, *LONG, "--set", f"trainer.total_training_steps={done + 1}", *SHORT)
    assert resumed.exit_code == 0, resumed.output
    assert metrics_steps(live.run_dir)[-1] == done + 1
    assert not containers(docker_client, live.run_id), "an attached run's containers go once it ended"
    assert owners(live.run_dir) == {CALLER}
    status = json.loads(cli("status", live.run_id, "--runs-dir", live.runs, "--json").output)
    assert (status["state"], status["exit_code"]) == ("succeeded", 0)


def test_containers_it_did_not_make_are_left_alone(tmp_path, cpu_image, docker_client):
    """compose's containers carry the run-id label too: runs, status and stop never record or remove them."""
    foreign = docker_client.containers.run(cpu_image, entrypoint=["true"], detach=True,
                                           labels={RUN_ID_LABEL: "dock-foreign"})
    try:
        foreign.wait(timeout=60)
        assert cli("runs", "--target", "docker", "--runs-dir", tmp_path).exit_code == 0
        assert cli("status", "dock-foreign", "--runs-dir", tmp_path).exit_code == 2
        assert cli("stop", "dock-foreign", "--runs-dir", tmp_path).exit_code == 2
        foreign.reload()
        assert foreign.status == "exited" and not (tmp_path / "dock-foreign").exists()
    finally:
        foreign.remove(force=True)


# --- memory ---------------------------------------------------------------------------------------------------

def test_out_of_memory_is_said_in_one_line_and_recorded(tmp_path, cpu_image, docker_client, leftovers):
    leftovers.append("dock-oom")
    result = cli("run", QUICKSTART, "--target", "docker", "--image", cpu_image, "--runs-dir", tmp_path,
                 "--run-id", "dock-oom", "--memory", "20m", *SHORT)  # python dies importing torch
    assert result.exit_code == 137, result.output
    assert "run dock-oom was killed for lack of memory (OOMKilled, --memory 20m): raise --memory" in \
        result.stderr.splitlines()
    assert not containers(docker_client, "dock-oom")
    status = json.loads(cli("status", "dock-oom", "--runs-dir", tmp_path, "--json").output)
    assert status["state"] == "failed" and status["exit_code"] == 137
    assert status["detail"] == "out of memory (OOMKilled): raise --memory (now 20m)"


def test_a_container_removed_by_hand_leaves_a_known_run(tmp_path, cpu_image, docker_client, leftovers):
    leftovers.append("dock-gone")
    started = cli("run", QUICKSTART, "--target", "docker", "--image", cpu_image, "--runs-dir", tmp_path,
                  "--run-id", "dock-gone", "--memory", "20m", "--detach", *SHORT)
    assert started.exit_code == 0, started.output
    [container] = containers(docker_client, "dock-gone")
    container.wait(timeout=60)
    container.remove()  # `docker rm` before verl-deploy saw it end
    status = json.loads(cli("status", "dock-gone", "--runs-dir", tmp_path, "--json").output)
    assert status["state"] == "unknown" and "how it ended was not recorded" in status["detail"]
    listed = cli("runs", "--target", "docker", "--runs-dir", tmp_path)
    assert listed.stdout.splitlines()[1].split()[:4] == ["dock-gone", "docker", "verl-deploy", "unknown"]
    assert not secrets_dir("dock-gone").exists()


@pytest.mark.parametrize("flag, value, message", [
    ("--memory", "lots", "error: --memory 'lots' is not a size: use e.g. 64g (or 64Gi)"),
    ("--shm-size", "huge", "error: --shm-size 'huge' is not a size: use e.g. 16g (or 16Gi)"),
])
def test_a_bad_size_is_one_line_before_anything_is_created(tmp_path, cpu_image, docker_client, flag, value, message):
    result = cli("run", QUICKSTART, "--target", "docker", "--image", cpu_image, "--runs-dir", tmp_path,
                 "--run-id", "dock-size", flag, value)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [message]
    assert not containers(docker_client, "dock-size") and not (tmp_path / "dock-size").exists()


# --- Ctrl-C before the run started ---------------------------------------------------------------------------

class CtrlCAfter:
    """The real docker client, except that `<collection>.<method>` does its real work and then Ctrl-C arrives."""

    def __init__(self, client, collection: str, method: str):
        self._client, self._collection, self._method = client, collection, method
        self.done = []  # what the real call returned

    def __getattr__(self, name):
        real = getattr(self._client, name)
        return _Then(real, self._method, self.done) if name == self._collection else real


class _Then:
    def __init__(self, real, method, done):
        self._real, self._method, self._done = real, method, done

    def __getattr__(self, name):
        real = getattr(self._real, name)
        if name != self._method:
            return real

        def then_ctrl_c(*args, **kwargs):
            self._done.append(real(*args, **kwargs))
            raise KeyboardInterrupt

        return then_ctrl_c


@pytest.mark.parametrize("collection, method", [("containers", "create"), ("images", "get")])
def test_ctrl_c_before_the_start_leaves_nothing_behind(tmp_path, cpu_image, docker_client, monkeypatch, leftovers,
                                                       collection, method):
    import docker.errors

    leftovers.append("dock-ctrlc")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    spec = build_spec(QUICKSTART, image=cpu_image, runs_root=tmp_path, run_id="dock-ctrlc", shm_size="1g")
    engine = CtrlCAfter(docker_client, collection, method)
    with pytest.raises(LaunchInterrupted, match="^interrupted before the run started: nothing was left behind$"):
        DockerLauncher(tmp_path, engine=engine).launch(spec)
    assert LaunchInterrupted.exit_code == 130
    assert engine.done, "the real call ran before the interrupt"
    if collection == "containers":
        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(engine.done[0].id)
    assert not containers(docker_client, "dock-ctrlc")
    assert not spec.run_dir.exists() and not secrets_dir("dock-ctrlc").exists()


# --- a run directory held by a live trainer -------------------------------------------------------------------

def test_a_run_dir_a_live_trainer_holds_is_refused(tmp_path, cpu_image, docker_client):
    with rundir.locked(tmp_path / "dock-held"):  # as a local trainer on that run directory holds it
        result = cli("run", QUICKSTART, "--target", "docker", "--image", cpu_image, "--runs-dir", tmp_path,
                     "--run-id", "dock-held", *SHORT)
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert line.startswith(f"error: run dock-held is in use by a live trainer (pid {os.getpid()} on ")
    assert not containers(docker_client, "dock-held")


# --- one options object: created, and printed ------------------------------------------------------------------

def test_the_dry_run_prints_the_options_the_launcher_creates(tmp_path):
    spec = build_spec(QUICKSTART, image="img:1", runs_root=tmp_path, run_id="r1", gpus=parse_gpus("0,1"), memory="8g",
                      cpus=2, hf_cache=tmp_path / "hf", environ={"HF_TOKEN": TOKEN})
    options = container_options(spec)
    argv = docker_run_args(options)
    assert ["--memory", "8g", "--memory-swap", "8g"] == argv[argv.index("--memory"):][:4]
    assert ["--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--pids-limit", str(PIDS_LIMIT),
            "--read-only", "--tmpfs", "/tmp:rw,exec,nosuid,nodev,mode=1777"] == \
        argv[argv.index("--cap-drop"):][:9]
    assert f"{secrets_dir('r1')}:/run/secrets:ro" in argv and TOKEN not in " ".join(argv)
    assert "--ulimit" in argv and "memlock=-1" in argv
    # The launcher's fallback for engines that cannot raise ulimits changes the object; its dry run follows.
    fallback = docker_run_args(without_ulimits(options))
    assert [a for a in argv if a not in ("--ulimit", "memlock=-1", "stack=67108864")] == fallback
