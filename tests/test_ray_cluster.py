"""Joining a Ray cluster that is already running (as on `ray start` nodes or a KubeRay RayJob): RAY_ADDRESS is set,
the trainer uses that cluster's workers instead of starting its own Ray."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port, require

pytestmark = pytest.mark.slow


@pytest.fixture
def ray_head(tmp_path):
    """`ray start --head --block` on a free port with 3 CPUs; ending that one process stops its cluster."""
    ray_cli = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    require(Path(ray_cli).exists(), "the ray command is not installed (pip install verl-deploy[runtime])")
    port, log = free_port(), tmp_path / "ray-head.log"
    # Without token auth: a local ray.init earlier on this host leaves a token that `ray start` would then demand.
    head = subprocess.Popen(
        [ray_cli, "start", "--head", f"--port={port}", "--num-cpus=3", "--include-dashboard=false",
         "--disable-usage-stats", "--block"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    try:
        deadline = time.monotonic() + 90
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        head.terminate()
        head.wait(timeout=60)


def test_the_trainer_joins_a_running_cluster_from_ray_address(ray_head, tmp_path):
    run_dir, config = tmp_path / "run", tmp_path / "grpo.yaml"
    config.write_text(
        "algorithm: {adv_estimator: grpo}\n"
        "rollout: {n: 2}\n"
        "data: {batch_size: 2, max_response_length: 4}\n"
        f"trainer: {{device: cpu, n_workers: 2, total_training_steps: 1, run_dir: {run_dir}}}\n"
    )
    train = subprocess.run(
        [sys.executable, "-m", "verl_runtime", "train", str(config)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "RAY_ADDRESS": ray_head, "RAY_AUTH_MODE": "disabled"},  # as the head (a local ray.init sets token)
    )
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-2000:]
    assert "[INFO] Ray cluster: 1 node(s), 3 CPUs, 0 GPUs" in train.stdout  # the head's 3, not a new local Ray
    assert "[INFO] 2 Ray worker(s) for actor, ref on 1 node(s), cpu" in train.stdout
    assert (run_dir / "checkpoints" / "step_1").is_dir()
