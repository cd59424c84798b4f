"""The run's services (config.services) for the length of a run: each one that a launcher already runs (its URL in
the trainer's environment, registry.url_env) or that the config points at (services.<name>.url) is checked; each
other one is started here as a process beside the trainer, its log in <run_dir>/services/<name>.log. All are
health-checked before the first step and the processes stopped with the run, however it ends."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from verl_runtime.errors import ConfigError
from verl_runtime.rundir import SERVICES_DIR, SERVICES_FILE
from verl_runtime.services.health import healthy
from verl_runtime.services.registry import Service, declared, url_env

_SERVING = re.compile(r"serving \w+ on (http://\S+)")
STOP_GRACE_S = 10


def _die_with_parent() -> None:
    """Linux: the service gets SIGTERM when the trainer dies, even by SIGKILL (no orphan outlives the run)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def last_line(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return "(its log is empty)"


def wait_healthy(base: str, service: Service, timeout: float, process: subprocess.Popen | None = None,
                 log: Path | None = None) -> None:
    """Until GET <base>/health answers 200; ConfigError (one line, with the log's last line) past the timeout or
    when its process ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ConfigError(f"service {service.name} exited with code {process.returncode} before it became "
                              f"healthy: {last_line(log)} (its log: {log})")
        if healthy(service.health_url(base)):
            return
        time.sleep(0.2)
    said = f": {last_line(log)} (its log: {log})" if log else ""
    raise ConfigError(f"service {service.name} at {base} did not become healthy in {timeout:g} s "
                      f"(services.health_timeout){said}")


def _served_at(process: subprocess.Popen, log: Path, service: Service, timeout: float) -> str:
    """The base URL a service started with --port 0 says it serves on (its first log line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if found := _SERVING.search(log.read_text(errors="replace")):
                return found.group(1)
        if process.poll() is not None:
            raise ConfigError(f"service {service.name} exited with code {process.returncode} before it became healthy: "
                              f"{last_line(log)} (its log: {log})")
        time.sleep(0.1)
    raise ConfigError(f"service {service.name} did not start in {timeout:g} s (services.health_timeout): "
                      f"{last_line(log)} (its log: {log})")


def start(service: Service, settings, run_dir: Path, timeout: float) -> tuple[subprocess.Popen, str]:
    """The service as a child process on a free port of this host's loopback, healthy; its base URL."""
    log = run_dir / SERVICES_DIR / f"{service.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.truncate(0)  # this start's log only: a resumed run starts its services again
        process = subprocess.Popen([sys.executable, *service.args(settings, port=0)], stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    try:
        base = _served_at(process, log, service, timeout)
        wait_healthy(base, service, timeout, process, log)
    except BaseException:
        stop(process)
        raise
    return process, base


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _given(service: Service, config, environ=None) -> str | None:
    """Where something else runs the service: the launcher's container (its URL in the environment), or the
    config's services.<name>.url; None: nothing does."""
    environ = os.environ if environ is None else environ
    return environ.get(url_env(service.name)) or getattr(config.services, service.name).url


def given_urls(config, environ=None) -> dict[str, str]:
    """{name: base URL} of the declared services something else runs (a launcher's container, services.<name>.url);
    ConfigError for one that nothing runs."""
    urls = {}
    for service in declared(config):
        urls[service.name] = _given(service, config, environ)
        if not urls[service.name]:
            raise ConfigError(f"services.{service.name} is declared but nothing runs it: train with `python -m "
                              "verl_runtime train`, which starts it, or give its services."
                              f"{service.name}.url")
    return urls


@contextlib.contextmanager
def running(config, environ=None):
    """The run's services for the length of the with-block; yields {name: base URL}."""
    timeout = config.services.health_timeout
    urls, processes = {}, []
    try:
        for service in declared(config):
            if given := _given(service, config, environ):
                wait_healthy(given, service, timeout)
                urls[service.name] = given
                print(f"service {service.name}: {given} is healthy", flush=True)
                continue
            process, urls[service.name] = start(service, getattr(config.services, service.name), config.run_dir,
                                                timeout)
            processes.append(process)
            print(f"service {service.name}: started on {urls[service.name]} (pid {process.pid}; its log: "
                  f"{config.run_dir / SERVICES_DIR / (service.name + '.log')})", flush=True)
        if urls:
            (config.run_dir / SERVICES_FILE).write_text(json.dumps(urls, indent=2) + "\n")
        yield urls
    finally:
        for process in reversed(processes):
            stop(process)
        with contextlib.suppress(OSError):
            (config.run_dir / SERVICES_FILE).unlink(missing_ok=True)
