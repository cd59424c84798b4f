"""Run directories as the host sees them: the launch record, the last metrics line, checkpoints."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

LAUNCH_RECORD = "launch.json"


def default_runs_root() -> Path:
    return Path(os.environ.get("VERL_DEPLOY_RUNS", "runs"))


@dataclass
class RunStatus:
    """What `status` and `runs` show for one run."""

    run_id: str
    target: str
    state: str  # running | succeeded | failed | stopped | pending | unknown
    exit_code: int | None = None
    image: str = ""
    run_dir: str = ""
    metrics: dict = field(default_factory=dict)
    checkpoints: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def progress(self) -> str:
        return summarize_metrics(self.metrics)

    def to_json(self) -> dict:
        return {
            "run_id": self.run_id,
            "target": self.target,
            "state": self.state,
            "exit_code": self.exit_code,
            "image": self.image,
            "run_dir": self.run_dir,
            "last_metrics": self.metrics,
            "checkpoints": self.checkpoints,
            "detail": self.detail,
        }


def write_record(run_dir: Path, record: dict) -> None:
    """Keep what was launched (no config text, secrets by name only) next to the run's outputs."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LAUNCH_RECORD
    previous = read_record(run_dir)
    path.write_text(json.dumps({**previous, **record}, indent=2, default=str) + "\n")


def read_record(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / LAUNCH_RECORD).read_text())
    except (OSError, ValueError):
        return {}


def last_metrics(run_dir: Path | str) -> dict:
    """The last complete JSON line of metrics.jsonl ({} when there is none yet)."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue  # a line still being written
    return {}


def metrics_lines(run_dir: Path | str) -> list[dict]:
    """Every complete line of metrics.jsonl."""
    try:
        lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue  # a line still being written
    return found


def checkpoints(run_dir: Path | str) -> list[str]:
    """Completed checkpoints (checkpoints/step_N), oldest first."""
    root = Path(run_dir) / "checkpoints"
    steps = [p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()] if root.is_dir() else []
    return [p.name for p in sorted(steps, key=lambda p: int(p.name[5:]))]


def summarize_metrics(metrics: dict) -> str:
    """'step 4 · reward 0.625 · 812 tok/s' from one metrics line."""
    if not metrics:
        return "no metrics yet"
    parts = []
    step = metrics.get("step", metrics.get("training/global_step"))
    if step is not None:
        parts.append(f"step {step}")
    reward = metrics.get("critic/score/mean", metrics.get("critic/rewards/mean"))
    if reward is not None:
        parts.append(f"reward {reward:.3f}")
    throughput = metrics.get("perf/throughput")
    if throughput is not None:
        parts.append(f"{throughput:,.0f} tok/s")
    return " · ".join(parts) or "metrics without step/reward"


def local_run_ids(runs_root: Path) -> list[str]:
    """Runs recorded under the runs root, oldest first."""
    if not runs_root.is_dir():
        return []
    return sorted(p.name for p in runs_root.iterdir() if (p / LAUNCH_RECORD).is_file())
