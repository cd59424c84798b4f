"""`run --target slurm`: batch scripts as data, and the quickstart through a real Slurm controller (.ci/slurm.sh
starts one on this host: slurmctld and slurmd, one partition, no GPUs, no accounting database)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import free_port, require
from launch_support import QUICKSTART, cli, metrics_steps, wait_for

from verl_deploy.launchers import slurm as slurm_launcher
from verl_deploy.launchers.slurm import partition_gpus
from verl_deploy.runs import read_record
from verl_runtime.rundir import JOB_EXIT, JOB_LOG, JOB_SCRIPT

SHORT = ["--memory", "2g", "--set", "data.max_response_length=8", "--set", "trainer.test_freq=-1"]


def _slurm_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30)
    return done.returncode == 0 and any(s.startswith(("idle", "mix", "alloc")) for s in done.stdout.split())


@pytest.fixture
def slurm():
    require(_slurm_up(), "no Slurm controller with a usable node here (.ci/slurm.sh starts one)")


def _job_state(job_id: str) -> str:
    done = subprocess.run(["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T"], capture_output=True, text=True)
    return done.stdout.strip()


# --- the batch script, as data -----------------------------------------------------------------------------------

def test_two_nodes_of_eight_gpus_ask_slurm_for_both_and_start_ray_across_them(tmp_path):
    result = cli("run", QUICKSTART, "--target", "slurm", "--gpus", "8", "--nodes", "2", "--partition", "gpu",
                 "--account", "lab", "--time", "4:00:00", "--runs-dir", tmp_path, "--dry-run")
    assert result.exit_code == 0, result.output
    script = result.stdout
    assert script.startswith("#!/bin/bash\n")
    for directive in ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:8", "--cpus-per-task=32", "--partition=gpu",
                      "--account=lab", "--time=4:00:00", "--signal=B:TERM@120", "--requeue", "--open-mode=append"):
        assert f"#SBATCH {directive}\n" in script
    assert "#SBATCH --mem=278528M" in script  # 8 x 32 GiB + 16 GiB of /dev/shm, as a Kubernetes pod is sized
    assert "ray start --head --port=6379" in script
    assert 'srun --overlap --nodes=1 --ntasks=1 --ntasks-per-node=1 --exclude="$VERL_DEPLOY_HEAD"' in script
    assert 'ray start "--address=$RAY_ADDRESS" --block' in script
    assert "trainer.n_workers=16" in script  # world size: nodes x GPUs
    assert 'RAY_ADDRESS="$RAY_ADDRESS"' in script.split("trainer.n_workers=16")[0].splitlines()[-1]
    # the pre-flight across the nodes comes first, one task per node, and ends the job when it fails
    preflight = script.split("ray start --head")[0]
    assert ('srun --nodes=2 --ntasks=2 --ntasks-per-node=1 bash -c' in preflight and '-m verl_deploy doctor --nodes 2 '
            '--node-rank "$SLURM_NODEID" --master "$VERL_DEPLOY_HEAD_IP:29400" --timeout 30' in preflight)
    assert "the pre-flight across the nodes failed: no trainer started" in preflight
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


@pytest.mark.parametrize("container, runs", [
    ("docker", "docker run --rm --name"),
    ("apptainer", 'apptainer exec --cleanenv --bind'),
    ("pyxis", "--container-image=verl-deploy:"),
])
def test_each_container_mode_runs_the_trainer_in_the_image(tmp_path, container, runs):
    result = cli("run", QUICKSTART, "--target", "slurm", "--container", container, "--runs-dir", tmp_path,
                 "--dry-run")
    assert result.exit_code == 0, result.output
    trainer = next(line for line in result.stdout.splitlines() if "verl_runtime" in line and "train" in line)
    assert runs in trainer
    assert "/etc/verl-deploy/config.yaml" in trainer  # container paths: the config is mounted there
    if container == "apptainer":
        assert "docker-daemon://" in result.stdout and "docker://" in result.stdout


@pytest.mark.parametrize("container", ["docker", "apptainer", "pyxis"])
def test_a_containers_model_cache_is_on_the_shared_runs_directory_so_a_requeue_reuses_it(tmp_path, container):
    """Not the container's own file system nor a tmpfs, which go with the job: every start (a requeue runs the same
    script) and every run of the runs directory mounts the same cache."""
    first, second = (cli("run", QUICKSTART, "--target", "slurm", "--container", container, "--runs-dir", tmp_path,
                         "--run-id", run_id, "--dry-run") for run_id in ("sl-one", "sl-two"))
    for result in (first, second):
        assert result.exit_code == 0, result.output
        trainer = next(line for line in result.stdout.splitlines() if "verl_runtime" in line and "train" in line)
        assert f"{tmp_path / 'hf_cache'}:/cache/huggingface" in trainer
        assert "--tmpfs /cache/huggingface" not in trainer
    assert not list(tmp_path.iterdir())  # a dry run writes nothing
    shared = tmp_path / "team" / "hf"
    chosen = cli("run", QUICKSTART, "--target", "slurm", "--container", container, "--hf-cache", shared,
                 "--runs-dir", tmp_path, "--dry-run")
    assert f"{shared}:/cache/huggingface" in chosen.stdout and "hf_cache" not in chosen.stdout


def test_without_a_container_the_job_keeps_its_own_hf_home_or_the_one_given(tmp_path):
    result = cli("run", QUICKSTART, "--target", "slurm", "--runs-dir", tmp_path, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "HF_HOME" not in result.stdout and "hf_cache" not in result.stdout  # sbatch exports the submit env's
    result = cli("run", QUICKSTART, "--target", "slurm", "--hf-cache", tmp_path / "hf", "--runs-dir", tmp_path,
                 "--dry-run")
    assert f"HF_HOME={tmp_path / 'hf'} " in result.stdout


FAKE_SLURM = {  # a submit host's client commands, for what launch does before the job runs
    "sinfo": "#!/bin/sh\necho 'debug*'\n",
    "sbatch": "#!/bin/sh\necho 4242\n",
    "squeue": "#!/bin/sh\nexit 0\n",
}


def test_the_cache_directory_is_there_before_the_job_mounts_it(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in FAKE_SLURM.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    runs = tmp_path / "runs"
    result = cli("run", QUICKSTART, "--target", "slurm", "--container", "apptainer", "--runs-dir", runs,
                 "--run-id", "sl-cache", "--detach", "--no-plan")
    assert result.exit_code == 0, result.output
    assert (runs / "hf_cache").is_dir()  # apptainer's --bind (and pyxis' mounts) refuse a missing source
    assert f"{runs / 'hf_cache'}:/cache/huggingface" in (runs / "sl-cache" / JOB_SCRIPT).read_text()
    listed = cli("runs", "--target", "slurm", "--runs-dir", runs, "--json")
    assert "hf_cache" not in listed.stdout  # the cache is no run


def test_partition_gpus_read_from_sinfo_gres():
    assert partition_gpus("(null)") == 0
    assert partition_gpus("gpu:8") == 8
    assert partition_gpus("gpu:h100:4(S:0-1),nic:1") == 4
    assert partition_gpus("gpu:a100:2,gpu:a100:8(S:0)") == 8


@pytest.mark.parametrize("flags, says", [
    (["--container", "singularity"], "--container 'singularity': use one of none, docker, apptainer, pyxis"),
    (["--time", "four hours"], "--time 'four hours': use Slurm's form"),
    (["--gpus", "0,1"], "on Slurm give a count per node"),
])
def test_bad_flags_are_one_line(tmp_path, flags, says):
    args = ["run"] + ([] if "--runtime" in flags else [QUICKSTART]) + ["--target", "slurm", "--runs-dir", tmp_path,
                                                                     "--dry-run", *flags]
    result = cli(*args)
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0] and "Traceback" not in result.output, result.output


def test_no_slurm_on_this_host_is_one_line(tmp_path):
    bare = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # the venv: python, no sbatch or sinfo
    done = subprocess.run([sys.executable, "-m", "verl_deploy", "run", str(QUICKSTART), "--target", "slurm",
                           "--runs-dir", str(tmp_path)], capture_output=True, text=True, env=bare, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: sinfo not found: this host is no Slurm submit host")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# --- the real controller -----------------------------------------------------------------------------------------

def test_unknown_partition_and_missing_gpus_are_refused_by_the_controller(tmp_path, slurm):
    result = cli("run", QUICKSTART, "--target", "slurm", "--partition", "nope", "--runs-dir", tmp_path)
    assert result.exit_code == 2
    assert "--partition nope: this cluster has no such partition (it has: debug" in result.output
    result = cli("run", QUICKSTART, "--target", "slurm", "--gpus", "1", "--runs-dir", tmp_path, "--no-plan")
    assert result.exit_code == 2
    assert "--gpus 1: partition debug cannot give a node 1 GPUs: its nodes have none" in result.output
    assert not list(tmp_path.iterdir())  # nothing submitted, nothing written


@pytest.mark.slow
def test_quickstart_trains_to_the_end_through_sbatch(tmp_path, slurm):
    runs = tmp_path / "runs"
    result = cli("run", QUICKSTART, "--target", "slurm", "--runs-dir", runs, "--run-id", "sl-venv", *SHORT,
                 "--set", "trainer.total_training_steps=2")
    assert result.exit_code == 0, result.output
    assert "Training finished at step 2" in result.stdout  # followed from the job's output file
    run_dir = runs / "sl-venv"
    assert metrics_steps(run_dir) == [1, 2]
    assert (run_dir / JOB_SCRIPT).read_text().startswith("#!/bin/bash")
    status = cli("status", "sl-venv", "--runs-dir", runs, "--json")
    found = json.loads(status.stdout)
    assert (found["target"], found["state"], found["exit_code"]) == ("slurm", "succeeded", 0)
    listed = [line.split() for line in cli("runs", "--runs-dir", runs).stdout.splitlines()]
    assert any(row[:2] == ["sl-venv", "slurm"] and "succeeded" in row for row in listed), listed


@pytest.mark.slow
def test_requeue_and_stop_checkpoint_and_resume_without_losing_a_step(tmp_path, slurm):
    # Enough steps that the requeue and the stop land mid-run on an idle machine too (a quickstart step takes
    # tens of milliseconds); a checkpoint every step, the newest two kept.
    runs, run_id, total = tmp_path / "runs", "sl-requeue", 60  # of the 64 steps of one epoch
    started = cli("run", QUICKSTART, "--target", "slurm", "--runs-dir", runs, "--run-id", run_id, "--detach",
                  *SHORT, "--set", f"trainer.total_training_steps={total}", "--set", "trainer.save_freq=1",
                  "--set", "trainer.keep_last=2")
    assert started.exit_code == 0, started.output
    run_dir = runs / run_id
    job = read_record(run_dir)["job_id"]
    try:
        # A requeue (what a preemption does): every process of the job gets TERM; the trainer checkpoints, the
        # job goes back to the queue and starts the same script again, which resumes.
        assert wait_for(lambda: len(metrics_steps(run_dir)) >= 2, 240), (run_dir / JOB_LOG).read_text()
        subprocess.run(["scontrol", "requeue", job], check=True)
        assert wait_for(lambda: _job_state(job) == "PENDING", 120)
        assert json.loads(cli("status", run_id, "--runs-dir", runs, "--json").stdout)["state"] == "pending"
        before = len(metrics_steps(run_dir))
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)  # no requeue delay
        assert wait_for(lambda: len(metrics_steps(run_dir)) >= before + 1, 240), (run_dir / JOB_LOG).read_text()
        assert "resum" in (run_dir / JOB_LOG).read_text().lower()

        # stop: TERM to the batch shell, which asks the trainer to checkpoint; the job then ends.
        said = cli("stop", run_id, "--runs-dir", runs)
        assert said.exit_code == 0 and "it writes a checkpoint" in said.stdout, said.output
        assert wait_for(lambda: json.loads(cli("status", run_id, "--runs-dir", runs, "--json").stdout)["state"]
                        == "stopped", 120), (run_dir / JOB_LOG).read_text()
        stopped = json.loads(cli("status", run_id, "--runs-dir", runs, "--json").stdout)
        assert stopped["checkpoints"] and stopped["exit_code"] in (129, 143)
        assert len(metrics_steps(run_dir)) < total
    finally:
        subprocess.run(["scancel", job], capture_output=True)

    resumed = cli("run", "--resume", run_id, "--runs-dir", runs)
    assert resumed.exit_code == 0, resumed.output
    assert metrics_steps(run_dir) == list(range(1, total + 1))  # every step once, in order
    assert json.loads(cli("status", run_id, "--runs-dir", runs, "--json").stdout)["state"] == "succeeded"


@pytest.mark.slow
@pytest.mark.docker
def test_quickstart_trains_in_the_run_image_on_the_node(tmp_path, slurm, cpu_image):
    runs = tmp_path / "runs"
    result = cli("run", QUICKSTART, "--target", "slurm", "--container", "docker", "--image", cpu_image,
                 "--runs-dir", runs, "--run-id", "sl-image", "--shm-size", "1g", *SHORT,
                 "--set", "trainer.total_training_steps=2")
    assert result.exit_code == 0, result.output
    assert "docker run --rm --name sl-image-trainer-" in (runs / "sl-image" / JOB_SCRIPT).read_text()
    assert metrics_steps(runs / "sl-image") == [1, 2]
    assert json.loads(cli("status", "sl-image", "--runs-dir", runs, "--json").stdout)["state"] == "succeeded"


# --- two nodes on one host: the two-node script's Ray start-up, executed -----------------------------------------

# srun for a job whose second node is this host: it records how the step was asked for, then runs the step's command
# as that node's task (its Slurm variables, its own TMPDIR). exec: a signal to this srun reaches the task, as srun
# forwards one.
SRUN_ON_ONE_HOST = """#!/bin/bash
printf '%s\\n' "$*" >> "$SRUN_CALLS"
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done
export SLURMD_NODENAME="$SECOND_NODE" SLURM_NODEID=1 SLURM_PROCID=0 SLURM_STEP_ID=0 TMPDIR="$SECOND_NODE_TMP"
exec "$@"
"""


def _processes_with(marker: str) -> list[int]:
    """The live processes whose environment carries marker: everything a job started, however it detached."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass  # ended meanwhile
    return found


@pytest.mark.slow
@pytest.mark.ray
def test_two_node_script_starts_ray_on_both_nodes_trains_across_them_and_tears_down(tmp_path, monkeypatch):
    """The batch script for --nodes 2, run by bash as the batch step would, with Slurm's variables for two nodes that
    are both this host and srun standing in as above: a real Ray head, a real Ray worker joining it, the trainer on
    the head. Not proven here: two machines, sbatch's allocation of them, the network between them."""
    ray_cli = Path(sys.executable).parent / "ray"
    require(ray_cli.exists(), "the ray command is not installed (pip install verl-deploy[runtime])")
    monkeypatch.setattr(slurm_launcher, "RAY_PORT", free_port())  # not 6379: other Ray clusters may run here
    runs, run_id = tmp_path / "runs", "sl-two"
    rendered = cli("run", QUICKSTART, "--target", "slurm", "--nodes", "2", "--runs-dir", runs, "--run-id", run_id,
                   "--dry-run", "--no-preflight",  # one host: tests/test_multinode_run.py has the pre-flight
                   *SHORT, "--set", "trainer.total_training_steps=2", "--set", "trainer.n_workers=2",
                   # a whole node's CPUs per worker: the two workers can only be placed one on each node
                   "--set", f"trainer.cpus_per_worker={os.cpu_count()}")
    assert rendered.exit_code == 0, rendered.output
    script, log, calls = tmp_path / JOB_SCRIPT, tmp_path / JOB_LOG, tmp_path / "srun-calls"
    script.write_text(rendered.stdout)
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "srun").write_text(SRUN_ON_ONE_HOST)
    (shims / "srun").chmod(0o755)
    (tmp_path / "node-2-tmp").mkdir()
    head = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
    marker = f"VERL_DEPLOY_TEST_JOB=sl-two-{uuid.uuid4().hex}"
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_NNODES": "2",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": f"{head},{head}-2", "SLURMD_NODENAME": head,
           "SLURM_NODEID": "0", "SECOND_NODE": f"{head}-2", "SECOND_NODE_TMP": str(tmp_path / "node-2-tmp"),
           "SRUN_CALLS": str(calls),
           "RAY_AUTH_MODE": "disabled",  # as tests/test_ray_cluster.py: a local ray.init here may have left a token
           marker.split("=")[0]: marker.split("=")[1]}
    with open(log, "w") as out:
        job = subprocess.Popen(["bash", str(script)], stdout=out, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    try:
        code = job.wait(timeout=300)
        output = log.read_text()
        assert code == 0, output[-3000:]
        [call] = calls.read_text().splitlines()  # one step: a worker on the node that is not the head
        assert call.startswith(f"--overlap --nodes=1 --ntasks=1 --ntasks-per-node=1 --exclude={head} bash -c ")
        assert call.endswith(f'{ray_cli} start "--address=$RAY_ADDRESS" --block')
        assert "[INFO] Ray cluster: 2 node(s)" in output, output[-3000:]
        assert "[INFO] 2 Ray worker(s) for actor on 2 node(s), cpu" in output  # world size 2, one per node
        assert "Training finished at step 2" in output
        assert metrics_steps(runs / run_id) == [1, 2]
        assert json.loads((runs / run_id / JOB_EXIT).read_text()) == {"job_id": "4242", "restart": 0, "exit_code": 0}
        # the script's own teardown: no Ray process of the job (head, worker, raylets, their workers) outlives it
        assert wait_for(lambda: not _processes_with(marker), 60), _processes_with(marker)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        for pid in _processes_with(marker):
            os.kill(pid, signal.SIGKILL)
