"""JobSpec -> the runtime in a subprocess on this host (no container): the quickest loop, and CI without images."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from verl_deploy import runs
from verl_deploy.launchers.jobspec import Gpus, JobSpec, LaunchError
from verl_deploy.runs import RunStatus

CONSOLE_LOG = "console.log"  # the subprocess's stdout and stderr


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (finished, not yet reaped by its parent) is not running.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def host_gpu_env(gpus: Gpus) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for the GPUs asked for, after checking that this host has them and that this Python's
    torch can use them (else the run would quietly train on the CPU)."""
    if not gpus.wanted:
        return {}
    from verl_deploy.doctor.torch_check import installed_torch
    from verl_deploy.images.listing import host_reading

    found = len(host_reading()[1])
    env = visible_devices(gpus, found)
    build = installed_torch()
    if build is None or build[1] is None:
        what = "no torch" if build is None else f"torch {build[0]}, a CPU build,"
        raise LaunchError(f"--gpus {gpus}: this Python has {what} so the run would train on the CPU: install a CUDA "
                          "build (`verl-deploy doctor` says which), or use --target docker")
    return env


def visible_devices(gpus: Gpus, found: int) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for `gpus` on a host with `found` GPUs; LaunchError where it has fewer."""
    wanted = found if gpus.count < 0 else gpus.number or 0
    indices = [i for i in gpus.device_ids if i.isdigit()]
    if found == 0 or wanted > found or any(int(i) >= found for i in indices):
        have = "no NVIDIA GPU" if found == 0 else f"{found} NVIDIA GPU{'s' * (found > 1)}"
        fix = "drop --gpus to train on the CPU" if found == 0 else f"ask for at most {found}"
        raise LaunchError(f"--gpus {gpus}: this host has {have}: {fix}")
    ids = gpus.device_ids or tuple(str(i) for i in range(wanted))
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids)}


class LocalLauncher:
    target = "local"

    def __init__(self, runs_root: Path):
        self.runs_root = Path(runs_root)

    def command(self, spec: JobSpec) -> list[str]:
        return [sys.executable, "-m", "verl_runtime", *spec.train_args(str(spec.config_path), str(spec.run_dir))]

    def dry_run(self, spec: JobSpec) -> str:
        env = " ".join(f"{key}={shlex.quote(value)}" for key, value in host_gpu_env(spec.gpus).items())
        return (env + " " if env else "") + shlex.join(self.command(spec))

    def launch(self, spec: JobSpec, detach: bool = False) -> int:
        record = runs.read_record(spec.run_dir)
        if _alive(record.get("pid")):
            raise LaunchError(f"run {spec.run_id} is still running: `verl-deploy stop {spec.run_id}` first")
        gpu_env = host_gpu_env(spec.gpus)
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **gpu_env, **spec.env}
        with open(spec.run_dir / CONSOLE_LOG, "ab") as log:
            # A session of its own: the run survives the CLI when detached, and gets signals only from us.
            process = subprocess.Popen(
                self.command(spec),
                stdout=log if detach else subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        runs.write_record(spec.run_dir, {"run_id": spec.run_id, "target": self.target, "pid": process.pid,
                                         "command": self.command(spec), "exit_code": None})
        if detach:
            return 0
        code = self._follow(process, spec.run_dir / CONSOLE_LOG)
        runs.write_record(spec.run_dir, {"exit_code": code})
        return code

    def _follow(self, process: subprocess.Popen, log_path: Path) -> int:
        """Copy the output to the terminal and the console log; Ctrl-C sends SIGTERM so the runtime checkpoints."""

        def on_sigint(signum, frame):
            print("\nstopping: SIGTERM sent, the run writes a checkpoint", file=sys.stderr)
            process.send_signal(signal.SIGTERM)

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            with open(log_path, "ab") as log:
                for line in process.stdout:
                    sys.stdout.write(line.decode(errors="replace"))
                    sys.stdout.flush()
                    log.write(line)
                    log.flush()
            return process.wait()
        finally:
            signal.signal(signal.SIGINT, previous)

    def _run_dir(self, run_id: str) -> Path:
        run_dir = self.runs_root / run_id
        if runs.read_record(run_dir).get("target") != self.target:
            raise LaunchError(f"no local run {run_id!r} under {self.runs_root}: `verl-deploy runs` lists the runs")
        return run_dir

    def _status(self, run_dir: Path) -> RunStatus:
        record = runs.read_record(run_dir)
        code = record.get("exit_code")
        if _alive(record.get("pid")):
            state = "running"
        elif code is None:
            state = "exited"  # detached: the exit code went with the process
        else:
            state = "succeeded" if code == 0 else "stopped" if code in (-15, 130, 143) else "failed"
        return RunStatus(
            run_id=run_dir.name,
            target=self.target,
            state=state,
            exit_code=code,
            run_dir=str(run_dir.resolve()),
            metrics=runs.last_metrics(run_dir),
            checkpoints=runs.checkpoints(run_dir),
        )

    def status(self, run_id: str) -> RunStatus:
        return self._status(self._run_dir(run_id))

    def logs(self, run_id: str, follow: bool = False) -> Iterator[str]:
        run_dir = self._run_dir(run_id)
        path = run_dir / CONSOLE_LOG
        with open(path, errors="replace") as log:
            yield log.read()
            while follow and _alive(runs.read_record(run_dir).get("pid")):
                time.sleep(0.5)
                text = log.read()
                if text:
                    yield text
            yield log.read()

    def stop(self, run_id: str) -> None:
        pid = runs.read_record(self._run_dir(run_id)).get("pid")
        if _alive(pid):
            os.killpg(pid, signal.SIGTERM)  # the whole session: the trainer and anything it started

    def list(self) -> list[RunStatus]:
        return [
            self._status(self.runs_root / run_id)
            for run_id in runs.local_run_ids(self.runs_root)
            if runs.read_record(self.runs_root / run_id).get("target") == self.target
        ]
