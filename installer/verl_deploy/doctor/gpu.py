"""NVIDIA: driver, CUDA, GPUs and the image variants they can run, from the host's NVML reading (host_facts: taken
live or replayed from a recorded file, so every check below runs the same on a real GPU host and on a recorded one).
"""

from __future__ import annotations

from typing import Any

from verl_deploy import compat
from verl_deploy.doctor import capacity
from verl_deploy.doctor.core import Context, Finding

AREA = "nvidia"
GPU_MODE_REMEDY = (
    f"for GPU mode install the NVIDIA driver (>= {compat.DRIVER_FLOOR}) and, for containers, "
    "the NVIDIA Container Toolkit"
)


def check(ctx: Context) -> list[Finding]:
    reading = ctx.nvml
    if reading.get("error") == "library_not_found":
        return [Finding(AREA, "driver", "skip", "no NVIDIA driver: CPU mode works (variant cpu)", GPU_MODE_REMEDY)]
    if reading.get("error"):
        return [
            Finding(
                AREA,
                "driver",
                "fail",
                f"NVML is installed but fails: {reading.get('message', reading['error'])}",
                "run `nvidia-smi`; a driver/library version mismatch clears after a reboot (or reloading the "
                "nvidia kernel modules); a driver that is not loaded needs `sudo modprobe nvidia`",
            )
        ]
    findings = [_driver_finding(reading)]
    if not ctx.gpus:
        findings.append(
            Finding(AREA, "gpus", "skip", "the driver sees no GPU: CPU mode works (variant cpu)",
                    "check the GPU is seated and visible: `nvidia-smi -L`")
        )
    findings += [_gpu_finding(gpu) for gpu in ctx.gpus]
    findings += capacity.findings(ctx)
    findings += _variant_findings(ctx)
    return findings


def _driver_finding(reading: dict[str, Any]) -> Finding:
    driver = reading["driver_version"]
    cuda = reading.get("cuda_driver_version")
    cuda_text = compat.cuda_from_nvml(cuda) if cuda else compat.max_cuda(driver) or "none"
    message = f"driver {driver}, CUDA up to {cuda_text}"
    if not compat.meets_floor(driver):
        return Finding(
            AREA, "driver", "fail", f"{message}: older than {compat.DRIVER_FLOOR}, the floor verl asks for",
            f"upgrade the NVIDIA driver to >= {compat.DRIVER_FLOOR} (550 or newer recommended)",
        )
    return Finding(AREA, "driver", "ok", message)


def _gpu_finding(gpu: dict[str, Any]) -> Finding:
    index = gpu.get("index", 0)
    cc = gpu.get("compute_capability")
    used_gib = (gpu.get("memory_used") or 0) / 2**30
    parts = [
        gpu.get("name", "unknown GPU"),
        f"{gpu.get('memory_total', 0) / 2**30:.1f} GiB ({used_gib:.1f} GiB used)",
        f"CC {cc[0]}.{cc[1]}" if cc else "CC unknown",
        f"MIG {_on_off(gpu.get('mig_mode'))}",
        f"ECC {_on_off(gpu.get('ecc_mode'))}",
        f"{gpu.get('processes') or 0} processes",
    ]
    message = ", ".join(parts)
    name = f"gpu {index}"
    mig, ecc = gpu.get("mig_mode"), gpu.get("ecc_mode")
    if mig and mig[0]:
        return Finding(
            AREA, name, "warn", f"{message}: MIG splits this GPU; a process sees one MIG instance",
            f"to use the whole GPU: `sudo nvidia-smi -i {index} -mig 0` (then reset the GPU)",
        )
    if mig and mig[0] != mig[1] or ecc and ecc[0] != ecc[1]:
        return Finding(AREA, name, "warn", f"{message}: a mode change is pending", "reboot or reset the GPU to apply it")
    if ecc and not ecc[0]:
        return Finding(
            AREA, name, "warn", f"{message}: ECC is off, memory errors go unnoticed",
            f"`sudo nvidia-smi -i {index} -e 1`, then reboot",
        )
    if gpu.get("processes"):
        return Finding(
            AREA, name, "warn", f"{message}: other processes use this GPU",
            "see them with `nvidia-smi`; free the GPU or choose others with --gpus",
        )
    return Finding(AREA, name, "ok", message)


def _on_off(mode: list[int] | None) -> str:
    return "n/a" if mode is None else ("on" if mode[0] else "off")


def _variant_findings(ctx: Context) -> list[Finding]:
    verdicts = compat.check_variants(ctx.driver, ctx.capabilities)
    findings = [
        Finding(AREA, f"variant {v.variant.name}", "ok", f"runs ({_describe(v.variant)})")
        if v.runs
        else Finding(AREA, f"variant {v.variant.name}", "skip", f"cannot run here: {v.reason}", v.remedy)
        for v in verdicts
    ]
    best = compat.choose_variant(ctx.driver, ctx.capabilities)
    if ctx.gpus and best.is_cpu:
        drivers = [v.needs_driver for v in verdicts if v.needs_driver]
        remedy = (
            f"upgrade the NVIDIA driver to >= {min(drivers, key=compat.version_tuple)}"
            if drivers
            else "see the variant lines above"
        )
        findings.append(Finding(AREA, "best variant", "fail", "no CUDA variant runs on this host: only cpu", remedy))
    else:
        findings.append(Finding(AREA, "best variant", "ok", f"{best.name} (images build --variant auto picks it)"))
    return findings + _runtime_findings(ctx)


def _runtime_findings(ctx: Context) -> list[Finding]:
    """The images of the other runtimes (upstream verl): which run here. A skip, never a failure: they are a choice."""
    findings = []
    for runtime in compat.load_runtimes().values():
        if runtime.is_default:
            continue
        for v in compat.check_variants(ctx.driver, ctx.capabilities, compat.load_catalog(runtime=runtime.name)):
            name, what = f"variant {v.variant.name} --runtime {runtime.name}", f"{runtime.name} {runtime.version}"
            findings.append(
                Finding(AREA, name, "ok", f"runs ({what}: {_describe(v.variant)})") if v.runs
                else Finding(AREA, name, "skip", f"cannot run here ({what}): {v.reason}",
                             v.remedy if v.needs_driver else "upstream verl's images need an NVIDIA GPU"))
    return findings


def _describe(variant: compat.Variant) -> str:
    return "CPU only" if variant.is_cpu else f"CUDA {variant.cuda}, torch {variant.torch}"
