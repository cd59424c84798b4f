"""`verl-deploy init DIR` and `--version`: a user's own starting files, the same as the repository's, and one
version for the CLI, its runtime and the image catalog."""

import hashlib
import os
import shutil
import subprocess

import pytest
import yaml
from conftest import REPO, require
from typer.testing import CliRunner

from verl_deploy import __version__, assets
from verl_deploy.cli import app


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_init_writes_the_files_the_repository_ships(tmp_path):
    result = cli("init", tmp_path / "mine")
    assert result.exit_code == 0, result.output
    mine = tmp_path / "mine"
    for name in (*assets.STARTER, "k8s/base/config.yaml", "k8s/policy-exceptions.yaml"):
        assert (mine / name).read_bytes() == (REPO / name).read_bytes(), name
    shipped = sorted(p.relative_to(REPO / "k8s") for p in (REPO / "k8s").rglob("*.yaml"))
    assert sorted(p.relative_to(mine / "k8s") for p in (mine / "k8s").rglob("*.yaml")) == shipped
    for relative in shipped:
        assert (mine / "k8s" / relative).read_text() == (REPO / "k8s" / relative).read_text(), relative
    assert oct((mine / ".secrets").stat().st_mode & 0o777) == "0o700"
    assert result.output.startswith(f"wrote {len(list(p for p in mine.rglob('*') if p.is_file()))} files to {mine}")


def test_init_gives_a_wheel_user_the_agentic_quickstart_with_its_tool_config(tmp_path, monkeypatch):
    from verl_runtime.agent.tools import load_tools
    from verl_runtime.config import load_config

    assert cli("init", tmp_path).exit_code == 0
    monkeypatch.chdir(tmp_path)  # where the user runs `verl-deploy run examples/tool-calculator.yaml` from
    config = load_config("examples/tool-calculator.yaml")
    tools = load_tools(config.rollout.multi_turn.tool_config_path, {"sandbox": "http://127.0.0.1:9"})
    assert tools["code_interpreter"].url == "http://127.0.0.1:9/run_code"


def test_init_kustomize_tree_and_compose_files_work_where_they_land(tmp_path):
    require(shutil.which("kubectl") is not None, "kubectl not installed (.ci/services.sh installs it)")
    assert cli("init", tmp_path).exit_code == 0
    out = subprocess.run(["kubectl", "kustomize", str(tmp_path / "k8s" / "overlays" / "eight-gpus")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert {d["kind"] for d in yaml.safe_load_all(out) if d} == {
        "ConfigMap", "NetworkPolicy", "PersistentVolumeClaim", "Job"}
    compose = shutil.which("docker-compose")
    require(compose is not None, "docker-compose not installed (.ci/services.sh installs it)")
    checked = subprocess.run([compose, "-f", "compose.yaml", "config", "--quiet"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60, env={**os.environ, "VERL_SECRETS_DIR": str(tmp_path / ".secrets")})
    assert checked.returncode == 0, checked.stderr


def test_init_refuses_to_overwrite_a_changed_file_and_writes_nothing(tmp_path):
    (tmp_path / "compose.yaml").write_text("services: {mine: {image: x}}\n")
    result = cli("init", tmp_path)
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {tmp_path} already has compose.yaml, different from the starter files: nothing written; pass "
        "--force to overwrite them, or init another folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compose.yaml"]
    again = cli("init", tmp_path, "--force")
    assert again.exit_code == 0 and (tmp_path / "compose.yaml").read_bytes() == (REPO / "compose.yaml").read_bytes()
    assert cli("init", tmp_path).output.startswith("wrote 0 files")  # the same files: nothing to do, no error


def test_init_into_a_folder_that_cannot_be_one_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    result = cli("init", tmp_path / "file" / "sub")
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert line.startswith(f"error: cannot write {tmp_path / 'file'}") and "choose a folder you can write to" in line
    assert not list(tmp_path.glob("**/.*init-tmp"))


def test_version_names_the_cli_the_runtime_and_the_catalog():
    result = cli("--version")
    assert result.exit_code == 0
    digest = hashlib.sha256((REPO / "docker" / "variants.yaml").read_bytes()).hexdigest()[:12]
    assert result.output.splitlines() == [
        f"verl-deploy {__version__}",
        f"runtime: verl_runtime {__version__} (the images' tags: verl-deploy:{__version__}-<variant>)",
        f"catalog: docker/variants.yaml sha256:{digest} (cpu, cu128, cu130; verl 0.9.1: cu130)",
    ]
