"""Checkpoints: atomic step dirs, crash leftovers ignored, manifests, pruning, and a full RNG round trip."""

import json
import os
import random
import shutil

import numpy as np
import torch

from verl_runtime import rundir
from verl_runtime.checkpoint import (
    checkpoint_step,
    latest_checkpoint,
    load_checkpoint,
    load_newest,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def _state(step):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "data": {"epoch": 0}}


def test_save_then_load_round_trips_model_and_optimizer(tmp_path):
    state = _state(3)
    path = save_checkpoint(tmp_path, 3, state, keep_last=2)

    assert path == tmp_path / "checkpoints" / "step_3" and checkpoint_step(path) == 3
    loaded = load_checkpoint(path)
    assert loaded["step"] == 3 and loaded["data"] == {"epoch": 0}
    assert all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())
    restored = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=1e-3)
    restored.load_state_dict(loaded["optimizer"])
    assert torch.equal(restored.state_dict()["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])


def test_latest_ignores_what_a_crashed_save_left_behind(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    save_checkpoint(tmp_path, 2, _state(2), keep_last=0)
    # A save killed mid-write leaves a temp dir (with a partial file) and never renames it.
    crashed = tmp_path / "checkpoints" / ".tmp-step_4-abc123"
    crashed.mkdir()
    (crashed / "state.pt").write_bytes(b"\x80partial")
    # A step dir without its state file is not a checkpoint either.
    (tmp_path / "checkpoints" / "step_5").mkdir()

    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_2"
    assert load_checkpoint(latest_checkpoint(tmp_path))["step"] == 2
    # The next successful save cleans the crash leftovers up.
    save_checkpoint(tmp_path, 6, _state(6), keep_last=0)
    assert not crashed.exists()
    assert latest_checkpoint(tmp_path).name == "step_6"


def test_keep_last_prunes_oldest_by_step_number(tmp_path):
    for step in (1, 2, 9, 10, 11):
        save_checkpoint(tmp_path, step, _state(step), keep_last=3)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()) == ["step_10", "step_11", "step_9"]
    assert latest_checkpoint(tmp_path).name == "step_11"


def test_saving_a_step_again_replaces_it(tmp_path):
    save_checkpoint(tmp_path, 4, {"value": 1}, keep_last=1)
    save_checkpoint(tmp_path, 4, {"value": 2}, keep_last=1)
    assert load_checkpoint(latest_checkpoint(tmp_path)) == {"value": 2}
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()] == ["step_4"]


def test_rng_state_round_trips_through_a_checkpoint(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.normal()  # leaves a cached gaussian in NumPy's state
    save_checkpoint(tmp_path, 1, {"rng": rng_state()}, keep_last=1)
    expected = (random.random(), np.random.normal(), np.random.rand(3).tolist(), torch.rand(4))

    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    set_rng_state(load_checkpoint(latest_checkpoint(tmp_path))["rng"])
    again = (random.random(), np.random.normal(), np.random.rand(3).tolist(), torch.rand(4))
    assert expected[:3] == again[:3] and torch.equal(expected[3], again[3])


# --- manifests: a checkpoint damaged after its save is passed over ---------------------------------------------


def test_a_save_ends_with_its_manifest(tmp_path):
    path = save_checkpoint(tmp_path, 1, _state(1), keep_last=0)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 1
    assert manifest["files"]["state.pt"]["size"] == (path / "state.pt").stat().st_size
    assert rundir.checkpoint_problem(path, deep=True) is None


def test_truncated_and_corrupt_checkpoints_are_not_the_latest(tmp_path):
    for step in (1, 2):
        save_checkpoint(tmp_path, step, _state(step), keep_last=0)
    step_1, step_2 = (tmp_path / "checkpoints" / name / "state.pt" for name in ("step_1", "step_2"))
    os.truncate(step_2, step_2.stat().st_size // 2)  # a disk that filled up, a copy cut short
    assert latest_checkpoint(tmp_path).name == "step_1"
    with open(step_1, "r+b") as handle:  # one byte flipped, the size unchanged: only the checksum sees it
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert latest_checkpoint(tmp_path).name == "step_1"
    assert latest_checkpoint(tmp_path, deep=True) is None


def test_load_newest_passes_over_damaged_checkpoints_and_says_why(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, _state(step), keep_last=0)
    step_2, step_3 = tmp_path / "checkpoints" / "step_2", tmp_path / "checkpoints" / "step_3"
    size = (step_3 / "state.pt").stat().st_size
    os.truncate(step_3 / "state.pt", 123)
    # Damaged before its manifest was written: the manifest agrees, torch.load does not.
    (step_2 / "state.pt").write_bytes(b"PK\x03\x04 not a zip archive")
    rundir.write_manifest(step_2, 2)

    path, state, unusable = load_newest(tmp_path)
    assert path.name == "step_1" and state["step"] == 1
    assert [(bad.name, why) for bad, why in unusable][0] == (
        "step_3", f"state.pt is 123 bytes, the manifest says {size} (truncated?)")
    assert unusable[1][0].name == "step_2" and unusable[1][1].startswith("torch.load failed: RuntimeError: ")
    assert "\n" not in unusable[1][1]


def test_nothing_usable_loads_nothing(tmp_path):
    save_checkpoint(tmp_path, 1, _state(1), keep_last=0)
    os.remove(tmp_path / "checkpoints" / "step_1" / "manifest.json")
    assert load_newest(tmp_path) == (None, None, [(tmp_path / "checkpoints" / "step_1",
                                                   "no manifest (the save did not finish)")])


def test_pruning_counts_only_complete_checkpoints(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, _state(step), keep_last=0)
    os.truncate(root / "step_1" / "state.pt", 10)  # damaged and older than the good ones: removed
    for step in (7, 8):  # damaged and newer: they must not push the good ones out
        shutil.copytree(root / "step_3", root / f"step_{step}")
        os.truncate(root / f"step_{step}" / "state.pt", 10)

    save_checkpoint(tmp_path, 4, _state(4), keep_last=2)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["step_3", "step_4", "step_7", "step_8"]
    assert [step for step, _ in rundir.valid_checkpoints(tmp_path)] == [3, 4]


def flip_a_byte(path) -> None:
    """Bit rot, or a write that kept the size: only the checksum sees it."""
    with open(path, "r+b") as handle:
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 0xFF]))


def test_a_corrupt_checkpoint_of_the_right_size_does_not_push_the_good_ones_out(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        save_checkpoint(tmp_path, step, _state(step), keep_last=2)
    flip_a_byte(root / "step_2" / "state.pt")

    save_checkpoint(tmp_path, 3, _state(3), keep_last=2)

    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["step_1", "step_3"]  # the corrupt step_2 went
    assert [step for step, _ in rundir.valid_checkpoints(tmp_path, deep=True)] == [1, 3]
    assert load_newest(tmp_path)[0].name == "step_3"


def test_a_save_notes_its_own_checksums_so_pruning_reads_no_checkpoint_again(tmp_path, monkeypatch):
    for step in (1, 2):
        save_checkpoint(tmp_path, step, _state(step), keep_last=2)
    hashed = []
    real = rundir._sha256
    monkeypatch.setattr(rundir, "_sha256", lambda path: hashed.append(path.parent.name) or real(path))

    save_checkpoint(tmp_path, 3, _state(3), keep_last=2)

    # write_manifest's hash of the bytes it wrote, in the save's temp dir: nothing is read back to prune
    assert len(hashed) == 1 and hashed[0].startswith(".tmp-step_3-")
    assert [problem for _, _, problem in rundir.checked_checkpoints(tmp_path)] == [None, None] and len(hashed) == 1
