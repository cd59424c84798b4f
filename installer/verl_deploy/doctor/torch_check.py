"""PyTorch on the host (used by `run --target local`; images bring their own): version, the CUDA it was built
for, and whether this driver runs it. torch is never imported in doctor's process: its version file is read as
text, and only on a GPU host a short subprocess asks torch whether it sees the GPUs."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from verl_deploy import compat
from verl_deploy.doctor.core import Context, Finding

AREA = "pytorch"
GPU_PROBE_TIMEOUT_S = 30.0  # importing torch and initialising CUDA takes seconds
GPU_PROBE = (
    "import json, torch; print(json.dumps({'available': torch.cuda.is_available(), "
    "'count': torch.cuda.device_count(), 'arch': torch.cuda.get_arch_list()}))"
)


def check(ctx: Context) -> list[Finding]:
    build = installed_torch()
    if build is None:
        return [
            Finding(AREA, "torch", "skip", "not installed on the host: fine for docker and k8s targets",
                    "for --target local: installer/install.sh --extras runtime")
        ]
    version, cuda = build
    if cuda is None:
        if ctx.gpus:
            best = compat.choose_variant(ctx.driver, ctx.capabilities)
            remedy = (
                "install a CUDA build once the driver runs one (see the nvidia lines)"
                if best.is_cpu
                else f"install the CUDA {best.cuda} build from PyPI: pip install torch=={best.torch}"
            )
            return [
                Finding(AREA, "torch", "warn", f"{version}, a CPU-only build: --target local leaves the GPUs idle",
                        remedy)
            ]
        return [Finding(AREA, "torch", "ok", f"{version}, CPU build")]
    message = f"{version}, built for CUDA {cuda}"
    if ctx.driver is None or not ctx.gpus:
        return [Finding(AREA, "torch", "ok", f"{message}; no GPU here, so it runs on the CPU")]
    if not compat.driver_runs_cuda(ctx.driver, cuda):
        floor = compat.FAMILY_FLOORS.get(compat.version_tuple(cuda)[0], "a newer one")
        return [
            Finding(AREA, "torch", "warn", f"{message}: driver {ctx.driver} cannot run it",
                    f"upgrade the driver to >= {floor}, or install a torch built for an older CUDA")
        ]
    return [Finding(AREA, "torch", "ok", f"{message}: driver {ctx.driver} runs it"), _gpu_probe(ctx)]


def installed_torch() -> tuple[str, str | None] | None:
    """(version, CUDA version or None) of the torch this Python would import, read from torch/version.py."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        values = _literals(Path(spec.submodule_search_locations[0]) / "version.py")
    except (OSError, SyntaxError):
        return None
    version = values.get("__version__")
    return (str(version), values.get("cuda")) if version else None


def _literals(path: Path) -> dict[str, object]:
    """Top-level `name = literal` and `name: type = literal` assignments of a Python file."""
    values: dict[str, object] = {}
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Name) and node.value is not None:
                try:
                    values[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return values


def _gpu_probe(ctx: Context) -> Finding:
    try:
        done = subprocess.run(
            [sys.executable, "-c", GPU_PROBE], capture_output=True, text=True, timeout=GPU_PROBE_TIMEOUT_S
        )
        seen = json.loads(done.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return Finding(AREA, "torch sees gpus", "warn", f"torch gave no answer within {GPU_PROBE_TIMEOUT_S:g} s",
                       "check `python -c 'import torch; print(torch.cuda.is_available())'`")
    except (IndexError, ValueError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Finding(AREA, "torch sees gpus", "warn", f"torch failed: {last}",
                       "check `python -c 'import torch; print(torch.cuda.is_available())'`")
    if not seen["available"]:
        return Finding(AREA, "torch sees gpus", "warn", "torch.cuda.is_available() is False",
                       "check CUDA_VISIBLE_DEVICES and that the driver matches (`nvidia-smi`)")
    built = tuple(arch.split("_")[-1] for arch in seen["arch"] if arch.startswith("sm_"))
    built = tuple(f"{cc[:-1]}.{cc[-1]}" for cc in built if cc.isdigit())
    missing = [cc for cc in ctx.capabilities if not compat.capability_supported(cc, built)]
    if missing:
        return Finding(AREA, "torch sees gpus", "warn",
                       f"compute capability {', '.join(missing)} is not in torch's arch list {seen['arch']}",
                       "install a torch build for this GPU (see the nvidia variant lines)")
    return Finding(AREA, "torch sees gpus", "ok", f"{seen['count']} GPU(s), arch list {', '.join(seen['arch'])}")
