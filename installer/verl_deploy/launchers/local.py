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
from verl_runtime import rundir
from verl_runtime.rundir import CONSOLE_LOG
from verl_deploy.launchers.jobspec import Gpus, JobSpec, LaunchError, launch_fault, remove_run_dir
from verl_deploy.runs import RunStatus



def host_gpu_env(gpus: Gpus) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for the GPUs asked for, after checking that this host has them and that this Python's
    torch can use them (else the run would quietly train on the CPU)."""
    if not gpus.wanted:
        return {}
    from verl_deploy.doctor.torch_check import installed_torch

    env = visible_devices(gpus, _gpus_here())
    build = installed_torch()
    if build is None or build[1] is None:
        what = "no torch" if build is None else f"torch {build[0]}, a CPU build,"
        raise LaunchError(f"--gpus {gpus}: this Python has {what} so the run would train on the CPU: install a CUDA "
                          "build (`verl-deploy doctor` says which), or use --target docker")
    return env


def _gpus_here() -> int:
    from verl_deploy import host_facts

    return len(host_facts.read().capabilities)


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
        if spec.upstream:  # upstream verl in the python3 on PATH (host_verl)
            from verl_deploy.launchers import host_verl

            return host_verl.argv(spec, host_verl.python())
        return [sys.executable, "-m", "verl_runtime", *spec.command.host_args]

    def environment(self, spec: JobSpec) -> dict[str, str]:
        """What the trainer gets on top of this host's environment."""
        if spec.upstream:
            from verl_deploy.launchers import host_verl

            found = _gpus_here()
            if found == 0:
                raise LaunchError("--runtime verl --target local: this host has no NVIDIA GPU, and verl trains on GPUs "
                                  "only: run it on a GPU host or cluster (--target k8s, slurm), or train on this CPU "
                                  "with our runtime (drop --runtime verl)")
            return {**host_verl.environment(spec), **visible_devices(spec.gpus, found)}  # verl checks its torch
        cache = {"HF_HOME": str(spec.hf_cache)} if spec.hf_cache else {}  # --hf-cache: this host's folder
        # trainer.mode=separate_async: the rollout's GPUs are visible too, after the trainer's (async_rollout.py)
        gpus = Gpus(count=spec.gpus_of("trainer")) if spec.rollout_gpus and not spec.gpus.device_ids else spec.gpus
        return {**host_gpu_env(gpus), **cache, **spec.env}

    def dry_run(self, spec: JobSpec) -> str:
        env = " ".join(f"{key}={shlex.quote(value)}" for key, value in self.environment(spec).items()
                       if key not in spec.env)  # --env values are the user's: not echoed
        return (env + " " if env else "") + shlex.join(self.command(spec))

    def launch(self, spec: JobSpec, detach: bool = False) -> int:
        if self._running(spec.run_dir):
            raise LaunchError(f"run {spec.run_id} is still running: `verl-deploy stop {spec.run_id}` first")
        run_env = self.environment(spec)
        fresh = not spec.run_dir.exists()
        log_path = spec.run_dir / CONSOLE_LOG
        try:
            spec.run_dir.mkdir(parents=True, exist_ok=True)
            log_path.touch()
        except OSError as exc:
            raise _abandon(spec.run_dir, fresh, exc) from None
        offset = log_path.stat().st_size  # a resumed run's log goes on: follow from where this start begins
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **run_env}
        # The supervisor records the exit code; a session of its own: the run survives the CLI and the terminal,
        # and gets signals only from us.
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "verl_deploy.launchers.supervise", str(spec.run_dir), "--", *self.command(spec)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )
        try:
            runs.record_launch(spec.run_dir, spec.launch(self.target, command=tuple(self.command(spec))),
                               pid=supervisor.pid, pid_start=runs.process_start(supervisor.pid), exit_code=None,
                               detail="")
        except OSError as exc:  # a full disk: no run without its record (stop and status could not find it)
            _signal_session(supervisor.pid, signal.SIGKILL)
            supervisor.wait()
            raise _abandon(spec.run_dir, fresh, exc) from None
        if detach:
            return 0
        code = _follow(supervisor, log_path, offset)
        if code and (why := unsaid_full_disk(spec.run_dir, log_path, offset)):
            _say(why)
        return code

    def _run_dir(self, run_id: str) -> Path:
        run_dir = self.runs_root / run_id
        if runs.target_of(run_dir) != self.target:
            raise LaunchError(runs.not_found(run_id, self.runs_root, self.target))
        return run_dir

    def _running(self, run_dir: Path) -> bool:
        """The trainer holds its run directory, or the run's supervisor (the pid recorded, with the same start
        time: not a later process that got the number) is still starting it."""
        record = runs.read_record(run_dir)
        return runs.trainer_holds(run_dir) or runs.same_process(record.get("pid"), record.get("pid_start"))

    def _status(self, run_dir: Path) -> RunStatus:
        record = runs.read_record(run_dir)
        # Once the supervisor has recorded the exit code the run is over, though it lives on for an instant after.
        ended = record.get("exit_code") is not None and not runs.trainer_holds(run_dir)
        if not ended and self._running(run_dir):
            return runs.run_status(run_dir, self.target, "running", exit_code=None, detail="")
        if record.get("exit_code") is None:
            return runs.run_status(run_dir, self.target, "exited",
                                   detail="its processes are gone and no exit code was recorded (killed?)")
        return runs.run_status(run_dir, self.target, runs.state_of(record["exit_code"]))

    def status(self, run_id: str) -> RunStatus:
        return self._status(self._run_dir(run_id))

    def logs(self, run_id: str, follow: bool = False) -> Iterator[str]:
        run_dir = self._run_dir(run_id)
        with open(run_dir / CONSOLE_LOG, errors="replace") as log:
            yield from runs.follow_log(log, lambda: follow and self._running(run_dir))

    def stop(self, run_id: str) -> str:
        """SIGTERM to the run's session (the trainer checkpoints), once it is sure the pid is still the run's."""
        run_dir = self._run_dir(run_id)
        record = runs.read_record(run_dir)
        if runs.same_process(record.get("pid"), record.get("pid_start")):
            os.killpg(record["pid"], signal.SIGTERM)  # the whole session: the trainer and anything it started
            return f"stopping {run_id}: SIGTERM sent, it writes a checkpoint"
        holder = rundir.holder(run_dir)
        if holder and holder.get("pid") and runs.process_start(holder["pid"]) is not None:
            os.kill(holder["pid"], signal.SIGTERM)  # its supervisor is gone; the lock says who trains
            return f"stopping {run_id}: SIGTERM sent to its trainer (pid {holder['pid']}), it writes a checkpoint"
        state = self._status(run_dir).state
        reused = " (its recorded pid now belongs to another process)" if runs.process_start(record.get("pid")) else ""
        return f"run {run_id} is not running{reused}: it {state}; nothing to stop"

    def list(self) -> list[RunStatus]:
        return [self._status(self.runs_root / run_id) for run_id in runs.local_run_ids(self.runs_root, self.target)]

    def remove(self, run_id: str, confirm=None) -> list[str]:
        """Remove a run that has ended: its run directory (config, metrics, logs, checkpoints)."""
        run_dir = self._run_dir(run_id)
        return remove_run_dir(run_id, run_dir, self._running(run_dir), confirm)


def _abandon(run_dir: Path, fresh: bool, exc: OSError) -> LaunchError:
    """A launch the host could not write: the run directory goes if this launch made it; the one-line error."""
    if fresh:
        import shutil

        shutil.rmtree(run_dir, ignore_errors=True)
    return launch_fault(exc, run_dir)


# Less free space than this on a failed run's disk, and no error line from the run: its disk filled up.
FULL_BELOW = 1 << 20


def unsaid_full_disk(run_dir: Path, log_path: Path, offset: int = 0) -> str | None:
    """A run that filled its disk may have had no room left for its own error line (its console log is on that
    disk): then the one line is said here, on the terminal. None when the run said why, or the disk has room."""
    import shutil

    try:
        with open(log_path, "rb") as log:
            log.seek(max(offset, log.seek(0, os.SEEK_END) - 65536))
            said = any(line.startswith(b"error: ") for line in log.read().splitlines())
        free = shutil.disk_usage(run_dir).free
    except OSError:
        return None
    if said or free >= FULL_BELOW:
        return None
    return (f"error: the disk holding {run_dir} is full ({free} bytes free), so the run could not write why it "
            f"stopped: free space there (or move the runs with --runs-dir), then `verl-deploy run --resume "
            f"{run_dir.name}`")


def _follow(supervisor: subprocess.Popen, log_path: Path, offset: int = 0) -> int:
    """Print the console log as it grows until the run ends. Ctrl-C, a closed terminal (SIGHUP) or SIGTERM send
    SIGTERM to the run, which checkpoints and exits; a second Ctrl-C kills it. The trainer writes to its log file,
    not to us, so a terminal that goes away cannot break it: we just stop echoing."""
    interrupts = 0

    def on_signal(signum, frame):
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            _say(f"\nstopping ({signal.Signals(signum).name}): SIGTERM sent, the run writes a checkpoint "
                 "(Ctrl-C again to kill it)")
            _signal_session(supervisor.pid, signal.SIGTERM)
        elif signum == signal.SIGINT:
            _signal_session(supervisor.pid, signal.SIGKILL)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, on_signal) for signum in handled}
    echo = True
    try:
        with open(log_path, "rb") as log:
            log.seek(offset)
            while True:
                done = supervisor.poll() is not None
                chunk = log.read()
                if chunk and echo:
                    echo = _echo(chunk)
                if done:
                    break
                if not chunk:
                    time.sleep(0.2)
        return supervisor.returncode
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _echo(chunk: bytes) -> bool:
    """Copy to our stdout; False once the terminal is gone (then the run goes on without an audience)."""
    try:
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
        return True
    except OSError:
        return False


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass


def _signal_session(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass  # it ended meanwhile
