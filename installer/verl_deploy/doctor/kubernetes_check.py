"""Kubernetes (when a kubeconfig exists or --k8s is given): context, API reachable, GPU nodes, and which image
variant their drivers (GPU Feature Discovery labels) can run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from verl_deploy import compat
from verl_deploy.doctor.core import Context, Finding, describe_error
from verl_deploy.watchdog import call_with_timeout

AREA = "kubernetes"
GPU_RESOURCE = "nvidia.com/gpu"
INSTALL_GPU_OPERATOR = "install the NVIDIA GPU Operator (device plugin and GPU Feature Discovery)"


def kubeconfig_paths() -> list[Path]:
    """KUBECONFIG's files (as named, so a missing one is reported), else ~/.kube/config when it exists."""
    named = os.environ.get("KUBECONFIG")
    if named:
        return [Path(p) for p in named.split(os.pathsep) if p]
    default = Path.home() / ".kube" / "config"
    return [default] if default.exists() else []


def invalid_kubeconfig(paths: list[Path], reason: str) -> tuple[str, str]:
    """(message, remedy) for a kubeconfig that cannot be used: doctor's finding, and `run --target k8s`'s error
    as '<message>: <remedy>'."""
    if os.environ.get("KUBECONFIG"):
        return f"KUBECONFIG={os.environ['KUBECONFIG']} is not a valid kubeconfig ({reason})", "fix or unset it"
    return f"{paths[0]} is not a valid kubeconfig ({reason})", "fix it or set KUBECONFIG to a valid one"


def kubeconfig_error(paths: list[Path]) -> tuple[str, str] | None:
    """Why the kubeconfig files cannot be used (their text, then the kubernetes client's loader), or None."""
    for path in paths:
        if problem := kubeconfig_problem(path):
            return invalid_kubeconfig(paths, problem if len(paths) == 1 else f"{path}: {problem}")
    try:
        from kubernetes import client, config
    except ImportError:
        return None  # the text is sound; the client's absence is a finding (and an error) of its own
    try:
        config.load_kube_config(config_file=os.pathsep.join(map(str, paths)), client_configuration=client.Configuration())
    except Exception as exc:  # the loader raises ConfigException, YAML, key and type errors alike
        return invalid_kubeconfig(paths, describe_error(exc))
    return None


def check(ctx: Context) -> list[Finding]:
    paths = kubeconfig_paths()
    if not paths:
        if ctx.k8s:
            return [Finding(AREA, "kubeconfig", "fail", "--k8s given but no kubeconfig found",
                            "set KUBECONFIG or create ~/.kube/config (your cluster's admin or CLI gives one)")]
        return [Finding(AREA, "cluster", "skip", "no kubeconfig: not checked", "pass --k8s to check a cluster")]
    if error := kubeconfig_error(paths):
        return [Finding(AREA, "kubeconfig", "fail", *error)]
    try:
        from kubernetes import client, config
    except ImportError:
        return [Finding(AREA, "client", "warn", "the kubernetes client is not installed",
                        "installer/install.sh --extras k8s")]
    config_file = os.pathsep.join(str(p) for p in paths)
    _contexts, active = config.list_kube_config_contexts(config_file=config_file)
    configuration = client.Configuration()
    config.load_kube_config(config_file=config_file, client_configuration=configuration)
    configuration.retries = 0  # one try within the timeout: an unreachable API must not stall doctor
    findings = [Finding(AREA, "context", "ok", f"{active['name']} ({configuration.host})")]
    api = client.CoreV1Api(client.ApiClient(configuration))
    try:
        nodes = call_with_timeout(lambda: api.list_node(_request_timeout=ctx.timeout_s).items, ctx.timeout_s)
    except client.ApiException as exc:
        return findings + [Finding(AREA, "api", "warn", f"API answers but cannot list nodes: {exc.status} {exc.reason}",
                                   "ask for permission to list nodes to check GPU nodes")]
    except Exception as exc:
        return findings + [Finding(AREA, "api", "fail", f"API at {configuration.host} not reachable: {describe_error(exc)}",
                                   "check the cluster is up and the context is right: `kubectl cluster-info`")]
    findings.append(Finding(AREA, "api", "ok", f"reachable, {len(nodes)} node(s)"))
    gpu_nodes = [node for node in nodes if _gpu_count(node.status.allocatable or {})]
    if not gpu_nodes:
        return findings + [Finding(AREA, "gpu nodes", "warn", f"no node offers {GPU_RESOURCE}: CPU jobs only",
                                   INSTALL_GPU_OPERATOR)]
    return findings + [
        gpu_node_finding(node.metadata.name, _gpu_count(node.status.allocatable), node.metadata.labels or {})
        for node in gpu_nodes
    ]


def kubeconfig_problem(path: Path) -> str | None:
    """Why a kubeconfig file cannot be used, checked before the client's loader gives a cryptic error."""
    import yaml

    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        return f"cannot be read: {describe_error(exc)}"
    except UnicodeDecodeError:
        return "binary data, not YAML text"
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark else ""
        return f"not valid YAML{where}: {getattr(exc, 'problem', None) or describe_error(exc)}"
    if not isinstance(data, dict):
        return "not a YAML mapping with clusters, users and contexts"
    return None


def gpu_node_finding(name: str, gpus: int, labels: dict[str, str]) -> Finding:
    """What a GPU node's GPU Feature Discovery labels say about the image variants it can run."""
    driver = node_driver(labels)
    product = labels.get("nvidia.com/gpu.product", "GPU")
    if driver is None:
        return Finding(AREA, f"node {name}", "warn", f"{gpus} x {product}, no driver labels from GPU Feature Discovery",
                       INSTALL_GPU_OPERATOR)
    capability = node_capability(labels)
    best = compat.choose_variant(driver, [capability] if capability else [])
    message = f"{gpus} x {product}, driver {driver}, CC {capability or 'unknown'}"
    if best.is_cpu:
        verdicts = compat.check_variants(driver, [capability] if capability else [])
        reasons = "; ".join(f"{v.variant.name}: {v.reason}" for v in verdicts if not v.runs)
        return Finding(AREA, f"node {name}", "fail", f"{message}: no CUDA variant runs ({reasons})",
                       "upgrade the node's NVIDIA driver (see the reasons)")
    return Finding(AREA, f"node {name}", "ok", f"{message}: variant {best.name}")


def node_driver(labels: dict[str, str]) -> str | None:
    """The driver version from GFD labels: new style (cuda.driver-version.*) or old (cuda.driver.*)."""
    if "nvidia.com/cuda.driver-version.full" in labels:
        return labels["nvidia.com/cuda.driver-version.full"]
    for prefix, rev in (("nvidia.com/cuda.driver-version.", "revision"), ("nvidia.com/cuda.driver.", "rev")):
        parts = [labels.get(prefix + key) for key in ("major", "minor", rev)]
        if parts[0] and parts[1]:
            return ".".join(p for p in parts if p)
    return None


def node_capability(labels: dict[str, str]) -> str | None:
    major, minor = labels.get("nvidia.com/gpu.compute.major"), labels.get("nvidia.com/gpu.compute.minor")
    return f"{major}.{minor}" if major and minor else None


def _gpu_count(allocatable: dict[str, Any]) -> int:
    try:
        return int(allocatable.get(GPU_RESOURCE, 0))
    except ValueError:
        return 0
