"""`verl-deploy export RUN` of a run that trained on Kubernetes: its checkpoints are on its run claim (<run>-runs), so
the export runs there, as a Job in the run's namespace, in the run's image.

The Job's pod is the trainer's (launchers/k8s.py: non-root, read-only root, no capabilities, seccomp RuntimeDefault,
no API token) with the run claim and the run's cache claim (the base model's config and tokenizer) mounted, offline,
without a GPU, the config ConfigMap (the trainer Job's TTL may have removed it) or the secrets. It runs `python -m
verl_runtime export <run dir>`, which writes the run's own hf/step_<N> on the claim. It is labelled
verl-deploy.export-of=<run>, never with the run-id label, so that `status`, `stop` and `runs` do not take it for the
trainer. The host cannot read the claim: it prints how to copy the model out (a pod that mounts the claim, kubectl cp).
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from verl_deploy import runs, sizes
from verl_deploy.export import EXPORT_LABEL
from verl_deploy.launchers import k8s
from verl_deploy.launchers.jobspec import RUNS_DIR, JobSpec, LaunchError
from verl_runtime import rundir

DEADLINE_S = 3600  # the Job fails when its pod has not finished by then (e.g. it cannot be scheduled): the wait ends
TTL_AFTER_FINISHED_S = 24 * 3600
POLL_S = 2.0
_DROPPED = ("config", "secrets")  # the trainer pod's volumes that an export does not read


def on_cluster(run_dir: Path) -> bool:
    """A Kubernetes run whose checkpoints are not here (a run directory copied here from the claim exports here)."""
    return runs.target_of(run_dir) == "k8s" and not (run_dir / rundir.CHECKPOINTS_DIR).is_dir()


@dataclass(frozen=True)
class ClusterExport:
    """The export Job of one run, and where its model lands on the claim."""

    run_id: str
    namespace: str
    image: str
    job: dict
    step: int | None

    @property
    def objects(self) -> list[dict]:
        """The Job and a NetworkPolicy that admits no ingress to its pod (the Job owns it once made)."""
        policy = k8s.ingress_policy({**self.job["metadata"], "name": f"{self.name}-ingress"},
                                    dict(self.job["metadata"]["labels"]))
        return [policy, self.job]

    @property
    def name(self) -> str:
        return self.job["metadata"]["name"]

    @property
    def claim(self) -> str:
        return f"{self.run_id}-runs"

    @property
    def model_path(self) -> str:
        """The model's directory on the claim; without --step, the exports' directory (the Job's log names the step)."""
        exports = f"{RUNS_DIR}/{self.run_id}/{rundir.EXPORTS_DIR}"
        return exports if self.step is None else f"{exports}/{rundir.step_dir_name(self.step)}"

    def dry_run(self) -> str:
        return (f"# verl-deploy export {self.run_id}: kubectl apply -f - (writes {self.model_path} on claim "
                f"{self.claim})\n" + k8s.to_yaml(self.objects))


def plan(run_dir: Path, *, step: int | None = None, dtype: str | None = None, max_shard_size: str | None = None,
         out: Path | None = None, image: str | None = None, push_to_hub: str | None = None) -> ClusterExport:
    """The export Job of a Kubernetes run (plain data); LaunchError (one line) for what cannot work."""
    launch = runs.read_launch(run_dir) or runs.Launch()
    run_id = launch.run_id or run_dir.name
    namespace = launch.namespace
    if out is not None:
        raise LaunchError(f"run {run_id} trained on Kubernetes: the export is written on its claim {run_id}-runs, "
                          "not here; drop --out (`export` then prints the kubectl cp that copies it here)")
    if push_to_hub:
        raise LaunchError(f"run {run_id} trained on Kubernetes: its model is written on its claim, not here; export "
                          "it, copy it here as `export` prints, then `hf upload REPO DIR`")
    if launch.upstream:
        raise LaunchError(f"run {run_id} trained upstream verl on Kubernetes, whose checkpoints export does not read "
                          f"on a claim: copy its run directory here (a pod that mounts claim {run_id}-runs, kubectl "
                          "cp), then `verl-deploy export DIR --out OUT`")
    image = image or launch.image
    if not image:
        raise LaunchError(f"run {run_id} records no image to export in: pass --image (the one it trained in)")
    spec = JobSpec(run_id=run_id, image=image, config_path=None, config_text="", namespace=namespace,
                   cache_claim=launch.cache_claim, labels={EXPORT_LABEL: run_id},
                   env={"HF_HUB_OFFLINE": "1", "VERL_RUNTIME_CACHE": "/tmp/verl_runtime"})  # builtin:tiny: built there
    args = ["export", spec.container_run_dir, *(["--step", str(step)] if step is not None else []),
            *(["--dtype", dtype] if dtype else []), *(["--max-shard-size", max_shard_size] if max_shard_size else [])]
    name = f"{run_id[:41].rstrip('-')}-export-{_stamp()}"  # a Job's name is at most 63 characters
    return ClusterExport(run_id, namespace, image, export_job(spec, name, args, _trainer_memory(launch)), step)


def _stamp() -> str:
    """A new Job for each export (a Job's template cannot change, and a finished one does not run again)."""
    return time.strftime("%Y%m%d%H%M%S", time.gmtime())


def _trainer_memory(launch: runs.Launch) -> int:
    """The trainer pod's memory: the export loads the same checkpoint (weights and optimizer state)."""
    try:
        gpus = sizes.parse_gpus(launch.gpus).number or 0  # a recorded value, not a run's --gpus
    except sizes.SizeError:
        gpus = 0
    return sizes.pod_size(gpus).memory_limit


def export_job(spec: JobSpec, name: str, args: list[str], memory: int) -> dict:
    main = k8s.container(spec, "export", args)
    main["volumeMounts"] = [m for m in main["volumeMounts"] if m["name"] not in _DROPPED]
    quantity = sizes.k8s_quantity(memory)
    disk = k8s.ephemeral_storage(k8s.tmp_size(spec))  # its /tmp, as the trainer's pod has it
    main["resources"] = {"requests": {"cpu": sizes.k8s_cpus(sizes.CPU_ONLY_CPUS), "memory": quantity, **disk},
                         "limits": {"memory": quantity, **disk}}
    pod = k8s.pod_spec(spec, main, "Never", fetch=False)
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] not in _DROPPED]
    pod.pop("tolerations", None)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": spec.namespace, "labels": dict(spec.labels)},
        "spec": {
            "backoffLimit": 0,  # an export that failed fails the same way again
            "activeDeadlineSeconds": DEADLINE_S,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {"metadata": {"labels": dict(spec.labels)}, "spec": pod},
        },
    }


def copy_commands(export: ClusterExport, to: str) -> list[str]:
    """kubectl cp needs a running pod that mounts the claim (the export's has ended): one made for the copy, read-only,
    hardened as the export's pod, deleted after."""
    pod = f"{export.run_id[:50].rstrip('-')}-copy"
    hardened = export.job["spec"]["template"]["spec"]
    overrides = {"apiVersion": "v1", "spec": {
        "securityContext": hardened["securityContext"], "automountServiceAccountToken": False,
        "containers": [{"name": pod, "image": export.image, "command": ["sleep", "3600"],
                        "securityContext": hardened["containers"][0]["securityContext"],
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "256Mi"}},
                        "volumeMounts": [{"name": "runs", "mountPath": RUNS_DIR, "readOnly": True}]}],
        "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": export.claim, "readOnly": True}}]}}
    ns = shlex.quote(export.namespace)
    return [
        f"kubectl -n {ns} run {pod} --image {shlex.quote(export.image)} --restart=Never "
        f"--overrides {shlex.quote(json.dumps(overrides, separators=(',', ':')))}",
        f"kubectl -n {ns} wait --for=condition=Ready pod/{pod} --timeout=5m",
        f"kubectl -n {ns} cp {pod}:{export.model_path} {shlex.quote(to)}",
        f"kubectl -n {ns} delete pod {pod}",
    ]


def run(export: ClusterExport, cluster: k8s.Cluster, *, detach: bool = False, echo=print) -> None:
    """Create the Job, wait for it (unless detach) and say how to copy the model here; LaunchError (one line) when
    the export fails on the cluster."""
    cluster.check_namespace(export.namespace)
    with k8s.api_errors():
        policy, job = (cluster.apply(obj) for obj in export.objects)
        cluster.set_owner("NetworkPolicy", export.namespace, policy["metadata"]["name"], k8s.owner_reference(job))
    echo(f"export Job {export.name} created in namespace {export.namespace}")
    if not detach:
        _wait(export, cluster)
        echo(f"exported run {export.run_id}: {export.model_path} on claim {export.claim}")
    else:
        echo(f"follow it: kubectl -n {export.namespace} wait --for=condition=complete job/{export.name} --timeout=1h")
    here = f"{export.run_id}-{Path(export.model_path).name}"
    echo(f"copy it here ({here}/) with a pod that mounts the claim:")
    for command in copy_commands(export, here):
        echo(f"  {command}")


def _pause() -> None:
    time.sleep(POLL_S)


def _wait(export: ClusterExport, cluster: k8s.Cluster) -> None:
    while True:
        with k8s.api_errors():
            state, detail = k8s.job_state(cluster.batch.read_namespaced_job(export.name, export.namespace))
        if state == "succeeded":
            return
        if state in ("failed", "stopped"):
            why = _last_error(export, cluster) or detail or state
            raise LaunchError(f"the export of run {export.run_id} failed on the cluster ({why}): "
                              f"`kubectl -n {export.namespace} logs job/{export.name}` shows its log")
        _pause()


def _last_error(export: ClusterExport, cluster: k8s.Cluster) -> str:
    """The failed export's own one-line error (its pod's log), where the cluster still has it."""
    return cluster.last_error(export.namespace, f"job-name={export.name}", "export").removeprefix("error: ")
