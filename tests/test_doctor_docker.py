"""Doctor's Docker checks against the real engine, and against engines that are missing, stopped, hung or
forbidden."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
from conftest import FIXTURES, REPO
from typer.testing import CliRunner

from verl_deploy.cli import app
from verl_deploy.doctor import docker_check
from verl_deploy.doctor.core import Context

NO_GPU = FIXTURES / "nvml" / "no-driver.json"


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def docker_findings(*args):
    result = CliRunner().invoke(app, ["doctor", "--json", "--nvml-reading", str(NO_GPU), *args])
    document = json.loads(result.stdout)
    return result.exit_code, {f["name"]: f for f in document["findings"] if f["area"] == "docker"}


@pytest.mark.docker
def test_real_engine_is_found_with_its_version(docker_client, monkeypatch):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    code, found = docker_findings()
    engine = found["engine"]
    assert engine["status"] == "ok"
    assert f"Docker {docker_client.version()['Version']}" in engine["message"]
    assert found["gpu support"]["status"] in ("ok", "skip")  # no GPU here: skip unless a toolkit is installed
    assert code == 0


@pytest.mark.docker
def test_gpu_smoke_without_gpus_is_skipped(docker_client, monkeypatch):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    _, found = docker_findings("--gpu-smoke")
    assert found["gpu smoke"]["status"] == "skip" and found["gpu smoke"]["message"] == "no GPU on this host"


def test_docker_host_naming_a_missing_socket_fails_clearly(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    code, found = docker_findings()
    assert found["engine"]["status"] == "fail"
    assert found["engine"]["message"] == "DOCKER_HOST names /nonexistent.sock, which does not exist"
    assert "DOCKER_HOST" in found["engine"]["remedy"]
    assert code == 1


def test_docker_host_where_nothing_listens_fails_clearly(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    code, found = docker_findings()
    assert found["engine"] == {
        "area": "docker",
        "name": "engine",
        "status": "fail",
        "message": "no Docker engine answers at tcp://127.0.0.1:1: connection refused",
        "remedy": docker_check.START_REMEDY,
    }
    assert code == 1


def test_stopped_engine_that_left_its_socket_behind(monkeypatch, tmp_path):
    stale = tmp_path / "docker.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(stale))  # bound, never listening: what a dead daemon leaves
        monkeypatch.setenv("DOCKER_HOST", f"unix://{stale}")
        [engine] = docker_check.check(Context(nvml={}, timeout_s=2))
    assert engine.status == "fail" and engine.message.endswith(": connection refused")


def test_hung_engine_cannot_hang_doctor(monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()  # accepts connections, never answers
        monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{server.getsockname()[1]}")
        [engine] = docker_check.check(Context(nvml={}, timeout_s=1))
    assert engine.status == "fail" and "no answer within 1 s" in engine.message


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become another user")
@pytest.mark.docker
def test_socket_permission_denied_says_how_to_get_access(docker_client):
    code = (
        "from verl_deploy.doctor import docker_check; from verl_deploy.doctor.core import Context;"
        "[f] = docker_check.check(Context(nvml={})); print(f.status, '|', f.message, '|', f.remedy)"
    )
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c"]
    if subprocess.run([*as_nobody, "import verl_deploy.doctor"], cwd=REPO, capture_output=True).returncode:
        pytest.skip("user nobody cannot read this checkout")
    done = subprocess.run([*as_nobody, code], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    status, message, remedy = done.stdout.strip().split(" | ")
    assert status == "fail" and message.startswith("permission denied on ")
    assert "usermod -aG docker" in remedy
