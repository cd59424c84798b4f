"""The multi-node pre-flight (`verl-deploy doctor --nodes N`, docs/multinode.md) as the launchers start it on every
node of a run before Ray and the trainer: Slurm (one srun task per node), the Ray cluster on Docker (each container
first), the KubeRay RayJob (each pod before `ray start`). `run --no-preflight` leaves it out."""

from __future__ import annotations

import shlex

from verl_deploy.launchers.jobspec import JobSpec
from verl_runtime.preflight_ray import PORT, TIMEOUT_S  # the rendezvous port on the head; the nodes' wait


def doctor_argv(python: str, nodes: int, rank: str, master_host: str, env_file: str | None = None) -> list[str]:
    """The doctor's command line on one node; `rank` and `master_host` may be shell words ($SLURM_NODEID)."""
    argv = [python, "-m", "verl_deploy", "doctor", "--nodes", str(nodes), "--node-rank", rank,
            "--master", f"{master_host}:{PORT}", "--timeout", str(TIMEOUT_S)]
    return argv + (["--env-file", env_file] if env_file else [])


def ray_step(spec: JobSpec) -> str | None:
    """The shell line that runs the pre-flight on a Ray cluster that is up, before its trainer (verl_runtime's
    preflight_ray: a task on each node); None where none runs (one node, --no-preflight, upstream verl's image)."""
    if spec.nodes == 1 or not spec.preflight or spec.upstream:
        return None
    nodes = spec.nodes + (spec.rollout_pool[0] if spec.rollout_gpus else 0)  # a RayJob's rollout group joins too
    return shlex.join(["python", "-m", "verl_runtime.preflight_ray", "--nodes", str(nodes)])
