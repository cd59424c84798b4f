"""`python -m verl_deploy.launchers.supervise RUN_DIR -- COMMAND...`: the parent of a local run's trainer.

It lives in the run's session with the trainer, waits for it and records its exit code in the run directory,
so a detached run's ending is known after the CLI that started it is gone. Signals are the trainer's business:
`stop` signals the whole session (the trainer checkpoints on SIGTERM/SIGHUP/SIGINT), so this process only
outlives them; it never forwards one (a second SIGTERM would make the trainer skip its checkpoint).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from pathlib import Path

from verl_deploy import runs
from verl_runtime.rundir import CONSOLE_LOG


def _ignore(signum, frame) -> None:
    """A handler, not SIG_IGN: an ignored signal would stay ignored in the trainer after exec."""


def exit_code(returncode: int) -> int:
    """A shell's convention: 128 + N for a process ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def main(argv: list[str]) -> int:
    run_dir, command = Path(argv[0]), argv[argv.index("--") + 1 :]
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _ignore)
    with open(run_dir / CONSOLE_LOG, "ab") as log:
        # The console log, never a pipe: no terminal that goes away can break the trainer's output.
        trainer = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    # A full disk must not end this process before the trainer: the record is then the launcher's, and the exit
    # code reaches a following CLI all the same (a detached run's status then says its end was not recorded).
    with contextlib.suppress(OSError):
        runs.write_record(run_dir, {"trainer_pid": trainer.pid})
    returncode = trainer.wait()
    detail = f"killed by {signal.Signals(-returncode).name}" if returncode < 0 else ""
    with contextlib.suppress(OSError):
        runs.record_finished(run_dir, exit_code(returncode), detail)
    return exit_code(returncode)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
