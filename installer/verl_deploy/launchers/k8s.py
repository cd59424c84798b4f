"""JobSpec -> Kubernetes objects: a ConfigMap (the config), a PVC (the run directory) and a batch/v1 Job
(one node) or a KubeRay RayJob (several nodes). Applied with server-side apply through the kubernetes client.

`manifests(spec)` is plain data; the dry run prints it as YAML for `kubectl apply -f -`, and the files under
k8s/ are rendered from it (tests/test_k8s.py keeps them equal), so the two cannot drift.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Iterator

from verl_deploy import gpu_types, runs, sizes
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
    TOOL_CONFIG_NAME,
    JobSpec,
    LaunchError,
    pools_line,
)
from verl_deploy.runs import RunStatus
from verl_deploy.sizes import Gpus
from verl_runtime.errors import EXIT_USER_ERROR
from verl_runtime.services.registry import url_env

FIELD_MANAGER = "verl-deploy"
SECRET_NAME = "verl-deploy-secrets"  # optional; `launch` fills it from the caller's environment
RUN_VOLUME_SIZE = "50Gi"
# The Hugging Face cache: one claim per namespace, shared by its runs, so that a model is downloaded once (by the
# first run's fetch-models) and not into 200Gi per run. `run` creates it when the namespace has none and never
# changes it after (a claim's access modes and class are immutable; an admin may have resized it); `runs rm` leaves
# it (it carries no run's label). --hf-cache NAME names another claim instead.
# ReadWriteMany, so that runs on different nodes (and a RayJob's head and workers) mount it at once. A ReadWriteOnce
# claim is attached to one node at a time: a second run on another node would hold its GPUs and wait, Pending with
# Multi-Attach, until the first ends. Block-disk storage (most clouds' default class) offers no ReadWriteMany and
# would leave a ReadWriteMany claim unbound forever, so on the provisioners below `run` makes it ReadWriteOnce and
# says so (shared_cache_access): runs then share it on one node at a time.
SHARED_CACHE_CLAIM = "verl-deploy-hf-cache"
CACHE_VOLUME_SIZE = "200Gi"
RWO_ONLY_PROVISIONERS = frozenset({
    "ebs.csi.aws.com", "kubernetes.io/aws-ebs",  # EKS
    "pd.csi.storage.gke.io", "kubernetes.io/gce-pd",  # GKE (its ReadWriteMany class is Filestore's)
    "disk.csi.azure.com", "kubernetes.io/azure-disk",  # AKS (its ReadWriteMany class is Azure Files')
    "cinder.csi.openstack.org", "kubernetes.io/cinder", "csi.vsphere.vmware.com", "dobs.csi.digitalocean.com",
    "csi.hetzner.cloud", "linodebs.csi.linode.com", "blockvolume.csi.oraclecloud.com", "vpc.block.csi.ibm.io",
    "diskplugin.csi.alibabacloud.com", "rbd.csi.ceph.com",  # Ceph RBD: ReadWriteMany only for raw block volumes
    "rancher.io/local-path", "kubernetes.io/no-provisioner", "openebs.io/local", "local.csi.openebs.io",
    "topolvm.io", "hostpath.csi.k8s.io",  # a node's own disk (kind's default is local-path)
})
DEFAULT_CLASS_ANNOTATIONS = ("storageclass.kubernetes.io/is-default-class",
                             "storageclass.beta.kubernetes.io/is-default-class")
# /tmp (HOME: Triton's, torch.compile's, vLLM's and FlashInfer's caches, Ray's session logs and spilled objects, which
# grow with the pod's worker processes, one per GPU): an emptyDir on the node's disk of 4Gi per GPU (4Gi without
# GPUs), and each container's ephemeral storage requested as limited, /tmp plus LOG_ALLOWANCE for its logs, so that
# the scheduler places the pod where that much disk is free and the kubelet never evicts it for using what it asked.
# Sized to fit GKE's default 100 GB boot disk (about 44Gi allocatable): 8 one-GPU pods, or one of 8 GPUs.
TMP_PER_GPU = 4 * 1024**3
LOG_ALLOWANCE = 1024**3  # the kubelet rotates a container's log at 10Mi x 5 files by default
SUBMITTER_TMP = 1024**3  # KubeRay's submitter only runs `ray job submit`
# The fetch-models init container's memory (huggingface_hub's downloads), never more than the trainer's limit.
FETCH_MEMORY_REQUEST, FETCH_MEMORY_LIMIT = 2 * 1024**3, 8 * 1024**3
BACKOFF_LIMIT = 2  # a retried pod resumes from the last checkpoint (trainer.resume=auto)
TTL_AFTER_FINISHED_S = 7 * 24 * 3600
# The NVIDIA device plugin's taint on GPU nodes (GKE and the GPU Operator set it as nvidia.com/gpu=present and
# nvidia.com/gpu:NoSchedule): Exists tolerates every value.
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# GPU Feature Discovery's label for the node's driver major version. Preferred, never required: clusters that run
# only the device plugin (GKE's and EKS's defaults) carry no GFD labels, and a required term would leave the pods
# Pending forever. `status` and doctor say when a labelled node's driver is too old.
DRIVER_MAJOR_LABEL = "nvidia.com/cuda.driver.major"
# The Ray dashboard (job submission, which KubeRay's submitter and operator use) and its agent.
RAY_SUBMISSION_PORTS = (8265, 52365)
# KubeRay's submitter Job runs `ray job submit` in the head's image; KubeRay writes the command and its env into the
# first container of spec.submitterPodTemplate when it has no command (ray-operator/controllers/ray/
# rayjob_controller.go, configureSubmitterContainer). Its default pod has no securityContext and mounts the service
# account token; ours is hardened as the trainer's, with KubeRay's default resources (common/job.go,
# GetDefaultSubmitterContainer), and a label of its own: status and logs select the run-id label.
SUBMITTER_LABEL = "verl-deploy.submitter-of"
SUBMITTER_RESOURCES = {"requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
NONROOT_ID = 1000
# Secret files are root-owned in the volume; with the pod's fsGroup the kubelet gives them that group and g+r anyway
# (0400 would become 0440): say so, so the manifest shows what the pod's uid 1000 (group 1000) really gets.
SECRET_FILE_MODE = 0o440


def _gpu_count(spec: JobSpec) -> int:
    if spec.gpus.device_ids or spec.gpus.count < 0:
        raise LaunchError(
            f"--gpus {spec.gpus} cannot be honoured on Kubernetes: the scheduler picks devices, give a count (--gpus 8)"
        )
    return spec.gpus_of("trainer") if spec.nodes == 1 else spec.gpus.count  # one pod: the rollout's pool beside


def _driver_major_floor(variant: str | None, runtime: str) -> int | None:
    """The lowest driver major the image variant runs on, for GPU Feature Discovery's driver label."""
    if not variant:
        return None
    from verl_deploy.compat import load_catalog

    chosen = load_catalog(runtime=runtime).get(variant)
    return int(chosen.min_driver.split(".")[0]) if chosen and chosen.min_driver else None


def _node_affinity(spec: JobSpec) -> dict | None:
    """Required: the --gpu-type's labels, any one of them (node selector terms are ORed: a cluster carries GFD's,
    GKE's or the cloud's instance type). Preferred: a driver that runs the image's CUDA, where GFD labels it."""
    affinity = {}
    if spec.cluster.gpu_type:
        labels = gpu_types.lookup(spec.cluster.gpu_type).labels
        terms = [{"matchExpressions": [{"key": key, "operator": "In", "values": list(values)}]}
                 for key, values in labels.items()]
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    floor = _driver_major_floor(spec.variant, spec.runtime)
    if floor:  # Gt compares integers
        driver = {"key": DRIVER_MAJOR_LABEL, "operator": "Gt", "values": [str(floor - 1)]}
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": 100, "preference": {"matchExpressions": [driver]}}]
    return {"nodeAffinity": affinity} if affinity else None


def pod_size(spec: JobSpec) -> sizes.PodSize:
    """The pod's CPUs, memory and shared memory: the flags, else sized from its GPUs (sizes.pod_size)."""
    return sizes.pod_size(_gpu_count(spec), spec.cpus, spec.memory, spec.shm_size)


def _env(spec: JobSpec) -> list[dict]:
    """Settings only: credentials are files in SECRETS_DIR (the secrets volume), never environment variables.
    Upstream verl's pods also name the token file for huggingface_hub: KubeRay starts their Ray processes itself,
    past the image's entrypoint that loads the files (a path, not the value; no file, no token)."""
    env = {**spec.container_env, **{url_env(service.name): service_url(spec, service) for service in spec.services}}
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
    """Memory requested as limited (the scheduler reserves what the trainer may use; /dev/shm inside it). No CPU
    limit: CFS throttling stalls data loaders and NCCL's threads, and the request already reserves the cores."""
    size = pod_size(spec)
    memory = sizes.k8s_quantity(size.memory_limit)
    resources = {"requests": {"cpu": sizes.k8s_cpus(size.cpus), "memory": memory, **ephemeral_storage(tmp_size(spec))},
                 "limits": {"memory": memory, **ephemeral_storage(tmp_size(spec))}}
    gpus = _gpu_count(spec)
    if gpus:
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
        resources["limits"]["nvidia.com/gpu"] = str(gpus)  # quantities are strings
    return resources


def tmp_size(spec: JobSpec) -> int:
    """The /tmp emptyDir's size limit: TMP_PER_GPU for each GPU of the pod, one's worth without GPUs."""
    return TMP_PER_GPU * max(1, _gpu_count(spec))


def ephemeral_storage(tmp: int) -> dict:
    """A container's node-disk share, requested as limited: its /tmp and its logs."""
    return {"ephemeral-storage": sizes.k8s_quantity(tmp + LOG_ALLOWANCE)}


def container(spec: JobSpec, name: str = "trainer", args: list[str] | None = None) -> dict:
    """The trainer container; `args` replace the image's arguments (its entrypoint: `python -m verl_runtime`, or
    for upstream verl the secret-file loader, which runs them)."""
    body = {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": pull_policy(spec),
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


def pull_policy(spec: JobSpec, image: str | None = None) -> str:
    """Always for a tag (it may move: the node checks the registry), IfNotPresent for a digest (immutable) or an
    image the nodes were given by hand (kind load, minikube image load: there is no registry to ask). image: the
    run's, unless another is named (a service's)."""
    return "IfNotPresent" if "@sha256:" in (image or spec.image) or spec.cluster.image_preloaded else "Always"


def fetch_container(spec: JobSpec) -> dict:
    """The init container that puts the run's models into the cache claim before the trainer (and on several nodes,
    the workers) start: one download, not one per pod. Its memory is capped at the trainer's (a namespace's
    LimitRange or quota sized for the run admits its init container too)."""
    body = container(spec, "fetch-models", ["fetch", CONFIG_FILE, *[a for o in spec.overrides for a in ("--set", o)]])
    limit = min(FETCH_MEMORY_LIMIT, pod_size(spec).memory_limit)
    body["resources"] = {
        "requests": {"cpu": "1", "memory": sizes.k8s_quantity(min(FETCH_MEMORY_REQUEST, limit)),
                     **ephemeral_storage(tmp_size(spec))},
        "limits": {"memory": sizes.k8s_quantity(limit), **ephemeral_storage(tmp_size(spec))},
    }
    body["volumeMounts"] = [m for m in body["volumeMounts"] if m["name"] in ("config", "secrets", "cache", "tmp")]
    return body


def cache_claim(spec: JobSpec) -> str:
    """The cache claim's name: --hf-cache's, else the namespace's shared one."""
    return spec.cache_claim or SHARED_CACHE_CLAIM


def pod_spec(spec: JobSpec, main: dict, restart_policy: str | None = "Never", fetch: bool = True) -> dict:
    body = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NONROOT_ID,
            "runAsGroup": NONROOT_ID,
            "fsGroup": NONROOT_ID,
            # The kubelet gives every volume the fsGroup: by default by walking all of it at every mount (minutes
            # for a cache of models); OnRootMismatch walks it only when its root does not have it yet.
            "fsGroupChangePolicy": "OnRootMismatch",
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
            # It counts against the container's memory limit, which _resources raises by as much.
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": sizes.k8s_quantity(pod_size(spec).shm)}},
            # HOME=/tmp: Triton, torch.compile, vLLM and Ray write their caches and sessions there (the root is
            # read-only); the containers' ephemeral-storage covers it.
            {"name": "tmp", "emptyDir": {"sizeLimit": sizes.k8s_quantity(tmp_size(spec))}},
        ] + ([{"name": "data", "persistentVolumeClaim": {"claimName": spec.data_claim, "readOnly": True}}]
             if spec.data_claim else []),
    }
    if fetch and not spec.upstream:  # upstream verl's image has no `fetch`: verl downloads the models itself
        body["initContainers"] = [fetch_container(spec)]
    if restart_policy:
        body["restartPolicy"] = restart_policy
    body.update(_scheduling(spec))
    return body


def _scheduling(spec: JobSpec) -> dict:
    """Where the pod may run and who it runs as: GPU taint and affinity, the user's node selector, priority
    class, service account and pull secrets, and the grace period a checkpoint needs after SIGTERM."""
    options = spec.cluster
    body: dict = {"terminationGracePeriodSeconds": options.grace_period_s}
    if _gpu_count(spec):
        body["tolerations"] = [dict(GPU_TOLERATION)]
    if affinity := _node_affinity(spec) if _gpu_count(spec) else None:
        body["affinity"] = affinity
    if options.node_selector:
        body["nodeSelector"] = dict(options.node_selector)
    if options.priority_class:
        body["priorityClassName"] = options.priority_class
    if options.service_account:
        body["serviceAccountName"] = options.service_account
    if options.image_pull_secrets:
        body["imagePullSecrets"] = [{"name": name} for name in options.image_pull_secrets]
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
                 **({spec.reward_file.name: spec.reward_file.read_text()} if spec.reward_file else {}),
                 **({TOOL_CONFIG_NAME: spec.tool_config.read_text()} if spec.tool_config else {})},
    }


def run_volume(spec: JobSpec) -> dict:
    return _claim(spec, f"{spec.run_id}-runs", RUN_VOLUME_SIZE, dict(spec.labels))


def cache_volume(spec: JobSpec) -> dict | None:
    """The namespace's shared cache claim, unless --hf-cache names another: ReadWriteMany (SHARED_CACHE_CLAIM's
    comment), labelled as verl-deploy's but with no run's label, so that `runs rm` of one run leaves it to the
    others. `launch` creates it only where it is missing (K8sLauncher._shared_cache)."""
    if spec.cache_claim:
        return None
    body = _claim(spec, cache_claim(spec), CACHE_VOLUME_SIZE, {MANAGED_LABEL: "true"})
    body["spec"]["accessModes"] = ["ReadWriteMany"]
    return body


def data_volume(spec: JobSpec) -> dict | None:
    """The data claim, when --data-size asks the launcher to create it (fill it, e.g. from a pod, before training)."""
    if not spec.data_size:
        return None
    return _claim(spec, spec.data_claim, sizes.k8s_quantity(spec.data_size), {MANAGED_LABEL: "true"})


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
            "podFailurePolicy": pod_failure_policy(spec),
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {
                "metadata": {"labels": dict(spec.labels)},
                "spec": pod_spec(spec, container(spec, args=list(spec.command.entry_args))),
            },
        },
    }


def pod_failure_policy(spec: JobSpec) -> dict:
    """A node drained, preempted or lost (the pod's DisruptionTarget condition) does not count against
    backoffLimit: the retry resumes from the checkpoint. Our trainer's user-error exit (a config mistake, a missing
    file: the same every time) fails the Job at once instead of rerunning it on the GPUs. Upstream verl exits 1 for
    every failure, so only the first rule applies to it."""
    rules = [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    if not spec.upstream:
        rules.append({"action": "FailJob", "onExitCodes": {"operator": "In", "values": [EXIT_USER_ERROR]}})
    return {"rules": rules}


def ray_job(spec: JobSpec) -> dict:
    """A KubeRay RayJob: a head and `nodes - 1` workers, each with the spec's GPUs; the entrypoint runs the
    trainer on the head, which joins the cluster through RAY_ADDRESS (set by KubeRay)."""
    import shlex

    from verl_deploy.launchers import preflight

    def template(name: str) -> dict:
        # The head fetches the models; the workers start when KubeRay brings them up, reading the shared cache.
        pod = pod_spec(spec, container(spec, name), None, fetch=name == "ray-head")
        return {"metadata": {"labels": dict(spec.labels)}, "spec": pod}

    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": _metadata(spec, spec.run_id),
        "spec": {
            # the pre-flight across the nodes first, in a Ray task on each (launchers/preflight.py)
            "entrypoint": " && ".join(filter(None, [preflight.ray_step(spec), shlex.join(spec.command.shell)])),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "submitterPodTemplate": submitter_template(spec),
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
                    },
                    *rollout_group(spec),
                ],
            },
        },
    }


def rollout_group(spec: JobSpec) -> list[dict]:
    """trainer.mode=separate_async: the rollout's pool as a worker group of its own, rollout.nnodes pods of
    rollout.n_gpus_per_node GPUs (the trainer places its rollout workers on them through Ray); none otherwise."""
    nodes, per_node = spec.rollout_pool
    if not nodes:
        return []
    sized = dataclasses.replace(spec, gpus=Gpus(count=per_node), rollout_pool=(0, 0))
    pod = pod_spec(sized, container(sized, "ray-rollout"), None, fetch=False)
    return [{"groupName": "rollout", "replicas": nodes, "minReplicas": nodes, "maxReplicas": nodes,
             "rayStartParams": {}, "template": {"metadata": {"labels": dict(spec.labels)}, "spec": pod}}]


def submitter_template(spec: JobSpec) -> dict:
    """The pod template of KubeRay's submitter Job: the image and hardening of the trainer's pod, /tmp its only
    writable place, no GPU, no claims and no secrets (it only talks to the head's dashboard)."""
    main = container(spec, "ray-job-submitter")
    main["resources"] = {kind: {**values, **ephemeral_storage(SUBMITTER_TMP)}
                         for kind, values in SUBMITTER_RESOURCES.items()}
    main["volumeMounts"] = [mount for mount in main["volumeMounts"] if mount["name"] == "tmp"]
    pod = pod_spec(spec, main, "Never", fetch=False)
    pod["volumes"] = [{"name": "tmp", "emptyDir": {"sizeLimit": sizes.k8s_quantity(SUBMITTER_TMP)}}]
    for gpu_only in ("tolerations", "affinity"):
        pod.pop(gpu_only, None)
    return {"metadata": {"labels": {SUBMITTER_LABEL: spec.run_id}}, "spec": pod}


def ingress_policy(metadata: dict, selects: dict, ingress: list | None = None) -> dict:
    """A NetworkPolicy on the pods whose labels match `selects`: ingress only as `ingress` allows (none by
    default); egress stays open (models, data and trackers are outside)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {"podSelector": {"matchLabels": selects}, "policyTypes": ["Ingress"], "ingress": ingress or []},
    }


def network_policy(spec: JobSpec) -> dict:
    """Ingress to the run's pods from the run's own pods only (a Ray cluster's head and workers talk to each other on
    many ports); with several nodes also the Ray dashboard ports, through which KubeRay's operator and submitter
    submit and follow the job. A one-pod Job needs none."""
    own = {RUN_ID_LABEL: spec.run_id}
    ingress = []
    if spec.nodes > 1:
        ports = [{"protocol": "TCP", "port": port} for port in RAY_SUBMISSION_PORTS]
        ingress = [{"from": [{"podSelector": {"matchLabels": own}}]},
                   {"from": [{"namespaceSelector": {}}], "ports": ports}]
    return ingress_policy(_metadata(spec, f"{spec.run_id}-ingress"), own, ingress)


def submitter_policy(spec: JobSpec) -> dict:
    """No ingress at all to a RayJob's submitter pod: it only calls the head's dashboard."""
    return ingress_policy(_metadata(spec, f"{spec.run_id}-submitter-ingress"), {SUBMITTER_LABEL: spec.run_id})


def network_policies(spec: JobSpec) -> list[dict]:
    return [network_policy(spec)] + ([submitter_policy(spec)] if spec.nodes > 1 else [])


# The run's services (config.services): a Deployment, a Service and a NetworkPolicy each, owned by the workload.
# Their pods carry SERVICE_OF_LABEL, not the run's RUN_ID_LABEL: the run's pods are its trainer's (status, logs).
SERVICE_OF_LABEL = "verl-deploy.service-of"
SERVICE_LABEL = "verl-deploy.service"
SERVICE_MEMORY = 2 << 30  # the sandbox's runs are limited one by one (services.sandbox.memory_mb); this caps them all
SERVICE_TMP = 1 << 30


def service_url(spec: JobSpec, service) -> str:
    return f"http://{spec.run_id}-{service.name}:{service.port}"  # the Service's name, in the run's namespace


def service_objects(spec: JobSpec, service) -> list[dict]:
    """One service of the run: its Deployment (the run's image or services.image, hardened as the trainer, nothing
    of the run's environment or secrets, the data claim read-only for a retriever's corpus), its Service, and a
    NetworkPolicy that lets only the run's trainer pods in and nothing out (the sandbox runs untrusted code)."""
    name = f"{spec.run_id}-{service.name}"
    selects = {SERVICE_OF_LABEL: spec.run_id, SERVICE_LABEL: service.name}
    labels = {MANAGED_LABEL: "true", **selects}
    settings = getattr(spec.loaded.services, service.name)
    memory, storage = sizes.k8s_quantity(SERVICE_MEMORY), ephemeral_storage(SERVICE_TMP)
    main = {
        "name": service.name,
        "image": spec.service_image,
        "imagePullPolicy": pull_policy(spec, spec.service_image),
        "command": ["python"],
        "args": service.args(settings, service.port, host="0.0.0.0", in_container=True),
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "http", "containerPort": service.port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": service.health, "port": service.port}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "1", "memory": memory, **storage}, "limits": {"memory": memory, **storage}},
        "securityContext": container(spec)["securityContext"],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]
        + ([{"name": "data", "mountPath": DATA_DIR, "readOnly": True}] if spec.data_claim else []),
    }
    pod = {
        "securityContext": pod_spec(spec, main)["securityContext"],
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [main],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": sizes.k8s_quantity(SERVICE_TMP)}}]
        + ([{"name": "data", "persistentVolumeClaim": {"claimName": spec.data_claim, "readOnly": True}}]
           if spec.data_claim else []),
    }
    metadata = {"name": name, "namespace": spec.namespace, "labels": labels}
    port = {"protocol": "TCP", "port": service.port}
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
         "spec": {"replicas": service.replicas(settings), "selector": {"matchLabels": selects},
                  "template": {"metadata": {"labels": labels}, "spec": pod}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": metadata,
         "spec": {"selector": selects, "ports": [{**port, "name": "http", "targetPort": service.port}]}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata,
         "spec": {"podSelector": {"matchLabels": selects}, "policyTypes": ["Ingress", "Egress"],
                  "ingress": [{"from": [{"podSelector": {"matchLabels": {RUN_ID_LABEL: spec.run_id}}}],
                               "ports": [port]}],
                  "egress": []}},
    ]


def manifests(spec: JobSpec) -> list[dict]:
    workload = ray_job(spec) if spec.nodes > 1 else job(spec)
    config = None if spec.upstream else config_map(spec)  # upstream verl's config is its command line
    services = [obj for service in spec.services for obj in service_objects(spec, service)]
    objects = (config, *network_policies(spec), *services, run_volume(spec), data_volume(spec), cache_volume(spec),
               workload)
    return [obj for obj in objects if obj]


def to_yaml(objects: list[dict]) -> str:
    """YAML without anchors and aliases (`&id001`/`*id001`, which PyYAML writes for an object met twice): every
    object stands alone, as kubectl and admission policies expect to read it."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data) -> bool:
            return True

    return yaml.dump_all(objects, Dumper=Dumper, sort_keys=False, default_flow_style=False)


def image_driver_floor(image: str) -> str | None:
    """The lowest driver an image of ours runs on, from its tag (`<version>-<variant>`, the way `images build` names
    them); None for an image whose tag names no variant of the catalog."""
    from verl_deploy.compat import load_catalog, load_runtimes

    tag = image.split("@")[0].rpartition(":")[2]
    variants = {name: v for runtime in load_runtimes() for name, v in load_catalog(runtime=runtime).items()}
    found = variants.get(tag.rpartition("-")[2])
    return found.min_driver if found else None


def cluster_image(spec: JobSpec) -> JobSpec:
    """The spec with an image the nodes can get: one without a registry is refused (one line naming `images
    push`) unless the nodes were given it by hand (--image-preloaded); a pushed image is pinned to the digest the
    registry gave this engine, when it knows it."""
    from verl_deploy.images.registry import has_registry, pinned

    if spec.cluster.image_preloaded:
        return spec
    if not has_registry(spec.image):
        raise LaunchError(
            f"image {spec.image} names no registry, so no node can pull it: `verl-deploy images push --registry "
            f"HOST[:PORT]/PATH`, then --image HOST[:PORT]/PATH/{spec.image}; or --image-preloaded if the nodes "
            "already hold it (kind load docker-image, minikube image load)")
    return dataclasses.replace(spec, image=pinned(spec.image))


def cluster_services_image(spec: JobSpec) -> tuple[JobSpec, str | None]:
    """The spec with an image its services' pods can get, and a note where that is not the services image: the
    services.image the config names, as given; else the services image beside the run's (images/context.services_tag)
    where its registry has it, pinned to its digest (what this engine pushed or pulled, else what the registry
    answers; with --image-preloaded, where this engine has it); else the run's own image, which runs them too."""
    from verl_deploy.images.context import services_tag
    from verl_deploy.images.engine import inspect_local
    from verl_deploy.images.registry import pinned, registry_pinned

    if not spec.services or spec.service_image_given or spec.services_image:
        return spec, None
    wanted = services_tag(spec.image.partition("@")[0])
    if wanted is None:  # an image of another name: the run's
        return spec, None
    if spec.cluster.image_preloaded:
        found = wanted if inspect_local(wanted) else None
    elif "@" in (known := pinned(wanted)):  # this engine pushed or pulled it
        found = known
    else:
        found = registry_pinned(wanted)
    if found:
        return dataclasses.replace(spec, services_image=found), None
    where = ("this host has no such image to load onto the nodes" if spec.cluster.image_preloaded
             else f"its registry does not have it: `verl-deploy images push --variant services --registry "
                  f"{wanted.rpartition('/')[0]}`")
    return dataclasses.replace(spec, services_image=spec.image), (
        f"note: the services image {wanted} cannot be had ({where}): the services run the run's image {spec.image}")


def tag_warning(spec: JobSpec) -> str | None:
    """One line when the image is a tag (cluster_image found no digest to pin it to): each node pulls what the tag
    names when its pod starts, so a tag pushed again in between gives a retry, or a RayJob's workers, another image.
    None for a digest, and for an image the nodes were given by hand (no registry to pin against)."""
    if "@sha256:" in spec.image or spec.cluster.image_preloaded:
        return None
    return (f"warning: image {spec.image} is a tag: the nodes pull whatever it names when each pod starts, which may "
            f"be a different image if it is pushed again; pin it with --image {spec.image}@sha256:<digest> "
            "(`verl-deploy images push` prints REF@sha256:...)")


def shared_cache_access(storage_class: dict | None) -> str:
    """The access mode of a new shared cache claim on this storage class (None: not known): ReadWriteMany, unless
    the class's provisioner is one that offers only ReadWriteOnce (RWO_ONLY_PROVISIONERS)."""
    if storage_class and storage_class.get("provisioner") in RWO_ONLY_PROVISIONERS:
        return "ReadWriteOnce"
    return "ReadWriteMany"


def _cache_note(spec: JobSpec) -> str:
    """The dry run's word on the shared cache claim among what it prints (`kubectl apply` of an existing claim)."""
    if spec.cache_claim:
        return ""
    return (f"# PersistentVolumeClaim {SHARED_CACHE_CLAIM}: the namespace's model cache, shared by its runs and kept "
            "by `runs rm`; `run` creates it only where it is missing (ReadWriteOnce on block storage without "
            "ReadWriteMany, e.g. EBS, PD, Azure Disk, local-path) and leaves an existing one as it is\n")


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


def owner_reference(obj: dict) -> dict:
    """An ownerReference to an object as the API server answered it (its uid is the server's): Kubernetes' garbage
    collector deletes the dependent once the owner is gone, e.g. the run's ConfigMap when the Job's TTL ends it.
    Not a controller reference; the owner's deletion does not wait for the dependent."""
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": False, "blockOwnerDeletion": False}


def api_error_line(exc) -> str:
    """One line from the API server's Status answer (its message says what and why), else the HTTP status."""
    import json

    try:
        message = json.loads(exc.body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        message = ""
    return f"Kubernetes API answered {exc.status} {exc.reason}" + (f": {message}" if message else "")


class api_errors:  # noqa: N801 (used as `with api_errors():`)
    """An API server's refusal, or none answering, as one line (LaunchError) instead of a traceback."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        if isinstance(exc, ApiException):
            raise LaunchError(api_error_line(exc)) from None
        if isinstance(exc, HTTPError):
            raise LaunchError(f"cannot reach the Kubernetes API server ({type(exc).__name__}): "
                              "`verl-deploy doctor --k8s` checks the connection") from None
        return False


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


# The kinds the launcher makes: (the client's API, the suffix of its calls: patch_namespaced_<suffix>, read_..., ...).
KINDS = {
    "ConfigMap": ("core", "config_map"),
    "Secret": ("core", "secret"),
    "PersistentVolumeClaim": ("core", "persistent_volume_claim"),
    "Job": ("batch", "job"),
    "NetworkPolicy": ("networking", "network_policy"),
    "RayJob": ("custom", "custom_object"),
    "Deployment": ("apps", "deployment"),
    "Service": ("core", "service"),
}
# The run's objects that go with its workload: owned by it, garbage-collected when its TTL deletes it.
WITH_WORKLOAD = ("ConfigMap", "NetworkPolicy", "Deployment", "Service")
RUN_KINDS = ("ConfigMap", "NetworkPolicy", "PersistentVolumeClaim")  # those labelled with the run's id
SERVICE_KINDS = ("NetworkPolicy", "Deployment", "Service")  # a service's (service_objects)


class Cluster:
    """The few API calls the launcher makes, on a configured kubernetes ApiClient."""

    def __init__(self, api_client=None):
        try:  # part of the base install; an environment that lost it gets the fix, not a traceback
            from kubernetes import client
        except ImportError:
            raise LaunchError("the Kubernetes client is not installed: `pip install kubernetes` (or reinstall "
                              "verl-deploy, which depends on it)") from None
        if api_client is None:
            load_client_config()
            api_client = client.ApiClient()
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
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

    def _call(self, verb: str, kind: str):
        """The client's `verb` (patch, read, delete, list) for a kind, called as (name, namespace, ...) or, to list,
        (namespace, ...); KubeRay's RayJobs through the custom objects API."""
        if kind not in KINDS:
            raise ValueError(f"cannot {verb} kind {kind}")
        api, suffix = KINDS[kind]
        if kind != "RayJob":
            return getattr(getattr(self, api), f"{verb}_namespaced_{suffix}")
        call = getattr(self.custom, f"{'get' if verb == 'read' else verb}_namespaced_custom_object")
        if verb == "list":
            return lambda namespace, **kw: call("ray.io", "v1", namespace, "rayjobs", **kw)
        return lambda name, namespace, *args, **kw: call("ray.io", "v1", namespace, "rayjobs", name, *args, **kw)

    def apply(self, obj: dict) -> dict:
        """Server-side apply of one object (as field manager verl-deploy); the object as the server answered it
        (with its uid)."""
        name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
        answer = self._call("patch", obj["kind"])(
            name, namespace, obj, field_manager=FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml", _preload_content=False,
        )
        return _json(answer)

    def set_owner(self, kind: str, namespace: str, name: str, owner: dict) -> None:
        """Make `owner` the object's only owner. A merge patch, not an apply: applying a part of the object as
        verl-deploy would drop the fields its earlier apply set; and a run started again (--resume) gets its new
        Job's uid, not a second, stale owner."""
        self._call("patch", kind)(
            name, namespace, {"metadata": {"ownerReferences": [owner]}},
            field_manager=FIELD_MANAGER, _content_type="application/merge-patch+json",
        )

    # Reads as plain dicts (the JSON the server sent, as `kubectl get -o json` shows it): k8s_pending reads those.

    def pods(self, namespace: str, selector: str) -> list[dict]:
        return _json(self.core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False))["items"]

    def last_error(self, namespace: str, selector: str, container: str) -> str:
        """The runtime's own last `error:` line (runs.last_error) in the log of the newest of these pods' container,
        where the cluster still has it; "" otherwise."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            pods = self.pods(namespace, selector)
            if not pods:
                return ""
            newest = max(pods, key=lambda pod: pod["metadata"].get("creationTimestamp", ""))
            log = self.core.read_namespaced_pod_log(newest["metadata"]["name"], namespace, container=container,
                                                    _preload_content=False).data.decode(errors="replace")
        except (ApiException, HTTPError):
            return ""
        return runs.last_error(".", log.splitlines())

    def storage_class(self, name: str | None) -> dict | None:
        """The StorageClass of that name, else the cluster's default one; None where there is none or it cannot be
        read (StorageClasses are cluster-wide, and a namespace's user may not read them)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        api = client.StorageV1Api(self.core.api_client)
        try:
            if name:
                return _json(api.read_storage_class(name, _preload_content=False))
            found = _json(api.list_storage_class(_preload_content=False))["items"]
        except (ApiException, HTTPError):
            return None
        defaults = [item for item in found if any((item["metadata"].get("annotations") or {}).get(key) == "true"
                                                  for key in DEFAULT_CLASS_ANNOTATIONS)]
        return defaults[0] if defaults else None

    def events(self, namespace: str) -> list[dict]:
        """The namespace's events, in one call: they expire an hour after they last happen (the API server's
        --event-ttl), so a namespace holds few, and the pod's and its claims' come together."""
        return _json(self.core.list_namespaced_event(namespace, _preload_content=False))["items"]

    def names(self, kind: str, namespace: str, selector: str) -> list[str]:
        """The names of a kind's objects that carry the label selector."""
        found = _json(self._call("list", kind)(namespace, label_selector=selector, _preload_content=False))["items"]
        return [obj["metadata"]["name"] for obj in found]

    def read(self, kind: str, namespace: str, name: str) -> dict | None:
        """The object, or None where there is none (404)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return _json(self._call("read", kind)(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def delete(self, kind: str, namespace: str, name: str, propagation: str | None = None) -> bool:
        """Delete one object (its dependents by `propagation`); False where it was gone already."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        body = client.V1DeleteOptions(propagation_policy=propagation) if propagation else None
        try:  # the answer is not read: a Status for most kinds, the object for a claim (its finalizer holds it)
            self._call("delete", kind)(name, namespace, body=body, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _json(answer) -> dict:
    """The body of an answer read with _preload_content=False."""
    import json

    return json.loads(answer.data)


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
        spec = cluster_image(spec)
        spec, services_note = cluster_services_image(spec)
        objects = manifests(spec)  # a run they refuse says only why: the warning comes after
        for line in (services_note, tag_warning(spec)):
            if line:
                print(line, file=sys.stderr, flush=True)
        header = f"# verl-deploy run {spec.run_id}: kubectl apply -f - (server-side: --server-side)\n"
        header += _cache_note(spec)
        if pools := pools_line(spec):
            header += f"# {pools}\n"
        if spec.secrets:
            header += (
                f"# {', '.join(spec.secrets)}: files in {SECRETS_DIR} from Secret {SECRET_NAME} (not shown); "
                f"create it (bash/zsh, no value in history): {create_secret_command(spec.secrets, spec.namespace)}\n"
            )
        return header + to_yaml(objects)

    def launch(self, spec: JobSpec, detach: bool = False) -> int:
        spec = cluster_image(spec)
        spec, services_note = cluster_services_image(spec)
        objects = manifests(spec)
        self.cluster.check_namespace(spec.namespace)
        credentials = secret(spec, dict(os.environ))
        with api_errors():
            objects, note = self._shared_cache(spec, objects)
            applied = [self.cluster.apply(obj) for obj in ([credentials] if credentials else []) + objects]
            self._own_config(spec.namespace, applied)
        for line in (note, services_note, tag_warning(spec)):  # once the cluster took the run: a refused one says only why
            if line:
                print(line, file=sys.stderr, flush=True)
        # The cache claim too: `export` mounts it (the base model's config and tokenizer) beside the run claim.
        runs.record_launch(spec.run_dir, spec.launch(self.target, cache_claim=cache_claim(spec)))
        if detach:
            return 0
        for text in self.logs(spec.run_id, follow=True):
            print(text, end="", flush=True)
        final = self.status(spec.run_id)
        return 0 if final.state == "succeeded" else 1

    def _shared_cache(self, spec: JobSpec, objects: list[dict]) -> tuple[list[dict], str | None]:
        """The run's objects with the shared cache claim as the namespace needs it: left out where the claim exists
        (a claim's spec cannot change; an admin may have resized it), else ReadWriteOnce where the storage class
        offers no ReadWriteMany, with a note saying so. A run on several nodes cannot share a ReadWriteOnce claim
        between its pods: refused in one line."""
        if spec.cache_claim:
            return objects, None
        ours = next(obj for obj in objects if obj["kind"] == "PersistentVolumeClaim"
                    and obj["metadata"]["name"] == SHARED_CACHE_CLAIM)
        others = [obj for obj in objects if obj is not ours]
        found = self.cluster.read("PersistentVolumeClaim", spec.namespace, SHARED_CACHE_CLAIM)
        if found is not None:
            modes = found.get("spec", {}).get("accessModes") or []
            if spec.nodes > 1 and "ReadWriteMany" not in modes:
                raise LaunchError(
                    f"claim {SHARED_CACHE_CLAIM} (the namespace's model cache) is {', '.join(modes) or 'not shareable'}"
                    f": the {spec.nodes} nodes of this run cannot mount it at once; pass --hf-cache NAME, a "
                    "ReadWriteMany claim (NFS, CephFS, EFS, Filestore, Azure Files)")
            return others, None
        if spec.nodes > 1:  # its run claim needs ReadWriteMany as well: nothing to choose
            return objects, None
        storage_class = self.cluster.storage_class(spec.storage_class)
        if shared_cache_access(storage_class) == "ReadWriteMany":
            return objects, None
        ours["spec"]["accessModes"] = ["ReadWriteOnce"]
        return objects, (
            f"note: storage class {storage_class['metadata']['name']} ({storage_class['provisioner']}) has no "
            f"ReadWriteMany: the shared model cache {SHARED_CACHE_CLAIM} is made ReadWriteOnce, so runs on different "
            "nodes take turns with it; for one every node mounts at once, make a ReadWriteMany claim and pass "
            "--hf-cache NAME (docs/kubernetes.md)")

    def _selector(self, run_id: str) -> str:
        return f"{RUN_ID_LABEL}={run_id}"

    def _own_config(self, namespace: str, applied: list[dict]) -> None:
        """The run's ConfigMap (and NetworkPolicy) go with its workload: owned by the Job (or RayJob) the server just
        made, they are garbage-collected when the Job's TTL deletes the Job. The run's claims are not owned: they
        hold the checkpoints and the models, and stay until `runs rm`."""
        owner = owner_reference(next(obj for obj in applied if obj["kind"] in ("Job", "RayJob")))
        for obj in applied:
            if obj["kind"] in WITH_WORKLOAD:
                self.cluster.set_owner(obj["kind"], namespace, obj["metadata"]["name"], owner)

    def status(self, run_id: str) -> RunStatus:
        with api_errors():
            jobs = self.cluster.batch.list_namespaced_job(self.namespace, label_selector=self._selector(run_id)).items
            if jobs:
                state, detail = job_state(jobs[0])
                image = jobs[0].spec.template.spec.containers[0].image
            else:
                found = self._ray_jobs(self._selector(run_id))
                if not found:
                    raise LaunchError(f"no Kubernetes job for run {run_id!r} in namespace {self.namespace!r}")
                state, detail = ray_job_state(found[0])
                image = head_image(found[0])
            if state == "failed" and jobs:  # the trainer's own line (out of memory, a bad config), not the Job's
                detail = self.cluster.last_error(self.namespace, self._selector(run_id), "trainer") or detail
            if state in ("pending", "running"):  # the pods say why it waits, or on which node it runs
                pods = self.cluster.pods(self.namespace, self._selector(run_id))
                state, detail = self._why_pending(pods, state, detail)
                if state == "running":
                    detail = self._old_driver(pods, image) or detail
        return RunStatus(run_id=run_id, target=self.target, state=state, image=image, detail=detail,
                         run_dir=f"pvc {run_id}-runs:{RUNS_DIR}/{run_id}")

    def _why_pending(self, pods: list[dict], state: str, detail: str) -> tuple[str, str]:
        """A workload with Pending pods: why, in one line (k8s_pending). A Job counts a pod that cannot be
        scheduled as active, so a run none of whose pods has started is pending, not running."""
        from verl_deploy.launchers import k8s_pending

        waiting = [p for p in pods if p.get("status", {}).get("phase") == "Pending"]
        if not waiting:
            return state, detail
        if len(waiting) == len(pods):
            state = "pending"
        names = sorted({name for pod in waiting for name in k8s_pending.claim_names(pod)})
        claims = {name: self.cluster.read("PersistentVolumeClaim", self.namespace, name) for name in names}
        return state, k8s_pending.explain(pods, self.cluster.events(self.namespace), claims) or detail

    def _old_driver(self, pods: list[dict], image: str) -> str:
        """The driver floor is only preferred (clusters without GPU Feature Discovery carry no driver label), so a
        pod may land on a node whose driver is too old for the image's CUDA: say so, where the node's GFD labels
        tell (a user who may not read nodes gets nothing)."""
        from kubernetes.client.exceptions import ApiException

        from verl_deploy.compat import version_tuple
        from verl_deploy.doctor.kubernetes_check import node_driver

        floor = image_driver_floor(image)
        if not floor:
            return ""
        for node in sorted({pod.get("spec", {}).get("nodeName") for pod in pods} - {None}):
            try:
                labels = _json(self.cluster.core.read_node(node, _preload_content=False))["metadata"].get("labels", {})
            except ApiException:
                continue
            driver = node_driver(labels)
            if driver and version_tuple(driver) < version_tuple(floor):
                return (f"node {node} has NVIDIA driver {driver}, older than the {floor} this image's CUDA needs: "
                        "upgrade its driver, or steer the run elsewhere (--gpu-type, --node-selector) or use an "
                        "older variant (--variant cu128)")
        return ""

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

    def _workloads(self, run_id: str) -> list[tuple[str, str]]:
        """(kind, name) of the run's Job, or else its RayJob."""
        jobs = self.cluster.batch.list_namespaced_job(self.namespace, label_selector=self._selector(run_id)).items
        if jobs:
            return [("Job", item.metadata.name) for item in jobs]
        return [("RayJob", obj["metadata"]["name"]) for obj in self._ray_jobs(self._selector(run_id))]

    def stop(self, run_id: str) -> str:
        """Delete the workload (its pods get SIGTERM and a grace period to checkpoint); the run claim stays."""
        with api_errors():
            found = self._workloads(run_id)
            if not found:
                raise LaunchError(f"no Kubernetes job for run {run_id!r} in namespace {self.namespace!r}: "
                                  "`verl-deploy runs --target k8s` lists the runs")
            for kind, name in found:
                self.cluster.delete(kind, self.namespace, name, propagation="Foreground")
        what = ", ".join(f"{kind} {name}" for kind, name in found)
        return (f"stopping {run_id}: {what} deleted; its pods get SIGTERM and write a checkpoint to claim "
                f"{run_id}-runs (`verl-deploy run --resume {run_id}` continues)")

    def remove(self, run_id: str, confirm=None) -> list[str]:
        """Remove the run: its workload (a running one is stopped), its ConfigMap and NetworkPolicy, the claims made
        for it (labelled with the run: <run>-runs, the checkpoints, and its own cache) and its run directory here.
        Claims the run was given (--hf-cache NAME, --data NAME) and the namespace's Secret stay: not the run's.
        `confirm(items)` sees what will go before anything does, and raises to keep it all."""
        with api_errors():
            found = self._removable(run_id)
            if not found:
                raise LaunchError(f"no Kubernetes run {run_id!r} in namespace {self.namespace!r} and no run directory "
                                  f"{self.runs_root / run_id}: `verl-deploy runs --target k8s` lists the runs")
            if confirm is not None:
                confirm([what for what, _ in found])
            for _, delete in found:
                delete()
        return [what for what, _ in found]

    def _removable(self, run_id: str) -> list[tuple[str, object]]:
        """(what, how to delete it) for each part of the run that exists."""
        import shutil

        ns = self.namespace
        found = [(f"{kind} {name}", lambda k=kind, n=name: self.cluster.delete(k, ns, n, propagation="Background"))
                 for kind, name in self._workloads(run_id)]
        # A claim's pvc-protection finalizer keeps it until the workload's pods are gone: no need to wait for them.
        for kind in (*WITH_WORKLOAD, "PersistentVolumeClaim"):
            names = self.cluster.names(kind, ns, self._selector(run_id)) if kind in RUN_KINDS else []
            names += self._service_names(kind, run_id) if kind in SERVICE_KINDS else []
            found += [(f"{kind} {name}", lambda k=kind, n=name: self.cluster.delete(k, ns, n))
                      for name in names]
        run_dir = self.runs_root / run_id
        if run_dir.is_dir():
            found.append((f"run directory {run_dir}", lambda: shutil.rmtree(run_dir)))
        return found

    def _service_names(self, kind: str, run_id: str) -> list[str]:
        """The run's service objects of a kind (they carry SERVICE_OF_LABEL, not the run's label: service_objects
        says why). None where this user may not list the kind: a run without services never needed to, and the
        run's Job owns them, so the garbage collector removes them with it all the same."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.cluster.names(kind, self.namespace, f"{SERVICE_OF_LABEL}={run_id}")
        except ApiException as exc:
            if exc.status == 403:
                return []
            raise

    def list(self) -> list[RunStatus]:
        """Every run in the namespace: batch Jobs (one node) and RayJobs (several)."""
        with api_errors():
            return self._list()

    def _list(self) -> list[RunStatus]:
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

    def _ray_jobs(self, selector: str = MANAGED_LABEL) -> list[dict]:
        """The namespace's verl-deploy RayJobs (of one run, by its selector); none where KubeRay's CRD is not
        installed."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.cluster.custom.list_namespaced_custom_object(
                "ray.io", "v1", self.namespace, "rayjobs", label_selector=selector
            )["items"]
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise
