"""Run directories as the host sees them: the launch record, the last metrics line, checkpoints.

The run directory is the run's memory: launch.json records what was launched (config, overrides, image, pid and
its start time) and, once the run ends, how it ended (exit code, out of memory, when). `status` and `runs` read it
when the container is gone or the engine does not answer.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from verl_runtime import rundir

LAUNCH_RECORD = rundir.LAUNCH_RECORD
STOPPED_CODES = (-15, -1, 129, 130, 143)  # SIGTERM/SIGHUP/SIGINT: the runtime checkpointed and left


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
    unusable_checkpoints: dict[str, str] = field(default_factory=dict)  # name -> why resume skips it

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
            "unusable_checkpoints": self.unusable_checkpoints,
            "detail": self.detail,
        }


def state_of(exit_code: int | None, stop_asked: bool = False) -> str:
    """A finished run's state from its exit code; one that `stop` asked to end is stopped, whatever its code (upstream
    verl's Ray driver aborts on SIGTERM where our runtime exits 143)."""
    if exit_code is None:
        return "unknown"
    if exit_code == 0:
        return "succeeded"
    return "stopped" if exit_code in STOPPED_CODES or stop_asked else "failed"


def note_stop(run_dir: Path) -> None:
    """Keep that `stop` asked the run to end, before the signal goes: its exit code then reads as stopped."""
    write_record(run_dir, {"stop_asked_at": _now()})


def run_status(run_dir: Path, target: str, state: str, **fields) -> RunStatus:
    """A RunStatus with what the run directory says (metrics, checkpoints); the caller says the state."""
    run_dir = Path(run_dir)
    record = read_record(run_dir)
    fields.setdefault("exit_code", record.get("exit_code"))
    fields.setdefault("image", record.get("image", ""))
    fields.setdefault("detail", record.get("detail", ""))
    return RunStatus(
        run_id=run_dir.name, target=target, state=state, run_dir=str(run_dir.resolve()),
        metrics=last_metrics(run_dir), checkpoints=checkpoints(run_dir),
        unusable_checkpoints=unusable_checkpoints(run_dir), **fields,
    )


def record_finished(run_dir: Path, exit_code: int | None, detail: str = "") -> None:
    """How the run ended, kept in its run directory (the container or process that knew it may be gone)."""
    write_record(run_dir, {"exit_code": exit_code, "detail": detail, "finished_at": _now()})


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- processes: a pid is the trainer's only while its start time matches -------------------------------------

def process_start(pid: int | None) -> int | None:
    """The start time of process pid (clock ticks since boot, /proc/PID/stat field 22); None if there is none
    or it has exited (a zombie)."""
    if not pid:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
    return None if fields[0] == "Z" else int(fields[19])


def same_process(pid: int | None, started: int | None) -> bool:
    """pid is alive and is the process recorded (not a later one that reuses the number)."""
    now = process_start(pid)
    return now is not None and started is not None and now == started


def trainer_holds(run_dir: Path) -> bool:
    """A live trainer holds the run directory's lock (locally or in a container on this host)."""
    return rundir.holder(run_dir) is not None


# --- resume ---------------------------------------------------------------------------------------------------

@dataclass
class Resume:
    """How `run --resume RUN` starts a run again: as recorded, with what was given now on top."""

    config: Path
    target: str
    overrides: list[str]
    gpus: str | None
    nodes: int
    image: str | None
    changes: list[str]  # "what: old -> new", one per thing given now that differs from the record


def plan_resume(runs_root: Path, run_id: str, *, config: Path | None, target: str | None, overrides: list[str],
                gpus: str | None, nodes: int | None, image: str | None, needs_config: bool = True) -> Resume:
    """The recorded launch of run_id with the given flags on top; ValueError (one line) for a run that is not
    there, so a typo never starts a fresh run under the typed name."""
    record = read_record(Path(runs_root) / run_id)
    if not record:
        raise ValueError(f"no run {run_id!r} under {runs_root} to resume: `verl-deploy runs` lists the runs "
                         f"(a new run of that name: --run-id {run_id})")
    merged, changes = resume_overrides(record.get("overrides", []), list(overrides))
    recorded_config = Path(record["config"]) if record.get("config") else None
    if config is None and recorded_config is None and needs_config:  # upstream verl's runs have none
        raise ValueError(f"run {run_id} recorded no config file: pass it (`verl-deploy run CONFIG --resume {run_id}`)")
    for what, old, new in (("config", recorded_config, config), ("--target", record.get("target"), target),
                           ("--gpus", record.get("gpus"), gpus), ("--nodes", record.get("nodes"), nodes),
                           ("--image", record.get("image"), image)):
        if new is not None and str(new) != str(old):
            changes.append(f"{what}: {old} -> {new}")
    return Resume(
        config=config or recorded_config, target=target or record.get("target", "docker"), overrides=merged,
        gpus=gpus if gpus is not None else record.get("gpus"), nodes=nodes or record.get("nodes", 1),
        image=image or record.get("image"), changes=changes,
    )


def note_resume(run_dir: Path, changes: list[str]) -> None:
    """Keep in launch.json when the run was resumed and what changed then."""
    history = read_record(run_dir).get("resumes", [])
    write_record(run_dir, {"resumes": [*history, {"at": _now(), "changes": changes}]})


def resume_overrides(recorded: list[str], given: list[str]) -> tuple[list[str], list[str]]:
    """The overrides a resumed run trains with (the recorded ones, then the ones given now, which win), and one
    line per key the new ones change ("key: old -> new")."""
    merged = dict(item.split("=", 1) if "=" in item else (item, None) for item in recorded)  # ~key: no value
    changes = []
    for item in given:
        key, value = item.split("=", 1) if "=" in item else (item, None)
        if merged.get(key) != value:
            changes.append(f"{key}: {merged.get(key, '(config file)')} -> {value}")
        merged.pop(key, None)
        merged[key] = value
    return [key if value is None else f"{key}={value}" for key, value in merged.items()], changes


def write_record(run_dir: Path, record: dict) -> None:
    """Keep what was launched (no config text, secrets by name only) next to the run's outputs; written to a temp
    file and renamed, so a crash leaves the old record or the new one, never half of one."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LAUNCH_RECORD
    previous = read_record(run_dir)
    tmp = path.with_name(f".{LAUNCH_RECORD}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**previous, **record}, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_record(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / LAUNCH_RECORD).read_text())
    except (OSError, ValueError):
        return {}


def last_metrics(run_dir: Path | str) -> dict:
    """The last complete JSON line of metrics.jsonl ({} when there is none yet)."""
    path = Path(run_dir) / rundir.METRICS_FILE
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            return flat_metrics(json.loads(line))
        except ValueError:
            continue  # a line still being written
    return {}


def flat_metrics(row: dict) -> dict:
    """A metrics line as verl-deploy's runtime writes them (flat, with "step"); upstream verl's file logger writes
    {"step": N, "data": {...}}."""
    if isinstance(row, dict) and isinstance(row.get("data"), dict) and set(row) <= {"step", "data"}:
        return {"step": row.get("step"), **row["data"]}
    return row


def metrics_lines(run_dir: Path | str) -> list[dict]:
    """Every complete line of metrics.jsonl."""
    try:
        lines = (Path(run_dir) / rundir.METRICS_FILE).read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            found.append(flat_metrics(json.loads(line)))
        except ValueError:
            continue  # a line still being written
    return found


def checkpoints(run_dir: Path | str) -> list[str]:
    """Complete checkpoints (checkpoints/step_N whose files match their manifest's sizes), oldest first."""
    return [path.name for _, path in rundir.valid_checkpoints(run_dir)]


def unusable_checkpoints(run_dir: Path | str) -> dict[str, str]:
    """Checkpoint directories a resume skips, with why (an interrupted save, a truncated file)."""
    found = {}
    for _, path in rundir.checkpoint_dirs(run_dir):
        problem = rundir.checkpoint_problem(path)
        if problem:
            found[path.name] = problem
    return found


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


def local_run_ids(runs_root: Path, target: str | None = None) -> list[str]:
    """Runs recorded under the runs root (of one target, when given), oldest first."""
    if not runs_root.is_dir():
        return []
    found = sorted(p.name for p in runs_root.iterdir() if (p / LAUNCH_RECORD).is_file())
    return [r for r in found if target is None or read_record(runs_root / r).get("target") == target]
