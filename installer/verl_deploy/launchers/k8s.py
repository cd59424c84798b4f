"""JobSpec -> Kubernetes objects: a ConfigMap (the config), a PVC (the run directory) and a batch/v1 Job
(one node) or a KubeRay RayJob (several nodes). Applied with server-side apply through the kubernetes client.

`manifests(spec)` is plain data; the dry run prints it as YAML for `kubectl apply -f -`, and the files under
k8s/ are rendered from it (tests/test_k8s.py keeps them equal), so the two cannot drift.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

from verl_deploy import runs
from verl_deploy.launchers.jobspec import (
    CACHE_DIR,
    CONFIG_DIR,
    CONFIG_FILE,
    DATA_DIR,
    MANAGED_LABEL,
    RUN_ID_LABEL,
    RUNS_DIR,
    SECRET_ENV,
    SECRETS_DIR,
    JobSpec,
    LaunchError,
)
from verl_deploy.runs import RunStatus

FIELD_MANAGER = "verl-deploy"
SECRET_NAME = "verl-deploy-secrets"  # optional; `launch` fills it from the caller's environment
RUN_VOLUME_SIZE = "50Gi"
# The namespace's Hugging Face cache, shared by its runs (so a model is downloaded once), unless --hf-cache names one.
CACHE_CLAIM = "verl-deploy-hf-cache"
CACHE_VOLUME_SIZE = "200Gi"
BACKOFF_LIMIT = 2  # a retried pod resumes from the last checkpoint (trainer.resume=auto)
TTL_AFTER_FINISHED_S = 7 * 24 * 3600
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
NONROOT_ID = 1000
# Secret files are root-owned in the volume; with the pod's fsGroup the kubelet gives them that group and g+r anyway
# (0400 would become 0440): say so, so the manifest shows what the pod's uid 1000 (group 1000) really gets.
SECRET_FILE_MODE = 0o440


def k8s_quantity(size: str) -> str:
    """Docker's '16g' / '512m' -> Kubernetes' '16Gi' / '512Mi'; Kubernetes spellings pass through."""
    match = re.fullmatch(r"(\d+)([kmgt])b?", size.strip().lower())
    return f"{match.group(1)}{match.group(2).upper()}i" if match else size


def _gpu_count(spec: JobSpec) -> int:
    if spec.gpus.device_ids or spec.gpus.count < 0:
        raise LaunchError(
            f"--gpus {spec.gpus} cannot be honoured on Kubernetes: the scheduler picks devices, give a count (--gpus 8)"
        )
    return spec.gpus.count


def _driver_major_floor(variant: str | None, runtime: str) -> int | None:
    """The lowest driver major the image variant runs on, for GPU Feature Discovery's driver label."""
    if not variant:
        return None
    from verl_deploy.compat import load_catalog

    chosen = load_catalog(runtime=runtime).get(variant)
    return int(chosen.min_driver.split(".")[0]) if chosen and chosen.min_driver else None


def _node_affinity(spec: JobSpec) -> dict:
    expressions = [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]
    floor = _driver_major_floor(spec.variant, spec.runtime)
    if floor:  # GFD's nvidia.com/cuda.driver.major; Gt compares integers
        expressions.append({"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": [str(floor - 1)]})
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
        }
    }


def _env(spec: JobSpec) -> list[dict]:
    """Settings only: credentials are files in SECRETS_DIR (the secrets volume), never environment variables.
    Upstream verl's pods also name the token file for huggingface_hub: KubeRay starts their Ray processes itself,
    past the image's entrypoint that loads the files (a path, not the value; no file, no token)."""
    env = dict(spec.container_env)
    if spec.upstream:
        env.setdefault("HF_TOKEN_PATH", f"{SECRETS_DIR}/HF_TOKEN")
    return [{"name": key, "value": value} for key, value in env.items()]


def secrets_volume() -> dict:
    """Secret SECRET_NAME as one file per credential in SECRETS_DIR. Optional, and so is each item: a missing Secret
    or a name it lacks is no file (the kubelet skips absent keys of an optional Secret), so the k8s/ tree and every
    run list all of SECRET_ENV and the files are exactly the names the Secret holds."""
    return {"name": "secrets", "secret": {
        "secretName": SECRET_NAME, "optional": True, "defaultMode": SECRET_FILE_MODE,
        "items": [{"key": name, "path": name} for name in SECRET_ENV],
    }}


def _resources(spec: JobSpec) -> dict:
    cpu = str(spec.cpus or 2)
    memory = k8s_quantity(spec.memory or "16g")
    resources = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}
    gpus = _gpu_count(spec)
    if gpus:
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
        resources["limits"]["nvidia.com/gpu"] = str(gpus)  # quantities are strings
    return resources


def container(spec: JobSpec, name: str = "trainer", args: list[str] | None = None) -> dict:
    """The trainer container; `args` replace the image's arguments (its entrypoint: `python -m verl_runtime`, or
    for upstream verl the secret-file loader, which runs them)."""
    body = {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "env": _env(spec),
        "resources": _resources(spec),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,  # writes go to the volumes below: /tmp, /dev/shm, runs, cache
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            *([] if spec.upstream else [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]),
            {"name": "secrets", "mountPath": SECRETS_DIR, "readOnly": True},
            {"name": "runs", "mountPath": RUNS_DIR},
            {"name": "cache", "mountPath": CACHE_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ] + ([{"name": "data", "mountPath": DATA_DIR, "readOnly": True}] if spec.data_claim else []),
    }
    if args is not None:
        body["args"] = args
    if spec.working_dir:
        body["workingDir"] = spec.working_dir
    return body


def fetch_container(spec: JobSpec) -> dict:
    """The init container that puts the run's models into the cache claim before the trainer (and on several nodes,
    the workers) start: one download, not one per pod."""
    body = container(spec, "fetch-models", ["fetch", CONFIG_FILE, *[a for o in spec.overrides for a in ("--set", o)]])
    body["resources"] = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}}
    body["volumeMounts"] = [m for m in body["volumeMounts"] if m["name"] in ("config", "secrets", "cache", "tmp")]
    return body


def cache_claim(spec: JobSpec) -> str:
    """The cache claim's name; several nodes share it only through ReadWriteMany, a claim of its own."""
    return spec.cache_claim or (CACHE_CLAIM if spec.nodes == 1 else f"{CACHE_CLAIM}-rwx")


def pod_spec(spec: JobSpec, main: dict, restart_policy: str | None = "Never", fetch: bool = True) -> dict:
    body = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NONROOT_ID,
            "runAsGroup": NONROOT_ID,
            "fsGroup": NONROOT_ID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # The trainer does not talk to the API server; no token in the pod (and none mounted at
        # /var/run/secrets/kubernetes.io, inside SECRETS_DIR where /var/run is /run).
        "automountServiceAccountToken": False,
        "containers": [main],
        "volumes": [
            *([] if spec.upstream else [{"name": "config", "configMap": {"name": f"{spec.run_id}-config"}}]),
            secrets_volume(),
            {"name": "runs", "persistentVolumeClaim": {"claimName": f"{spec.run_id}-runs"}},
            {"name": "cache", "persistentVolumeClaim": {"claimName": cache_claim(spec)}},
            # PyTorch workers and NCCL exchange tensors through /dev/shm; the default 64 MB is far too small.
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": k8s_quantity(spec.shm_size)}},
            # HOME=/tmp: Triton, torch.compile, vLLM and Ray write their caches and sessions there (the root is read-only).
            {"name": "tmp", "emptyDir": {}},
        ] + ([{"name": "data", "persistentVolumeClaim": {"claimName": spec.data_claim, "readOnly": True}}]
             if spec.data_claim else []),
    }
    if fetch and not spec.upstream:  # upstream verl's image has no `fetch`: verl downloads the models itself
        body["initContainers"] = [fetch_container(spec)]
    if restart_policy:
        body["restartPolicy"] = restart_policy
    if _gpu_count(spec):
        body["tolerations"] = [GPU_TOLERATION]
        body["affinity"] = _node_affinity(spec)
    return body


def _metadata(spec: JobSpec, name: str) -> dict:
    return {"name": name, "namespace": spec.namespace, "labels": dict(spec.labels)}


def config_map(spec: JobSpec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(spec, f"{spec.run_id}-config"),
        # The reward function's file beside the config (the container's reward.function points there).
        "data": {"config.yaml": spec.config_text,
                 **({spec.reward_file.name: spec.reward_file.read_text()} if spec.reward_file else {})},
    }


def run_volume(spec: JobSpec) -> dict:
    return _claim(spec, f"{spec.run_id}-runs", RUN_VOLUME_SIZE, dict(spec.labels))


def cache_volume(spec: JobSpec) -> dict | None:
    """The shared cache claim, when the launcher makes it (not --hf-cache NAME): labelled managed, not by run, so
    that stopping a run leaves it."""
    if spec.cache_claim:
        return None
    return _claim(spec, cache_claim(spec), CACHE_VOLUME_SIZE, {MANAGED_LABEL: "true"})


def data_volume(spec: JobSpec) -> dict | None:
    """The data claim, when --data-size asks the launcher to create it (fill it, e.g. from a pod, before training)."""
    if not spec.data_size:
        return None
    return _claim(spec, spec.data_claim, k8s_quantity(spec.data_size), {MANAGED_LABEL: "true"})


def _claim(spec: JobSpec, name: str, size: str, labels: dict) -> dict:
    # Several nodes share a claim only through ReadWriteMany.
    body = {"accessModes": ["ReadWriteMany" if spec.nodes > 1 else "ReadWriteOnce"],
            "resources": {"requests": {"storage": size}}}
    if spec.storage_class:
        body["storageClassName"] = spec.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": spec.namespace, "labels": labels},
        "spec": body,
    }


def job(spec: JobSpec) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(spec, spec.run_id),
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {
                "metadata": {"labels": dict(spec.labels)},
                "spec": pod_spec(spec, container(spec, args=spec.trainer_args())),
            },
        },
    }


def ray_job(spec: JobSpec) -> dict:
    """A KubeRay RayJob: a head and `nodes - 1` workers, each with the spec's GPUs; the entrypoint runs the
    trainer on the head, which joins the cluster through RAY_ADDRESS (set by KubeRay)."""
    import shlex

    def template(name: str) -> dict:
        # The head fetches the models; the workers start when KubeRay brings them up, reading the shared cache.
        pod = pod_spec(spec, container(spec, name), None, fetch=name == "ray-head")
        return {"metadata": {"labels": dict(spec.labels)}, "spec": pod}

    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": _metadata(spec, spec.run_id),
        "spec": {
            "entrypoint": shlex.join(spec.command()),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "rayClusterSpec": {
                "headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0"}, "template": template("ray-head")},
                "workerGroupSpecs": [
                    {
                        "groupName": "workers",
                        "replicas": spec.nodes - 1,
                        "minReplicas": spec.nodes - 1,
                        "maxReplicas": spec.nodes - 1,
                        "rayStartParams": {},
                        "template": template("ray-worker"),
                    }
                ],
            },
        },
    }


def manifests(spec: JobSpec) -> list[dict]:
    workload = ray_job(spec) if spec.nodes > 1 else job(spec)
    config = None if spec.upstream else config_map(spec)  # upstream verl's config is its command line
    return [obj for obj in (config, run_volume(spec), data_volume(spec), cache_volume(spec), workload) if obj]


def to_yaml(objects: list[dict]) -> str:
    import yaml

    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)


def secret(spec: JobSpec, environ: dict[str, str]) -> dict | None:
    """The Secret holding the caller's credentials; applied, never printed."""
    values = {name: environ[name] for name in spec.secrets if environ.get(name)}
    if not values:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET_NAME, "namespace": spec.namespace, "labels": {MANAGED_LABEL: "true"}},
        "type": "Opaque",
        "stringData": values,
    }


def create_secret_command(names, namespace: str) -> str:
    """kubectl reading each value from the caller's environment through a process substitution: the command line
    (shell history, `ps`) holds variable names only, and printf (a shell builtin) adds no newline."""
    files = " ".join(f'--from-file={name}=<(printf %s "${name}")' for name in names)
    return f"kubectl create secret generic {SECRET_NAME} -n {namespace} {files}"


# --- talking to a cluster --------------------------------------------------------------------------------------


def job_state(job_obj) -> tuple[str, str]:
    """(state, detail) from a V1Job's status conditions."""
    status = job_obj.status
    for condition in (status.conditions or []) if status else []:
        if condition.status != "True":
            continue
        if condition.type == "Complete":
            return "succeeded", ""
        if condition.type == "Failed":
            return "failed", condition.message or condition.reason or ""
        if condition.type == "Suspended":
            return "stopped", "suspended"
    if status and status.active:
        return "running", ""
    return "pending", ""


def ray_job_state(obj: dict) -> tuple[str, str]:
    """(state, detail) from a RayJob's status (jobStatus from Ray, jobDeploymentStatus from KubeRay)."""
    status = obj.get("status") or {}
    job_status = status.get("jobStatus", "")
    deployment = status.get("jobDeploymentStatus", "")
    states = {"SUCCEEDED": "succeeded", "FAILED": "failed", "STOPPED": "stopped", "RUNNING": "running"}
    if job_status in states:
        return states[job_status], status.get("message", "")
    if deployment == "Failed":
        return "failed", status.get("message", "")
    return "pending", deployment


def head_image(obj: dict) -> str:
    """The image of a RayJob's head (the trainer runs there)."""
    return obj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]


def newest_pod(pods) -> object | None:
    """The most recently created pod of a V1PodList (a retried Job has several)."""
    items = [p for p in pods.items if p.metadata and p.metadata.creation_timestamp]
    return max(items, key=lambda p: p.metadata.creation_timestamp) if items else None


def load_client_config() -> None:
    """The kubeconfig (KUBECONFIG, else ~/.kube/config), else the pod's service account; a kubeconfig that is there
    but unusable is one line saying so (doctor's finding), not 'no cluster configured'."""
    from kubernetes import config

    from verl_deploy.doctor.kubernetes_check import kubeconfig_error, kubeconfig_paths

    paths = kubeconfig_paths()
    if paths:
        if error := kubeconfig_error(paths):
            raise LaunchError("{}: {}".format(*error))
        config.load_kube_config(config_file=os.pathsep.join(map(str, paths)))
        return
    try:
        config.load_incluster_config()
    except config.ConfigException:
        raise LaunchError(
            "no Kubernetes cluster configured: set KUBECONFIG or run inside a cluster; "
            "`--dry-run` prints the manifests without one"
        ) from None


class Cluster:
    """The few API calls the launcher makes, on a configured kubernetes ApiClient."""

    def __init__(self, api_client=None):
        from kubernetes import client, config

        if api_client is None:
            load_client_config()
            api_client = client.ApiClient()
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def check_namespace(self, namespace: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.read_namespace(namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise LaunchError(
                    f"namespace {namespace!r} does not exist: `kubectl create namespace {namespace}` or pass --namespace"
                ) from None
            if exc.status != 403:  # a user who may not read namespaces may still create jobs in theirs
                raise LaunchError(f"Kubernetes API refused: {exc.status} {exc.reason}") from None

    def apply(self, obj: dict) -> None:
        """Server-side apply of one object (as field manager verl-deploy)."""
        common = {
            "body": obj,
            "field_manager": FIELD_MANAGER,
            "force": True,
            "_content_type": "application/apply-patch+yaml",
        }
        name, namespace, kind = obj["metadata"]["name"], obj["metadata"]["namespace"], obj["kind"]
        if kind == "ConfigMap":
            self.core.patch_namespaced_config_map(name, namespace, **common)
        elif kind == "Secret":
            self.core.patch_namespaced_secret(name, namespace, **common)
        elif kind == "PersistentVolumeClaim":
            self.core.patch_namespaced_persistent_volume_claim(name, namespace, **common)
        elif kind == "Job":
            self.batch.patch_namespaced_job(name, namespace, **common)
        elif kind == "RayJob":
            self.custom.patch_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", name, **common)
        else:
            raise ValueError(f"cannot apply kind {kind}")


class K8sLauncher:
    target = "k8s"

    def __init__(self, runs_root: Path, namespace: str = "default", cluster: Cluster | None = None):
        self.runs_root = Path(runs_root)
        self.namespace = namespace
        self._cluster = cluster

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = Cluster()
        return self._cluster

    def dry_run(self, spec: JobSpec) -> str:
        header = f"# verl-deploy run {spec.run_id}: kubectl apply -f - (server-side: --server-side)\n"
        if spec.secrets:
            header += (
                f"# {', '.join(spec.secrets)}: files in {SECRETS_DIR} from Secret {SECRET_NAME} (not shown); "
                f"create it (bash/zsh, no value in history): {create_secret_command(spec.secrets, spec.namespace)}\n"
            )
        return header + to_yaml(manifests(spec))

    def launch(self, spec: JobSpec, detach: bool = False) -> int:
        self.cluster.check_namespace(spec.namespace)
        credentials = secret(spec, dict(os.environ))
        for obj in ([credentials] if credentials else []) + manifests(spec):
            self.cluster.apply(obj)
        runs.write_record(spec.run_dir, {**spec.record(), "target": self.target})
        if detach:
            return 0
        for text in self.logs(spec.run_id, follow=True):
            print(text, end="", flush=True)
        final = self.status(spec.run_id)
        return 0 if final.state == "succeeded" else 1

    def _selector(self, run_id: str) -> str:
        return f"{RUN_ID_LABEL}={run_id}"

    def status(self, run_id: str) -> RunStatus:
        jobs = self.cluster.batch.list_namespaced_job(self.namespace, label_selector=self._selector(run_id)).items
        if jobs:
            state, detail = job_state(jobs[0])
            image = jobs[0].spec.template.spec.containers[0].image
        else:
            found = self.cluster.custom.list_namespaced_custom_object(
                "ray.io", "v1", self.namespace, "rayjobs", label_selector=self._selector(run_id)
            )["items"]
            if not found:
                raise LaunchError(f"no Kubernetes job for run {run_id!r} in namespace {self.namespace!r}")
            state, detail = ray_job_state(found[0])
            image = head_image(found[0])
        return RunStatus(run_id=run_id, target=self.target, state=state, image=image, detail=detail,
                         run_dir=f"pvc {run_id}-runs:{RUNS_DIR}/{run_id}")

    def logs(self, run_id: str, follow: bool = False) -> Iterator[str]:
        """The trainer pod's log (the newest pod of the run: a retried Job has several)."""
        import time

        for _ in range(600 if follow else 1):  # wait for the pod to be scheduled and started
            pod = newest_pod(self.cluster.core.list_namespaced_pod(self.namespace, label_selector=self._selector(run_id)))
            if pod is not None and pod.status.phase != "Pending":
                break
            if not follow:
                raise LaunchError(f"run {run_id!r} has no started pod yet")
            time.sleep(1)
        else:
            raise LaunchError(f"run {run_id!r}: no pod started within 10 minutes (`kubectl describe job {run_id}`)")
        name = pod.metadata.name
        if not follow:
            yield self.cluster.core.read_namespaced_pod_log(name, self.namespace)
            return
        stream = self.cluster.core.read_namespaced_pod_log(name, self.namespace, follow=True, _preload_content=False)
        for chunk in stream.stream():
            yield chunk.decode(errors="replace")

    def stop(self, run_id: str) -> None:
        """Delete the workload (its pods get SIGTERM and a grace period to checkpoint); the PVC stays."""
        from kubernetes import client

        options = client.V1DeleteOptions(propagation_policy="Foreground")
        jobs = self.cluster.batch.list_namespaced_job(self.namespace, label_selector=self._selector(run_id)).items
        for item in jobs:
            self.cluster.batch.delete_namespaced_job(item.metadata.name, self.namespace, body=options)
        if not jobs:
            self.cluster.custom.delete_namespaced_custom_object("ray.io", "v1", self.namespace, "rayjobs", run_id)

    def list(self) -> list[RunStatus]:
        """Every run in the namespace: batch Jobs (one node) and RayJobs (several)."""
        jobs = self.cluster.batch.list_namespaced_job(self.namespace, label_selector=MANAGED_LABEL).items
        result = []
        for item in jobs:
            state, detail = job_state(item)
            result.append(RunStatus(run_id=item.metadata.labels[RUN_ID_LABEL], target=self.target, state=state,
                                    image=item.spec.template.spec.containers[0].image, detail=detail))
        for obj in self._ray_jobs():
            state, detail = ray_job_state(obj)
            result.append(RunStatus(run_id=obj["metadata"]["labels"][RUN_ID_LABEL], target=self.target, state=state,
                                    image=head_image(obj), detail=detail))
        return result

    def _ray_jobs(self) -> list[dict]:
        """The namespace's verl-deploy RayJobs; none where KubeRay's CRD is not installed."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.cluster.custom.list_namespaced_custom_object(
                "ray.io", "v1", self.namespace, "rayjobs", label_selector=MANAGED_LABEL
            )["items"]
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise
