"""`verl-deploy doctor`: is this host ready? One module per area; each check returns findings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from verl_deploy import compat, host_facts
from verl_deploy.doctor import docker_check, gpu, host, kubernetes_check, torch_check
from verl_deploy.doctor.core import Context, Finding, exit_code, run_checks

__all__ = ["Finding", "Report", "diagnose", "exit_code"]

CHECKS = {
    "host": host.check,
    "nvidia": gpu.check,
    "pytorch": torch_check.check,
    "docker": docker_check.check,
    "kubernetes": kubernetes_check.check,
}
# The safety net around all areas; each probe inside has its own, shorter timeout (GPU smoke: 60 s).
SAFETY_NET_S = 90.0


@dataclass
class Report:
    """The findings of one doctor run and the image variant this host should use."""

    findings: list[Finding]
    recommended_variant: str

    @property
    def exit_code(self) -> int:
        return exit_code(self.findings)


def diagnose(nvml_reading: Path | None = None, k8s: bool = False, gpu_smoke: bool = False) -> Report:
    """Run every check. `nvml_reading` replays a recorded NVML reading instead of asking this host's driver
    (ValueError when the file is not one)."""
    ctx = Context(nvml=host_facts.nvml_reading(nvml_reading), k8s=k8s, gpu_smoke=gpu_smoke)
    findings = run_checks(CHECKS, ctx, SAFETY_NET_S)
    return Report(findings, compat.variant_for("auto", wants_gpus=True, on_this_host=True, host=ctx.facts))

