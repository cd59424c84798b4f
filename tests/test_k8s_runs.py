"""`status`, `stop` and `runs rm` of a Kubernetes run, through the CLI and the real kubernetes client, against a local
server that answers as the API server does from recorded answers (tests/k8s_api.py, tests/fixtures/k8s-api/); and
`runs rm` of a local run. The messages in the answers are Kubernetes' own (the fixtures' README says where each is
from), so these tests show what a user reads when a pod is Pending for each of those reasons.
"""

import subprocess

import pytest
from k8s_api import recorded
from typer.testing import CliRunner

from verl_deploy import cli as cli_module
from verl_deploy import runs
from verl_deploy.cli import app
from verl_deploy.launchers.k8s_pending import explain

pytestmark = pytest.mark.k8s
CORE = "/api/v1/namespaces/team-a"
JOBS = "/apis/batch/v1/namespaces/team-a/jobs"
POLICIES = "/apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies"
DEPLOYMENTS = "/apis/apps/v1/namespaces/team-a/deployments"


def cli(*args, **kwargs):
    return CliRunner().invoke(app, [str(a) for a in args], **kwargs)


def pending_run(pods: str, events: str, cache: str = "pvc-r1-hf-cache-pending.json") -> dict:
    """Run r1's Job (active, its pod not started), its pod, the namespace's events, its two claims."""
    return {("GET", JOBS): "jobs-r1-pending.json", ("GET", f"{CORE}/pods"): pods, ("GET", f"{CORE}/events"): events,
            ("GET", f"{CORE}/persistentvolumeclaims/r1-runs"): "pvc-r1-runs-bound.json",
            ("GET", f"{CORE}/persistentvolumeclaims/r1-hf-cache"): cache}


IMAGE = "registry.local/verl:1"
PENDING = {
    "insufficient GPUs": (
        "pods-r1-insufficient-gpu.json", "events-r1-insufficient-gpu.json",
        "pending: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu. (ask for fewer GPUs, or add GPU nodes)"),
    "node affinity": (
        "pods-r1-node-affinity.json", "events-r1-node-affinity.json",
        "pending: 0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. (no node carries "
        "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3|NVIDIA-H100-PCIe|NVIDIA-H100-NVL or "
        "cloud.google.com/gke-accelerator=nvidia-h100-80gb|nvidia-h100-mega-80gb or "
        "node.kubernetes.io/instance-type=p5.48xlarge|Standard_ND96isr_H100_v5, as --gpu-type / --node-selector ask: "
        "pass what the cluster's nodes carry (`kubectl get nodes --show-labels`))"),
    "ImagePullBackOff": (
        "pods-r1-image-pull-backoff.json", "events-r1-image-pull-backoff.json",
        f'pending: image {IMAGE} cannot be pulled (ImagePullBackOff: Failed to pull image "{IMAGE}": rpc error: '
        f'code = NotFound desc = failed to pull and unpack image "{IMAGE}": failed to resolve reference "{IMAGE}": '
        f"{IMAGE}: not found): push it with verl-deploy images push and pass --image"),
    "no storage class": (
        "pods-r1-unbound-claim.json", "events-r1-no-storage-class.json",
        "pending: claim r1-hf-cache is not bound (FailedBinding: no persistent volumes available for this claim and no "
        "storage class is set): the cluster has no default storage class: pass --storage-class, or create a "
        "PersistentVolume"),
    "provisioning failed": (
        "pods-r1-unbound-claim.json", "events-r1-provisioning-failed.json",
        'pending: claim r1-hf-cache is not bound (ProvisioningFailed: storageclass.storage.k8s.io "fast-rwx" not '
        "found): check --storage-class against `kubectl get storageclass`"),
    "Multi-Attach": (
        "pods-r1-multi-attach.json", "events-r1-multi-attach.json",
        'pending: claim r1-runs is attached to another node (Multi-Attach error for volume '
        '"pvc-3f9e2d1c-0b8a-4e7d-a6c5-b4a392817060" Volume is already used by pod(s) r1-8qz5w): a ReadWriteOnce '
        "claim is on one node at a time; it follows once the pod using it there has ended (`kubectl get pods -o "
        "wide` shows where)"),
}


@pytest.mark.parametrize("why", list(PENDING))
def test_status_of_a_pending_run_says_why_in_one_line(cluster, tmp_path, why):
    pods, events, line = PENDING[why]
    cache = "pvc-r1-hf-cache-fast-rwx.json" if why == "provisioning failed" else "pvc-r1-hf-cache-pending.json"
    api = cluster(pending_run(pods, events, cache))
    result = cli("status", "r1", "--target", "k8s", "--namespace", "team-a", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("r1  k8s  pending  ")  # the Job counts its pod as active
    assert result.stdout.splitlines()[-1] == f"  {line}"
    assert api.requests[1].query == {"labelSelector": "verl-deploy.run-id=r1"}  # the run's pods


def test_the_translation_reads_the_api_answers_as_they_come():
    """k8s_pending is pure: the same recorded answers, as plain dicts, give the same line."""
    claims = {"r1-runs": recorded("pvc-r1-runs-bound.json"), "r1-hf-cache": recorded("pvc-r1-hf-cache-pending.json")}
    pods, events, line = PENDING["Multi-Attach"]
    assert explain(recorded(pods)["items"], recorded(events)["items"], claims) == line
    assert explain([], recorded(events)["items"], claims) == ""  # no pod yet: nothing to say
    missing = {"r1-runs": None, "r1-hf-cache": recorded("pvc-r1-hf-cache-pending.json")}
    pods, events, _ = PENDING["no storage class"]
    assert explain(recorded(pods)["items"], [], missing).startswith("pending: claim r1-runs does not exist: ")


def test_a_registry_that_refuses_the_node_asks_for_pull_credentials():
    pod = recorded("pods-r1-image-pull-backoff.json")["items"][0]
    waiting = pod["status"]["initContainerStatuses"][0]["state"]["waiting"]
    waiting.update(reason="ErrImagePull",
                   message=f'failed to pull and unpack image "{IMAGE}": failed to authorize: failed to fetch anonymous '
                           "token: unexpected status: 401 Unauthorized")
    line = explain([pod], [], {})
    assert line.startswith(f"pending: image {IMAGE} cannot be pulled (ErrImagePull: failed to pull and unpack")
    assert line.endswith("give the nodes the registry's credentials: --image-pull-secret NAME "
                         "(`kubectl create secret docker-registry`)")


def test_stop_deletes_the_workload_and_keeps_the_claims(cluster, tmp_path):
    api = cluster({("GET", JOBS): "jobs-r1-pending.json", ("DELETE", f"{JOBS}/r1"): "job-r1-deleting.json"})
    result = cli("stop", "r1", "--target", "k8s", "--namespace", "team-a", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("stopping r1: Job r1 deleted; its pods get SIGTERM and write a checkpoint")
    assert api.calls() == [("GET", JOBS), ("DELETE", f"{JOBS}/r1")]
    assert api.requests[-1].body == {"propagationPolicy": "Foreground"}


def test_stop_deletes_a_ray_job_where_the_run_has_no_batch_job(cluster, tmp_path):
    rayjob = recorded("rayjob-r2-applied.json")
    rayjobs = "/apis/ray.io/v1/namespaces/team-a/rayjobs"
    api = cluster({("GET", JOBS): (200, {"kind": "JobList", "apiVersion": "batch/v1", "metadata": {}, "items": []}),
                   ("GET", rayjobs): (200, {"kind": "RayJobList", "apiVersion": "ray.io/v1", "metadata": {},
                                            "items": [rayjob]})})
    result = cli("stop", "r2", "--target", "k8s", "--namespace", "team-a", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("stopping r2: RayJob r2 deleted; ")
    assert api.calls() == [("GET", JOBS), ("GET", rayjobs), ("DELETE", f"{rayjobs}/r2")]
    assert api.requests[-1].body == {"propagationPolicy": "Foreground"}


def test_stopping_a_run_the_cluster_does_not_have_is_one_line(cluster, tmp_path):
    cluster({("GET", JOBS): (200, {"kind": "JobList", "apiVersion": "batch/v1", "metadata": {}, "items": []})})
    result = cli("stop", "gone", "--target", "k8s", "--namespace", "team-a", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 2
    assert result.output == ("error: no Kubernetes job for run 'gone' in namespace 'team-a': "
                             "`verl-deploy runs --target k8s` lists the runs\n")


REMOVABLE = {("GET", JOBS): "jobs-r1-pending.json", ("GET", f"{CORE}/configmaps"): "configmaps-team-a.json",
             ("GET", POLICIES): "networkpolicies-team-a.json", ("GET", DEPLOYMENTS): "deployments-team-a.json",
             ("GET", f"{CORE}/services"): "services-team-a.json",
             ("GET", f"{CORE}/persistentvolumeclaims"): "pvcs-team-a.json"}


def k8s_run_dir(root, run_id="r1"):
    runs.write_record(root / run_id, {"run_id": run_id, "target": "k8s", "namespace": "team-a"})
    return root / run_id


def test_runs_rm_removes_the_workload_its_config_and_its_claims_and_keeps_the_shared_ones(cluster, tmp_path):
    api = cluster(REMOVABLE)
    run_dir = k8s_run_dir(tmp_path / "runs")
    result = cli("runs", "rm", "r1", "--yes", "--runs-dir", tmp_path / "runs")  # target and namespace as recorded
    assert result.exit_code == 0, result.output
    assert api.calls("DELETE") == [
        ("DELETE", f"{JOBS}/r1"),
        ("DELETE", f"{CORE}/configmaps/r1-config"),
        ("DELETE", f"{POLICIES}/r1-ingress"),
        ("DELETE", f"{POLICIES}/r1-sandbox"),
        ("DELETE", f"{DEPLOYMENTS}/r1-sandbox"),
        ("DELETE", f"{CORE}/services/r1-sandbox"),
        ("DELETE", f"{CORE}/persistentvolumeclaims/r1-runs"),
        ("DELETE", f"{CORE}/persistentvolumeclaims/r1-hf-cache"),
    ]  # its sandbox's too (labelled as a service of r1); not team-hf-cache (--hf-cache), gsm8k (--data), nor r9's
    assert [r.body for r in api.requests if r.method == "DELETE"][0] == {"propagationPolicy": "Background"}
    assert not run_dir.exists()
    assert result.stdout == ("removed run r1: Job r1, ConfigMap r1-config, NetworkPolicy r1-ingress, "
                             "NetworkPolicy r1-sandbox, Deployment r1-sandbox, Service r1-sandbox, "
                             "PersistentVolumeClaim r1-runs, PersistentVolumeClaim r1-hf-cache, "
                             f"run directory {run_dir}\n")


def forbidden(resource: str, group: str) -> tuple[int, dict]:
    """RBAC's refusal to list a resource (the shape and message of status-403-jobs.json)."""
    api_group = f".{group}" if group else ""
    return 403, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden",
                 "message": f'{resource}{api_group} is forbidden: User "system:serviceaccount:team-a:default" cannot '
                            f'list resource "{resource}" in API group "{group}" in the namespace "team-a"',
                 "details": {"group": group, "kind": resource}, "code": 403}


def test_runs_rm_by_a_user_who_may_not_list_deployments_or_services_still_removes_the_run(cluster, tmp_path):
    """Such a user's runs have no services; any the run had are its Job's, which the garbage collector follows."""
    api = cluster({**REMOVABLE, ("GET", DEPLOYMENTS): forbidden("deployments", "apps"),
                   ("GET", f"{CORE}/services"): forbidden("services", "")})
    k8s_run_dir(tmp_path / "runs")
    result = cli("runs", "rm", "r1", "--yes", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    assert ("DELETE", f"{JOBS}/r1") in api.calls("DELETE") and len(api.calls("DELETE")) == 6  # the sandbox's policy


def test_runs_rm_without_a_terminal_to_ask_needs_yes(cluster, tmp_path):
    api = cluster(REMOVABLE)
    run_dir = k8s_run_dir(tmp_path / "runs")
    result = cli("runs", "rm", "r1", "--runs-dir", tmp_path / "runs")  # CliRunner's stdin is no terminal
    assert result.exit_code == 2
    assert result.output == ("error: `runs rm r1` asks before it removes anything, and there is no terminal to ask "
                             "on: pass --yes\n")
    assert api.requests == [] and run_dir.exists()


@pytest.mark.parametrize("answer", ["n", "y"])
def test_runs_rm_lists_what_goes_and_asks(cluster, tmp_path, monkeypatch, answer):
    api = cluster(REMOVABLE)
    run_dir = k8s_run_dir(tmp_path / "runs")
    monkeypatch.setattr(cli_module, "_interactive", lambda: True)  # as at a terminal
    result = cli("runs", "rm", "r1", "--runs-dir", tmp_path / "runs", input=f"{answer}\n")
    assert result.stdout.startswith("removing run r1 removes:\n  Job r1\n  ConfigMap r1-config\n"
                                    "  NetworkPolicy r1-ingress\n  NetworkPolicy r1-sandbox\n  Deployment r1-sandbox\n"
                                    "  Service r1-sandbox\n  PersistentVolumeClaim r1-runs\n"
                                    "  PersistentVolumeClaim r1-hf-cache\n"
                                    f"  run directory {run_dir}\nremove them? [y/N]: ")
    if answer == "n":
        assert result.exit_code == 1 and run_dir.exists() and api.calls("DELETE") == []
    else:
        assert result.exit_code == 0 and not run_dir.exists() and len(api.calls("DELETE")) == 8


def test_runs_still_lists_with_rm_beside_it(tmp_path):
    assert cli("runs", "--target", "local", "--runs-dir", tmp_path).stdout == "no runs\n"
    assert cli("runs", "--target", "local", "--runs-dir", tmp_path, "--json").stdout == "[]\n"


# --- local runs -------------------------------------------------------------------------------------------------


def local_run(root, run_id, process):
    """A run directory as the local launcher leaves it, supervised by `process` (its pid and start time)."""
    runs.write_record(root / run_id, {"run_id": run_id, "target": "local", "pid": process.pid,
                                      "pid_start": runs.process_start(process.pid), "exit_code": 0})
    (root / run_id / "metrics.jsonl").write_text('{"step": 1}\n')
    return root / run_id


def test_runs_rm_removes_a_finished_local_run(tmp_path):
    finished = subprocess.Popen(["true"])
    run_dir = local_run(tmp_path, "done", finished)
    finished.wait()  # its supervisor has exited: the run is over
    result = cli("runs", "rm", "done", "--yes", "--runs-dir", tmp_path)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"removed run done: run directory {run_dir}\n"
    assert not run_dir.exists()


def test_runs_rm_refuses_a_local_run_that_still_runs(tmp_path):
    supervisor = subprocess.Popen(["sleep", "60"])
    try:
        run_dir = local_run(tmp_path, "live", supervisor)
        result = cli("runs", "rm", "live", "--yes", "--runs-dir", tmp_path)
    finally:
        supervisor.kill()
        supervisor.wait()
    assert result.exit_code == 2
    assert result.output == "error: run live is still running: `verl-deploy stop live` first\n"
    assert (run_dir / "metrics.jsonl").exists()


def test_an_api_server_that_refuses_is_one_line(cluster, tmp_path):
    cluster({("GET", JOBS): (403, "status-403-jobs.json")})
    result = cli("status", "r1", "--target", "k8s", "--namespace", "team-a", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 2
    assert result.output == ('error: Kubernetes API answered 403 Forbidden: jobs.batch is forbidden: User '
                             '"system:serviceaccount:team-a:default" cannot list resource "jobs" in API group "batch" '
                             'in the namespace "team-a"\n')


def test_an_api_server_that_does_not_answer_is_one_line(cluster, tmp_path):
    api = cluster({})
    api.__exit__(None, None, None)  # nothing listens there any more
    result = cli("runs", "--target", "k8s", "--namespace", "team-a", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 2
    assert result.output.startswith("error: cannot reach the Kubernetes API server (MaxRetryError): ")


def test_status_of_a_run_on_a_node_whose_driver_is_too_old_says_so(cluster, tmp_path):
    """The driver floor is a preferred affinity only, so the pod may run on an old driver: status reads the node's
    GPU Feature Discovery labels (a GPU Operator node whose driver is 550) against the cu130 image's 580 floor."""
    import copy
    import json

    from conftest import FIXTURES

    image = "registry.local/team/verl-deploy:0.1.0-cu130"
    jobs = copy.deepcopy(recorded("jobs-r1-pending.json"))
    jobs["items"][0]["spec"]["template"]["spec"]["containers"][0]["image"] = image
    pods = copy.deepcopy(recorded("pods-r1-insufficient-gpu.json"))
    pod = pods["items"][0]
    pod["spec"]["nodeName"] = "dgx-07"
    pod["status"] = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    node = {"kind": "Node", "apiVersion": "v1",
            **json.loads((FIXTURES / "k8s-nodes" / "onprem-dgx-h100-gpu-operator.json").read_text())}
    cluster({("GET", JOBS): jobs, ("GET", f"{CORE}/pods"): pods, ("GET", "/api/v1/nodes/dgx-07"): node})
    result = cli("status", "r1", "--target", "k8s", "--namespace", "team-a", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("r1  k8s  running  ")
    assert result.stdout.splitlines()[-1] == (
        "  node dgx-07 has NVIDIA driver 550.90.07, older than the 580.65.06 this image's CUDA needs: upgrade its "
        "driver, or steer the run elsewhere (--gpu-type, --node-selector) or use an older variant (--variant cu128)")
