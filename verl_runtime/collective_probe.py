"""The collectives the multi-node pre-flight runs on every node (`verl-deploy doctor --nodes N`): a gloo
all_reduce and a monitored barrier, and on GPUs an NCCL all_reduce, each with a timeout of seconds. The host CLI
never imports torch: it runs this as `python -m verl_runtime.collective_probe` and reads the one JSON line it
prints last (with NCCL_DEBUG=INFO's lines before it, for verl_deploy.doctor.nccl_log to judge).

Bus bandwidth as nccl-tests defines it for all_reduce (its doc/PERFORMANCE.md): algbw x 2(n-1)/n."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from datetime import timedelta

RESULT_PREFIX = "PREFLIGHT_RESULT "
GLOO_ELEMENTS = 1 << 18  # 1 MiB of float32: enough to cross every link, quick on a slow one
NCCL_BYTES = 256 * 2**20  # large enough that the bus bandwidth, not latency, is measured
NCCL_ITERATIONS = 5


def _gloo(rank: int, world: int, timeout: timedelta) -> dict:
    import torch
    import torch.distributed as dist

    started = time.monotonic()
    tensor = torch.full((GLOO_ELEMENTS,), float(rank + 1))
    dist.all_reduce(tensor)
    expected = world * (world + 1) / 2
    if float(tensor[0]) != expected:
        return {"ok": False, "error": f"all_reduce gave {float(tensor[0])}, not {expected}"}
    dist.monitored_barrier(timeout=timeout, wait_all_ranks=True)
    return {"ok": True, "seconds": round(time.monotonic() - started, 3)}


def _nccl(rank: int, world: int, timeout: timedelta) -> dict:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)  # one process per node: its first GPU
    group = dist.new_group(backend="nccl", timeout=timeout)
    tensor = torch.ones(NCCL_BYTES // 4, device="cuda")
    dist.all_reduce(tensor, group=group)  # warm-up: connects the transports
    torch.cuda.synchronize()
    started = time.monotonic()
    for _ in range(NCCL_ITERATIONS):
        dist.all_reduce(tensor, group=group)
    torch.cuda.synchronize()
    seconds = (time.monotonic() - started) / NCCL_ITERATIONS
    algbw = NCCL_BYTES / seconds / 1e9
    return {"ok": True, "seconds": round(seconds, 4), "busbw_gbps": round(algbw * 2 * (world - 1) / world, 2)}


def _watchdog(result: dict, stage: list[str], seconds: float) -> threading.Timer:
    """gloo's connect to a peer whose port is dropped can outlast the group's timeout: after `seconds` the probe
    reports where it was stuck and ends, so the finding comes in seconds, never a hang."""
    def fire() -> None:
        key = "nccl" if stage[0].startswith("nccl") else "gloo"
        result[key] = {"ok": False, "error": f"stuck for {seconds:g} s in {stage[0]}: a node cannot reach another's "
                                             "ports"}
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        os._exit(0)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


def probe(master: str, port: int, rank: int, world: int, timeout_s: float, nccl: bool) -> dict:
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    result: dict = {"rank": rank}
    stage = ["gloo's rendezvous and full mesh (init_process_group)"]
    _watchdog(result, stage, timeout_s + 5)
    try:
        store = dist.TCPStore(master, port, world, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        stage[0] = "gloo's all_reduce and barrier"
        result["gloo"] = _gloo(rank, world, timeout)
        stage[0] = "nccl's all_reduce"
    except Exception as exc:  # every failure is the finding: report it, never hang
        result["gloo"] = {"ok": False, "error": _one_line(exc)}
        return result
    if nccl:
        try:
            result["nccl"] = _nccl(rank, world, timeout)
        except Exception as exc:
            result["nccl"] = {"ok": False, "error": _one_line(exc)}
    dist.destroy_process_group()
    return result


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--master", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--nccl", action="store_true")
    args = parser.parse_args()
    result = probe(args.master, args.port, args.rank, args.world, args.timeout, args.nccl)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
