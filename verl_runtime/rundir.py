"""A run directory's layout, the one place its file names are defined, and what of it both the trainer and the host
CLI read, torch-free: the live trainer's lock and the checkpoint manifests.

    <run_dir>/config.yaml                          the config the run last started with (the trainer writes it)
    <run_dir>/config-changes.jsonl                 keys changed between starts of the same run
    <run_dir>/metrics.jsonl                        one JSON object per step, verl's metric names
    <run_dir>/train.log                            the trainer's console, teed by `python -m verl_runtime train`
    <run_dir>/console.log                          a local launch's stdout and stderr (the supervisor's)
    <run_dir>/launch.json                          what verl-deploy launched, and how the run ended
    <run_dir>/job.sbatch                           a Slurm run's batch script, as submitted (a requeue runs it again)
    <run_dir>/job.log                              a Slurm job's stdout and stderr (its --output), appended on requeue
    <run_dir>/job-exit.json                        {job_id, restart, exit_code}: how the batch script's last start ended
    <run_dir>/trainer.lock                         flock()ed by the live trainer; JSON {pid, started, host} inside
    <run_dir>/tensorboard/                         TensorBoard event files
    <run_dir>/wandb/, wandb-run-id                 W&B's run files (offline runs too), and its run id: a resume continues it
    <run_dir>/mlruns/, mlflow-run-id               MLflow's local store (no MLFLOW_TRACKING_URI), and the run id a resume continues
    <run_dir>/swanlog/                             SwanLab's local files
    <run_dir>/checkpoints/step_<N>/state.pt        weights, optimizer, RNG and data position of step N
    <run_dir>/checkpoints/step_<N>/manifest.json   {"step", "files": {name: {"size", "sha256"}}}, written last
    <run_dir>/checkpoints/.verified.json           checksums the host already verified (a cache: safe to delete)
    <run_dir>/hf/step_<N>/                         a Hugging Face model directory exported from step N
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import socket
import time
from pathlib import Path

from verl_runtime.errors import UserError

CONFIG_FILE = "config.yaml"
CONFIG_CHANGES_FILE = "config-changes.jsonl"
METRICS_FILE = "metrics.jsonl"
TRAIN_LOG = "train.log"
CONSOLE_LOG = "console.log"
LAUNCH_RECORD = "launch.json"
JOB_SCRIPT = "job.sbatch"
JOB_LOG = "job.log"
JOB_EXIT = "job-exit.json"
LOCK_FILE = "trainer.lock"
SERVICES_FILE = "services.json"  # the run's services while it runs ({name: base URL}): `status` shows them
SERVICES_DIR = "services"  # their logs, when the trainer runs them as processes
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
WANDB_RUN_ID_FILE = "wandb-run-id"
MLFLOW_DIR = "mlruns"
MLFLOW_RUN_ID_FILE = "mlflow-run-id"
SWANLAB_DIR = "swanlog"
CHECKPOINTS_DIR = "checkpoints"
STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"
VERIFIED_FILE = ".verified.json"
EXPORTS_DIR = "hf"
STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir_name(step: int) -> str:
    """checkpoints/ and hf/ name a step's directory so."""
    return f"step_{step}"


class RunDirBusy(UserError):
    """Another live trainer holds the run directory."""


def replace_text(path, text: str) -> None:
    """Write a small file of the run directory whole or not at all (a temp file renamed over it; removed when the
    write fails, a full disk say), so a crash never leaves half of it for the next start to read."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# --- the trainer's lock ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def locked(run_dir, wait_s: float = 2.0):
    """Hold the run directory for this process: a second trainer on it fails with one line instead of
    interleaving its metrics and logs. The lock is the kernel's (flock), so it ends with the process however it
    ends (kill -9, OOM), and it holds across a container's bind mount."""
    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s  # a host's holder() probe holds it for an instant
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    who = describe(_read_holder(path))
                    raise RunDirBusy(f"run directory {run_dir} is in use by another trainer{who}: stop it first "
                                     "(`verl-deploy stop RUN`), or train under another run id") from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "started": time.time(), "host": socket.gethostname()}).encode())
        yield
    finally:
        os.close(fd)  # releases the lock


def holder(run_dir) -> dict | None:
    """Who holds the run directory now ({pid, started, host}), or None when no live trainer does."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(path) or {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def describe(found: dict) -> str:
    """' (pid N on HOST)' for a holder() that says who it is, else ''."""
    if not found.get("pid"):
        return ""
    return f" (pid {found['pid']} on {found.get('host', '?')})"


# --- checkpoint manifests -------------------------------------------------------------------------------------

def write_manifest(directory, step: int) -> Path:
    """Record every file of a finished checkpoint directory with its size and SHA-256, then fsync: the last file
    a save writes, so a checkpoint without one (or whose files disagree with it) is incomplete."""
    directory = Path(directory)
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST_FILE):
        files[str(path.relative_to(directory))] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest = directory / MANIFEST_FILE
    with open(manifest, "w", encoding="utf-8") as handle:
        json.dump({"step": step, "files": files}, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    return manifest


def checkpoint_problem(directory, deep: bool = False, known: dict | None = None) -> str | None:
    """Why a checkpoint directory cannot be used (None: it is complete). Sizes always; checksums when deep.

    known: {file name: fingerprint} of checksums verified before (checked_checkpoints' cache); a file whose
    fingerprint is unchanged is not hashed again, and each file hashed and found right is added to it."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST_FILE).read_text(encoding="utf-8"))
        files = manifest["files"]
    except FileNotFoundError:
        return "no manifest (the save did not finish)"
    except (OSError, ValueError, KeyError, TypeError):
        return "its manifest is unreadable"
    if not files:
        return "its manifest lists no files"
    for name, expected in files.items():
        path = directory / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != expected.get("size"):
            return f"{name} is {size} bytes, the manifest says {expected.get('size')} (truncated?)"
        if deep:
            fingerprint = _fingerprint(path, expected.get("sha256"))
            if known is not None and known.get(name) == fingerprint:
                continue
            if _sha256(path) != expected.get("sha256"):
                return f"{name} does not match its checksum (corrupt)"
            if known is not None:
                known[name] = fingerprint
    return None


def checked_checkpoints(run_dir) -> list[tuple[int, Path, str | None]]:
    """Every checkpoint directory, oldest first, with why it cannot be used (None: sizes and checksums match its
    manifest). What the host shows as valid is what a resume can load.

    Hashing gigabytes on every `status` would be slow, so the checksums verified are kept in
    checkpoints/.verified.json, each with its file's inode, size, mtime and ctime: any write to a file changes
    its ctime, which no one can set back (unlike mtime), so a changed file is always hashed again. Best effort: a
    run directory this user cannot write is hashed every time."""
    cache_path = Path(run_dir) / CHECKPOINTS_DIR / VERIFIED_FILE
    cache = _read_cache(cache_path)
    found, verified = [], {}
    for step, path in checkpoint_dirs(run_dir):
        known = cache.get(path.name)
        known = dict(known) if isinstance(known, dict) else {}
        problem = checkpoint_problem(path, deep=True, known=known)
        if problem is None:
            verified[path.name] = known
        found.append((step, path, problem))
    if verified != cache:
        _write_quietly(cache_path, verified)
    return found


def note_verified(directory) -> None:
    """Add a checkpoint just saved to checked_checkpoints' cache: write_manifest hashed the very bytes the save wrote,
    so they need not be read again (best effort, as the cache)."""
    directory = Path(directory)
    try:
        files = json.loads((directory / MANIFEST_FILE).read_text(encoding="utf-8"))["files"]
        entry = {name: _fingerprint(directory / name, expected["sha256"]) for name, expected in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
    cache_path = directory.parent / VERIFIED_FILE
    _write_quietly(cache_path, {**_read_cache(cache_path), directory.name: entry})


def _read_cache(path: Path) -> dict:
    try:
        cache = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def checkpoint_dirs(run_dir) -> list[tuple[int, Path]]:
    """Every checkpoints/step_<N> directory, complete or not, oldest first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return sorted(found)


def valid_checkpoints(run_dir, deep: bool = False) -> list[tuple[int, Path]]:
    """The complete checkpoints, oldest first."""
    return [(step, path) for step, path in checkpoint_dirs(run_dir) if checkpoint_problem(path, deep) is None]


def _fingerprint(path: Path, sha256) -> list:
    """What must stay the same for a verified checksum to hold: the file (inode, size, mtime, ctime) and the
    checksum its manifest expects."""
    stat = path.stat()
    return [stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, sha256]


def _write_quietly(path: Path, data: dict) -> None:
    """Write a cache file (temp file and rename); a run directory this user cannot write just keeps no cache."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
