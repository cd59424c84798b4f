"""Metrics: one JSON object per step in run_dir/metrics.jsonl (verl's names), TensorBoard and the trackers of
trainer.logger (trackers.py) when asked, a console line."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from verl_runtime.errors import machine_fault
from verl_runtime.rundir import METRICS_FILE, TENSORBOARD_DIR

# What the console line shows, in order: (label, candidate metric names, format).
_CONSOLE_FIELDS = (
    ("reward", ("critic/score/mean", "critic/rewards/mean", "reward"), "{:.3f}"),
    ("loss", ("loss", "actor/pg_loss"), "{:.4f}"),
    ("kl", ("actor/kl_loss", "actor/ppo_kl"), "{:.4f}"),
    ("len", ("response_length/mean",), "{:.1f}"),
    ("tool calls", ("tool_calls/mean",), "{:.2f}"),  # per episode, in a multi-turn run (verl_runtime/agent/loop.py)
    # versions the step's samples lag behind the policy they train, with trainer.mode=separate_async
    ("stale", ("training/off_policy/trajectory_staleness/mean",), "{:.1f}"),
)


class MetricsWriter:
    """Appends {"step": N, ...metrics} lines to run_dir/metrics.jsonl, flushed per step so `status` sees them live.

    truncate_after: on resume from a checkpoint at that step, drop the lines of later steps (written after the
    checkpoint, before the interruption) so the file reads as one uninterrupted run. A torn last line (the process
    died mid-write) is dropped in any case, so that the next record starts on a line of its own. A write that fails
    (a full disk) is cut off again, so the file keeps whole lines only, and ends the run with one line; TensorBoard,
    a view of the same numbers, is turned off with a warning instead.
    """

    def __init__(self, run_dir, tensorboard: bool = False, truncate_after: int | None = None, trackers=()):
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_after is not None and self.path.exists():
            _drop_steps_after(self.path, truncate_after)
        elif self.path.exists():
            _drop_torn_tail(self.path)
        # Unbuffered: a failed write leaves nothing in a buffer that a later flush would append as a torn line.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._tensorboard = _open_tensorboard(Path(run_dir) / TENSORBOARD_DIR) if tensorboard else None
        self._trackers = list(trackers)  # trackers.open_trackers(...): each gets every record written here

    def log(self, step: int, metrics: dict, generations=()) -> None:
        """One step's record; `generations`: validation samples (input, output, score) for the trackers that show
        them (trainer.log_val_generations)."""
        record = {"step": step, **{name: _plain(value) for name, value in metrics.items()}}
        self._append((json.dumps(record) + "\n").encode(), step)
        if self._tensorboard is not None:
            try:
                self._tensorboard.log(step, record)
            except OSError as exc:
                print(f"[WARN] TensorBoard is off from step {step}: {machine_fault(exc) or exc}; metrics still go "
                      f"to {self.path}", flush=True)
                self._close_tensorboard()
        for tracker in list(self._trackers):
            try:
                if generations and hasattr(tracker, "log_generations"):
                    tracker.log_generations(generations, step)
                tracker.log(record, step)
            except Exception as exc:  # the tracker's client or its server: it is a view, the run goes on
                print(f"[WARN] {tracker.name} is off from step {step} ({type(exc).__name__}: "
                      f"{str(exc).strip()[:200]}); metrics still go to {self.path}", flush=True)
                self._trackers.remove(tracker)

    def _append(self, line: bytes, step: int) -> None:
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            written = 0
            while written < len(line):
                written += os.write(self._fd, line[written:])
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, end)  # the part of the line that fitted: no torn line
            fault = machine_fault(exc, self.path, f"; the records before step {step} are kept")
            if fault is None:
                raise
            raise fault from exc

    def close(self) -> None:
        os.close(self._fd)
        self._close_tensorboard()
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            try:
                tracker.finish()
            except Exception as exc:  # its last records may be lost; metrics.jsonl has them
                print(f"[WARN] {tracker.name} did not finish cleanly ({type(exc).__name__}: "
                      f"{str(exc).strip()[:200]})", flush=True)

    def _close_tensorboard(self) -> None:
        writer, self._tensorboard = self._tensorboard, None
        if writer is not None:
            with contextlib.suppress(OSError):  # its last events are lost with the disk that refused them
                writer.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _open_tensorboard(log_dir: Path) -> _Events | None:
    """TensorBoard events in log_dir, and the command that shows them; None, with a warning, where the tensorboard
    package is missing (an image without it): TensorBoard is a view, never a reason to fail a run."""
    try:
        events = _Events(log_dir)
    except ImportError as exc:
        print(f"[WARN] TensorBoard is off: {exc} (pip install tensorboard); metrics still go to "
              f"{log_dir.parent / METRICS_FILE}", flush=True)
        return None
    print(f"[INFO] TensorBoard: tensorboard --logdir {log_dir}", flush=True)
    return events


class _Events:
    """A TensorBoard event file with one Summary per step that holds all the step's scalars: SummaryWriter's
    add_scalar converts and queues each scalar on its own, which a CPU step of a tiny model would feel."""

    def __init__(self, log_dir: Path):
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard.writer import FileWriter

        self._summary = Summary
        # The writer's own thread writes the queued events, flushed every 10 s.
        self._writer = FileWriter(str(log_dir), flush_secs=10)

    def log(self, step: int, record: dict) -> None:
        values = [self._summary.Value(tag=name, simple_value=value) for name, value in record.items()
                  if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)]
        self._writer.add_summary(self._summary(value=values), step)

    def close(self) -> None:
        self._writer.close()


def read_metrics(run_dir) -> list[dict]:
    """The records of run_dir/metrics.jsonl (empty if there is none yet). Lines that are not whole JSON objects
    (a torn last line while the trainer writes, or after a crash) are skipped."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    records = (_parse(line) for line in path.read_text(encoding="utf-8", errors="replace").splitlines())
    return [record for record in records if record is not None]


def format_console_line(step: int, total: int, metrics: dict, elapsed_s: float | None = None,
                        eta_s: float | None = None) -> str:
    """A compact progress line, e.g.
    ``step  3/20 | reward 0.412 | loss 0.4321 | 1,234 tok/s | 0.81 s/step | 0:02 elapsed, ETA 0:14``."""
    parts = [f"step {step:>{len(str(total))}}/{total}"]
    for label, names, fmt in _CONSOLE_FIELDS:
        name = next((n for n in names if n in metrics), None)
        if name is not None:
            parts.append(f"{label} {fmt.format(_plain(metrics[name]))}")
    if "perf/throughput" in metrics:
        parts.append(f"{_plain(metrics['perf/throughput']):,.0f} tok/s")
    if "timing_s/step" in metrics:
        parts.append(f"{_plain(metrics['timing_s/step']):.2f} s/step")
    if elapsed_s is not None:
        parts.append(f"{format_duration(elapsed_s)} elapsed" + ("" if eta_s is None else f", ETA {format_duration(eta_s)}"))
    return " | ".join(parts)


def format_validation_line(step: int, metrics: dict) -> str:
    """The validation scores of one evaluation, e.g. ``[VAL] step 4 | val-core/openai/gsm8k/reward/mean@1 0.250``."""
    scores = [f"{name} {_plain(value):.3f}" for name, value in sorted(metrics.items())]
    return " | ".join([f"[VAL] step {step}", *scores])


def eta_seconds(step_durations: list[float], remaining: int) -> float | None:
    """Seconds left for `remaining` steps at the mean of this process's step durations (None before the first).
    The first step is left out once others are known: it carries the warm-up (first allocations, compiled
    kernels, caches)."""
    if not step_durations:
        return None
    steady = step_durations[1:] or step_durations
    return sum(steady) / len(steady) * remaining


def format_duration(seconds: float) -> str:
    """``0:07``, ``12:34``, ``1:02:03``: minutes and seconds, hours when there are any."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class StepClock:
    """Elapsed time and ETA of the steps this process trains (after a resume: since the resume). A step's duration
    is the wall time between two laps, so checkpoint saves and validation count towards the ETA too."""

    def __init__(self):
        self.started = self._last = time.monotonic()
        self.durations: list[float] = []

    def lap(self, remaining: int) -> tuple[float, float | None]:
        """Mark the end of a step; (seconds elapsed, seconds left for `remaining` more steps)."""
        now = time.monotonic()
        self.durations.append(now - self._last)
        self._last = now
        return now - self.started, eta_seconds(self.durations, remaining)


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
    try:
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a full disk: the old file stays whole, and no temp file is left


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
