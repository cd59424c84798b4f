"""Run directories as the host sees them: the launch record, the last metrics line, checkpoints.

The run directory is the run's memory: launch.json records what was launched (config, overrides, image, pid and
its start time) and, once the run ends, how it ended (exit code, out of memory, when). `status` and `runs` read it
when the container is gone or the engine does not answer.

A run directory without launch.json but with the trainer's files is a run that `python -m verl_runtime train` (or
`main_ppo`) started by itself: target "direct". Its trainer's lock and log tell its state (direct_state).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from verl_deploy import runtimes
from verl_deploy.compat import DEFAULT_RUNTIME
from verl_runtime import rundir

LAUNCH_RECORD = rundir.LAUNCH_RECORD
STOPPED_CODES = (-15, -1, 129, 130, 143)  # SIGTERM/SIGHUP/SIGINT: the runtime checkpointed and left
DIRECT = "direct"  # the target of a run the trainer's own entrypoint started (no launch.json)
# What the runtime's console (train.log) says at a start and at each way a run ends (verl_runtime/trainer.py).
_STARTED = "[INFO] Initializing SingleControllerTrainer"
_FINISHED = ("[INFO] Training finished at step", "already finished step")
_STOPPED = ": stopped after step"
_LOG_TAIL_BYTES = 256 * 1024
_PROGRESS = re.compile(r"^step +\d+/(\d+)\b")  # the console's progress line: step 3/40 | ...


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
    runtime: str = ""  # verl-deploy (ours) | verl (upstream's main_ppo)
    started: str = ""  # UTC, ISO 8601 ("" where unknown)
    total_steps: int | None = None  # the run's last start said it trains this many steps
    services: dict[str, str] = field(default_factory=dict)  # a running run's services: name -> where they serve

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
            "services": self.services,
            "unusable_checkpoints": self.unusable_checkpoints,
            "detail": self.detail,
            "runtime": self.runtime,
            "started": self.started,
            "total_steps": self.total_steps,
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
    """A RunStatus with what the run directory says (metrics, checkpoints verified against their checksums, when
    it started); the caller says the state. A failed run without a recorded detail says why: the last error line
    of its logs."""
    run_dir = Path(run_dir)
    record = read_record(run_dir)
    launch = Launch.from_json(record)
    fields.setdefault("exit_code", record.get("exit_code"))
    fields.setdefault("image", launch.image or "")
    fields.setdefault("detail", record.get("detail", ""))
    if state == "failed" and not fields["detail"]:
        fields["detail"] = last_error(run_dir)
    checked = rundir.checked_checkpoints(run_dir)
    return RunStatus(
        run_id=run_dir.name, target=target, state=state, run_dir=str(run_dir.resolve()),
        metrics=last_metrics(run_dir), checkpoints=[path.name for _, path, why in checked if why is None],
        unusable_checkpoints={path.name: why for _, path, why in checked if why},
        runtime=launch.runtime, started=started_at(run_dir),
        total_steps=total_steps(run_dir), services=running_services(run_dir) if state == "running" else {},
        **fields,
    )


def running_services(run_dir: Path) -> dict[str, str]:
    """The services the run's trainer says run beside it (rundir.SERVICES_FILE), {} where it says none."""
    try:
        found = json.loads((Path(run_dir) / rundir.SERVICES_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(name): str(url) for name, url in found.items()} if isinstance(found, dict) else {}


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
    there, so a typo never starts a fresh run under the typed name, and for one none of whose checkpoints can be
    loaded, so that its completed steps are never silently trained again from step 1. A direct run (no launch
    record) resumes on this host (local) with the config its trainer last wrote."""
    run_dir = Path(runs_root) / run_id
    launch = read_launch(run_dir)
    if launch is None and is_direct_run(run_dir):
        launch = Launch(config=str(run_dir / rundir.CONFIG_FILE), target="local")
    if launch is None:
        raise ValueError(f"no run {run_id!r} under {runs_root} to resume: `verl-deploy runs` lists the runs "
                         f"(a new run of that name: --run-id {run_id})")
    merged, changes = resume_overrides(list(launch.overrides), list(overrides))
    if "trainer.resume=disable" not in merged:  # that one starts over deliberately
        refuse_unusable(run_dir, run_id)
    recorded_config = Path(launch.config) if launch.config else None
    if config is None and recorded_config is None and needs_config:  # upstream verl's runs have none
        raise ValueError(f"run {run_id} recorded no config file: pass it (`verl-deploy run CONFIG --resume {run_id}`)")
    for what, old, new in (("config", recorded_config, config), ("--target", launch.target, target),
                           ("--gpus", launch.gpus, gpus), ("--nodes", launch.nodes, nodes),
                           ("--image", launch.image, image)):
        if new is not None and str(new) != str(old):
            changes.append(f"{what}: {old} -> {new}")
    return Resume(
        config=config or recorded_config, target=target or launch.target or "docker", overrides=merged,
        gpus=gpus if gpus is not None else launch.gpus, nodes=nodes or launch.nodes,
        image=image or launch.image, changes=changes,
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


@dataclass(frozen=True)
class Launch:
    """What was launched, as launch.json keeps it: written once at the launch (JobSpec.launch, with what the target
    adds), read back as this type by --resume, status, export and the launchers. How the run goes (its pid or job
    id, exit code, when it ended, its resumes) is kept beside it in the same file, as plain fields of the record."""

    run_id: str = ""
    target: str | None = None
    config: str | None = None  # the config file's path (no config text is kept)
    runtime: str = DEFAULT_RUNTIME
    overrides: tuple[str, ...] = ()
    gpus: str | None = None  # as given (--gpus), None: none asked for
    nodes: int = 1
    image: str | None = None
    variant: str | None = None
    namespace: str = "default"
    secrets: tuple[str, ...] = ()  # by name only
    owner: str | None = None  # uid:gid of whoever launched it
    started_at: str | None = None  # UTC, ISO 8601
    flags: dict = field(default_factory=dict)  # runplan.RESUMED_FLAGS as given, restored by --resume
    trainer: tuple[str, ...] = ()  # upstream verl's command, when not its main_ppo (--entry)
    verl_source: dict = field(default_factory=dict)  # --verl-source's labels (path or URL, commit, dirty)
    command: tuple[str, ...] = ()  # what the target ran
    cache_claim: str | None = None  # Kubernetes: the Hugging Face cache's claim (export mounts it)
    slurm: dict = field(default_factory=dict)  # Slurm: the options it was submitted with (a resume keeps them)

    @property
    def upstream(self) -> bool:
        """Upstream verl trained it, not verl-deploy's runtime."""
        return self.runtime != runtimes.OURS.name

    def to_json(self) -> dict:
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in dataclasses.asdict(self).items()}

    @classmethod
    def from_json(cls, record: dict) -> Launch:
        """The launch a record keeps; fields it lacks take their defaults (older records, a direct run's)."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        values = {}
        for name, value in record.items():
            if name in known and value is not None:
                values[name] = tuple(value) if isinstance(known[name].default, tuple) else value
        if "flags" not in record and record.get("namespace") not in (None, "default"):  # before flags were kept
            values["flags"] = {"namespace": record["namespace"]}
        return cls(**values)


def read_launch(run_dir: Path) -> Launch | None:
    """The launch run_dir records, None where it records none (no run, or one its trainer started by itself)."""
    record = read_record(Path(run_dir))
    return Launch.from_json(record) if record else None


def record_launch(run_dir: Path, launch: Launch, **state) -> None:
    """Keep a launch in the run directory, with the target's first state fields (pid, job id, exit code None)."""
    write_record(run_dir, {**launch.to_json(), **state})


def write_record(run_dir: Path, record: dict) -> None:
    """Keep what was launched (no config text, secrets by name only) next to the run's outputs; written to a temp
    file and renamed, so a crash leaves the old record or the new one, never half of one."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LAUNCH_RECORD
    previous = read_record(run_dir)
    tmp = path.with_name(f".{LAUNCH_RECORD}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({**previous, **record}, indent=2, default=str) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a full disk cut the write short: the old record stays, no temp file


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
    """Complete checkpoints (checkpoints/step_N whose files match their manifest's sizes and checksums), oldest
    first."""
    return [path.name for _, path, why in rundir.checked_checkpoints(run_dir) if why is None]


def unusable_checkpoints(run_dir: Path | str) -> dict[str, str]:
    """Checkpoint directories a resume skips, with why (an interrupted save, a truncated or corrupt file)."""
    return {path.name: why for _, path, why in rundir.checked_checkpoints(run_dir) if why}


def refuse_unusable(run_dir: Path, run_id: str) -> None:
    """ValueError (one line) when the run has checkpoints and none of them can be loaded: a resume would train
    its completed steps again from step 1."""
    checked = rundir.checked_checkpoints(run_dir)
    if not checked or any(why is None for _, _, why in checked):
        return
    reasons = "; ".join(f"{path.name}: {why}" for _, path, why in reversed(checked))
    raise ValueError(f"every checkpoint of run {run_id} is unusable ({reasons}), so a resume would start it over "
                     f"at step 1: to start over deliberately, `--resume {run_id} --set trainer.resume=disable` (its "
                     f"metrics restart), `verl-deploy runs rm {run_id}`, or --run-id NEW for another run")


def runs_table(found: list[RunStatus]) -> str:
    """`verl-deploy runs`: one row per run under a header, in the order given."""
    header = ("RUN", "TARGET", "RUNTIME", "STATE", "STEP", "REWARD", "STARTED (UTC)")
    rows = [header] + [(r.run_id, r.target, r.runtime or "-", r.state, _step_cell(r), _reward_cell(r.metrics),
                        r.started.replace("T", " ")[:16] or "-") for r in found]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def _step_cell(run: RunStatus) -> str:
    step = run.metrics.get("step", run.metrics.get("training/global_step"))
    if step is None:
        return "-"
    return f"{step}/{run.total_steps}" if run.total_steps else str(step)


def _reward_cell(metrics: dict) -> str:
    reward = metrics.get("critic/score/mean", metrics.get("critic/rewards/mean"))
    return "-" if not isinstance(reward, (int, float)) else f"{reward:.3f}"


def summarize_metrics(metrics: dict) -> str:
    """'step 4 · reward 0.625 · 812 tok/s' (and '· stale 1', the samples' lag behind the policy, where the rollout runs
    ahead) from one metrics line."""
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
    staleness = metrics.get("training/off_policy/trajectory_staleness/max")  # trainer.mode=separate_async
    if staleness is not None:
        parts.append(f"stale {staleness:g}")
    return " · ".join(parts) or "metrics without step/reward"


# --- what a run's files say: its log, its start, its size ---------------------------------------------------------

def log_tail(run_dir: Path | str, names: tuple[str, ...] = (rundir.TRAIN_LOG, rundir.CONSOLE_LOG)) -> list[str]:
    """The last lines of the first of these logs that is there: the trainer's console (train.log), else a local
    launch's (console.log)."""
    for name in names:
        try:
            with open(Path(run_dir) / name, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - _LOG_TAIL_BYTES))
                return log.read().decode(errors="replace").splitlines()
        except OSError:
            continue
    return []


def last_error(run_dir: Path | str, lines: list[str] | None = None) -> str:
    """Why a run failed, as it said last: its last `error:` line (the runtime's one-line errors), else the last
    line of a traceback; "" when its logs say neither. A local launch's console.log comes first: it also holds
    what failed before the trainer opened train.log."""
    lines = log_tail(run_dir, (rundir.CONSOLE_LOG, rundir.TRAIN_LOG)) if lines is None else lines
    for line in reversed(lines):
        if line.startswith("error: "):
            return line
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith("Traceback (most recent call last)"):
            return next((line for line in reversed(lines[index:]) if line.strip()), "")
    return ""


def total_steps(run_dir: Path | str, lines: list[str] | None = None) -> int | None:
    """The steps the run trains in all, as its last progress line says ("step 3/40 | ..."); None before one."""
    lines = log_tail(run_dir) if lines is None else lines
    for line in reversed(lines):
        match = _PROGRESS.match(line)
        if match:
            return int(match.group(1))
    return None


def started_at(run_dir: Path | str) -> str:
    """When the run started (UTC, ISO 8601): as launch.json records it, else as its trainer's lock does."""
    launch = read_launch(Path(run_dir))
    if launch and launch.started_at:
        return launch.started_at
    try:
        started = json.loads((Path(run_dir) / rundir.LOCK_FILE).read_text() or "{}").get("started")
    except (OSError, ValueError, AttributeError):
        started = None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)) if isinstance(started, (int, float)) else ""


# --- direct runs: started by `python -m verl_runtime train`, without verl-deploy -------------------------------

_TRAINER_FILES = (rundir.CONFIG_FILE, rundir.METRICS_FILE, rundir.LOCK_FILE, rundir.TRAIN_LOG, rundir.CHECKPOINTS_DIR)


class UnknownRun(ValueError):
    """RUN names no run directory (one line: what to do)."""


def run_dir_of(run: str, runs_root: Path) -> Path:
    """RUN as a run directory (resolved), for the commands that take either (report, export): a run id under the
    runs root, taken as it is (a run just launched may have written nothing yet), else a path to a directory a run
    wrote (is_run_dir), so that a mistyped path is never taken for a run; UnknownRun (one line) otherwise."""
    runs_root = Path(runs_root)
    if run and Path(run).name == run and run not in (".", "..") and (runs_root / run).is_dir():
        return (runs_root / run).resolve()
    path = Path(run).expanduser()
    if is_run_dir(path):
        return path.resolve()
    raise UnknownRun(f"no run {run!r}: neither a run under {runs_root}/ (`verl-deploy runs` lists them) nor a run "
                     "directory")


def is_run_dir(path: Path) -> bool:
    """A directory a run wrote: its launch record or one of its trainer's files."""
    path = Path(path)
    return path.is_dir() and any((path / name).exists() for name in (LAUNCH_RECORD, *_TRAINER_FILES))


def is_direct_run(run_dir: Path) -> bool:
    """A run directory the trainer wrote that no launcher recorded."""
    run_dir = Path(run_dir)
    return (not (run_dir / LAUNCH_RECORD).is_file()) and any((run_dir / name).exists() for name in _TRAINER_FILES)


def target_of(run_dir: Path) -> str | None:
    """The target a run directory belongs to: as launch.json records it, "direct" for the trainer's own, else None."""
    launch = read_launch(Path(run_dir))
    return (launch and launch.target) or (DIRECT if is_direct_run(run_dir) else None)


def direct_state(run_dir: Path) -> tuple[str, str]:
    """(state, detail) of a direct run, from its trainer's lock (running) and what its log says at its last start."""
    if trainer_holds(run_dir):
        return "running", ""
    lines = log_tail(run_dir)
    starts = [i for i, line in enumerate(lines) if line.startswith(_STARTED)]
    lines = lines[starts[-1]:] if starts else lines
    for line in reversed(lines):
        if any(mark in line for mark in _FINISHED):
            return "succeeded", ""
        if _STOPPED in line:
            return "stopped", ""
        if line.startswith(("error: ", "Traceback (most recent call last)")):
            return "failed", last_error(run_dir, lines)
    if not lines:
        return "unknown", f"no {rundir.TRAIN_LOG} to tell how it went"
    return "exited", "its trainer is gone and its log does not say how it ended (killed?)"


def direct_run_ids(runs_root: Path) -> list[str]:
    """Direct runs under the runs root, by name."""
    if not Path(runs_root).is_dir():
        return []
    return sorted(p.name for p in Path(runs_root).iterdir() if p.is_dir() and is_direct_run(p))


def not_found(run_id: str, runs_root: Path, target: str, beside: str = "") -> str:
    """One line for a run `target`'s launcher does not know, saying what is true: that it is another target's run
    (recorded in its run directory; --target named the wrong one), or that there is no such run at all (`beside`: what
    else was looked in, e.g. the Docker engine's containers)."""
    found = target_of(Path(runs_root) / run_id)
    if found and found != target:
        return (f"run {run_id!r} is a {found} run, not a {target} one: leave out --target (the run's own is "
                f"recorded) or give --target {found}")
    return f"no run {run_id!r} under {runs_root}{beside}: `verl-deploy runs` lists the runs"


def in_use(run_id: str, run_dir: Path) -> str | None:
    """One line when a live trainer holds run_dir (a local one, or one in a container), else None."""
    holder = rundir.holder(run_dir)
    if holder is None:
        return None
    return (f"run {run_id} is in use by a live trainer{rundir.describe(holder)}: `verl-deploy stop {run_id}` first, "
            "or train under another run id")


def existing_run(runs_root: Path, run_id: str) -> str | None:
    """One line for a new run that would reuse run_id's directory (a launched run or a direct one), else None:
    the trainer would silently resume it. A run a live trainer holds is said to be in use, first."""
    run_dir = Path(runs_root) / run_id
    if busy := in_use(run_id, run_dir):
        return busy
    record = read_record(run_dir)
    if not record and not is_direct_run(run_dir):
        return None
    if record:
        state = state_of(record.get("exit_code"), bool(record.get("stop_asked_at"))) if record.get("finished_at") else ""
    else:
        state = direct_state(run_dir)[0]
    step, total = last_metrics(run_dir).get("step"), total_steps(run_dir)
    said = [f"step {step}" + (f" of {total}" if total else "")] if step is not None else []
    said += [state] if state and state != "unknown" else []
    return (f"run {run_id} already exists under {runs_root}" + (f" ({', '.join(said)})" if said else "")
            + f": `--resume {run_id}` continues it; --run-id NEW starts another")


def local_run_ids(runs_root: Path, target: str | None = None) -> list[str]:
    """Runs recorded under the runs root (of one target, when given), oldest first."""
    if not runs_root.is_dir():
        return []
    found = sorted(p.name for p in runs_root.iterdir() if (p / LAUNCH_RECORD).is_file())
    return [r for r in found if target is None or target_of(runs_root / r) == target]


def follow_log(log, still_running, poll_s: float = 0.5) -> Iterator[str]:
    """An open log's text so far, then (while still_running() says so) what is appended to it, then the rest: the
    `logs -f` of every target whose log is a file in the run directory."""
    yield log.read()
    while still_running():
        time.sleep(poll_s)
        text = log.read()
        if text:
            yield text
    yield log.read()
