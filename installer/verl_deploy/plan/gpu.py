"""The device a plan is for: this host's GPUs (doctor's NVML reading), a GPU type of the catalogue
(gpu_types.yaml: `--gpu-type H100`), a bare size (`--gpu-memory 80g`), or, for a CPU run, this host's memory."""

from __future__ import annotations

import os
from dataclasses import dataclass

from verl_deploy.plan.errors import PlanError
from verl_deploy.sizes import GiB, SizeError, parse_size


@dataclass(frozen=True)
class Device:
    kind: str  # cuda | cpu
    name: str
    memory_bytes: int  # what one GPU (or the host, for a CPU run) offers the run
    total_bytes: int  # the board's memory: vLLM's gpu_memory_utilization is a share of it
    bf16: bool
    source: str  # where the figure comes from, said in the plan
    visible: int | None = None  # GPUs this host shows (a host reading only)

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"


def from_type(name: str) -> Device:
    from verl_deploy import gpu_types

    try:
        gpu = gpu_types.lookup(name)
    except ValueError as exc:
        raise PlanError(str(exc).replace(" (or --node-selector KEY=VALUE with your cluster's own label)", "")
                        + " (or give its memory: --gpu-memory 80g)") from None
    size = gpu.memory_gib * GiB
    return Device("cuda", gpu.name, size, size, gpu.bf16, f"--gpu-type {gpu.name}: {gpu.memory_gib} GiB (gpu_types.yaml)")


def from_size(text: str, name: str | None = None) -> Device:
    try:
        size = parse_size("--gpu-memory", text, "80g")
    except SizeError as exc:
        raise PlanError(str(exc)) from None
    label = name or "GPU"
    return Device("cuda", label, size, size, True, f"--gpu-memory {text}: {size / GiB:.1f} GiB")


def host_reading() -> dict:
    """This host's NVML reading (host_facts: or the recorded one VERL_DEPLOY_NVML_READING names), as doctor takes it."""
    from verl_deploy import host_facts

    try:
        return host_facts.nvml_reading()
    except ValueError as exc:
        raise PlanError(str(exc)) from None


def from_reading(reading: dict, wanted: list[int] | None = None) -> Device | None:
    """The GPU a run gets on the host of `reading`: of the devices it would use (`wanted` indices, else all), the one
    with the least free memory (total - used by other processes). None when the reading shows no GPU."""
    devices = reading.get("devices") or []
    if not devices:
        return None
    chosen = [d for d in devices if wanted is None or d.get("index") in wanted] or devices
    gpu = min(chosen, key=lambda d: (d.get("memory_total") or 0) - (d.get("memory_used") or 0))
    total = int(gpu.get("memory_total") or 0)
    used = int(gpu.get("memory_used") or 0)
    cc = gpu.get("compute_capability") or [0, 0]
    free_note = f", {used / GiB:.1f} GiB of it in use" if used else ""
    return Device("cuda", gpu.get("name", "GPU"), total - used, total, tuple(cc) >= (8, 0),
                  f"this host's GPU {gpu.get('index', 0)} (NVML: {total / GiB:.1f} GiB{free_note})",
                  visible=len(devices))


def host_memory() -> Device:
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return Device("cpu", "CPU", total, total, False, f"this host's memory ({total / GiB:.1f} GiB): a CPU run")


def host_ram_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
