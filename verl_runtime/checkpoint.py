"""Checkpoints that a crash cannot corrupt: run_dir/checkpoints/step_<N>/state.pt, written to a temp dir and renamed.

A state is a dict of tensors, numbers, strings, lists and dicts (model and optimizer state_dicts, rng_state(),
the data position, ...). It is loaded with ``torch.load(weights_only=True)``, so a checkpoint cannot run code.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

STATE_FILE = "state.pt"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir(run_dir) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir, step: int, state: dict, keep_last: int) -> Path:
    """Write state as step_<step> atomically, then keep only the newest keep_last checkpoints (0: keep all)."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step_{step}-", dir=root))
    try:
        with open(tmp / STATE_FILE, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        _fsync_dir(tmp)
        if final.exists():  # saving the same step again (e.g. at the end right after a periodic save)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(root, keep_last)
    return final


def latest_checkpoint(run_dir) -> Path | None:
    """The newest complete checkpoint; temp dirs of interrupted saves are ignored."""
    steps = _complete_checkpoints(checkpoint_dir(run_dir))
    return steps[-1][1] if steps else None


def load_checkpoint(path) -> dict:
    """The state saved in checkpoint directory path, tensors on the CPU."""
    return torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)


def checkpoint_step(path) -> int:
    """The step number of a checkpoint directory (step_<N>)."""
    return int(_STEP_DIR.match(Path(path).name).group(1))


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


def _complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and (entry / STATE_FILE).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def _prune(root: Path, keep_last: int) -> None:
    """Drop all but the newest keep_last checkpoints, and temp dirs that interrupted saves left behind."""
    steps = _complete_checkpoints(root)
    if keep_last > 0:
        for _, path in steps[:-keep_last]:
            shutil.rmtree(path, ignore_errors=True)
    for entry in root.glob(".tmp-step_*"):
        shutil.rmtree(entry, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (a new file, a rename) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
