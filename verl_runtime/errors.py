"""Errors the user can fix: each carries one line that says what went wrong and what to do.

The entrypoint prints ``error: <message>`` and exits 2, without a traceback (unless --debug). A fault of the
machine under the run (a full disk or quota, a read-only file system, no permission) becomes such a line too,
through machine_fault(): the runtime's entrypoints and the host CLI both use it. Running out of memory does too
(OutOfMemory, worded by verl_runtime/oom.py, which needs the run's config).
"""

import contextlib
import errno


# The exit code of a UserError: the same input fails the same way again, so a scheduler should not retry it
# (the Kubernetes Job's podFailurePolicy fails the Job at once on it).
EXIT_USER_ERROR = 2


class UserError(Exception):
    """A one-line, user-facing error."""


class DataError(UserError):
    """A data file is missing, unreadable or not in verl's row layout."""


class RewardFunctionError(UserError):
    """A custom reward function cannot be loaded."""


class ConfigError(UserError):
    """The configuration is invalid."""


class ModelError(UserError):
    """A model directory is missing or cannot be loaded."""


class TrainingError(UserError):
    """Training cannot go on: a NaN loss, or out of memory (the message names the knob to turn)."""


class OutOfMemory(TrainingError):
    """Out of GPU or host memory, or no room for vLLM's KV cache: one line with the phase, the micro-batch, the plan's
    figure, the fix and the kept checkpoint (verl_runtime/oom.py words it).

    Exit 2 like any UserError: resumed unchanged, the run meets the same data in the same order (seeded, the RNG
    restored) and runs out of memory in the same micro-batch again, so a scheduler should not retry it on the GPUs
    (Kubernetes fails the Job at once); the line says which setting to change, and --resume takes it."""


class MachineFault(UserError):
    """The machine refuses a write where the run keeps its files: read-only, no permission, or no space.

    Exit 2 like any UserError: the same run on the same disk fails the same way again until someone frees space or
    fixes the permissions, so a scheduler should not retry it (Kubernetes fails the Job at once)."""


class DiskFull(MachineFault):
    """No space left on the device (or the disk quota reached) where the run writes."""


# Where a trainer's files can go instead: verl-deploy's --runs-dir is named too, as a launched trainer's run
# directory is the one under it.
RUN_DIR_ELSEWHERE = "point trainer.run_dir (verl-deploy: --runs-dir) at"
# errno -> (what it means, what to do), {elsewhere} filled in by the caller.
_FAULTS = {
    errno.ENOSPC: ("no space left on device", "free space on that disk, or {elsewhere} a larger one"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota, or {elsewhere} another disk"),
    errno.EROFS: ("read-only file system", "{elsewhere} a writable directory"),
    errno.EACCES: ("permission denied", "make it writable for this user, or {elsewhere} a writable directory"),
    errno.EPERM: ("operation not permitted", "make it writable for this user, or {elsewhere} a writable directory"),
}
# torch.save's zip writer reports a failed write as RuntimeError("... unexpected pos N vs M") (or "file write
# failed"); written to a file object, the OSError behind it is its __context__, written to a path it is not kept.
_TORCH_WRITE_FAILED = ("unexpected pos", "file write failed")


def machine_fault(exc: BaseException, path=None, then: str = "",
                  elsewhere: str = RUN_DIR_ELSEWHERE) -> MachineFault | None:
    """exc as one line when a machine fault is behind it (itself, or the error it was raised from or during), else
    None. path: what was being written (default: the file the OSError names); then: what is kept, said before
    what to do; elsewhere: the setting that moves the files ("point X at")."""
    found = _fault_errno(exc)
    if found is None:
        return None
    code, filename = found
    reason, fix = _FAULTS[code]
    kind = DiskFull if code in (errno.ENOSPC, errno.EDQUOT) else MachineFault
    return kind(f"cannot write {path or filename or 'the run directory'}: {reason}{then}: "
                f"{fix.format(elsewhere=elsewhere)}")


@contextlib.contextmanager
def machine_faults():
    """Re-raise an error with a machine fault behind it as that fault's one line (the original as its cause, for
    --debug); any other error passes unchanged."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        fault = machine_fault(exc)
        if fault is None:
            raise
        raise fault from exc


def _fault_errno(exc: BaseException | None) -> tuple[int, str | None] | None:
    seen = 0
    torch_write = False
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in _FAULTS:
            return exc.errno, exc.filename
        torch_write = torch_write or (isinstance(exc, RuntimeError) and any(t in str(exc) for t in _TORCH_WRITE_FAILED))
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return (errno.ENOSPC, None) if torch_write else None  # a write cut short: in practice a full disk
