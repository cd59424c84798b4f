"""What each visible GPU could train: the largest dense model (the Qwen2.5 family) for full-parameter GRPO on it
alone, without and with offload (verl_deploy.plan.capacity: the planner's arithmetic, no torch)."""

from __future__ import annotations

import os

from verl_deploy.doctor.core import Context, Finding

AREA = "nvidia"


def findings(ctx: Context) -> list[Finding]:
    """One finding per run of identical GPUs (same name, same free memory): `capacity (gpu 0-7)`."""
    from verl_deploy.plan.capacity import DESCRIPTION, capacity
    from verl_deploy.plan.gpu import from_reading

    host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    groups: list[list[dict]] = []
    for gpu in ctx.gpus:
        key = (gpu.get("name"), (gpu.get("memory_total") or 0) - (gpu.get("memory_used") or 0))
        if groups and (groups[-1][0].get("name"), (groups[-1][0].get("memory_total") or 0)
                       - (groups[-1][0].get("memory_used") or 0)) == key:
            groups[-1].append(gpu)
        else:
            groups.append([gpu])
    out = []
    for group in groups:
        first, last = group[0].get("index", 0), group[-1].get("index", 0)
        name = f"capacity (gpu {first})" if first == last else f"capacity (gpu {first}-{last})"
        device = from_reading({"devices": group}, None)
        if device is None or device.memory_bytes <= 0:
            continue
        found = capacity(device, host)
        plain = f"up to {found.without_offload}" if found.without_offload else "not even Qwen2.5-0.5B"
        if found.with_offload is None:
            offload = "not even Qwen2.5-0.5B with FSDP2 CPU offload"
        else:
            offload = (f"up to {found.with_offload} with FSDP2 CPU offload, which takes "
                       f"{found.offload_host_bytes / 2**30:.0f} GiB of host memory")
            if found.within_host != found.with_offload:
                enough = f"enough for {found.within_host}" if found.within_host else "too little for any"
                offload += f" (this host has {host / 2**30:.0f} GiB: {enough})"
        message = f"{DESCRIPTION}: {plain} without offload; {offload}. Plan a run exactly: verl-deploy plan CONFIG"
        out.append(Finding(AREA, name, "ok", message))
    return out
