"""The multi-node pre-flight on a Ray cluster that is already up (a KubeRay RayJob's, the Docker target's Ray
cluster): `python -m verl_runtime.preflight_ray --nodes N`, run where the trainer's driver runs, before the
trainer. It waits for the N nodes to join, then runs `verl-deploy doctor --nodes N` in one Ray task pinned to each
other node (placed by Ray as the trainer's workers are: collectives that work under torchrun can fail inside Ray,
ray #61073) and as rank 0 here, the master. Its exit code is the doctor's: 0 ready, 1 a finding failed."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time

# The doctor's rendezvous port on the master (verl_deploy.launchers.preflight reads it here). torchrun's default:
# our trainer meets through Ray, not torchrun, so nothing of a run listens there; the doctor also takes the next
# port (gloo's store) and is done before the trainer starts.
PORT = 29400
TIMEOUT_S = 30  # the nodes of one job start within seconds of each other; a missing one is named after this
NODES_WAIT_S = 120.0  # the Ray workers' pods or containers may still be starting


def doctor(nodes: int, rank: str, master: str, timeout_s: float) -> tuple[int, str]:
    argv = [sys.executable, "-m", "verl_deploy", "doctor", "--nodes", str(nodes), "--node-rank", rank,
            "--master", f"{master}:{PORT}", "--timeout", str(timeout_s)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 120)
    return done.returncode, (done.stdout + done.stderr).strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S)
    args = parser.parse_args()
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    here = ray.util.get_node_ip_address()
    deadline = time.monotonic() + NODES_WAIT_S
    while len(alive := [n for n in ray.nodes() if n["Alive"]]) < args.nodes and time.monotonic() < deadline:
        time.sleep(1)
    if len(alive) < args.nodes:
        print(f"FAIL join: only {len(alive)} of {args.nodes} Ray nodes joined within {NODES_WAIT_S:g} s -> see the "
              "missing workers' logs (`ray status`; kubectl describe pod)", flush=True)
        return 1
    others = [n for n in alive if n["NodeManagerAddress"] != here][: args.nodes - 1]
    remote = ray.remote(num_cpus=0)(doctor)
    refs = [remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(args.nodes, "auto", here, args.timeout) for n in others]
    print(f"[INFO] pre-flight across {args.nodes} nodes from {socket.gethostname()} ({here})", flush=True)
    code, output = doctor(args.nodes, "0", here, args.timeout)
    print(output, flush=True)
    worst = max([code, *(c for c, _ in ray.get(refs, timeout=args.timeout + 180))])
    return worst


if __name__ == "__main__":
    sys.exit(main())
