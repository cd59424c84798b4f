"""Checkpoints that a crash cannot corrupt: run_dir/checkpoints/step_<N>/state.pt, written to a temp dir and renamed.

Each checkpoint carries a manifest (rundir.write_manifest: sizes and SHA-256), written last: a checkpoint whose files
disagree with it (truncated or damaged after the save, a copy cut short) is passed over, never loaded.

A state is a dict of tensors, numbers, strings, lists and dicts (model and optimizer state_dicts, rng_state(),
the data position, ...). It is loaded with ``torch.load(weights_only=True)``, so a checkpoint cannot run code.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from verl_runtime import rundir
from verl_runtime.errors import machine_fault

STATE_FILE = rundir.STATE_FILE


def checkpoint_dir(run_dir) -> Path:
    return Path(run_dir) / rundir.CHECKPOINTS_DIR


def save_checkpoint(run_dir, step: int, state: dict, keep_last: int) -> Path:
    """Write state as step_<step> atomically, then keep only the newest keep_last checkpoints (0: keep all)."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / rundir.step_dir_name(step)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step_{step}-", dir=root))
        tmp.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would hide it from `export`'s container user and teammates
        try:
            with open(tmp / STATE_FILE, "wb") as handle:  # a file object: torch's error then keeps the OSError
                torch.save(state, handle)
                handle.flush()
                os.fsync(handle.fileno())
            rundir.write_manifest(tmp, step)  # last: its presence says every other file is whole
            _fsync_dir(tmp)
            if final.exists():  # saving the same step again (e.g. at the end right after a periodic save)
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(root)
            rundir.note_verified(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except (OSError, RuntimeError) as exc:
        fault = machine_fault(exc, f"checkpoint {final.name} in {root}", _kept(run_dir))
        if fault is None:
            raise
        raise fault from exc
    _prune(run_dir, keep_last)
    return final


def _kept(run_dir) -> str:
    """What a failed save leaves to resume from, for its error line."""
    valid = _complete_checkpoints(run_dir)
    if not valid:
        return f"; no checkpoint was written yet, {rundir.METRICS_FILE} is kept"
    step, path = valid[-1]
    return f"; {path} (step {step}) and {rundir.METRICS_FILE} are kept, the same command resumes from there"


def latest_checkpoint(run_dir, deep: bool = False) -> Path | None:
    """The newest complete checkpoint (its manifest's sizes match; checksums too when deep); temp dirs of
    interrupted saves are ignored."""
    steps = _complete_checkpoints(run_dir, deep)
    return steps[-1][1] if steps else None


def load_newest(run_dir) -> tuple[Path | None, dict | None, list[tuple[Path, str]]]:
    """The newest checkpoint that is complete (sizes and checksums) and loads, its state, and the newer ones passed
    over with why: (None, None, [...]) when none is usable."""
    unusable = []
    for _, path in reversed(rundir.checkpoint_dirs(run_dir)):
        problem = rundir.checkpoint_problem(path, deep=True)
        if problem is None:
            try:
                return path, load_checkpoint(path), unusable
            except (EOFError, RuntimeError, pickle.UnpicklingError) as exc:  # damaged although its manifest matches
                problem = f"torch.load failed: {type(exc).__name__}: {_first_sentence(exc)}"
        unusable.append((path, problem))
    return None, None, unusable


def load_checkpoint(path) -> dict:
    """The state saved in checkpoint directory path, tensors on the CPU."""
    return torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)


def checkpoint_step(path) -> int:
    """The step number of a checkpoint directory (step_<N>)."""
    return int(rundir.STEP_DIR.match(Path(path).name).group(1))


def rng_state() -> dict:
    """Python, NumPy and torch (CPU and every CUDA device) RNG states, in types weights_only loading accepts."""
    algorithm, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [algorithm, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached_gaussian],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what rng_state() captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    algorithm, keys, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((algorithm, keys.numpy().astype(np.uint32), pos, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _complete_checkpoints(run_dir, deep: bool = False) -> list[tuple[int, Path]]:
    """(step, path) of the checkpoints that match their manifests, oldest first."""
    return rundir.valid_checkpoints(run_dir, deep)


def _prune(run_dir, keep_last: int) -> None:
    """Keep the newest keep_last usable checkpoints (0: all), usable as a resume judges them: sizes and checksums
    (rundir.checked_checkpoints, which hashes only what it has not verified before; a save notes its own). So damaged
    ones, truncated or of the right size, never push the last good ones out; damaged ones older than the newest good
    one go, as do interrupted saves' temp dirs."""
    valid = [(step, path) for step, path, problem in rundir.checked_checkpoints(run_dir) if problem is None]
    if keep_last > 0:
        for _, path in valid[:-keep_last]:
            shutil.rmtree(path, ignore_errors=True)
    if valid:
        valid_paths = {path for _, path in valid}
        for step, path in rundir.checkpoint_dirs(run_dir):
            if step < valid[-1][0] and path not in valid_paths:
                shutil.rmtree(path, ignore_errors=True)
    for entry in checkpoint_dir(run_dir).glob(".tmp-step_*"):
        shutil.rmtree(entry, ignore_errors=True)


def _first_sentence(exc: BaseException) -> str:
    """The first sentence of an exception's text (torch's go on for a paragraph)."""
    text = " ".join(str(exc).split())
    return text.split(". ")[0][:200]


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (a new file, a rename) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
