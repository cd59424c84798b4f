"""Kubernetes runs that a real cluster would schedule, size and end well — checked on the rendered objects.

No API server runs here, so the pods `run --target k8s` renders are placed on GPU nodes as GKE, EKS and the NVIDIA
GPU Operator present them (tests/fixtures/k8s-nodes, with where their labels, taints and sizes come from) by the
predicates kube-scheduler applies first: taints and tolerations, nodeSelector, required node affinity, requests
against allocatable (quantities parsed by the kubernetes client's own parse_quantity).
"""

import json

import pytest
import yaml
from conftest import FIXTURES, REPO
from test_k8s import validate
from typer.testing import CliRunner

from verl_deploy import gpu_types
from verl_deploy.cli import app

pytestmark = pytest.mark.k8s
NODES = {path.stem: json.loads(path.read_text()) for path in sorted((FIXTURES / "k8s-nodes").glob("*.json"))}
GSM8K = REPO / "examples" / "gsm8k-grpo.yaml"
IMAGE = "registry.example.com/team/verl-deploy:0.1.0-cu128"
VERL_ARGS = ["--runtime", "verl", "--", "data.train_files=/data/gsm8k/train.parquet",
             "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct"]  # anything after "--" goes last


def render(*flags: str, config=GSM8K, image: str = IMAGE) -> tuple[str, list[dict]]:
    flags = list(flags)
    overrides = flags[flags.index("--"):] if "--" in flags else []  # verl's overrides come last
    flags = flags[:len(flags) - len(overrides)]
    args = ["run", *([str(config)] if config else []), "--target", "k8s", "--dry-run", "--image", image,
            "--run-id", "fit", *flags, *overrides]
    result = CliRunner().invoke(app, args, env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert result.exit_code == 0, result.output
    return result.stdout, [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def pods(objects: list[dict]) -> list[dict]:
    """The pod specs of the workload: the Job's, or the RayJob's head and workers."""
    workload = objects[-1]
    if workload["kind"] == "Job":
        return [workload["spec"]["template"]["spec"]]
    cluster = workload["spec"]["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"]["spec"], *(g["template"]["spec"] for g in cluster["workerGroupSpecs"])]


# --- kube-scheduler's filters, as far as these pods need them ----------------------------------------------------


def tolerated(taint: dict, tolerations: list[dict]) -> bool:
    def matches(t: dict) -> bool:
        key_ok = t.get("key") == taint["key"] or (not t.get("key") and t.get("operator") == "Exists")
        value_ok = t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", "")
        return key_ok and value_ok and t.get("effect", taint["effect"]) == taint["effect"]

    return any(matches(t) for t in tolerations)


def expression_holds(expression: dict, labels: dict) -> bool:
    key, op, values = expression["key"], expression["operator"], expression.get("values", [])
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        return key in labels and (int(labels[key]) > int(values[0]) if op == "Gt" else int(labels[key]) < int(values[0]))
    raise AssertionError(f"operator {op}")


def requests(pod: dict) -> dict:
    """A pod's effective requests: its containers' sum, or its largest init container's where that is more."""
    from kubernetes.utils import parse_quantity

    total: dict = {}
    for container in pod["containers"]:
        for name, value in container["resources"].get("requests", {}).items():
            total[name] = total.get(name, 0) + parse_quantity(value)
    for container in pod.get("initContainers", []):
        for name, value in container["resources"].get("requests", {}).items():
            total[name] = max(total.get(name, 0), parse_quantity(value))
    return total


def why_not(pod: dict, node: dict) -> str | None:
    """None when the node can take the pod; else the filter that stops it."""
    from kubernetes.utils import parse_quantity

    labels = node["metadata"]["labels"]
    for taint in node["spec"].get("taints", []):
        if taint["effect"] in ("NoSchedule", "NoExecute") and not tolerated(taint, pod.get("tolerations", [])):
            return f"untolerated taint {taint['key']}"
    if any(labels.get(k) != v for k, v in pod.get("nodeSelector", {}).items()):
        return "nodeSelector"
    required = pod.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required and not any(all(expression_holds(e, labels) for e in term.get("matchExpressions", []))
                            for term in required["nodeSelectorTerms"]):
        return "node affinity"
    allocatable = node["status"]["allocatable"]
    for name, value in requests(pod).items():
        if value > parse_quantity(allocatable.get(name, "0")):
            return f"Insufficient {name}"
    return None


# --- the pods fit the clusters people have -----------------------------------------------------------------------


@pytest.mark.parametrize("node", list(NODES))
@pytest.mark.parametrize("shape", [["--gpus", "8"], ["--gpus", "8", "--nodes", "2"], ["--gpus", "1"],
                                   ["--gpus", "8", *VERL_ARGS], ["--gpus", "8", "--nodes", "2", *VERL_ARGS]],
                         ids=["job-8", "rayjob-2x8", "job-1", "verl-job-8", "verl-rayjob-2x8"])
def test_every_gpu_pod_schedules_on_gke_eks_and_gpu_operator_nodes(shape, node):
    config = None if "--runtime" in shape else GSM8K
    _, objects = render("--data", "gsm8k", *shape, config=config)
    for obj in objects:
        validate(obj)
    for pod in pods(objects):
        assert why_not(pod, NODES[node]) is None, (node, why_not(pod, NODES[node]))


def test_eight_gpus_are_sized_for_eight_gpus_with_shared_memory_inside_the_limit():
    _, objects = render("--gpus", "8", "--nodes", "2")
    for pod in pods(objects):
        [trainer] = pod["containers"]
        assert trainer["resources"] == {  # /tmp: 8 x 4Gi, and 1Gi for the container's logs
            "requests": {"cpu": "32", "memory": "272Gi", "ephemeral-storage": "33Gi", "nvidia.com/gpu": "8"},
            "limits": {"memory": "272Gi", "ephemeral-storage": "33Gi", "nvidia.com/gpu": "8"},  # 8 x 32Gi + 16Gi shm
        }
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
        assert {"name": "tmp", "emptyDir": {"sizeLimit": "32Gi"}} in pod["volumes"]


@pytest.mark.parametrize("flags, cpu, limit, shm", [
    (["--gpus", "1"], "4", "34Gi", "2Gi"),
    ([], "2", "9Gi", "1Gi"),  # a CPU-only run schedules anywhere
    (["--gpus", "8", "--cpus", "48", "--memory", "400g", "--shm-size", "32g"], "48", "432Gi", "32Gi"),
    (["--gpus", "2", "--cpus", "0.5", "--memory", "9216m"], "500m", "9216Mi", "4Gi"),
])
def test_flags_override_the_sizing_and_shared_memory_is_added_to_the_limit(flags, cpu, limit, shm):
    _, objects = render(*flags, config=REPO / "examples" / "quickstart.yaml")
    [pod] = pods(objects)
    resources = pod["containers"][0]["resources"]
    if "--memory" in flags and flags[flags.index("--memory") + 1] == "9216m":
        limit = "13Gi"  # 9Gi + 4Gi of /dev/shm
    assert resources["requests"]["cpu"] == cpu and "cpu" not in resources["limits"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == limit
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}} in pod["volumes"]


def test_the_kustomize_overlays_are_sized_as_the_launcher_sizes():
    eight = yaml.safe_load((REPO / "k8s" / "overlays" / "eight-gpus" / "job.yaml").read_text())
    assert eight["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "272Gi"
    for overlay in ("single-gpu", "eight-gpus", "multi-node"):
        for path in (REPO / "k8s" / "overlays" / overlay).glob("*.yaml"):
            text = path.read_text()
            assert "&id0" not in text and "*id0" not in text, path


# --- scheduling: GPU types, selectors, no GFD requirement ----------------------------------------------------


@pytest.mark.parametrize("gpu_type, fits", [
    ("H100", {"gke-a3-highgpu-8g", "onprem-dgx-h100-gpu-operator"}),
    ("L4", {"gke-g2-standard-96"}),
    ("a100-40gb", {"eks-p4d-24xlarge"}),
    ("H200", set()),
])
def test_gpu_type_matches_whichever_label_the_cluster_carries(gpu_type, fits):
    _, objects = render("--gpus", "8", "--gpu-type", gpu_type)
    [pod] = pods(objects)
    assert {name for name, node in NODES.items() if why_not(pod, node) is None} == fits
    assert {name for name, node in NODES.items() if why_not(pod, node) == "node affinity"} == set(NODES) - fits


def test_gfd_product_names_are_nvml_names_with_dashes():
    """GPU Feature Discovery labels nvidia.com/gpu.product with NVML's device name, spaces replaced by '-':
    the catalogue's H200 value is what the NVML reading recorded on an H200 gives."""
    recorded = json.loads((FIXTURES / "nvml" / "h200.json").read_text())["devices"][0]
    h200 = gpu_types.lookup("H200")
    assert recorded["name"].replace(" ", "-") in h200.labels["nvidia.com/gpu.product"]
    assert h200.memory_gib == recorded["memory_total"] // 2**30


def test_the_driver_floor_is_preferred_never_required():
    _, objects = render("--gpus", "8", "--variant", "cu130")
    [pod] = pods(objects)
    affinity = pod["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity
    [preferred] = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["preference"]["matchExpressions"] == [
        {"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": ["579"]}]
    old_driver = {**NODES["onprem-dgx-h100-gpu-operator"]}
    assert why_not(pod, old_driver) is None  # 550 < 580: still schedulable; doctor --k8s names the old driver


def test_selectors_priority_service_account_and_pull_secrets_reach_every_pod():
    _, objects = render("--gpus", "8", "--nodes", "2", "--node-selector", "pool=rl", "--node-selector",
                        "cloud.google.com/gke-spot=true", "--priority-class", "training-high",
                        "--service-account", "trainer", "--image-pull-secret", "regcred")
    for obj in objects:
        validate(obj)
    for pod in pods(objects):
        assert pod["nodeSelector"] == {"pool": "rl", "cloud.google.com/gke-spot": "true"}
        assert pod["priorityClassName"] == "training-high" and pod["serviceAccountName"] == "trainer"
        assert pod["automountServiceAccountToken"] is False and pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert why_not(pod, NODES["gke-a3-highgpu-8g"]) == "nodeSelector"


# --- lifecycle ---------------------------------------------------------------------------------------------------


def test_the_job_fails_fast_on_a_config_error_and_forgives_node_disruptions():
    _, objects = render("--gpus", "8")
    job = objects[-1]["spec"]
    assert job["backoffLimit"] >= 1
    assert job["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2]}},
    ]
    assert job["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it


def test_the_trainer_exits_with_the_code_the_policy_fails_on(tmp_path):
    """The FailJob rule's exit code is the trainer's own for a config mistake (verl_runtime's user errors)."""
    import subprocess
    import sys

    config = tmp_path / "bad.yaml"
    config.write_text("trainer:\n  total_steps: 2\n")
    done = subprocess.run([sys.executable, "-m", "verl_runtime", "train", str(config)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: "), done.stderr
    _, objects = render("--gpus", "1")
    assert objects[-1]["spec"]["podFailurePolicy"]["rules"][1]["onExitCodes"]["values"] == [done.returncode]


@pytest.mark.parametrize("shape", [["--gpus", "8"], ["--gpus", "8", "--nodes", "2"], ["--gpus", "8", *VERL_ARGS]])
def test_every_pod_gets_time_to_checkpoint(shape):
    _, objects = render(*shape, config=None if "--runtime" in shape else GSM8K)
    assert all(pod["terminationGracePeriodSeconds"] == 120 for pod in pods(objects))
    _, objects = render("--grace-period", "600", *shape, config=None if "--runtime" in shape else GSM8K)
    assert all(pod["terminationGracePeriodSeconds"] == 600 for pod in pods(objects))


def test_upstream_verl_is_not_failed_on_exit_code_2():
    _, objects = render("--gpus", "8", *VERL_ARGS, config=None)
    assert objects[-1]["spec"]["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]


def test_no_yaml_anchors_even_where_objects_repeat():
    text, objects = render("--gpus", "8", "--nodes", "2")
    assert "&id0" not in text and "*id0" not in text
    head, worker = pods(objects)
    assert head["tolerations"] == worker["tolerations"]  # equal, each written out


def test_runs_share_the_namespaces_cache_claim_unless_one_names_its_own():
    """One model cache per namespace, ReadWriteMany so that runs on any nodes mount it at once, and no run's label:
    `runs rm` of one run leaves it to the others. --hf-cache NAME names an existing claim instead."""
    claims = {}
    for run_id, flags in (("one", ["--gpus", "1"]), ("two", ["--gpus", "8"]), ("three", ["--gpus", "8", "--nodes", "2"])):
        text, objects = render(*flags, "--run-id", run_id)
        [cache] = [o for o in objects if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] != f"{run_id}-runs"]
        claims[run_id] = cache
        assert all(v["persistentVolumeClaim"] == {"claimName": "verl-deploy-hf-cache"}
                   for pod in pods(objects) for v in pod["volumes"] if v["name"] == "cache")
        assert "# PersistentVolumeClaim verl-deploy-hf-cache: the namespace's model cache, shared by its runs" in text
    assert claims["one"] == claims["two"] == claims["three"]  # one object, whichever run applies it first
    assert claims["one"]["metadata"] == {"name": "verl-deploy-hf-cache", "namespace": "default",
                                         "labels": {"verl-deploy.managed": "true"}}
    assert claims["one"]["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "200Gi"}}}
    _, objects = render("--gpus", "1", "--hf-cache", "team-models")
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"] == ["fit-runs"]
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "team-models"}} in pods(objects)[0]["volumes"]


def test_fetch_models_never_asks_for_more_memory_than_the_trainer():
    for flags, trainer, fetch in ((["--gpus", "1"], "34Gi", ("2Gi", "8Gi")),
                                  (["--memory", "3g", "--shm-size", "1g"], "4Gi", ("2Gi", "4Gi")),
                                  (["--memory", "1g", "--shm-size", "512m"], "1536Mi", ("1536Mi", "1536Mi"))):
        _, objects = render(*flags, config=REPO / "examples" / "quickstart.yaml")
        [pod] = pods(objects)
        assert pod["containers"][0]["resources"]["limits"]["memory"] == trainer
        [init] = pod["initContainers"]
        assert (init["resources"]["requests"]["memory"], init["resources"]["limits"]["memory"]) == fetch
        assert init["resources"]["limits"]["ephemeral-storage"] == pod["containers"][0]["resources"]["limits"][
            "ephemeral-storage"]  # it writes to the same /tmp


@pytest.mark.parametrize("image, flags, warned", [
    ("registry.example.com/team/verl-deploy:0.1.0-cu128", [], True),
    ("registry.example.com/team/verl-deploy:0.1.0-cu128@sha256:" + "a" * 64, [], False),
    ("verl-deploy:0.1.0-cu128", ["--image-preloaded"], False),  # no registry to pin against: the nodes hold it
])
def test_a_tag_is_printed_with_one_warning_on_how_to_pin_it(image, flags, warned):
    result = CliRunner().invoke(app, ["run", str(GSM8K), "--target", "k8s", "--dry-run", "--image", image,
                                      "--run-id", "fit", "--gpus", "1", *flags],
                                env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    if not warned:
        assert warnings == []
        return
    assert warnings == [
        f"warning: image {image} is a tag: the nodes pull whatever it names when each pod starts, which may be a "
        f"different image if it is pushed again; pin it with --image {image}@sha256:<digest> "
        "(`verl-deploy images push` prints REF@sha256:...)"]
    assert "warning" not in result.stdout  # the YAML for kubectl stays clean


# --- images the nodes can pull -------------------------------------------------------------------------------


@pytest.mark.parametrize("image, flags, policy", [
    ("registry.example.com/team/verl-deploy:0.1.0-cu128", [], "Always"),  # a tag may move
    ("registry.example.com/team/verl-deploy:0.1.0-cu128@sha256:" + "a" * 64, [], "IfNotPresent"),
    ("verl-deploy:0.1.0-cu128", ["--image-preloaded"], "IfNotPresent"),  # kind load / minikube image load
])
def test_pull_policy_follows_what_the_image_reference_promises(image, flags, policy):
    _, objects = render("--gpus", "1", *flags, image=image)
    [pod] = pods(objects)
    assert {c["imagePullPolicy"] for c in pod["containers"] + pod["initContainers"]} == {policy}
    assert pod["containers"][0]["image"] == image


def test_a_local_tag_is_refused_in_one_line_naming_images_push(tmp_path):
    result = CliRunner().invoke(app, ["run", str(GSM8K), "--target", "k8s", "--gpus", "8", "--dry-run",
                                      "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2
    [line] = result.output.splitlines()
    assert line.startswith("error: image verl-deploy:0.1.0-cu128 names no registry, so no node can pull it: "
                           "`verl-deploy images push --registry HOST[:PORT]/PATH`")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("nodes", ["1", "2"])
def test_a_network_policy_admits_only_the_runs_own_pods(nodes):
    _, objects = render("--gpus", "8", "--nodes", nodes)
    policy, *submitter = [o for o in objects if o["kind"] == "NetworkPolicy"]
    validate(policy)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    workload = objects[-1]
    templates = ([workload["spec"]["template"]] if workload["kind"] == "Job" else
                 [workload["spec"]["rayClusterSpec"]["headGroupSpec"]["template"],
                  *(g["template"] for g in workload["spec"]["rayClusterSpec"]["workerGroupSpecs"])])
    assert all(selector.items() <= t["metadata"]["labels"].items() for t in templates)  # it selects every pod
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    if nodes == "1":
        assert policy["spec"]["ingress"] == []  # one pod: nothing needs to reach it
    else:
        own, submission = policy["spec"]["ingress"]
        assert own == {"from": [{"podSelector": {"matchLabels": selector}}]}
        assert sorted(p["port"] for p in submission["ports"]) == [8265, 52365]  # KubeRay's job submission
        [submitter] = submitter  # KubeRay's submitter pod: nothing reaches it, and it is not one of the run's pods
        validate(submitter)
        labels = workload["spec"]["submitterPodTemplate"]["metadata"]["labels"]
        assert submitter["spec"] == {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"], "ingress": []}
        assert not selector.items() <= labels.items()


def test_kuberays_submitter_pod_is_hardened_as_the_trainers_and_is_not_taken_for_it():
    """KubeRay's default submitter pod has no securityContext and mounts the service account token; ours runs
    the head's image non-root, read-only, without a token, a GPU, claims or secrets, and KubeRay still writes its
    `ray job submit` command into it (it does when the first container has none)."""
    _, objects = render("--gpus", "8", "--nodes", "2")
    rayjob = objects[-1]
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    template = rayjob["spec"]["submitterPodTemplate"]
    pod = template["spec"]
    (main,) = pod["containers"]
    assert "command" not in main and "args" not in main
    assert main["image"] == head["containers"][0]["image"] and main["imagePullPolicy"] == "Always"
    assert main["securityContext"] == head["containers"][0]["securityContext"]
    assert pod["securityContext"] == head["securityContext"] and pod["automountServiceAccountToken"] is False
    assert pod["restartPolicy"] == "Never"
    assert main["resources"] == {"requests": {"cpu": "500m", "memory": "200Mi", "ephemeral-storage": "2Gi"},
                                 "limits": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "2Gi"}}
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]  # its limit covers it
    assert main["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert "tolerations" not in pod and "affinity" not in pod
    assert "verl-deploy.run-id" not in template["metadata"]["labels"]  # status and logs select the run's pods by it


def test_the_kubernetes_client_comes_with_the_base_install(tmp_path):
    """`make quickstart` installs the runtime extra only: `--target k8s` and `runs --target k8s` must work there."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert any(dep.startswith("kubernetes") for dep in project["dependencies"])
    result = CliRunner().invoke(app, ["runs", "--target", "k8s"], env={"KUBECONFIG": None, "HOME": str(tmp_path),
                                                                       "KUBERNETES_SERVICE_HOST": None})
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: no Kubernetes cluster configured: set KUBECONFIG or run inside a cluster; "
        "`--dry-run` prints the manifests without one"]
