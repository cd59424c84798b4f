"""Metrics: one JSON object per step in run_dir/metrics.jsonl (verl's names), TensorBoard when asked, a console line."""

from __future__ import annotations

import json
import os
from pathlib import Path

from verl_runtime.rundir import METRICS_FILE, TENSORBOARD_DIR

# What the console line shows, in order: (label, candidate metric names, format).
_CONSOLE_FIELDS = (
    ("reward", ("critic/score/mean", "critic/rewards/mean", "reward"), "{:.3f}"),
    ("loss", ("loss", "actor/pg_loss"), "{:.4f}"),
    ("kl", ("actor/kl_loss", "actor/ppo_kl"), "{:.4f}"),
    ("len", ("response_length/mean",), "{:.1f}"),
)


class MetricsWriter:
    """Appends {"step": N, ...metrics} lines to run_dir/metrics.jsonl, flushed per step so `status` sees them live.

    truncate_after: on resume from a checkpoint at that step, drop the lines of later steps (written after the
    checkpoint, before the interruption) so the file reads as one uninterrupted run. A torn last line (the process
    died mid-write) is dropped in any case, so that the next record starts on a line of its own.
    """

    def __init__(self, run_dir, tensorboard: bool = False, truncate_after: int | None = None):
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_after is not None and self.path.exists():
            _drop_steps_after(self.path, truncate_after)
        elif self.path.exists():
            _drop_torn_tail(self.path)
        self._file = open(self.path, "a", encoding="utf-8")
        self._tensorboard = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=str(Path(run_dir) / TENSORBOARD_DIR), flush_secs=10)

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step, **{name: _plain(value) for name, value in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tensorboard is not None:
            for name, value in record.items():
                if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tensorboard.add_scalar(name, value, step)

    def close(self) -> None:
        self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(run_dir) -> list[dict]:
    """The records of run_dir/metrics.jsonl (empty if there is none yet). Lines that are not whole JSON objects
    (a torn last line while the trainer writes, or after a crash) are skipped."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    records = (_parse(line) for line in path.read_text(encoding="utf-8", errors="replace").splitlines())
    return [record for record in records if record is not None]


def format_console_line(step: int, total: int, metrics: dict) -> str:
    """A compact progress line, e.g. ``step  3/20 | reward 0.412 | loss 0.4321 | 1,234 tok/s | 0.81 s/step``."""
    parts = [f"step {step:>{len(str(total))}}/{total}"]
    for label, names, fmt in _CONSOLE_FIELDS:
        name = next((n for n in names if n in metrics), None)
        if name is not None:
            parts.append(f"{label} {fmt.format(_plain(metrics[name]))}")
    if "perf/throughput" in metrics:
        parts.append(f"{_plain(metrics['perf/throughput']):,.0f} tok/s")
    if "timing_s/step" in metrics:
        parts.append(f"{_plain(metrics['timing_s/step']):.2f} s/step")
    return " | ".join(parts)


def reduce_metrics(list_of_dicts: list[dict]) -> dict:
    """The mean of each metric over the dicts that report it (e.g. over micro-batches)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for metrics in list_of_dicts:
        for name, value in metrics.items():
            sums[name] = sums.get(name, 0.0) + float(_plain(value))
            counts[name] = counts.get(name, 0) + 1
    return {name: sums[name] / counts[name] for name in sums}


def _plain(value):
    """A JSON-ready Python value from a tensor / NumPy scalar / number."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    return value


def _parse(line: str) -> dict | None:
    """The record on one line, or None for a blank, torn or otherwise unreadable one."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _drop_steps_after(path: Path, step: int) -> None:
    """Rewrite path with its whole records of steps <= step (atomically: a crash now leaves the old file)."""
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    records = [(line, _parse(line)) for line in lines]
    torn = sum(record is None for _, record in records)
    if torn:
        _warn_torn(path, torn)
    kept = [line for line, record in records if record is not None and record.get("step", 0) <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line that has no newline (the process died mid-write) so the next record does not join it."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    _warn_torn(path, 1)
    with open(path, "r+b") as handle:
        handle.truncate(data.rfind(b"\n") + 1)


def _warn_torn(path: Path, count: int) -> None:
    lines = "a torn line" if count == 1 else f"{count} torn lines"
    print(f"[WARN] {path} has {lines} (a crash mid-write?): dropped, the file keeps its complete records", flush=True)
