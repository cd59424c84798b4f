"""Doctor's Kubernetes checks: kubeconfig found or not, unreadable, an API that is down or hung, and what GPU
Feature Discovery labels on a node say about the image variants; `run --target k8s` says the same of a bad
kubeconfig in one line."""

import json
import socket

import pytest
from typer.testing import CliRunner

from verl_deploy.cli import app
from verl_deploy.doctor import kubernetes_check
from verl_deploy.doctor.core import Context

pytest.importorskip("kubernetes")

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {{server: "{server}", insecure-skip-tls-verify: true}}
users:
- name: me
  user: {{token: not-a-secret}}
contexts:
- name: lab-admin
  context: {{cluster: lab, user: me}}
current-context: lab-admin
"""


@pytest.fixture(autouse=True)
def isolated_home(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def k8s_findings(*args):
    result = CliRunner().invoke(app, ["doctor", "--json", *args])
    document = json.loads(result.stdout)
    return result.exit_code, [f for f in document["findings"] if f["area"] == "kubernetes"]


def test_without_kubeconfig_the_cluster_is_skipped():
    code, [cluster] = k8s_findings()
    assert cluster["status"] == "skip" and "--k8s" in cluster["remedy"]


def test_k8s_flag_without_kubeconfig_fails():
    code, [finding] = k8s_findings("--k8s")
    assert finding["status"] == "fail" and finding["message"] == "--k8s given but no kubeconfig found"
    assert code == 1


def junk(tmp_path, kind: str):
    """A KUBECONFIG that is set but no kubeconfig, as real files (or their absence)."""
    path = tmp_path / "kubeconfig"
    if kind == "binary":
        path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe\x00junk")
    elif kind == "invalid yaml":
        path.write_text("clusters: [unclosed\n")
    elif kind == "a string":
        path.write_text("just a string\n")
    elif kind == "no current context":
        path.write_text("apiVersion: v1\nkind: Config\n")
    elif kind == "a directory":
        path.mkdir()
    return path


JUNK = {
    "binary": "binary data, not YAML text",
    "invalid yaml": "not valid YAML, line 2: expected ',' or ']'",
    "a string": "not a YAML mapping with clusters, users and contexts",
    "no current context": "Invalid kube-config file. Expected key current-context",
    "a directory": "cannot be read: is a directory",
    "missing": "cannot be read: no such file or directory",
}


@pytest.mark.parametrize("kind", list(JUNK))
def test_a_kubeconfig_that_is_not_one_is_one_finding_saying_so(monkeypatch, tmp_path, kind):
    path = junk(tmp_path, kind)
    monkeypatch.setenv("KUBECONFIG", str(path))
    code, findings = k8s_findings("--k8s")
    assert len(findings) == 1, findings
    [finding] = findings
    assert finding["name"] == "kubeconfig" and finding["status"] == "fail"
    assert finding["message"].startswith(f"KUBECONFIG={path} is not a valid kubeconfig (")
    assert JUNK[kind] in finding["message"] and finding["remedy"] == "fix or unset it"
    assert code == 1


@pytest.mark.parametrize("kind", ["binary", "invalid yaml", "a directory", "missing"])
def test_run_on_kubernetes_with_such_a_kubeconfig_is_one_line_and_exit_2(monkeypatch, tmp_path, kind):
    from launch_support import QUICKSTART, cli

    path = junk(tmp_path, kind)
    monkeypatch.setenv("KUBECONFIG", str(path))
    result = cli("run", QUICKSTART, "--target", "k8s", "--image", "reg.io/img:1", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 2, result.output
    [line] = result.output.splitlines()
    assert line.startswith(f"error: KUBECONFIG={path} is not a valid kubeconfig (") and JUNK[kind] in line
    assert line.endswith("): fix or unset it")


def test_a_broken_default_kubeconfig_names_its_path(tmp_path):
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_bytes(b"\xff\xfe\x00")
    _, [finding] = k8s_findings()
    assert finding["message"] == f"{tmp_path / '.kube' / 'config'} is not a valid kubeconfig (binary data, not YAML text)"
    assert finding["remedy"] == "fix it or set KUBECONFIG to a valid one"


def test_api_that_is_down_fails_with_the_reason(monkeypatch, tmp_path):
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG.format(server="https://127.0.0.1:1"))
    monkeypatch.setenv("KUBECONFIG", str(config))
    code, findings = k8s_findings()
    context, api = findings
    assert context["status"] == "ok" and context["message"] == "lab-admin (https://127.0.0.1:1)"
    assert api["status"] == "fail" and "not reachable" in api["message"] and "refused" in api["message"].lower()
    assert code == 1


def test_hung_api_cannot_hang_doctor(monkeypatch, tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()  # accepts connections, never answers
        config = tmp_path / "kubeconfig"
        config.write_text(KUBECONFIG.format(server=f"https://127.0.0.1:{server.getsockname()[1]}"))
        monkeypatch.setenv("KUBECONFIG", str(config))
        _, api = kubernetes_check.check(Context(nvml={}, timeout_s=1))
    assert api.status == "fail" and "not reachable" in api.message


def test_gpu_node_labels_pick_a_variant():
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54",
        "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
    }
    finding = kubernetes_check.gpu_node_finding("gpu-1", 8, labels)
    assert finding.status == "ok"
    assert finding.message == "8 x NVIDIA-H100-80GB-HBM3, driver 550.54.15, CC 9.0: variant cu128"


def test_gpu_node_with_new_style_labels_and_a_driver_too_old_for_blackwell():
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-B200",
        "nvidia.com/cuda.driver-version.full": "550.90.07",
        "nvidia.com/gpu.compute.major": "10",
        "nvidia.com/gpu.compute.minor": "0",
    }
    finding = kubernetes_check.gpu_node_finding("gpu-2", 8, labels)
    assert finding.status == "fail" and "predates Blackwell" in finding.message


def test_gpu_node_without_feature_discovery_labels():
    finding = kubernetes_check.gpu_node_finding("gpu-3", 1, {})
    assert finding.status == "warn" and "GPU Feature Discovery" in finding.remedy
