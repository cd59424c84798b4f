"""compose.yaml validates with the Compose on this host; the CPU override runs a short training to completion."""

import os
import shutil
import subprocess

import pytest
import yaml
from conftest import REPO, require

pytestmark = pytest.mark.docker


def compose_command() -> tuple[list[str], int]:
    """(argv prefix, major version): the Compose v2 plugin, else Debian's docker-compose (v1)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"], 2
    require(shutil.which("docker-compose") is not None, "no Docker Compose (.ci/services.sh installs docker-compose)")
    return ["docker-compose"], 1


@pytest.fixture
def project(tmp_path):
    """A copy of the compose files with a .env made from .env.example, as a user would set it up."""
    for name in ("compose.yaml", "compose.cpu.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    env = (REPO / ".env.example").read_text().replace("VERL_UID=1000", f"VERL_UID={os.getuid() or 1000}")
    (tmp_path / ".env").write_text(env)
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "quickstart.yaml").write_text("model:\n  pretrained_model_name_or_path: builtin:tiny\n")
    (tmp_path / "data").mkdir()
    return tmp_path


def config(project, *files, env=None) -> dict:
    prefix, _ = compose_command()
    args = [a for f in files for a in ("-f", f)]
    out = subprocess.run([*prefix, *args, "config"], cwd=project, capture_output=True, text=True, timeout=60,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def test_compose_yaml_reserves_gpus_and_mounts_the_run_volumes(project):
    trainer = config(project, "compose.yaml")["services"]["trainer"]
    devices = trainer["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
    targets = {v.split(":")[1] if isinstance(v, str) else v["target"] for v in trainer["volumes"]}
    assert {"/etc/verl-deploy/config.yaml", "/workspace/runs", "/cache/huggingface", "/data"} <= targets
    assert trainer["user"] != "0:0" and trainer["command"][0] == "train"


def test_cpu_override_runs_to_completion(project, request):
    _, major = compose_command()
    if major < 2:
        pytest.skip("compose.cpu.yaml uses Compose v2's !reset; this host has Compose v1 (Debian's docker-compose)")
    cpu_image = request.getfixturevalue("cpu_image")
    env = {"VERL_IMAGE": cpu_image, "VERL_RUN_ID": "compose-cpu"}
    merged = config(project, "compose.yaml", "compose.cpu.yaml", env=env)
    assert "deploy" not in merged["services"]["trainer"]
    prefix, _ = compose_command()
    (project / "runs").mkdir()
    os.chown(project / "runs", os.getuid() or 1000, os.getgid() or 1000)
    run = subprocess.run(
        [*prefix, "-f", "compose.yaml", "-f", "compose.cpu.yaml", "run", "--rm", "trainer", "train",
         "/etc/verl-deploy/config.yaml", "--set", "trainer.run_dir=/workspace/runs/compose-cpu",
         "--set", "trainer.total_training_steps=2", "--set", "data.max_response_length=8"],
        cwd=project, capture_output=True, text=True, timeout=300, env={**os.environ, **env},
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert (project / "runs" / "compose-cpu" / "metrics.jsonl").read_text().count("\n") == 2
