"""Each policy-loss mode, the ReMax estimator and the learning-rate schedules train on the CPU (the built-in model)."""

from __future__ import annotations

import math

import pytest
import torch

from verl_runtime.config import POLICY_LOSSES, load_config
from verl_runtime.errors import TrainingError
from verl_runtime.metrics import read_metrics
from verl_runtime.trainer import SingleControllerTrainer
from verl_runtime.workers import optim


def run(run_dir, *overrides):
    """Two steps of GRPO on the toy task with verl's spelling of the keys, as a verl script would give them."""
    config = load_config(None, [
        "model.path=builtin:tiny", "trainer.device=cpu", f"trainer.run_dir={run_dir}", "data.toy_size=16",
        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "data.max_response_length=6",
        "data.max_prompt_length=64",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=2",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.tensorboard=false",
        "actor_rollout_ref.actor.optim.lr=1e-3", *overrides,
    ])
    SingleControllerTrainer(config).fit()
    return read_metrics(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [mode for mode in POLICY_LOSSES if mode != "vanilla"])
def test_every_policy_loss_mode_trains_two_steps(tmp_path, mode):
    extra = ["actor_rollout_ref.actor.policy_loss.dro_beta=0.5"] if mode == "dro" else []
    records = run(tmp_path, f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}", *extra)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert math.isfinite(record["actor/pg_loss"]) and math.isfinite(record["actor/grad_norm"])


@pytest.mark.slow
def test_remax_trains_on_the_reward_of_a_greedy_response_per_prompt(tmp_path):
    records = run(tmp_path, "algorithm.adv_estimator=remax", "actor_rollout_ref.rollout.n=2")
    assert [r["step"] for r in records] == [1, 2] and all("timing_s/gen_max" in r for r in records)
    assert all(math.isfinite(r["actor/pg_loss"]) for r in records)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_the_optimal_token_baselines_train_on_the_actors_sum_of_squared_probabilities(tmp_path, estimator):
    records = run(tmp_path, f"algorithm.adv_estimator={estimator}")
    assert [r["step"] for r in records] == [1, 2] and all("timing_s/old_log_prob" in r for r in records)
    assert all(math.isfinite(r["actor/pg_loss"]) and math.isfinite(r["critic/advantages/max"]) for r in records)


def test_sum_pi_squared_comes_with_the_same_old_log_probs(tiny_model_dir):
    config = load_config(None, [f"model.path={tiny_model_dir}", "trainer.device=cpu"])
    trainer = SingleControllerTrainer(config)
    samples = [{"prompt": "2 + 2?", "response": r, "reward": 0.0} for r in ("4", "five")]
    batch = trainer._encode_samples(samples)
    both = trainer.actor.compute_log_prob_and_sum_pi_squared(batch)
    assert torch.equal(both["old_log_prob"], trainer.actor.compute_log_prob(batch))
    probs = both["old_log_prob"].exp()
    assert ((both["sum_pi_squared"] >= probs**2 - 1e-6) & (both["sum_pi_squared"] <= 1 + 1e-6)).all()


@pytest.mark.slow
def test_the_learning_rate_follows_verls_warmup_and_cosine_and_is_logged_as_verl_does(tmp_path):
    records = run(tmp_path, "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.5",
                  "actor_rollout_ref.actor.optim.warmup_style=cosine", "actor_rollout_ref.actor.optim.min_lr_ratio=0.1",
                  "actor_rollout_ref.actor.optim.weight_decay=0.1", "actor_rollout_ref.actor.optim.betas=[0.8,0.95]")
    # one warm-up step of 2, from 0 (the first update has learning rate 0); then the cosine from lr down to
    # min_lr_ratio x lr at the last step. verl logs the rate after its scheduler's step: the next update's
    assert [r["actor/lr"] for r in records] == pytest.approx([1e-3, 0.1 * 1e-3])


def test_a_schedule_that_needs_the_run_length_says_so_in_step(tiny_model_dir):
    config = load_config(None, [f"model.path={tiny_model_dir}", "trainer.device=cpu", "algorithm.adv_estimator=grpo",
                                "actor.lr_scheduler_type=cosine"])
    trainer = SingleControllerTrainer(config)
    samples = [{"prompt": "2 + 2?", "response": r, "reward": float(r == "4")} for r in ("4", "5")]
    with pytest.raises(TrainingError, match="set trainer.total_training_steps"):
        trainer.step(samples)
    trainer.total_steps = 10
    assert math.isfinite(trainer.step(samples)["loss"])
    optimizer = trainer.actor.workers[0].optimizer
    assert optimizer.param_groups[0]["lr"] == pytest.approx(config.actor.lr)  # cosine at step 0 of 10, no warm-up
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.999) and optimizer.param_groups[0]["weight_decay"] == 0.01


def test_the_default_schedule_is_the_constant_lr():
    config = load_config(None, [])
    assert [optim.learning_rate(config.actor, step, None) for step in range(3)] == [config.actor.lr] * 3
    assert not optim.needs_total_steps(config.actor) and not optim.needs_total_steps(config.critic)
    torch.testing.assert_close(torch.tensor(optim.learning_rate(config.critic, 5, 10)), torch.tensor(config.critic.lr))
