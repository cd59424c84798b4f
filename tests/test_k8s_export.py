"""`verl-deploy export RUN` of a Kubernetes run: a Job in the run's namespace that mounts the run's claim and exports
there, through the CLI and the real kubernetes client against the recorded API server (tests/k8s_api.py); its Job
validated against the official schemas and scanned with checkov's policies (tests/test_k8s_policy.py's exceptions).
"""

import json
import subprocess

import pytest
import yaml
from typer.testing import CliRunner

from test_k8s import validate
from test_k8s_policy import checkov_path, exceptions
from verl_deploy import runs
from verl_deploy.cli import app
from verl_deploy.launchers import k8s_export

pytestmark = pytest.mark.k8s
NAME = "r1-export-20260720100500"
JOB = f"/apis/batch/v1/namespaces/team-a/jobs/{NAME}"
CORE = "/api/v1/namespaces/team-a"
POLICY = f"/apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies/{NAME}-ingress"
IMAGE = "registry.local/verl:1"


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def k8s_run(tmp_path, monkeypatch):
    """Run r1 as `run --target k8s` recorded it here: launch.json only, its checkpoints on its claim."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(k8s_export, "_stamp", lambda: "20260720100500")
    root = tmp_path / "runs"
    runs.write_record(root / "r1", {"run_id": "r1", "target": "k8s", "namespace": "team-a", "image": IMAGE,
                                    "runtime": "verl-deploy", "gpus": "1", "cache_claim": "r1-hf-cache"})
    return root


@pytest.fixture
def team_a(cluster):
    """The recorded API server of conftest's `cluster`, where namespace team-a exists."""
    return lambda answers: cluster({("GET", "/api/v1/namespaces/team-a"): "namespace-team-a.json", **answers})


def dry_run(root, *flags) -> list[dict]:
    result = cli("export", "r1", "--runs-dir", root, "--dry-run", *flags)
    assert result.exit_code == 0, result.output
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert [d["kind"] for d in docs] == ["NetworkPolicy", "Job"]
    assert result.stdout.startswith("# verl-deploy export r1: kubectl apply -f -")
    return docs


def test_the_dry_run_prints_a_job_that_mounts_the_run_claim_and_is_not_the_trainer(k8s_run):
    policy, job = dry_run(k8s_run, "--step", "40", "--dtype", "bfloat16")
    validate(policy)
    validate(job)
    assert policy["spec"] == {"podSelector": {"matchLabels": {"verl-deploy.export-of": "r1"}},
                              "policyTypes": ["Ingress"], "ingress": []}  # no ingress to the export's pod
    assert job["metadata"] == {"name": NAME, "namespace": "team-a", "labels": {"verl-deploy.export-of": "r1"}}
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["template"]["metadata"]["labels"] == {"verl-deploy.export-of": "r1"}  # no run-id label
    (main,) = pod["containers"]
    assert main["image"] == IMAGE and main["args"] == ["export", "/workspace/runs/r1", "--step", "40", "--dtype",
                                                        "bfloat16"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"runs": "r1-runs", "cache": "r1-hf-cache"}
    assert {m["name"] for m in main["volumeMounts"]} == {"runs", "cache", "tmp", "dshm"}  # no config, no secrets
    assert pod["securityContext"]["runAsNonRoot"] and main["securityContext"]["readOnlyRootFilesystem"]
    assert pod["automountServiceAccountToken"] is False and "initContainers" not in pod
    assert "nvidia.com/gpu" not in main["resources"]["requests"]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in main["env"]


def test_the_job_passes_the_policy_scan_but_the_listed_exceptions(k8s_run, tmp_path):
    checkov = checkov_path()
    out = tmp_path / "scan"
    out.mkdir()
    (out / "export.yaml").write_text(yaml.safe_dump_all(dry_run(k8s_run), sort_keys=False))
    scan = subprocess.run([checkov, "-d", str(out), "--framework", "kubernetes", "-o", "json", "--quiet",
                           "--skip-download"], capture_output=True, text=True, timeout=300)
    assert scan.returncode in (0, 1), scan.stderr
    report = json.loads(scan.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report["summary"]["parsing_errors"] == 0 and report["summary"]["passed"] > 0
    failed = {check["check_id"] for check in report.get("results", {}).get("failed_checks", [])}
    assert failed <= {e["id"] for e in exceptions()}, failed


def test_export_creates_the_job_waits_for_it_and_says_how_to_copy_the_model(k8s_run, team_a, monkeypatch):
    api = team_a({("GET", JOB): "job-r1-export-running.json"})
    polls = []

    def pause():  # the cluster finishes the export while the CLI waits
        polls.append(1)
        api.answers[("GET", JOB)] = "job-r1-export-complete.json"

    monkeypatch.setattr(k8s_export, "_pause", pause)
    result = cli("export", "r1", "--runs-dir", k8s_run, "--step", "40")

    assert result.exit_code == 0, result.output
    applied = [r for r in api.requests if r.method == "PATCH"]
    assert [r.path for r in applied] == [POLICY, JOB, POLICY]
    assert [r.content_type for r in applied] == ["application/apply-patch+yaml"] * 2 + ["application/merge-patch+json"]
    assert applied[1].body["metadata"]["labels"] == {"verl-deploy.export-of": "r1"}
    assert api.objects[POLICY]["metadata"]["ownerReferences"][0]["name"] == NAME  # goes with the Job's TTL
    assert polls == [1] and api.calls("GET").count(("GET", JOB)) == 2
    lines = result.output.splitlines()
    assert "exported run r1: /workspace/runs/r1/hf/step_40 on claim r1-runs" in lines
    copy = [line.strip() for line in lines if line.startswith("  kubectl")]
    assert copy[0].startswith("kubectl -n team-a run r1-copy --image registry.local/verl:1 --restart=Never --overrides")
    assert '"claimName":"r1-runs","readOnly":true' in copy[0] and '"runAsNonRoot":true' in copy[0]
    assert copy[2] == "kubectl -n team-a cp r1-copy:/workspace/runs/r1/hf/step_40 r1-step_40"
    assert copy[3] == "kubectl -n team-a delete pod r1-copy"


def test_detach_creates_the_job_and_returns(k8s_run, team_a):
    api = team_a({})
    result = cli("export", "r1", "--runs-dir", k8s_run, "--detach")
    assert result.exit_code == 0, result.output
    assert ("PATCH", JOB) in api.calls("PATCH") and ("GET", JOB) not in api.calls("GET")
    assert f"kubectl -n team-a wait --for=condition=complete job/{NAME}" in result.output
    assert "cp r1-copy:/workspace/runs/r1/hf r1-hf" in result.output  # no --step: the exports' directory


def test_a_failed_export_is_one_line_with_its_own_error(k8s_run, team_a):
    team_a({("GET", JOB): "job-r1-export-failed.json", ("GET", f"{CORE}/pods"): "pods-r1-export-failed.json",
             ("GET", f"{CORE}/pods/{NAME}-x7k2p/log"): "log-r1-export-failed.log"})
    result = cli("export", "r1", "--runs-dir", k8s_run, "--step", "7")
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: the export of run r1 failed on the cluster (/workspace/runs/r1 has no checkpoint of step 7: the steps "
        f"there are 20, 40): `kubectl -n team-a logs job/{NAME}` shows its log"]
    assert "Traceback" not in result.output


def test_what_cannot_work_on_a_cluster_is_one_line(k8s_run, tmp_path):
    for flags, said in ((["--out", tmp_path / "m"], "drop --out"), (["--push-to-hub", "me/m"], "hf upload")):
        result = cli("export", "r1", "--runs-dir", k8s_run, *flags)
        assert result.exit_code == 2 and said in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "m").exists()
