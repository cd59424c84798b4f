"""What the services' HTTP servers share: an ASGI app (Starlette) served by uvicorn, where each JSON endpoint's work
runs in a worker (a thread, or a process: Endpoint.process) behind a gate of bounded concurrency. A request past the
gate's room is turned away at once (503 with Retry-After), never left hanging: the gate answers it in front of the
app, with a reply made once, so that a burst of turned-away calls costs the event loop as little as it can. GET
/health answers beside the gate, GET /metrics in Prometheus' text format (requests, in flight, latency, rejections,
and what a service counts of its own). One log line per request, bodies bounded; turned-away requests a line a
second at most, with their count."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import anyio
import anyio.to_process
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

MAX_REQUEST_BYTES = 1 << 20
RETRY_AFTER_S = 1  # a turned-away request's Retry-After (whole seconds in HTTP); our client's backoff stays below it
SWITCH_INTERVAL_S = 0.001
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class TooLarge(ValueError):
    """A request body over MAX_REQUEST_BYTES."""


class Metrics:
    """A service's Prometheus metrics, in a registry of its own (several servers may share a process: the tests)."""

    def __init__(self, service: str):
        self.service = service
        self.registry = CollectorRegistry()
        self.requests = Counter("verl_deploy_service_requests", "Requests answered, by path and status code",
                                ["service", "path", "code"], registry=self.registry)
        self.in_flight = Gauge("verl_deploy_service_in_flight", "Requests admitted and not yet answered (at work or "
                               "waiting for a worker)", ["service"], registry=self.registry).labels(service)
        self.latency = Histogram("verl_deploy_service_request_seconds", "Seconds from a request's arrival to its "
                                 "answer, admitted requests", ["service", "path"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.rejections = Counter("verl_deploy_service_rejections", "Requests turned away because the service was "
                                  "full (503 with Retry-After)", ["service"], registry=self.registry).labels(service)

    def answered(self, path: str, code: int) -> None:
        self.requests.labels(self.service, path, str(code)).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)


class Gate:
    """At most `workers` requests at work at once and `queue` more waiting for one; a request past that is turned
    away at once. The event loop alone counts admissions, so no lock is needed. A waiting request waits for its turn
    (`turn`) before anything else is done for it, so that a burst's first wave costs the event loop little before
    it reaches the requests it turns away."""

    def __init__(self, workers: int, queue: int):
        if workers < 1 or queue < 0:
            raise ValueError(f"concurrency must be 1 or more and queue 0 or more (got {workers} and {queue})")
        self.workers, self.room = workers, workers + queue
        self.admitted = 0
        self.turn = anyio.Semaphore(workers)
        self.limiter = anyio.CapacityLimiter(workers)  # the workers' own bound (no wait: `turn` comes first)

    def admit(self) -> bool:
        if self.admitted >= self.room:
            return False
        self.admitted += 1
        return True

    def leave(self) -> None:
        self.admitted -= 1

    async def work(self, function, *args, process: bool = False):
        """function(*args) in a worker thread (or a worker process), once one of `workers` is free."""
        if process:
            return await anyio.to_process.run_sync(function, *args, limiter=self.limiter)
        return await anyio.to_thread.run_sync(function, *args, limiter=self.limiter)


@dataclass(frozen=True)
class Endpoint:
    """A JSON POST endpoint: answer(request) -> reply (200), run in a worker thread; a ValueError from it is a 400
    with its first line."""

    paths: tuple[str, ...]
    answer: Callable[[dict], dict]
    # the body of a 400 for a request that is not a JSON object (a service may answer in its API's own shape)
    not_json: Callable[[str], dict] = lambda why: {"message": f"the request is not a JSON object: {why}"}
    # answer in worker processes (anyio's, started as needed and kept): answer and its replies must pickle. For work
    # that spends its time in Python around child processes (the sandbox's runs): in threads, a worker preempted
    # while it holds the GIL stalls the event loop, and with it every 503 and health check, when cores are short.
    process: bool = False
    started: Callable[[], None] = int  # run in each worker process the server starts before it serves (picklable)
    seen: Callable[[dict], None] = lambda reply: None  # called in the server with each reply (a service's metrics)


async def read_json(request: Request) -> dict:
    """The request's JSON object; TooLarge over the bound (read no further), ValueError for anything else."""
    if int(request.headers.get("content-length") or 0) > MAX_REQUEST_BYTES:
        raise TooLarge(f"request of {request.headers['content-length']} bytes is over the limit of {MAX_REQUEST_BYTES}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_REQUEST_BYTES:
            raise TooLarge(f"request over the limit of {MAX_REQUEST_BYTES} bytes")
    try:
        parsed = json.loads(bytes(body) or b"{}")
    except ValueError as exc:
        raise ValueError(str(exc).splitlines()[0]) from None
    if not isinstance(parsed, dict):
        raise ValueError("not a JSON object")
    return parsed


class Gated:
    """ASGI middleware: a POST to one of `paths` passes the gate first. Admitted, it is counted in flight until the
    app has answered it; past the gate's room it is answered here, before routing and before its body is read, with
    a 503 and Retry-After prepared once."""

    def __init__(self, app, name: str, gate: Gate, paths: set[str], metrics: Metrics):
        self.app, self.name, self.gate, self.paths, self.metrics = app, name, gate, paths, metrics
        body = json.dumps({"message": f"{name} is busy ({gate.workers} at work, {gate.room - gate.workers} waiting): "
                                      f"try again in up to {RETRY_AFTER_S} s"}).encode()
        self.busy = ({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(RETRY_AFTER_S).encode())]}, {"type": "http.response.body", "body": body})
        self.unlogged, self.logged_at = 0, 0.0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        if not self.gate.admit():
            self.turned_away(scope["path"])
            await send(self.busy[0])
            await send(self.busy[1])
            return
        self.metrics.in_flight.inc()
        arrived = time.monotonic()
        try:
            async with self.gate.turn:
                await self.app(scope, receive, send)
        finally:
            self.gate.leave()
            self.metrics.in_flight.dec()
            self.metrics.latency.labels(self.name, scope["path"]).observe(time.monotonic() - arrived)

    def turned_away(self, path: str) -> None:
        self.metrics.rejections.inc()
        self.metrics.answered(path, 503)
        self.unlogged += 1
        now = time.monotonic()
        if now - self.logged_at >= 1.0:  # a burst is hundreds a second: its count, not a line each
            sys.stderr.write(f"{self.name}: POST {path} 503 (busy) x{self.unlogged}\n")
            self.unlogged, self.logged_at = 0, now


def app(name: str, endpoints: list[Endpoint], gate: Gate, metrics: Metrics, health: tuple[str, ...] = ("/health",)):
    """The service's ASGI app: its endpoints behind the gate, health and metrics beside it."""

    def log(request: Request, code: int) -> None:
        sys.stderr.write(f"{name}: {request.method} {request.url.path} {code}\n")

    def reply(request: Request, code: int, body: dict | str, **headers) -> Response:
        log(request, code)
        metrics.answered(request.url.path, code)
        if isinstance(body, dict):
            return JSONResponse(body, code, headers=headers)
        return PlainTextResponse(body, code, headers=headers)

    def post(endpoint: Endpoint):
        async def handle(request: Request) -> Response:  # admitted by the gate, its turn come (Gated)
            try:
                body = await read_json(request)
            except TooLarge as exc:
                return reply(request, 413, {"message": str(exc)})
            except ValueError as exc:
                return reply(request, 400, endpoint.not_json(str(exc)))
            try:
                answer = await gate.work(endpoint.answer, body, process=endpoint.process)
            except ValueError as exc:
                return reply(request, 400, {"message": str(exc).splitlines()[0]})
            except anyio.BrokenWorkerProcess:  # killed from outside (the OOM killer): this request only
                return reply(request, 500, {"message": f"the {name} worker answering this request died: try again"})
            endpoint.seen(answer)
            return reply(request, 200, answer)

        return handle

    async def healthy(request: Request) -> Response:
        return PlainTextResponse("pong")

    async def prometheus(request: Request) -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    served = [f"POST {endpoint.paths[0]}" for endpoint in endpoints] + ["GET /health", "GET /metrics"]

    async def not_found(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 404:
            return reply(request, 404, {"message": f"no such path {request.url.path}: {', '.join(served)}"})
        return reply(request, exc.status_code, {"message": exc.detail})

    routes = [Route(path, post(endpoint), methods=["POST"]) for endpoint in endpoints for path in endpoint.paths]
    routes += [Route(path, healthy, methods=["GET"]) for path in health]
    routes += [Route("/metrics", prometheus, methods=["GET"])]

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        for endpoint in endpoints:  # the worker processes started before the first burst, each told so
            if endpoint.process:
                async with anyio.create_task_group() as group:
                    for _ in range(gate.workers):
                        group.start_soon(partial(anyio.to_process.run_sync, endpoint.started, limiter=gate.limiter))
        yield

    starlette = Starlette(routes=routes, exception_handlers={HTTPException: not_found}, lifespan=lifespan)
    return Gated(starlette, name, gate, {path for endpoint in endpoints for path in endpoint.paths}, metrics)


class _Uvicorn(uvicorn.Server):
    """uvicorn's server that says when it serves: after the app's startup (the worker processes started), so that
    a banner printed then is not followed by a burst that waits for them."""

    ready: Callable[[], None] | None = None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.ready is not None:
            self.ready()


class Server:
    """uvicorn serving an app on a socket bound at once (port 0: a free one, in server_port), so that the caller
    knows the address before serving starts; serve_forever in this thread, shutdown from another."""

    def __init__(self, asgi_app, host: str, port: int):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # a deep accept backlog: a burst of connections waits for the loop instead of being refused by the kernel
        self.socket = socket.create_server((host, port), family=family, backlog=4096)
        self.server_port = self.socket.getsockname()[1]
        self.uvicorn = _Uvicorn(uvicorn.Config(asgi_app, lifespan="on", access_log=False, log_level="warning",
                                                     timeout_graceful_shutdown=30))
        self._stopped = threading.Event()
        # What the first request would import (anyio's event-loop backend, its worker threads' code), imported now:
        # otherwise the first burst waits the tens of milliseconds that takes, health checks and 503s included.
        anyio.run(anyio.to_thread.run_sync, int)

    def serve_forever(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until shutdown; ready() once it serves."""
        # The event loop answers health and busy replies; the worker threads' Python (a retriever's searches) must
        # hand it the GIL sooner than the default 5 ms so that those answers come at once.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.uvicorn.ready = ready
        try:
            self.uvicorn.run(sockets=[self.socket])
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        self.uvicorn.should_exit = True
        self._stopped.wait(60)

    def server_close(self) -> None:
        self.socket.close()


def serve_until_stopped(server: Server, banner: str) -> int:
    """Say banner on stderr once it serves, serve until SIGTERM or Ctrl-C (uvicorn finishes what is at work), then
    close; exit code 0."""
    # uvicorn raises the signal it stopped on again once it is done: that second one is a no-op here
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.serve_forever(ready=lambda: print(banner, file=sys.stderr, flush=True))
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
