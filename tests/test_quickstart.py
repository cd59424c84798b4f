"""The quickstart (examples/quickstart.yaml) learns its toy task: the reward climbs, with a fixed seed."""

import json

import pytest

from conftest import REPO
from verl_runtime.__main__ import main

STEPS = 30


@pytest.mark.slow
def test_quickstart_reward_climbs(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_RUNTIME_CACHE", str(tmp_path / "cache"))  # builtin:tiny built offline, here
    code = main([
        "train", str(REPO / "examples" / "quickstart.yaml"),
        "--set", f"trainer.run_dir={tmp_path / 'run'}",
        "--set", f"trainer.total_training_steps={STEPS}",
        "--set", "trainer.test_freq=-1",  # validation is not what this test measures
    ])
    assert code == 0
    rewards = [json.loads(line)["critic/score/mean"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rewards) == STEPS
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"quickstart reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert last > 0.4 and last > first + 0.3, rewards
