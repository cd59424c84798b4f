"""A code sandbox that speaks SandboxFusion's `run_code` HTTP API, for tool-calling RL (issue #40).

verl's code tools and its sandbox_fusion reward scorer (verl/utils/reward_score/sandbox_fusion/utils.py,
call_sandbox_api) POST {"code", "language", "stdin", "run_timeout", "compile_timeout", "memory_limit_MB", "files",
"fetch_files"} to a `.../run_code` URL and read back SandboxFusion's reply: {"status": "Success" | "Failed" |
"SandboxError", "message", "compile_result", "run_result": {"status": "Finished" | "TimeLimitExceeded" | "Error",
"execution_time", "return_code", "stdout", "stderr"}, "executor_pod_name", "files"}. Pointing such a URL here works
for our runtime and for upstream verl alike.

Each request runs untrusted code in a child process that the kernel confines (confined.py: no network, not root,
limits of time, memory, output and processes, nothing of the server's environment).

At most --concurrency runs at once and --queue requests waiting; past that a request is answered at once with 503
and Retry-After (serving.py), and GET /metrics counts requests, rejections and the runs stopped at a limit. Each run
is started and waited for by a worker process, not a thread of the server (serving.Endpoint.process), so that the
server's event loop answers at once however busy the cores are.

Run it: `python -m verl_runtime.services.sandbox --port 8080` (GET /health for readiness).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

# Only the standard library and confined.py at the top: the worker processes load this module again when it is the
# server's __main__ (anyio's workers do), and the server's stack (serving: uvicorn, Starlette, Prometheus) is
# imported where it serves.
from verl_runtime.services.confined import Limits, in_worker, kill, lower_priority, reply, run_code

ISOLATIONS = ("namespace", "external")
# Requests that may wait for a run, per run at once: a burst of an RL step's tool calls waits a few runs' time
# instead of polling; past that, a request is turned away (503, Retry-After) and its client retries.
QUEUE_PER_RUN = 8


def check_workdirs() -> None:
    """OSError (one line) where no run could have a working directory of its own: no writable temporary directory
    (a read-only container without a tmpfs at /tmp), where every request would fail."""
    import tempfile

    try:
        tempfile.gettempdir()
    except FileNotFoundError:
        raise OSError("no writable temporary directory for the runs' working directories: give the sandbox one at "
                      "/tmp (a read-only container: docker run --tmpfs /tmp, a Kubernetes emptyDir) or name one "
                      "in TMPDIR") from None


def check_isolation(isolation: str) -> None:
    """ValueError (one line) where this host cannot cut a child off the network and nothing else does."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"--network-isolation {isolation!r}: use {' or '.join(ISOLATIONS)}")
    if isolation == "external":
        return
    probe = run_code({"code": "print('ok')", "run_timeout": 10}, Limits(), isolation)
    if probe["status"] != "Success":
        why = probe["message"] or ((probe["run_result"] or {}).get("stderr") or "").strip()
        raise ValueError(f"the sandbox cannot give its runs a network namespace of their own here ({why}): run it "
                         "in a container without a network (docker run --network none) and pass "
                         "--network-isolation external")


def app(limits: Limits = Limits(), isolation: str = "namespace", concurrency: int | None = None,
        queue: int | None = None):
    """The sandbox's ASGI app: at most `concurrency` runs at once (default: one per CPU), `queue` more waiting
    (default: QUEUE_PER_RUN per run), the rest turned away with 503 and Retry-After."""
    from prometheus_client import Counter

    from verl_runtime.services import serving

    metrics = serving.Metrics("sandbox")
    kills = Counter("verl_deploy_sandbox_kills", "Runs the sandbox stopped at a limit (time, cpu, output)",
                    ["reason"], registry=metrics.registry)

    def count(answer: dict) -> None:
        if reason := kill(answer):
            kills.labels(reason).inc()

    workers = concurrency or os.cpu_count() or 1
    gate = serving.Gate(workers, QUEUE_PER_RUN * workers if queue is None else queue)
    endpoint = serving.Endpoint(("/run_code", "/v1/run_code"),
                                functools.partial(in_worker, limits=limits, isolation=isolation),
                                lambda why: reply("SandboxError", f"the request is not a JSON object: {why}", None),
                                process=True, started=functools.partial(lower_priority, limits.nice), seen=count)
    return serving.app("sandbox", [endpoint], gate, metrics, health=("/health", "/v1/ping"))


def serve(host: str, port: int, limits: Limits = Limits(), isolation: str = "namespace",
          concurrency: int | None = None, queue: int | None = None):
    """The HTTP server (serving.Server, not yet serving: call serve_forever); ValueError (one line) for an isolation
    this host lacks."""
    from verl_runtime.services import serving

    check_workdirs()
    check_isolation(isolation)
    return serving.Server(app(limits, isolation, concurrency, queue), host, port)


def main(argv=None) -> int:
    from verl_runtime.services import serving
    from verl_runtime.services.registry import NICE_BESIDE_TRAINER

    parser = argparse.ArgumentParser(prog="python -m verl_runtime.services.sandbox", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--network-isolation", default="namespace",
                        help="namespace: each run gets a network namespace of its own (none); external: the "
                             "container the sandbox runs in has no network")
    parser.add_argument("--concurrency", type=int, default=None, help="runs at a time (default: one per CPU)")
    parser.add_argument("--queue", type=int, default=None, help="requests that may wait for a run; past them, 503 "
                                                                 f"with Retry-After (default: {QUEUE_PER_RUN} per run)")
    parser.add_argument("--memory-mb", type=int, default=Limits.memory_mb)
    parser.add_argument("--run-timeout", type=float, default=Limits.run_timeout_s)
    parser.add_argument("--nice", type=int, choices=range(20), default=Limits.nice, metavar="0-19",
                        help="the runs' CPU priority, below the server's so that it answers at once however many "
                             f"runs burn CPU (default: {Limits.nice}; the trainer starts the sandbox beside itself "
                             f"with {NICE_BESIDE_TRAINER}, as its runs share the trainer's CPU)")
    args = parser.parse_args(argv)
    try:
        server = serve(args.host, args.port, Limits(run_timeout_s=args.run_timeout, memory_mb=args.memory_mb,
                                                    nice=args.nice),
                       args.network_isolation, args.concurrency, args.queue)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return serving.serve_until_stopped(server, f"sandbox: serving run_code on http://{args.host}:{server.server_port}")


if __name__ == "__main__":
    sys.exit(main())
