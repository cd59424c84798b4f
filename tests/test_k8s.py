"""Kubernetes: the launcher's manifests and the k8s/ kustomize tree are one source, valid against the official
schemas (and KubeRay's RayJob CRD); the apply/status/log code works with the kubernetes client's own models.

No Kubernetes API server runs here: apply, the namespace check and listing are exercised against a local HTTP
endpoint (tests/k8s_api.py) that answers the real kubernetes client from recorded API answers and records what it
sends; nothing is checked against a live cluster.
"""

import json
import shutil
import subprocess
from datetime import datetime, timedelta, timezone

import jsonschema
import pytest
import yaml
from conftest import FIXTURES, REPO, require
from k8s_api import ApiServer, recorded
from typer.testing import CliRunner

from verl_deploy.sizes import parse_gpus
from verl_deploy.cli import app
from verl_deploy.launchers import kustomize
from verl_deploy.launchers.jobspec import LaunchError, build_spec
from verl_deploy.launchers.k8s import Cluster, K8sLauncher, job_state, manifests, newest_pod, ray_job_state
from verl_runtime.secrets import SECRET_ENV, SECRETS_DIR

pytestmark = pytest.mark.k8s
K8S_VERSION = "1.30"
SECRET = "wandb_secret_value_42"


def validate(obj: dict) -> None:
    """Official schemas (strict: unknown fields fail) for built-in kinds; KubeRay's CRD schema for RayJob."""
    import kubernetes_validate

    if obj["kind"] != "RayJob":
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        return
    schema = yaml.safe_load((FIXTURES / "kuberay" / "rayjob-v1-schema.yaml").read_text())
    jsonschema.validate(obj, schema)
    cluster = obj["spec"]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": group["template"]}
        kubernetes_validate.validate(pod_template, K8S_VERSION, strict=True)


def kubectl_kustomize(overlay: str) -> list[dict]:
    require(shutil.which("kubectl") is not None, "kubectl not installed (.ci/services.sh installs it)")
    out = subprocess.run(["kubectl", "kustomize", str(REPO / "k8s" / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: list[dict]) -> dict:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_k8s_tree_is_rendered_from_the_launcher():
    expected = kustomize.files(REPO / "k8s" / "base" / "config.yaml")
    for relative, text in expected.items():
        assert (REPO / "k8s" / relative).read_text() == text, (
            f"k8s/{relative} is stale: run `python -m verl_deploy.launchers.kustomize k8s`"
        )


@pytest.mark.parametrize("overlay", list(kustomize.OVERLAYS))
def test_overlay_renders_the_launchers_objects_and_validates(overlay):
    rendered = kubectl_kustomize(overlay)
    launcher = manifests(kustomize.overlay_spec(overlay, REPO / "k8s" / "base" / "config.yaml"))
    assert by_kind(rendered) == by_kind(launcher)
    for obj in rendered:
        validate(obj)


@pytest.mark.parametrize("flags", [["--gpus", "1"], ["--gpus", "8", "--memory", "256g"], ["--gpus", "8", "--nodes", "3"], []])
def test_dry_run_yaml_validates_and_keeps_secrets_out(flags, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  path: builtin:tiny\ndata:\n  batch_size: 24  # an equal share for 1, 8 and 24 workers\n")
    result = CliRunner().invoke(
        app, ["run", str(config), "--target", "k8s", "--dry-run", "--image", "registry.local/verl:1", *flags,
              "--runs-dir", str(tmp_path)],
        env={"WANDB_API_KEY": SECRET},
    )
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output and "kubectl create secret generic verl-deploy-secrets" in result.output
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    policies = ["NetworkPolicy"] * (2 if "--nodes" in flags else 1)  # a RayJob's submitter has its own
    assert [o["kind"] for o in objects][:2 + len(policies)] == ["ConfigMap", *policies, "PersistentVolumeClaim"]
    for obj in objects:
        validate(obj)
    workload = objects[-1]
    assert workload["kind"] == ("RayJob" if "--nodes" in flags else "Job")
    pods = (
        [workload["spec"]["template"]]
        if workload["kind"] == "Job"
        else [workload["spec"]["rayClusterSpec"]["headGroupSpec"]["template"],
              workload["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]]
    )
    for pod in pods:
        spec = pod["spec"]
        assert_hardened_pod(spec)
        main = spec["containers"][0]
        gpus = int(flags[flags.index("--gpus") + 1]) if "--gpus" in flags else 0
        shm = {0: "1Gi", 1: "2Gi", 8: "16Gi"}[gpus]  # sized from the GPUs (test_k8s_scheduling has the rest)
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}} in spec["volumes"]
        if gpus:
            assert main["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)
            assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
            affinity = spec["affinity"]["nodeAffinity"]  # nothing required that only GPU Feature Discovery labels
            assert list(affinity) == ["preferredDuringSchedulingIgnoredDuringExecution"]
        else:
            assert "nvidia.com/gpu" not in main["resources"]["limits"] and "tolerations" not in spec
    if workload["kind"] == "Job":
        assert workload["spec"]["backoffLimit"] >= 1 and workload["spec"]["ttlSecondsAfterFinished"] > 0
    else:
        assert workload["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 2


def assert_hardened_pod(spec: dict) -> None:
    """Every container (init containers too) non-root on a read-only root with no capabilities, writing only to its
    volumes (/tmp an emptyDir of a limited size, which every container's ephemeral storage covers); credentials as the
    files of the optional Secret volume, readable by the pod's user (uid 1000, group 1000 = fsGroup: the kubelet makes
    the files root:1000, and 0440 lets the group read them), never in the environment; no service account token."""
    from kubernetes.utils import parse_quantity

    context = spec["securityContext"]
    assert context["runAsNonRoot"] is True and context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["runAsUser"] == 1000 and context["runAsGroup"] == context["fsGroup"] == 1000
    assert context["fsGroupChangePolicy"] == "OnRootMismatch"  # no walk of the whole model cache at every mount
    assert spec["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert list(volumes["tmp"]["emptyDir"]) == ["sizeLimit"]
    tmp = parse_quantity(volumes["tmp"]["emptyDir"]["sizeLimit"])
    assert volumes["secrets"]["secret"] == {
        "secretName": "verl-deploy-secrets", "optional": True, "defaultMode": 0o440,
        "items": [{"key": name, "path": name} for name in SECRET_ENV],
    }
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    for container in spec["containers"] + spec.get("initContainers", []):
        security = container["securityContext"]
        assert security == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "seccompProfile": {"type": "RuntimeDefault"}}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts[SECRETS_DIR] == {"name": "secrets", "mountPath": SECRETS_DIR, "readOnly": True}
        assert mounts["/tmp"]["name"] == "tmp"
        disk = container["resources"]
        assert disk["requests"]["ephemeral-storage"] == disk["limits"]["ephemeral-storage"]
        assert parse_quantity(disk["limits"]["ephemeral-storage"]) > tmp  # /tmp and the container's logs
        assert all("valueFrom" not in e and e["name"] not in SECRET_ENV for e in container["env"])


@pytest.mark.parametrize("overlay", list(kustomize.OVERLAYS))
def test_overlay_pods_are_hardened_and_name_the_secret_without_values(overlay):
    workload = [o for o in kubectl_kustomize(overlay) if o["kind"] in ("Job", "RayJob")][0]
    if workload["kind"] == "Job":
        pods = [workload["spec"]["template"]["spec"]]
    else:
        cluster = workload["spec"]["rayClusterSpec"]
        pods = [cluster["headGroupSpec"]["template"]["spec"], cluster["workerGroupSpecs"][0]["template"]["spec"]]
    for pod in pods:
        assert_hardened_pod(pod)
    assert "kind: Secret" not in "".join(p.read_text() for p in (REPO / "k8s").rglob("*.yaml"))


def test_the_suggested_create_secret_command_keeps_the_value_off_the_command_line(tmp_path):
    """The dry run's `kubectl create secret` line, run by bash with the token in the environment only, makes the
    Secret holding the value (kubectl's client-side dry run: no cluster) while the line itself names variables."""
    require(shutil.which("kubectl") is not None, "kubectl not installed (.ci/services.sh installs it)")
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  path: builtin:tiny\n")
    env = {"HF_TOKEN": SECRET, "WANDB_API_KEY": SECRET + "-w"}
    result = CliRunner().invoke(app, ["run", str(config), "--target", "k8s", "--dry-run", "--image", "reg.io/img:1",
                                      "--namespace", "team-a"], env=env)
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.stdout.splitlines() if "kubectl create secret" in line]
    command = line[line.index("kubectl create secret"):]
    assert SECRET not in command and "--from-literal" not in command
    import base64
    import os

    out = subprocess.run(["bash", "-c", command + " --dry-run=client -o json"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    made = json.loads(out.stdout)
    assert made["metadata"] == {"name": "verl-deploy-secrets", "namespace": "team-a", "creationTimestamp": None}
    assert {k: base64.b64decode(v).decode() for k, v in made["data"].items()} == env  # no newline added


# --- the cluster-facing code, with the kubernetes client's own models ----------------------------------------


def test_job_state_from_conditions():
    from kubernetes.client import V1Job, V1JobCondition, V1JobStatus

    def state(**status):
        return job_state(V1Job(status=V1JobStatus(**status)))

    assert state(conditions=[V1JobCondition(type="Complete", status="True")]) == ("succeeded", "")
    assert state(conditions=[V1JobCondition(type="Failed", status="True", reason="BackoffLimitExceeded")]) == (
        "failed", "BackoffLimitExceeded")
    assert state(active=1) == ("running", "")
    assert state() == ("pending", "")
    assert ray_job_state({"status": {"jobStatus": "SUCCEEDED"}}) == ("succeeded", "")
    assert ray_job_state({"status": {"jobDeploymentStatus": "Initializing"}}) == ("pending", "Initializing")


def test_newest_pod_of_a_retried_job():
    from kubernetes.client import V1ObjectMeta, V1Pod, V1PodList

    now = datetime.now(timezone.utc)
    pods = V1PodList(items=[V1Pod(metadata=V1ObjectMeta(name=f"p{i}", creation_timestamp=now + timedelta(seconds=i)))
                            for i in (2, 0, 1)])
    assert newest_pod(pods).metadata.name == "p2"


NAMESPACE = {("GET", "/api/v1/namespaces/team-a"): "namespace-team-a.json"}
IMAGE = "registry.local/verl:1"  # the nodes pull from a registry


def test_launch_server_side_applies_secret_config_volume_and_job(tmp_path, monkeypatch):
    """Each object by server-side apply, then the ConfigMap is given the Job the server made as its owner (the uid
    from the server's answer), so that it goes when the Job's TTL deletes the Job; the run claim has no owner."""
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  path: builtin:tiny\n")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    spec = build_spec(config, image=IMAGE, runs_root=tmp_path, run_id="r1", gpus=parse_gpus("1"), namespace="team-a")
    answers = {**NAMESPACE, ("PATCH", "/apis/batch/v1/namespaces/team-a/jobs/r1"): "job-r1-applied.json"}
    with ApiServer(answers) as api:
        assert K8sLauncher(tmp_path, "team-a", cluster=Cluster(api.client())).launch(spec, detach=True) == 0
    assert api.calls() == [
        ("GET", "/api/v1/namespaces/team-a"),
        ("GET", "/api/v1/namespaces/team-a/persistentvolumeclaims/verl-deploy-hf-cache"),  # none yet
        ("GET", "/apis/storage.k8s.io/v1/storageclasses"),  # the default class: ReadWriteMany unless it has none
        ("PATCH", "/api/v1/namespaces/team-a/secrets/verl-deploy-secrets"),
        ("PATCH", "/api/v1/namespaces/team-a/configmaps/r1-config"),
        ("PATCH", "/apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies/r1-ingress"),
        ("PATCH", "/api/v1/namespaces/team-a/persistentvolumeclaims/r1-runs"),
        ("PATCH", "/api/v1/namespaces/team-a/persistentvolumeclaims/verl-deploy-hf-cache"),
        ("PATCH", "/apis/batch/v1/namespaces/team-a/jobs/r1"),
        ("PATCH", "/api/v1/namespaces/team-a/configmaps/r1-config"),
        ("PATCH", "/apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies/r1-ingress"),
    ]
    applies, owners = api.requests[3:-2], api.requests[-2:]
    for request in applies:
        assert request.content_type == "application/apply-patch+yaml"
        assert request.query == {"fieldManager": "verl-deploy", "force": "true"}
    job_uid = recorded("job-r1-applied.json")["metadata"]["uid"]
    for owner in owners:
        assert owner.content_type == "application/merge-patch+json" and owner.query == {"fieldManager": "verl-deploy"}
        assert owner.body == {"metadata": {"ownerReferences": [{
            "apiVersion": "batch/v1", "kind": "Job", "name": "r1", "uid": job_uid,
            "controller": False, "blockOwnerDeletion": False}]}}
    assert "ownerReferences" not in json.dumps([r.body for r in applies])  # the claims outlive the Job
    assert applies[0].body["stringData"] == {"HF_TOKEN": SECRET}
    assert all(SECRET not in json.dumps(r.body) for r in api.requests[4:])
    assert "secretKeyRef" not in json.dumps(applies[-1].body)  # the Job reads it as a file
    assert SECRET not in (tmp_path / "r1" / "launch.json").read_text()


def test_a_ray_job_owns_its_config_map_and_network_policy(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  path: builtin:tiny\ndata:\n  batch_size: 16\n")
    spec = build_spec(config, image=IMAGE, runs_root=tmp_path, run_id="r2", gpus=parse_gpus("8"), nodes=2, namespace="team-a",
                      environ={})
    answers = {**NAMESPACE, ("PATCH", "/apis/ray.io/v1/namespaces/team-a/rayjobs/r2"): "rayjob-r2-applied.json"}
    with ApiServer(answers) as api:
        K8sLauncher(tmp_path, "team-a", cluster=Cluster(api.client())).launch(spec, detach=True)
    owners = api.requests[-3:]
    assert [(r.method, r.path) for r in owners] == [
        ("PATCH", "/api/v1/namespaces/team-a/configmaps/r2-config"),
        ("PATCH", "/apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies/r2-ingress"),
        ("PATCH", "/apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies/r2-submitter-ingress"),
    ]
    for owner in owners:
        assert owner.body["metadata"]["ownerReferences"] == [{
            "apiVersion": "ray.io/v1", "kind": "RayJob", "name": "r2",
            "uid": recorded("rayjob-r2-applied.json")["metadata"]["uid"],
            "controller": False, "blockOwnerDeletion": False}]


def test_missing_namespace_is_one_line_and_applies_nothing(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  path: builtin:tiny\n")
    spec = build_spec(config, image=IMAGE, runs_root=tmp_path, run_id="r1", namespace="missing", environ={})
    with ApiServer() as api, pytest.raises(
        LaunchError, match="namespace 'missing' does not exist: `kubectl create namespace missing`"
    ):
        K8sLauncher(tmp_path, "missing", cluster=Cluster(api.client())).launch(spec, detach=True)
    assert api.calls() == [("GET", "/api/v1/namespaces/missing")]


CACHE = "/api/v1/namespaces/team-a/persistentvolumeclaims/verl-deploy-hf-cache"
CLASSES = "/apis/storage.k8s.io/v1/storageclasses"


def _launch(tmp_path, answers: dict, run_id: str = "r1", **options):
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  path: builtin:tiny\ndata:\n  batch_size: 16\n")
    spec = build_spec(config, image=IMAGE + "@sha256:" + "b" * 64, runs_root=tmp_path, run_id=run_id,
                      namespace="team-a", environ={}, **options)
    with ApiServer({**NAMESPACE, **answers}) as api:
        K8sLauncher(tmp_path, "team-a", cluster=Cluster(api.client())).launch(spec, detach=True)
    return api


def _applied_cache(api) -> dict | None:
    return next((r.body for r in api.requests if r.method == "PATCH" and r.path == CACHE), None)


def test_the_first_run_creates_the_shared_cache_and_the_next_one_uses_it_as_it_is(tmp_path, capsys):
    """A claim's access modes and class cannot change and an admin may have grown it: a run that finds the namespace's
    cache claim leaves it alone (no apply) and mounts it."""
    first = _launch(tmp_path, {}, "r1", gpus=parse_gpus("1"))
    created = _applied_cache(first)
    assert created["spec"]["accessModes"] == ["ReadWriteMany"]  # no storage class said otherwise
    assert created["metadata"]["labels"] == {"verl-deploy.managed": "true"}  # no run's: `runs rm` keeps it
    grown = {("GET", CACHE): "pvc-verl-deploy-hf-cache-rwo.json"}
    second = _launch(tmp_path, grown, "r2", gpus=parse_gpus("1"))
    assert _applied_cache(second) is None
    assert ("GET", CLASSES) not in second.calls()
    job = second.objects["/apis/batch/v1/namespaces/team-a/jobs/r2"]
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "verl-deploy-hf-cache"}} in (
        job["spec"]["template"]["spec"]["volumes"])
    assert "note:" not in capsys.readouterr().err


def test_on_block_storage_the_shared_cache_is_read_write_once_and_the_run_says_so(tmp_path, capsys):
    """GKE's default class (Persistent Disk) has no ReadWriteMany: a ReadWriteMany claim there would never bind. The
    run makes it ReadWriteOnce and says, once, what that costs and how to share across nodes."""
    api = _launch(tmp_path, {("GET", CLASSES): "storageclasses-gke.json"}, gpus=parse_gpus("1"))
    assert _applied_cache(api)["spec"]["accessModes"] == ["ReadWriteOnce"]
    [note] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert note.startswith("note: storage class standard-rwo (pd.csi.storage.gke.io) has no ReadWriteMany: the "
                           "shared model cache verl-deploy-hf-cache is made ReadWriteOnce, so runs on different nodes "
                           "take turns with it")
    assert "--hf-cache NAME" in note
    filestore = recorded("storageclasses-gke.json")["items"][-1]
    named = _launch(tmp_path, {("GET", f"{CLASSES}/standard-rwx"): (200, filestore)}, "r3", gpus=parse_gpus("1"),
                    storage_class="standard-rwx")
    assert _applied_cache(named)["spec"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "standard-rwx",
                                             "resources": {"requests": {"storage": "200Gi"}}}


def test_a_run_on_several_nodes_refuses_a_shared_cache_they_cannot_mount_at_once(tmp_path):
    with pytest.raises(LaunchError) as refused:
        _launch(tmp_path, {("GET", CACHE): "pvc-verl-deploy-hf-cache-rwo.json"}, "r2", gpus=parse_gpus("8"), nodes=2)
    assert str(refused.value) == (
        "claim verl-deploy-hf-cache (the namespace's model cache) is ReadWriteOnce: the 2 nodes of this run cannot "
        "mount it at once; pass --hf-cache NAME, a ReadWriteMany claim (NFS, CephFS, EFS, Filestore, Azure Files)")


def listing(kuberay: bool) -> dict:
    """`runs --target k8s`: one batch Job and one RayJob (KubeRay's CRD not installed: its path is a 404)."""
    labels = lambda run: {"verl-deploy.managed": "true", "verl-deploy.run-id": run}  # noqa: E731
    job = {"metadata": {"name": "one", "labels": labels("one")},
           "spec": {"template": {"spec": {"containers": [{"name": "trainer", "image": "img:job"}]}}},
           "status": {"active": 1}}
    head = {"template": {"spec": {"containers": [{"name": "ray-head", "image": "img:ray"}]}}}
    rayjob = {"metadata": {"name": "many", "labels": labels("many")},
              "spec": {"rayClusterSpec": {"headGroupSpec": head}},
              "status": {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}}
    answers = {("GET", "/apis/batch/v1/namespaces/team-a/jobs"):
               (200, {"kind": "JobList", "apiVersion": "batch/v1", "metadata": {}, "items": [job]})}
    if kuberay:
        answers[("GET", "/apis/ray.io/v1/namespaces/team-a/rayjobs")] = (
            200, {"kind": "RayJobList", "apiVersion": "ray.io/v1", "items": [rayjob]})
    return answers


@pytest.mark.parametrize("kuberay", [True, False])
def test_runs_lists_ray_jobs_beside_batch_jobs(tmp_path, kuberay):
    with ApiServer(listing(kuberay)) as api:
        found = K8sLauncher(tmp_path, "team-a", cluster=Cluster(api.client())).list()
    listed = [(r.run_id, r.state, r.image) for r in found]
    expected = [("one", "running", "img:job")] + ([("many", "running", "img:ray")] if kuberay else [])
    assert listed == expected


def k8s_dry_run(config, *flags):
    result = CliRunner().invoke(app, ["run", str(config), "--target", "k8s", "--dry-run", "--image", "reg.io/img:1",
                                      *flags])
    return result, [doc for doc in yaml.safe_load_all(result.stdout) if doc] if result.exit_code == 0 else []


def test_the_readme_gsm8k_job_finds_its_files_on_the_data_claim():
    """`--data gsm8k` names a claim holding gsm8k/ and models/: mounted read-only at /data, where the example's
    paths point; the models go through the namespace's shared cache claim, filled by the init container."""
    config = REPO / "examples" / "gsm8k-grpo.yaml"
    result, objects = k8s_dry_run(config, "--gpus", "8", "--data", "gsm8k", "--run-id", "gsm8k")
    assert result.exit_code == 0, result.output
    for obj in objects:
        validate(obj)
    claims = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PersistentVolumeClaim"}
    assert set(claims) == {"gsm8k-runs", "verl-deploy-hf-cache"}
    assert "verl-deploy.run-id" not in claims["verl-deploy-hf-cache"]["metadata"]["labels"]  # no run's: `runs rm` keeps it
    pod = next(o for o in objects if o["kind"] == "Job")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "gsm8k", "readOnly": True}
    assert volumes["cache"]["persistentVolumeClaim"] == {"claimName": "verl-deploy-hf-cache"}
    trainer = pod["containers"][0]
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in trainer["volumeMounts"]
    paths = yaml.safe_load(config.read_text())
    assert all(p.startswith("/data/") for p in (paths["data"]["train_files"], paths["data"]["val_files"], paths["model"]["path"]))
    [fetch] = pod["initContainers"]
    assert fetch["args"] == ["fetch", "/etc/verl-deploy/config.yaml"]
    assert {m["name"] for m in fetch["volumeMounts"]} == {"config", "secrets", "cache", "tmp"}  # a gated model's token
    assert fetch["securityContext"] == trainer["securityContext"]


def test_named_claims_and_a_storage_class_and_several_nodes(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  path: org/tiny\ndata:\n  batch_size: 16\n")
    result, objects = k8s_dry_run(config, "--gpus", "8", "--nodes", "2", "--hf-cache", "team-cache",
                                  "--storage-class", "fast-rwx", "--set", "model.path=Qwen/Qwen2.5-0.5B-Instruct")
    assert result.exit_code == 0, result.output
    claims = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    assert [c["metadata"]["name"].endswith("-runs") for c in claims] == [True]  # team-cache is the user's own
    assert claims[0]["spec"]["storageClassName"] == "fast-rwx" and claims[0]["spec"]["accessModes"] == ["ReadWriteMany"]
    rayjob = objects[-1]["spec"]["rayClusterSpec"]
    head, worker = rayjob["headGroupSpec"]["template"]["spec"], rayjob["workerGroupSpecs"][0]["template"]["spec"]
    assert head["initContainers"][0]["args"] == ["fetch", "/etc/verl-deploy/config.yaml",
                                                 "--set", "model.path=Qwen/Qwen2.5-0.5B-Instruct"]
    assert "initContainers" not in worker
    for pod in (head, worker):
        assert {"name": "cache", "persistentVolumeClaim": {"claimName": "team-cache"}} in pod["volumes"]
    default = k8s_dry_run(config, "--gpus", "8", "--nodes", "2", "--run-id", "two")[1]
    cache = [o for o in default if o["kind"] == "PersistentVolumeClaim"][1]
    assert cache["metadata"]["name"] == "verl-deploy-hf-cache" and cache["spec"]["accessModes"] == ["ReadWriteMany"]


def test_a_host_folder_for_data_on_kubernetes_is_one_line(tmp_path):
    result, _ = k8s_dry_run(REPO / "examples" / "quickstart.yaml", "--data", str(tmp_path))
    assert result.exit_code == 2
    assert result.output.startswith(f"error: --data '{tmp_path}': on Kubernetes it names a PersistentVolumeClaim")


def test_a_data_claim_can_be_created_from_a_size_and_a_storage_class():
    result, objects = k8s_dry_run(REPO / "examples" / "quickstart.yaml", "--data-size", "100g", "--storage-class",
                                  "standard", "--run-id", "sized")
    assert result.exit_code == 0, result.output
    data = next(o for o in objects if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] == "sized-data")
    validate(data)
    assert data["spec"]["resources"]["requests"]["storage"] == "100Gi" and data["spec"]["storageClassName"] == "standard"
    pod = objects[-1]["spec"]["template"]["spec"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "sized-data", "readOnly": True}} in pod["volumes"]
