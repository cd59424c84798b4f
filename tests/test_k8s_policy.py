"""Kubernetes policy: every manifest the project produces passes checkov's Kubernetes checks (the policies cluster
admins run), except the checks that k8s/policy-exceptions.yaml names, each with its reason; and every exception
listed there is still needed, so the list cannot go stale.

checkov is installed by `make setup` in a venv of its own, .venv/tools/checkov (its pins do not fit the test venv).
checkov scans built-in workloads (a Job, and the Pod it derives from the Job's template) but not custom resources:
a KubeRay RayJob yields no result at all. So the head, worker and submitter pod templates of every RayJob are scanned here as
plain v1 Pods (name RAYJOB-GROUP, the template's labels, the RayJob's namespace) beside the manifests themselves.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require
from typer.testing import CliRunner

from test_k8s import kubectl_kustomize
from test_verl_runtime import EXAMPLE
from verl_deploy.cli import app
from verl_deploy.launchers import kustomize

pytestmark = pytest.mark.k8s
EXCEPTIONS = REPO / "k8s" / "policy-exceptions.yaml"
IMAGE = "registry.example.com/verl-deploy:1"
CONFIG = "model:\n  path: builtin:tiny\ndata:\n  batch_size: 16  # an equal share for 1, 8 and 16 workers\n"
# `verl-deploy run ... --target k8s --dry-run` for each kind of run; a config file is given to our runtime only.
RUNS = {
    "job-1-gpu": ["--gpus", "1"],
    "job-8-gpus": ["--gpus", "8"],
    "rayjob-2-nodes": ["--gpus", "8", "--nodes", "2"],
    "job-cpu": [],
    "verl-job-8-gpus": ["--runtime", "verl", "--gpus", "8", "--data", "gsm8k", "--", *EXAMPLE],
    "verl-rayjob-2-nodes": ["--runtime", "verl", "--gpus", "8", "--nodes", "2", "--data", "gsm8k", "--", *EXAMPLE],
}


def checkov_path() -> str:
    """`make setup`'s checkov beside this venv (.venv/tools/checkov), else one on PATH."""
    made = Path(sys.prefix) / "tools" / "checkov" / "bin" / "checkov"
    found = str(made) if made.exists() else shutil.which("checkov")
    require(found is not None, f"checkov is not installed: `make setup` puts it in {made.parent.parent}")
    return found


def dry_run(name: str, flags: list[str], tmp: Path) -> list[dict]:
    config = tmp / "c.yaml"
    config.write_text(CONFIG)
    given = [] if "--runtime" in flags else [str(config)]
    result = CliRunner().invoke(app, ["run", *given, "--target", "k8s", "--dry-run", "--image", IMAGE, "--run-id", name,
                                      "--runs-dir", str(tmp), *flags],
                                env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})  # as test_verl_runtime's: no engine
    assert result.exit_code == 0, result.output
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def ray_pods(rayjob: dict) -> list[dict]:
    """The RayJob's head, worker and submitter pod templates as the v1 Pods KubeRay makes of them (checkov cannot see
    inside)."""
    cluster = rayjob["spec"]["rayClusterSpec"]
    groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster["workerGroupSpecs"]]
    groups.append(("submitter", {"template": rayjob["spec"]["submitterPodTemplate"]}))
    return [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {**group["template"].get("metadata", {}), "name": f"{rayjob['metadata']['name']}-{name}",
                          "namespace": rayjob["metadata"].get("namespace", "default")},
             "spec": group["template"]["spec"]}
            for name, group in groups]


def write(path: Path, objects: list[dict]) -> None:
    pods = [pod for obj in objects if obj["kind"] == "RayJob" for pod in ray_pods(obj)]
    path.write_text(yaml.safe_dump_all(objects + pods, sort_keys=False))


@pytest.fixture(scope="module")
def failures(tmp_path_factory) -> dict[str, dict]:
    """check id -> {"name": checkov's name, "objects": ["FILE: KIND.NAMESPACE.NAME", ...]} for every failed check."""
    checkov = checkov_path()
    tmp = tmp_path_factory.mktemp("policy")
    out = tmp / "manifests"
    out.mkdir()
    for name, flags in RUNS.items():
        write(out / f"{name}.yaml", dry_run(name, flags, tmp))
    for overlay in kustomize.OVERLAYS:
        write(out / f"overlay-{overlay}.yaml", kubectl_kustomize(overlay))
    # --skip-download: no call to Prisma Cloud for guidelines (nothing is reachable from CI; the checks are local).
    scan = subprocess.run([checkov, "-d", str(out), "--framework", "kubernetes", "-o", "json", "--quiet",
                           "--skip-download"], capture_output=True, text=True, timeout=300)
    assert scan.returncode in (0, 1), scan.stderr  # 1: some check failed
    reports = json.loads(scan.stdout)
    found: dict[str, dict] = {}
    for report in reports if isinstance(reports, list) else [reports]:
        assert report["summary"]["parsing_errors"] == 0, report["summary"]  # a file checkov skips passes every check
        for check in report.get("results", {}).get("failed_checks", []):
            entry = found.setdefault(check["check_id"], {"name": check["check_name"], "objects": []})
            entry["objects"].append(f"{check['file_path'].lstrip('/')}: {check['resource']}")
    for entry in found.values():
        entry["objects"].sort()
    return found


def exceptions() -> list[dict]:
    return yaml.safe_load(EXCEPTIONS.read_text())


def test_every_exception_names_a_check_and_gives_its_reason():
    listed = exceptions()
    assert all(set(e) == {"id", "name", "reason"} and e["reason"].strip() for e in listed), listed
    ids = [e["id"] for e in listed]
    assert len(ids) == len(set(ids)), ids


def test_no_check_fails_but_the_listed_exceptions(failures):
    allowed = {e["id"] for e in exceptions()}
    unexpected = {check: entry for check, entry in failures.items() if check not in allowed}
    assert not unexpected, (
        "checkov checks fail on the manifests: fix them, or list them in k8s/policy-exceptions.yaml with a reason\n"
        + yaml.safe_dump(unexpected, sort_keys=True, width=200)
    )


def test_every_exception_is_still_needed_and_names_its_check(failures):
    listed = exceptions()
    stale = [e["id"] for e in listed if e["id"] not in failures]
    assert not stale, f"no manifest fails {stale} any more: remove them from k8s/policy-exceptions.yaml"
    assert {e["id"]: e["name"] for e in listed} == {e["id"]: failures[e["id"]]["name"] for e in listed}
