"""Launchers: one JobSpec, translated for a target (TorchX-scheduler style).

Every launcher offers the same verbs:
    dry_run(spec) -> str          what would be run (a `docker run` line, Kubernetes YAML), no side effects
    launch(spec, detach) -> int   start it; attached: stream logs, return the run's exit code
    status(run_id) -> RunStatus
    logs(run_id, follow) -> iterator of text
    stop(run_id)                  graceful: SIGTERM, so the runtime checkpoints
    list() -> list[RunStatus]
    remove(run_id, confirm) -> list  `runs rm`: what the run left (an ended one only, except on Kubernetes, where
                                  its workload is deleted); confirm(items) sees the list first and raises to keep it
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator, Protocol

from verl_deploy.compat import DEFAULT_RUNTIME
from verl_deploy.launchers.jobspec import JobSpec, LaunchError
from verl_deploy.runs import RunStatus
from verl_deploy.targets import CLUSTER_TARGETS, TARGETS  # noqa: F401 (callers read them from here too)



class Launcher(Protocol):
    target: str

    def dry_run(self, spec: JobSpec) -> str: ...

    def launch(self, spec: JobSpec, detach: bool = False) -> int: ...

    def status(self, run_id: str) -> RunStatus: ...

    def logs(self, run_id: str, follow: bool = False) -> Iterator[str]: ...

    def stop(self, run_id: str) -> None: ...

    def list(self) -> list[RunStatus]: ...

    def remove(self, run_id: str, confirm: Callable[[list[str]], None] | None = None) -> list[str]: ...


def get_launcher(target: str, runs_root: Path, namespace: str = "default", slurm=None) -> Launcher:
    """The target's launcher; slurm: SlurmOptions (--partition, --account, --time, --container) for `run`."""
    if target == "local":
        from verl_deploy.launchers.local import LocalLauncher

        return LocalLauncher(runs_root)
    if target == "docker":
        from verl_deploy.launchers.docker import DockerLauncher

        return DockerLauncher(runs_root)
    if target == "k8s":
        from verl_deploy.launchers.k8s import K8sLauncher

        return K8sLauncher(runs_root, namespace)
    if target == "slurm":
        from verl_deploy.launchers.slurm import SlurmLauncher

        return SlurmLauncher(runs_root, slurm)
    if target == "direct":  # not a target to launch on: runs `python -m verl_runtime train` started by itself
        from verl_deploy.launchers.direct import DirectLauncher

        return DirectLauncher(runs_root)
    raise LaunchError(f"unknown target {target!r}: use one of {', '.join(TARGETS)}")


__all__ = ["TARGETS", "CLUSTER_TARGETS", "JobSpec", "LaunchError", "Launcher", "get_launcher"]


def default_image(variant: str, runtime: str = DEFAULT_RUNTIME) -> str:
    """The tag `verl-deploy images build --variant V [--runtime R]` produces for a variant as chosen
    (compat.variant_for: a catalog name, never `auto`); nothing is built."""
    from verl_deploy.images import context

    try:
        if runtime != DEFAULT_RUNTIME:  # another runtime offers only some variants: name them
            context.variant(variant, runtime)
        return context.image_tag(variant, runtime_name=runtime)
    except context.ImageError as exc:
        raise LaunchError(str(exc)) from None


def ensure_default_image(variant: str, runtime: str = DEFAULT_RUNTIME) -> str:
    """The variant's image (a catalog name, as compat.variant_for chose it), built first when this host lacks it."""
    from verl_deploy import images

    try:
        return images.ensure(variant, runtime_name=runtime)
    except images.ImageError as exc:
        raise LaunchError(str(exc)) from None
