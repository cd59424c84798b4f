"""A burst of tool calls at one sandbox: N run_code requests, C at a time, as an RL step's tool calls arrive.

The requests are a mix, in a shuffled order (seeded): quick prints (5 in 8), a 1 s sleep, an infinite loop cut at
its 1 s limit, a memory hog stopped at its 128 MB limit (1 in 8 each). Each goes through the tools' own client
(verl_runtime/services/client.py): a request the sandbox turns away (503, Retry-After) is tried again with backoff.

    python bench/sandbox_load.py --requests 1024 --concurrency 128 --json sandbox_load.json
    python bench/sandbox_load.py --url http://127.0.0.1:8080      # a sandbox that already runs

Without --url it starts one (`python -m verl_runtime.services.sandbox --port 0`, --server-concurrency runs at once,
--server-queue waiting). It writes {"requests", "concurrency", "ok", "rejected_then_ok", "errors", "lost",
"p50_ms", "p99_ms", "rps"} and more:
  ok                 answered as the program makes it end (a print or sleep succeeds, the loop is stopped at its
                     time limit, the hog fails with MemoryError): the loop's and hog's failures are theirs, not errors
  rejected_then_ok   of those, the ones turned away at least once first
  errors             answered otherwise (another status, an HTTP error, or still turned away at --deadline)
  lost               no answer at all (the connection dropped, or no reply within --deadline)
  p50_ms, p99_ms     a request's time from its first try to its answer, retries included (answered ones)
  rejections, rejection_max_ms: every 503 the sandbox gave, and the longest it took to give one
  probe_*            the same seen by one more client beside the burst, in a process of its own, that sends a quick
                     print every 50 ms and does not retry: how fast the sandbox turns a request away, apart from the
                     time the burst's own 128 client threads wait for a core on a small machine
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # verl_runtime from this checkout

from verl_runtime.services.client import Busy, post_json  # noqa: E402


def _printed(reply: dict) -> bool:
    run = reply.get("run_result") or {}
    return reply.get("status") == "Success" and run.get("stdout") == "499500\n"


def _slept(reply: dict) -> bool:
    return reply.get("status") == "Success" and (reply.get("run_result") or {}).get("stdout") == "slept\n"


def _stopped(reply: dict) -> bool:
    return (reply.get("run_result") or {}).get("status") == "TimeLimitExceeded"


def _out_of_memory(reply: dict) -> bool:
    return reply.get("status") == "Failed" and "MemoryError" in ((reply.get("run_result") or {}).get("stderr") or "")


# name -> (share in 8, request, what its answer must be)
MIX = {
    "print": (5, {"code": "print(sum(range(1000)))", "run_timeout": 5}, _printed),
    "sleep": (1, {"code": "import time\ntime.sleep(1)\nprint('slept')", "run_timeout": 5}, _slept),
    "loop": (1, {"code": "while True:\n    pass", "run_timeout": 1}, _stopped),
    "hog": (1, {"code": "block = bytearray(1 << 30)\nprint(len(block))", "memory_limit_MB": 128}, _out_of_memory),
}


@dataclass
class Tally:
    ok: int = 0
    rejected_then_ok: int = 0
    program_failures: int = 0
    errors: int = 0
    lost: int = 0
    latencies_ms: list = field(default_factory=list)
    rejections_ms: list = field(default_factory=list)
    samples: list = field(default_factory=list)  # a few errors, as they were

    def add(self, other: Tally) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


def mix(n: int, seed: int) -> list[str]:
    kinds = [name for name, (share, _, _) in MIX.items() for _ in range(share)]
    order = [kinds[i % len(kinds)] for i in range(n)]
    random.Random(seed).shuffle(order)
    return order


def fire(url: str, kind: str, deadline: float, tally: Tally, lock: threading.Lock) -> None:
    _, request, expected = MIX[kind]
    rejections = []
    started = time.monotonic()
    try:
        reply = post_json(url, {"language": "python", **request}, timeout=deadline, within=deadline,
                          on_busy=lambda s: rejections.append(s * 1000))
        outcome = "ok" if expected(reply) else "error"
        seen = reply
    except Busy as exc:
        outcome, seen = "error", str(exc)
    except urllib.error.HTTPError as exc:
        outcome, seen = "error", f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:  # a dropped connection, a timeout: no answer
        outcome, seen = "lost", f"{type(exc).__name__}: {exc}"
    elapsed_ms = (time.monotonic() - started) * 1000
    with lock:
        tally.rejections_ms += rejections
        if outcome == "lost":
            tally.lost += 1
        else:
            tally.latencies_ms.append(elapsed_ms)
        if outcome == "ok":
            tally.ok += 1
            tally.rejected_then_ok += bool(rejections)
            tally.program_failures += kind in ("loop", "hog")
        elif outcome == "error":
            tally.errors += 1
        if outcome != "ok" and len(tally.samples) < 5:
            tally.samples.append({"kind": kind, "outcome": outcome, "seen": seen})


def client(url: str, kinds: list[str], threads: int, deadline: float) -> Tally:
    """One client process: its share of the requests, `threads` at a time (a process of its own, so that the time a
    reply takes to reach its thread is not spent waiting for one GIL shared by all C threads)."""
    tally, lock = Tally(), threading.Lock()
    with ThreadPoolExecutor(threads) as pool:
        for kind in kinds:
            pool.submit(fire, url, kind, deadline, tally, lock)
    return tally


def probe(url: str, stop, found) -> None:
    """One light client beside the burst: a quick print every 50 ms, one try each; the times of its 503s."""
    body = json.dumps({"language": "python", **MIX["print"][1]}).encode()
    while not stop.is_set():
        started = time.monotonic()
        try:
            with urllib.request.urlopen(urllib.request.Request(url, body), timeout=60) as reply:
                reply.read()
        except urllib.error.HTTPError as error:
            error.read()
            if error.code == 503:
                found.append((time.monotonic() - started) * 1000)
        except OSError:
            pass
        stop.wait(0.05)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def start_sandbox(concurrency: int, queue: int | None, log) -> tuple[subprocess.Popen, str]:
    """A sandbox on a free port of this host's loopback, its request lines into log (not through this process)."""
    command = [sys.executable, "-m", "verl_runtime.services.sandbox", "--port", "0", "--concurrency", str(concurrency)]
    if queue is not None:
        command += ["--queue", str(queue)]
    server = subprocess.Popen(command, stderr=log, cwd=Path(__file__).resolve().parent.parent)
    for _ in range(600):
        if found := re.search(r"serving run_code on (http://\S+)", Path(log.name).read_text()):
            return server, found.group(1)
        if server.poll() is not None:
            break
        time.sleep(0.1)
    server.kill()
    sys.exit(f"error: the sandbox did not start: {Path(log.name).read_text().strip()[-500:]}")


def kills(base: str) -> dict:
    """The sandbox's own count of the runs it stopped at a limit (its /metrics)."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {m.group(1): int(float(m.group(2)))
            for m in re.finditer(r'verl_deploy_sandbox_kills_total\{reason="(\w+)"\} (\S+)', text)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--url", help="a sandbox that already runs (http://host:port); default: start one")
    parser.add_argument("--server-concurrency", type=int, default=8, help="runs at once of the sandbox started here")
    parser.add_argument("--server-queue", type=int, default=None, help="requests that may wait there (its default)")
    parser.add_argument("--processes", type=int, default=8, help="client processes the C requests at a time are "
                                                                   "spread over (threads in each)")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds a request may take, retries included")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    log = tempfile.NamedTemporaryFile("w+", prefix="sandbox-", suffix=".log")
    server, base = (None, args.url.rstrip("/")) if args.url else start_sandbox(args.server_concurrency,
                                                                               args.server_queue, log)
    tally = Tally()
    try:
        started = time.monotonic()
        kinds, processes = mix(args.requests, args.seed), min(args.processes, args.concurrency)
        manager = multiprocessing.Manager()
        stop, probed = manager.Event(), manager.list()
        prober = multiprocessing.Process(target=probe, args=(base + "/run_code", stop, probed))
        prober.start()
        with ProcessPoolExecutor(processes) as pool:
            shares = [pool.submit(client, base + "/run_code", kinds[i::processes],
                                  args.concurrency // processes + (i < args.concurrency % processes), args.deadline)
                      for i in range(processes)]
            for share in shares:
                tally.add(share.result())
        wall = time.monotonic() - started
        stop.set()
        prober.join(60)
        probe_ms = list(probed)
        manager.shutdown()
        stopped = kills(base)
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        log.close()
    figures = {
        "requests": args.requests, "concurrency": args.concurrency, "ok": tally.ok,
        "rejected_then_ok": tally.rejected_then_ok, "errors": tally.errors, "lost": tally.lost,
        "p50_ms": round(percentile(tally.latencies_ms, 0.5), 1), "p99_ms": round(percentile(tally.latencies_ms, 0.99), 1),
        "rps": round(args.requests / wall, 2),
        "program_failures": tally.program_failures, "rejections": len(tally.rejections_ms),
        "rejection_max_ms": round(max(tally.rejections_ms, default=0.0), 1),
        "rejection_p99_ms": round(percentile(tally.rejections_ms, 0.99), 1),
        "rejections_over_100ms": sum(ms > 100 for ms in tally.rejections_ms),
        "probe_rejections": len(probe_ms), "probe_rejection_p50_ms": round(percentile(probe_ms, 0.5), 1),
        "probe_rejection_p99_ms": round(percentile(probe_ms, 0.99), 1),
        "probe_rejection_max_ms": round(max(probe_ms, default=0.0), 1),
        "probe_rejections_over_100ms": sum(ms > 100 for ms in probe_ms),
        "sandbox_kills": stopped, "wall_s": round(wall, 1), "server_concurrency": None if args.url else args.server_concurrency,
        "mix": {name: share for name, (share, _, _) in MIX.items()}, "error_samples": tally.samples,
    }
    if args.json:  # first: a reader of the printed figures may stop reading early
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    return 0 if tally.errors == 0 and tally.lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
