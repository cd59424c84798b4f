"""Joining a Ray cluster that is already running (as on `ray start` nodes or a KubeRay RayJob): RAY_ADDRESS is set,
the trainer uses that cluster's workers instead of starting its own Ray."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require

from verl_runtime.config import get_default_config
from verl_runtime.trainer import SingleControllerTrainer

pytestmark = pytest.mark.slow

SAMPLES = [
    {"prompt": "What is 2 + 2?", "response": "4", "reward": 1.0},
    {"prompt": "What is 2 + 2?", "response": "5", "reward": 0.0},
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def test_the_trainer_joins_a_running_cluster_from_ray_address(ray_head, monkeypatch, capsys):
    import ray

    monkeypatch.setenv("RAY_ADDRESS", ray_head)
    config = get_default_config("grpo")
    config.trainer.device, config.trainer.n_workers = "cpu", 2
    trainer = SingleControllerTrainer(config)
    try:
        assert ray.get_runtime_context().gcs_address.endswith(ray_head.split(":")[1])
        assert "[INFO] Ray cluster: 1 node(s), 3 CPUs, 0 GPUs" in capsys.readouterr().out  # the head's, not this host's
        assert ray.available_resources().get("CPU", 0) == 1  # two of its three CPUs hold the workers
        assert "actor/pg_loss" in trainer.step(SAMPLES)
    finally:
        trainer.close()
        ray.shutdown()
