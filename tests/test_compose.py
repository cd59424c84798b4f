"""compose.yaml validates with the Compose on this host (v2 plugin, or Debian's docker-compose v1); the CPU override
runs a short training to completion, leaving metrics and a checkpoint in the host's run directory."""

import os
import re
import shutil
import subprocess

import pytest
import yaml
from conftest import REPO, require

pytestmark = pytest.mark.docker

CPU = ["-f", "compose.yaml", "-f", "compose.cpu.yaml"]
PROJECT = f"verl-compose-test-{os.getpid()}"  # containers and network of one test session

# Two GRPO steps on the built-in tiny model: what the quickstart does, only smaller.
TINY_CONFIG = """\
data: {train_files: toy:letter, toy_size: 16, batch_size: 2, max_prompt_length: 64, max_response_length: 4}
model: {path: builtin:tiny}
rollout: {name: hf, n: 2}
algorithm: {adv_estimator: grpo}
trainer: {device: cpu, total_training_steps: 2}
"""


def compose_command() -> list[str]:
    """The Compose v2 plugin, else Debian's docker-compose (v1): compose.yaml is written for both."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    require(shutil.which("docker-compose") is not None, "no Docker Compose (.ci/services.sh installs docker-compose)")
    return ["docker-compose"]


def set_env(text: str, **values: str) -> str:
    """.env text with KEY=value set, uncommenting or appending the line, as a user edits .env.example."""
    for key, value in values.items():
        text, found = re.subn(rf"^#? ?{key}=.*$", f"{key}={value}", text, flags=re.M)
        if not found:
            text += f"{key}={value}\n"
    return text


@pytest.fixture
def project(tmp_path):
    """The compose files, a tiny config and a .env made from .env.example, as a user would set them up;
    the run directory and the HF cache on temporary host paths owned by the container's user."""
    uid, gid = os.getuid() or 1000, os.getgid() or 1000
    for name in ("compose.yaml", "compose.cpu.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "tiny.yaml").write_text(TINY_CONFIG)
    for name in ("runs", "hf-cache", "data"):
        (tmp_path / name).mkdir()
        os.chown(tmp_path / name, uid, gid)
    env = set_env((REPO / ".env.example").read_text(), VERL_CONFIG="./tiny.yaml", VERL_RUN_ID="compose-cpu",
                  VERL_RUNS=str(tmp_path / "runs"), VERL_HF_CACHE=str(tmp_path / "hf-cache"),
                  VERL_UID=str(uid), VERL_GID=str(gid))
    (tmp_path / ".env").write_text(env)
    return tmp_path


def compose(project, *args, env=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([*compose_command(), "-p", PROJECT, *args], cwd=project,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def config(project, *args) -> dict:
    out = compose(project, *args, "config")
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)["services"]


def test_compose_yaml_reserves_gpus_and_mounts_the_run_volumes(project):
    assert compose(project, "config", "-q").returncode == 0
    trainer = config(project)["trainer"]
    devices = trainer["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
    targets = {v.split(":")[1] if isinstance(v, str) else v["target"] for v in trainer["volumes"]}
    assert {"/etc/verl-deploy/config.yaml", "/workspace/runs", "/cache/huggingface", "/data"} <= targets
    assert trainer["user"] != "0:0" and trainer["command"][0] == "train"
    assert "profiles" not in trainer  # `docker compose up` starts it


def test_cpu_override_swaps_the_gpu_trainer_for_the_same_container_on_the_cpu(project):
    services = config(project, "--profile", "gpu", *CPU)  # v2 leaves services of inactive profiles out
    gpu, cpu = services["trainer"], services["trainer-cpu"]
    assert gpu["profiles"] == ["gpu"] and "profiles" not in cpu  # only trainer-cpu is in the default set
    assert "deploy" not in cpu and cpu["image"].endswith("-cpu") and "memlock" not in cpu["ulimits"]
    different = {"image", "shm_size", "deploy", "profiles", "ulimits"}
    assert {k: v for k, v in cpu.items() if k not in different} == {k: v for k, v in gpu.items() if k not in different}
    assert cpu["ulimits"]["stack"] == gpu["ulimits"]["stack"]


@pytest.mark.slow
def test_cpu_override_runs_to_completion(project, docker_client, cpu_image):
    env = {"VERL_IMAGE": cpu_image}
    try:
        up = compose(project, *CPU, "up", "--exit-code-from", "trainer-cpu", env=env, timeout=300)
    finally:
        down = compose(project, *CPU, "down", "-v", "--remove-orphans", env=env)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-2000:]
    assert "Training finished at step 2" in up.stdout
    run_dir = project / "runs" / "compose-cpu"
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run_dir / "checkpoints" / "step_2" / "state.pt").is_file()
    assert down.returncode == 0, down.stderr
    assert docker_client.containers.list(all=True, filters={"label": f"com.docker.compose.project={PROJECT}"}) == []
