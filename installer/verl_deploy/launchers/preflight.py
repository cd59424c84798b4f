"""The multi-node pre-flight (`verl-deploy doctor --nodes N`, docs/multinode.md) as the launchers start it on every
node of a run before Ray and the trainer: Slurm (one srun task per node), the Ray cluster on Docker (each container
first), the KubeRay RayJob (each pod before `ray start`). `run --no-preflight` leaves it out."""

from __future__ import annotations

# The rendezvous port on the head. torchrun's default rendezvous port: our trainer meets through Ray, not torchrun,
# so nothing of the run listens there; the pre-flight also takes the next one (gloo's store), and ends before Ray.
PORT = 29400
TIMEOUT_S = 30  # the nodes of one job start within seconds of each other; a missing one is named after this


def doctor_argv(python: str, nodes: int, rank: str, master_host: str, env_file: str | None = None) -> list[str]:
    """The doctor's command line on one node; `rank` and `master_host` may be shell words ($SLURM_NODEID)."""
    argv = [python, "-m", "verl_deploy", "doctor", "--nodes", str(nodes), "--node-rank", rank,
            "--master", f"{master_host}:{PORT}", "--timeout", str(TIMEOUT_S)]
    return argv + (["--env-file", env_file] if env_file else [])
