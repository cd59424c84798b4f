"""Runs that `python -m verl_runtime train` (or `python -m verl_runtime.main_ppo`) started by itself, as `make
quickstart` does: a run directory under the runs root with the trainer's files and no launch.json. verl-deploy did
not launch them, but they are runs like any other: listed by `runs`, known to `status`, `logs`, `stop`, `runs rm`.
What they are is read from the run directory alone (runs.direct_state): the trainer's lock while it runs, its log
after."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Iterator

from verl_deploy import runs
from verl_deploy.launchers.jobspec import JobSpec, LaunchError, remove_run_dir
from verl_deploy.runs import DIRECT, RunStatus
from verl_runtime import rundir


class DirectLauncher:
    target = DIRECT

    def __init__(self, runs_root: Path):
        self.runs_root = Path(runs_root)

    def dry_run(self, spec: JobSpec) -> str:
        raise LaunchError(f"--target {DIRECT} names runs started by `python -m verl_runtime train`: launch with "
                          "--target local, docker or k8s")

    launch = dry_run

    def _run_dir(self, run_id: str) -> Path:
        run_dir = self.runs_root / run_id
        if not runs.is_direct_run(run_dir):
            raise LaunchError(f"no run {run_id!r} under {self.runs_root}: `verl-deploy runs` lists the runs")
        return run_dir

    def _status(self, run_dir: Path) -> RunStatus:
        state, detail = runs.direct_state(run_dir)
        return runs.run_status(run_dir, self.target, state, detail=detail)

    def status(self, run_id: str) -> RunStatus:
        return self._status(self._run_dir(run_id))

    def logs(self, run_id: str, follow: bool = False) -> Iterator[str]:
        run_dir = self._run_dir(run_id)
        try:
            log = open(run_dir / rundir.TRAIN_LOG, errors="replace")
        except OSError:
            raise LaunchError(f"run {run_id} has no {rundir.TRAIN_LOG} (yet)") from None
        with log:
            yield from runs.follow_log(log, lambda: follow and runs.trainer_holds(run_dir))

    def stop(self, run_id: str) -> str:
        """SIGTERM to the trainer that holds the run directory (it checkpoints), when it runs on this host."""
        run_dir = self._run_dir(run_id)
        holder = rundir.holder(run_dir)
        if holder is None:
            return f"run {run_id} is not running: it {runs.direct_state(run_dir)[0]}; nothing to stop"
        if not holder.get("pid") or holder.get("host") != socket.gethostname():
            raise LaunchError(f"run {run_id} is trained{rundir.describe(holder)}, not on this host: stop it there")
        os.kill(holder["pid"], signal.SIGTERM)
        return f"stopping {run_id}: SIGTERM sent to its trainer (pid {holder['pid']}), it writes a checkpoint"

    def list(self) -> list[RunStatus]:
        return [self._status(self.runs_root / run_id) for run_id in runs.direct_run_ids(self.runs_root)]

    def remove(self, run_id: str, confirm=None) -> list[str]:
        """Remove a run that has ended: its run directory."""
        run_dir = self._run_dir(run_id)
        return remove_run_dir(run_id, run_dir, runs.trainer_holds(run_dir), confirm)
