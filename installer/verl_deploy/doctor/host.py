"""Host: OS, Python, CPU cores, memory, disk where runs and models go, /dev/shm, locked-memory limit."""

from __future__ import annotations

import os
import platform
import resource
import shutil
import sys
from pathlib import Path

from verl_deploy.doctor.core import Context, Finding

AREA = "host"
GIB = 2**30
MIN_PYTHON = (3, 10)
MIN_RAM_GIB = 8
DISK_WARN_GIB = 20  # a 7B model, its checkpoints and an image take tens of GiB
DISK_FAIL_GIB = 1
SHM_WARN_GIB = 1  # Docker's default is 64 MiB; PyTorch dataloader workers and NCCL need far more


def check(ctx: Context) -> list[Finding]:
    findings = [_os(), _python(), _cores(), _ram()]
    findings += [_disk(label, path) for label, path in data_dirs().items()]
    findings += [_shm(), _memlock(has_gpus=bool(ctx.gpus))]
    return findings


def data_dirs() -> dict[str, Path]:
    """Where runs (checkpoints, metrics) and downloaded models go."""
    from verl_deploy.runs import default_runs_root

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    hf_home = os.environ.get("HF_HOME") or cache / "huggingface"
    return {"runs": default_runs_root().absolute(), "model cache": Path(hf_home)}


def _os() -> Finding:
    name = platform.system()
    pretty = _os_release().get("PRETTY_NAME", name)
    message = f"{pretty}, kernel {platform.release()}, {platform.machine()}"
    if name != "Linux":
        return Finding(AREA, "os", "warn", f"{message}: GPU runs need Linux", "use Linux (or WSL2) for GPU runs")
    return Finding(AREA, "os", "ok", message)


def _os_release() -> dict[str, str]:
    try:
        lines = Path("/etc/os-release").read_text().splitlines()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in lines if "=" in line)
    return {key: value.strip('"') for key, value in pairs}


def _python() -> Finding:
    version = platform.python_version()
    if sys.version_info < MIN_PYTHON:
        return Finding(AREA, "python", "fail", f"Python {version} is too old", "install Python >= 3.10")
    return Finding(AREA, "python", "ok", f"Python {version} ({sys.executable})")


def _cores() -> Finding:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return Finding(AREA, "cpu cores", "ok", f"{usable} usable of {os.cpu_count()}")


def _ram() -> Finding:
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GIB
    message = f"{total:.1f} GiB"
    if total < MIN_RAM_GIB:
        return Finding(AREA, "memory", "warn", f"{message}: tight beyond the tiny quickstart model",
                       f"use a host with >= {MIN_RAM_GIB} GiB for real models")
    return Finding(AREA, "memory", "ok", message)


def _disk(label: str, path: Path) -> Finding:
    existing = next(p for p in (path, *path.parents) if p.exists())
    free = shutil.disk_usage(existing).free / GIB
    message = f"{free:.0f} GiB free at {existing}" if existing == path else f"{free:.0f} GiB free for {path}"
    name = f"disk ({label})"
    if free < DISK_FAIL_GIB:
        return Finding(AREA, name, "fail", f"{message}: runs will not fit", "free disk space or point it elsewhere")
    if free < DISK_WARN_GIB:
        return Finding(AREA, name, "warn", f"{message}: too little for real models and checkpoints",
                       f"free space (>= {DISK_WARN_GIB} GiB) or point it at a bigger disk")
    return Finding(AREA, name, "ok", message)


def _shm() -> Finding:
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return Finding(AREA, "/dev/shm", "skip", "no /dev/shm on this system")
    size = stat.f_blocks * stat.f_frsize / GIB
    message = f"{size:.1f} GiB"
    if size < SHM_WARN_GIB:
        return Finding(
            AREA, "/dev/shm", "warn", f"{message}: PyTorch workers and NCCL need more",
            "give containers more: docker run --shm-size=16g (compose: shm_size; k8s: an emptyDir of medium Memory)",
        )
    return Finding(AREA, "/dev/shm", "ok", message)


def _memlock(has_gpus: bool) -> Finding:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return Finding(AREA, "ulimit -l", "ok", "unlimited")
    message = f"{soft // 1024} KiB"
    if has_gpus:
        return Finding(
            AREA, "ulimit -l", "warn", f"{message}: NCCL over InfiniBand/RDMA needs unlimited locked memory",
            "raise it: `ulimit -l unlimited` (/etc/security/limits.conf; docker: --ulimit memlock=-1)",
        )
    return Finding(AREA, "ulimit -l", "ok", f"{message} (matters only for multi-GPU NCCL)")
