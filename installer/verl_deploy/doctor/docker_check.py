"""Docker: engine reachable (socket or DOCKER_HOST), version, socket permission, GPU support, GPU smoke test."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from verl_deploy.doctor.core import Context, Finding, describe_error, root_cause
from verl_deploy.watchdog import call_with_timeout

AREA = "docker"
DEFAULT_SOCKET = "/var/run/docker.sock"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
NVIDIA_HOOKS = ("nvidia-container-runtime-hook", "nvidia-container-toolkit")
SMOKE_TIMEOUT_S = 60.0
SDK_TIMEOUT_MARGIN_S = 10
START_REMEDY = "start the engine (`sudo systemctl start docker`) or point DOCKER_HOST at a running one"
GROUP_REMEDY = "add yourself to the docker group: `sudo usermod -aG docker $USER`, then log in again"
TOOLKIT_REMEDY = (
    "install the NVIDIA Container Toolkit, then "
    "`sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker`"
)


def check(ctx: Context) -> list[Finding]:
    host = os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
    socket = host.removeprefix("unix://") if host.startswith("unix://") else None
    if socket is not None:
        problem = _socket_problem(socket, explicit="DOCKER_HOST" in os.environ)
        if problem:
            return [problem]
    import docker  # imported before the clock starts: a slow import on a loaded host is not a silent engine

    try:
        version, info, client = call_with_timeout(lambda: _connect(docker, ctx.timeout_s), ctx.timeout_s)
    except Exception as exc:
        if isinstance(root_cause(exc), PermissionError):
            return [Finding(AREA, "engine", "fail", f"permission denied on {host}", GROUP_REMEDY)]
        return [Finding(AREA, "engine", "fail", f"no Docker engine answers at {host}: {describe_error(exc)}",
                        START_REMEDY)]
    findings = [
        Finding(AREA, "engine", "ok", f"Docker {version.get('Version')} (API {version.get('ApiVersion')}) at {host}"),
        _gpu_support(ctx, info),
    ]
    findings += _stale_images(client)
    if ctx.gpu_smoke:
        findings.append(_smoke(ctx, client))
    return findings


def _stale_images(client: Any) -> list[Finding]:
    """A warning per local image of ours that would train other code than this CLI's."""
    from verl_deploy.images.stale import rebuild_hint, stale_reason

    try:
        images = client.images.list(filters={"label": "verl-deploy.variant"})
    except Exception as exc:  # the engine answered once; a failing list is not this check's to report
        return [Finding(AREA, "images", "skip", f"local images not listed: {describe_error(exc)}")]
    findings = []
    for image in images:
        reason = stale_reason(image.labels or {})
        if reason:
            name = image.tags[0] if image.tags else image.short_id
            findings.append(Finding(AREA, f"image {name}", "warn", f"stale: {reason}",
                                    f"rebuild it: {rebuild_hint(image.labels)}"))
    return findings


def _socket_problem(socket: str, explicit: bool) -> Finding | None:
    path = Path(socket)
    if not path.exists():
        if explicit:
            return Finding(AREA, "engine", "fail", f"DOCKER_HOST names {socket}, which does not exist", START_REMEDY)
        return Finding(
            AREA, "engine", "warn", f"no Docker engine found ({socket} missing, DOCKER_HOST unset)",
            "install Docker for --target docker (e.g. `apt-get install docker.io`); --target local works without",
        )
    if not os.access(path, os.R_OK | os.W_OK):
        return Finding(AREA, "engine", "fail", f"permission denied on {socket}", GROUP_REMEDY)
    return None


def _connect(docker: Any, timeout_s: float) -> tuple[dict[str, Any], dict[str, Any], Any]:
    # The SDK's own socket timeout is longer than the watchdog's (call_with_timeout), so an engine that accepts
    # and never answers is always reported by the watchdog, in the same words, whichever thread runs first.
    client = docker.from_env(timeout=int(timeout_s) + SDK_TIMEOUT_MARGIN_S)
    return client.version(), client.info(), client


def _gpu_support(ctx: Context, info: dict[str, Any]) -> Finding:
    ways = []
    if "nvidia" in (info.get("Runtimes") or {}):
        ways.append("nvidia runtime registered")
    specs = _cdi_specs(info.get("CDISpecDirs") or CDI_DIRS)
    if specs:
        ways.append(f"CDI specs: {', '.join(str(s) for s in specs)}")
    hooks = [hook for hook in NVIDIA_HOOKS if shutil.which(hook)]
    if hooks:
        ways.append(f"{hooks[0]} installed (--gpus)")
    if ways:
        return Finding(AREA, "gpu support", "ok", "; ".join(ways))
    if not ctx.gpus:
        return Finding(AREA, "gpu support", "skip", "no GPU on this host: containers run the cpu variant")
    return Finding(AREA, "gpu support", "warn", "GPUs present but Docker cannot hand them to containers",
                   TOOLKIT_REMEDY)


def _cdi_specs(dirs: tuple[str, ...] | list[str]) -> list[Path]:
    """CDI spec files that describe NVIDIA GPUs (kind nvidia.com/gpu)."""
    found = []
    for folder in dirs:
        for spec in sorted(Path(folder).glob("*")) if Path(folder).is_dir() else []:
            if spec.suffix in (".yaml", ".yml", ".json") and "nvidia.com/gpu" in _read(spec):
                found.append(spec)
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _smoke(ctx: Context, client: Any) -> Finding:
    """Run `nvidia-smi -L` in a container with all GPUs: proves engine, toolkit and driver together."""
    if not ctx.gpus:
        return Finding(AREA, "gpu smoke", "skip", "no GPU on this host")
    images = client.images.list(filters={"label": "verl-deploy.variant"})
    if not images:
        return Finding(AREA, "gpu smoke", "skip", "no verl-deploy image to run it in",
                       "build one: verl-deploy images build --variant auto")
    import docker

    image = images[0].tags[0] if images[0].tags else images[0].id
    try:
        output = call_with_timeout(
            lambda: client.containers.run(
                image, ["nvidia-smi", "-L"], entrypoint="", remove=True,
                device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu", "utility"]])],
            ),
            SMOKE_TIMEOUT_S,
        )
    except Exception as exc:
        return Finding(AREA, "gpu smoke", "fail", f"a GPU container in {image} failed: {describe_error(exc)}",
                       TOOLKIT_REMEDY)
    gpus = [line for line in output.decode().splitlines() if line.startswith("GPU ")]
    return Finding(AREA, "gpu smoke", "ok", f"a container in {image} sees {len(gpus)} GPU(s)")
