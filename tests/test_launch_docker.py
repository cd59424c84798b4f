"""`verl-deploy run --target docker` against the real engine: training to completion in the cpu image, a killed
container resumed, Ctrl-C leaving a checkpoint, and bad input failing in one line with nothing left behind.
More faults (secrets, hardening, out of memory, an unreachable engine, Ctrl-C before the start): test_docker_faults."""

import json
import os
import signal
import subprocess
import sys

import pytest
from launch_support import QUICKSTART, cli, containers, metrics_steps, wait_for

pytestmark = pytest.mark.docker
SHORT = ["--set", "data.max_response_length=8", "--set", "trainer.test_freq=-1", "--shm-size", "1g"]


def test_quickstart_trains_in_a_container_to_completion(tmp_path, cpu_image, docker_client, leftovers):
    runs = tmp_path / "runs"
    leftovers.append("dock-2")
    result = cli("run", QUICKSTART, "--target", "docker", "--image", cpu_image, "--runs-dir", runs,
                 "--run-id", "dock-2", "--set", "trainer.total_training_steps=2", *SHORT)
    assert result.exit_code == 0, result.output
    assert "step 2/2" in result.output  # streamed live from the container
    run_dir = runs / "dock-2"
    assert metrics_steps(run_dir) == [1, 2]
    assert (run_dir / "checkpoints" / "step_2").is_dir()
    # The caller's files, a root caller's too (its container ran as 1000 and handed the run directory back).
    assert (run_dir / "metrics.jsonl").stat().st_uid == os.getuid()
    assert not containers(docker_client, "dock-2"), "its end is recorded in the run directory, its container gone"
    status = cli("status", "dock-2", "--runs-dir", runs)
    assert status.output.startswith("dock-2  docker  succeeded (exit 0)  step 2 · reward "), status.output
    assert "step 2/2" in cli("logs", "dock-2", "--runs-dir", runs).output
    listed = json.loads(cli("runs", "--target", "docker", "--runs-dir", runs, "--json").output)
    assert [r["run_id"] for r in listed] == ["dock-2"]


@pytest.mark.slow
def test_killed_container_resumes_without_losing_a_step(tmp_path, cpu_image, docker_client, leftovers):
    runs = tmp_path / "runs"
    run_dir = runs / "dock-kill"
    leftovers.append("dock-kill")
    common = ["--target", "docker", "--image", cpu_image, "--runs-dir", runs, "--set", "trainer.save_freq=1", *SHORT]
    started = cli("run", QUICKSTART, *common, "--run-id", "dock-kill", "--detach",
                  "--set", "trainer.total_training_steps=100")
    assert started.exit_code == 0, started.output
    assert wait_for(lambda: len(metrics_steps(run_dir)) >= 2)
    containers(docker_client, "dock-kill")[0].kill()  # SIGKILL: no chance to checkpoint
    done = max(int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step_*"))

    resumed = cli("run", QUICKSTART, *common, "--resume", "dock-kill", "--set", f"trainer.total_training_steps={done + 1}")
    assert resumed.exit_code == 0, resumed.output
    assert metrics_steps(run_dir) == list(range(1, done + 2)), "every completed step kept, none repeated"
    assert not containers(docker_client, "dock-kill", running_only=True)


@pytest.mark.slow
def test_ctrl_c_leaves_a_checkpoint_and_nothing_running(tmp_path, cpu_image, docker_client, leftovers):
    runs = tmp_path / "runs"
    run_dir = runs / "dock-int"
    leftovers.append("dock-int")
    cli_process = subprocess.Popen(
        [sys.executable, "-m", "verl_deploy", "run", str(QUICKSTART), "--target", "docker", "--image", cpu_image,
         "--runs-dir", str(runs), "--run-id", "dock-int", "--set", "trainer.total_training_steps=100", *SHORT],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert wait_for(lambda: len(metrics_steps(run_dir)) >= 1)
        cli_process.send_signal(signal.SIGINT)
        output, _ = cli_process.communicate(timeout=180)
    finally:
        cli_process.kill()
    assert not containers(docker_client, "dock-int")
    recorded = json.loads(cli("status", "dock-int", "--runs-dir", runs, "--json").output)
    assert recorded["state"] == "stopped" and cli_process.returncode == recorded["exit_code"], output
    last = metrics_steps(run_dir)[-1]
    assert (run_dir / "checkpoints" / f"step_{last}").is_dir(), output


def test_missing_image_is_one_line_and_starts_nothing(tmp_path, docker_client):
    result = cli("run", QUICKSTART, "--target", "docker", "--image", "localhost:1/no-such-image:0",
                 "--runs-dir", tmp_path, "--run-id", "dock-noimage")
    assert result.exit_code == 2
    assert result.output.startswith("error: image 'localhost:1/no-such-image:0' is not here and cannot be pulled")
    assert len(result.output.strip().splitlines()) == 1
    assert not containers(docker_client, "dock-noimage") and not (tmp_path / "dock-noimage").exists()


def test_gpus_without_docker_gpu_support_is_one_line_and_leaves_nothing(tmp_path, docker_client, base_image):
    runtimes = docker_client.info().get("Runtimes", {})
    if "nvidia" in runtimes:
        pytest.skip("this Docker engine has GPU support")
    result = cli("run", QUICKSTART, "--target", "docker", "--image", base_image, "--gpus", "1",
                 "--runs-dir", tmp_path, "--run-id", "dock-gpu")
    assert result.exit_code == 2
    # the quickstart trains on the CPU, so --gpus could not be planned: the pre-flight says why in its one note line
    note, error = result.output.strip().splitlines()
    assert note.startswith("note: not planned for memory: trainer.device=cpu trains on the CPU: drop --gpus")
    assert error.startswith("error: Docker on this host has no GPU support")
    assert not containers(docker_client, "dock-gpu") and not (tmp_path / "dock-gpu").exists()


@pytest.mark.slow
def test_two_nodes_form_one_ray_cluster_and_stop_together(tmp_path, cpu_image, docker_client, leftovers):
    """The launcher side of multi-node: a Ray head (running the trainer) and a worker on one network."""
    runs = tmp_path / "runs"
    leftovers.append("dock-ray")
    started = cli("run", QUICKSTART, "--target", "docker", "--image", cpu_image, "--nodes", "2", "--detach",
                  "--runs-dir", runs, "--run-id", "dock-ray", "--set", "trainer.total_training_steps=100", *SHORT)
    assert started.exit_code == 0, started.output
    head = docker_client.containers.get("dock-ray")

    def two_nodes():
        result = head.exec_run(["ray", "status"], user="1000")
        return result.exit_code == 0 and result.output.decode().count("node_") == 2

    assert wait_for(two_nodes), head.logs().decode()[-2000:]
    assert wait_for(lambda: len(metrics_steps(runs / "dock-ray")) >= 1)
    assert cli("stop", "dock-ray", "--runs-dir", runs).exit_code == 0
    assert not containers(docker_client, "dock-ray", running_only=True)
    last = metrics_steps(runs / "dock-ray")[-1]
    assert (runs / "dock-ray" / "checkpoints" / f"step_{last}").is_dir()
    assert json.loads(cli("status", "dock-ray", "--runs-dir", runs, "--json").output)["state"] == "stopped"


@pytest.mark.slow
def test_two_nodes_train_one_run_across_both_containers(tmp_path, cpu_image, docker_client, leftovers):
    """Multi-node training: two workers of a whole node's CPUs each (a container sees the host's CPUs) must take
    one node each, and they train data-parallel over gloo from container to container."""
    runs = tmp_path / "runs"
    leftovers.append("dock-ray-dp")
    result = cli("run", QUICKSTART, "--target", "docker", "--image", cpu_image, "--nodes", "2", "--runs-dir", runs,
                 "--run-id", "dock-ray-dp", "--set", "trainer.n_workers=2", "--set", "trainer.total_training_steps=2",
                 "--set", f"trainer.cpus_per_worker={os.cpu_count()}", *SHORT)
    assert result.exit_code == 0, result.output
    assert "[INFO] Ray cluster: 2 node(s)" in result.output
    assert "2 Ray worker(s) for actor on 2 node(s), cpu" in result.output
    assert metrics_steps(runs / "dock-ray-dp") == [1, 2]
    assert (runs / "dock-ray-dp" / "checkpoints" / "step_2").is_dir()
    assert not containers(docker_client, "dock-ray-dp", running_only=True)
