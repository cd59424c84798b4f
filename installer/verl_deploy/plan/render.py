"""A plan as a table for people (phases x components, GiB per GPU) and as JSON for programs (docs/plan.md)."""

from __future__ import annotations

import json

from verl_deploy.plan.core import FITS, NO, Plan
from verl_deploy.plan.memory import COMPONENTS
from verl_deploy.sizes import GiB, MiB

STYLES = {FITS: "bold green", "tight": "bold yellow", NO: "bold red"}
# Short enough for an 80-column terminal; the legend under the table and the JSON give the full names.
HEADERS = {"weights": "param", "weight copies": "copy", "gradients": "grad", "optimizer": "optim",
           "rollout": "roll", "activations": "act", "logits": "logit", "overhead": "other"}
LEGEND = ("param: resident weights; copy: weight copies (bf16 casts, FSDP units); grad: gradients; optim: AdamW; "
          "roll: the rollout engine; act: activations; logit: log-prob tensors; other: CUDA contexts, allocator")


def to_json(result: Plan) -> str:
    return json.dumps(result.to_json(), indent=2)


def _unit(result: Plan) -> tuple[int, str]:
    return (MiB, "MiB") if result.peak_bytes < GiB else (GiB, "GiB")


def _number(value: int, unit: int) -> str:
    if not value:
        return "-"
    shown = value / unit
    return "<0.1" if shown < 0.05 else f"{shown:.1f}"


def to_renderables(result: Plan) -> list:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    w, device = result.workload, result.device
    unit, unit_name = _unit(result)
    if device.is_cpu:
        where = f"{unit_name}, this host's memory: a CPU run"
    else:
        nodes = f" on {w.nodes} nodes" if w.nodes > 1 else ""
        where = f"{unit_name} per GPU, {w.world} x {device.name}{nodes}"
    title = Text(f"verl-deploy plan: {result.model.source}, {result.runtime} runtime ({where})", style="bold")
    table = Table(box=box.SIMPLE_HEAD, padding=0, show_edge=False, pad_edge=False)
    table.add_column("phase", no_wrap=True, min_width=max(len(p.name) for p in result.memory.phases))
    for name in COMPONENTS:
        table.add_column(HEADERS[name], justify="right", no_wrap=True, min_width=5)
    table.add_column("peak", justify="right", style="bold", no_wrap=True, min_width=5)
    peak_name = result.memory.peak_phase.name
    for phase in result.memory.phases:
        style = "bold" if phase.name == peak_name else ""
        table.add_row(Text(phase.name, style=style), *[_number(phase.components[c], unit) for c in COMPONENTS],
                      _number(phase.peak, unit))
    lines = [title, table, Text(LEGEND, style="dim")]
    for phase in result.memory.phases:
        if phase.detail:
            lines.append(Text(f"  {phase.name}: {phase.detail}", style="dim"))
    lines.append(Text(f"GPU: {device.source}" if not device.is_cpu else f"memory: {device.source}", style="dim"))
    lines.append(Text(f"model: {result.model.describe()}; {result.model.counted_by}", style="dim"))
    lines.append(Text(f"lengths (typical, the table): prompt {result.lengths.prompt} tokens ({result.lengths.prompt_how}); "
                      f"response {result.lengths.response} tokens ({result.lengths.response_how})", style="dim"))
    if result.worst is not None:
        worst = result.worst
        lines.append(Text(f"worst case: prompt {worst.lengths.prompt}, response {worst.lengths.response} tokens "
                          f"({worst.lengths.prompt_how}; {worst.lengths.response_how}): peak "
                          f"{worst.peak_bytes / GiB:.1f} GiB ({worst.memory.peak_phase.name}), {worst.verdict}",
                          style="dim"))
    limited = {name: n for name, n in result.phase_limits.items() if n != w.max_response_length}
    if limited and w.padding_free:
        said = ", ".join(f"{name} {n if n is not None else 'never'}" for name, n in limited.items())
        lines.append(Text(f"mean response (tokens) up to which each phase fits, at a {result.lengths.prompt}-token "
                          f"prompt: {said}; the others fit up to the limit", style="dim"))
    for note in result.notes:
        lines.append(Text(f"note: {note}", style="dim"))
    verdict = Text()
    verdict.append(result.verdict, style=STYLES[result.verdict])
    verdict.append(f": {result.reason}")
    lines.append(verdict)
    if result.suggestions:
        heading = "to make it fit" if result.verdict == NO else "to remove the risk"
        lines.append(Text(f"{heading} (cheapest first, each planned again):", style="bold"))
        for line in result.suggestions:
            lines.append(Text(f"  - {line}", style="cyan"))
    return lines
