"""Doctor's Kubernetes checks: kubeconfig found or not, unreadable, an API that is down or hung, and what GPU
Feature Discovery labels on a node say about the image variants."""

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


def test_garbage_kubeconfig_is_a_clear_finding(monkeypatch, tmp_path):
    garbage = tmp_path / "kubeconfig"
    garbage.write_text("{{{ this is : not a kubeconfig\n\x00")
    monkeypatch.setenv("KUBECONFIG", str(garbage))
    code, [finding] = k8s_findings()
    assert finding["status"] == "fail"
    assert finding["message"].startswith(f"kubeconfig {garbage} is not valid YAML")
    assert "kubectl config view" in finding["remedy"]
    assert code == 1


@pytest.mark.parametrize(
    "text, says",
    [
        ("just a string\n", "is not a kubeconfig"),
        ("apiVersion: v1\nkind: Config\n", "unreadable: Invalid kube-config file. Expected key current-context"),
    ],
)
def test_kubeconfig_that_is_not_one_is_a_clear_finding(monkeypatch, tmp_path, text, says):
    config = tmp_path / "kubeconfig"
    config.write_text(text)
    monkeypatch.setenv("KUBECONFIG", str(config))
    _, [finding] = k8s_findings()
    assert finding["name"] == "kubeconfig" and finding["status"] == "fail" and says in finding["message"]


def test_kubeconfig_env_naming_a_missing_file(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    _, [finding] = k8s_findings()
    assert finding["status"] == "fail" and finding["message"].endswith("nope cannot be read: no such file or directory")


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
