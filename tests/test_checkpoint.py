"""Checkpoints: atomic step dirs, crash leftovers ignored, pruning, and a full RNG round trip."""

import random

import numpy as np
import torch

from verl_runtime.checkpoint import (
    checkpoint_step,
    latest_checkpoint,
    load_checkpoint,
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
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_10", "step_11", "step_9"]
    assert latest_checkpoint(tmp_path).name == "step_11"


def test_saving_a_step_again_replaces_it(tmp_path):
    save_checkpoint(tmp_path, 4, {"value": 1}, keep_last=1)
    save_checkpoint(tmp_path, 4, {"value": 2}, keep_last=1)
    assert load_checkpoint(latest_checkpoint(tmp_path)) == {"value": 2}
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_4"]


def test_rng_state_round_trips_through_a_checkpoint(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.normal()  # leaves a cached gaussian in NumPy's state
    save_checkpoint(tmp_path, 1, {"rng": rng_state()}, keep_last=1)
    expected = (random.random(), np.random.normal(), np.random.rand(3).tolist(), torch.rand(4))

    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    set_rng_state(load_checkpoint(latest_checkpoint(tmp_path))["rng"])
    again = (random.random(), np.random.normal(), np.random.rand(3).tolist(), torch.rand(4))
    assert expected[:3] == again[:3] and torch.equal(expected[3], again[3])
