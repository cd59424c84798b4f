"""verl 0.9.1's policy-loss modes and learning-rate schedules against ours, number for number.

verl's files come from its PyPI wheel (tests/verl_wheel.py); the random batches are test_verl_parity's.
"""

from __future__ import annotations

import zipfile

import pytest
import torch
import yaml

import verl_runtime.algorithms as A
from test_verl_parity import CASES, MODES, Config, batch, same, verl  # noqa: F401  (verl: the wheel fixture)
from verl_runtime.config import ActorConfig
from verl_runtime.config import Config as OurConfig
from verl_wheel import WHEEL
from verl_runtime.workers import optim

# every mode verl 0.9.1 registers but bypass_mode (its rollout-correction plumbing: algorithm.rollout_correction,
# refused here)
LOSS_MODES = ["vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo"]


def test_the_registered_policy_losses_are_verls(verl):
    assert set(A.POLICY_LOSS_REGISTRY) == set(verl.core_algos.POLICY_LOSS_REGISTRY) - {"bypass_mode"}
    assert set(A.POLICY_LOSS_REGISTRY) == set(LOSS_MODES)


def actor_config(verl, seed: int, mask: torch.Tensor):
    """verl's ActorConfig (its class, which gspo, sapo and cispo check for) with varied clip and mode settings."""
    policy_loss = Config(clip_cov_ratio=[0.0002, 0.3, 1.0][seed % 3], clip_cov_lb=[1.0, -5.0][seed % 2],
                         clip_cov_ub=[5.0, 50.0][seed % 2], kl_cov_ratio=[0.0002, 0.25, 1.0][seed % 3],
                         ppo_kl_coef=[0.1, 1.0][seed % 2], dro_beta=[0.5, 2.0][seed % 2])
    info = {} if seed % 2 else {"batch_num_tokens": int(mask.sum()) + 3, "global_batch_size": 9, "dp_size": 2}
    return verl.core_algos.ActorConfig(
        clip_ratio=0.2, clip_ratio_low=[None, 0.1][seed % 2], clip_ratio_high=[None, 0.28][seed % 2],
        clip_ratio_c=[3.0, 10.0][seed % 2], tau_pos=1.0, tau_neg=1.05, policy_loss=policy_loss, global_batch_info=info,
    )


@pytest.mark.parametrize("seed", range(CASES))
@pytest.mark.parametrize("mode", LOSS_MODES)
def test_policy_loss_modes_values_metrics_and_gradients(verl, seed, mode):
    _, mask, _, advantages = batch(seed, min_tokens=1)
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(mask.shape, generator=g) * 3
    new = (old + [0.05, 0.5, 2.0][seed % 3] * torch.randn(mask.shape, generator=g)).requires_grad_()
    weights = [None, torch.rand(mask.shape, generator=g)][seed % 2]
    agg = MODES[seed % len(MODES)]
    config = actor_config(verl, seed, mask)

    def run(fn):
        torch.manual_seed(seed)  # clip_cov draws its tokens from the global generator
        loss, metrics = fn(old, new, advantages, mask, agg, config, weights)
        loss.backward()
        grad, new.grad = new.grad, None
        return loss.detach(), metrics, grad

    ours, theirs = run(A.get_policy_loss_fn(mode)), run(verl.core_algos.get_policy_loss_fn(mode))
    same(ours[0], theirs[0])
    assert set(ours[1]) == set(theirs[1])
    for name, value in theirs[1].items():
        assert ours[1][name] == pytest.approx(value, abs=1e-6), name
    same(ours[2], theirs[2])


# ---------------------------------------------------------------------------------------------- LR schedules


def verl_lrs(verl, schedule: str, steps: int, warmup: int, total: int, **options) -> list[float]:
    """The LR verl's scheduler gives each step: before the first step, then after each scheduler.step()."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    if schedule == "constant":
        scheduler = verl.F.get_constant_schedule_with_warmup(opt, num_warmup_steps=warmup)
    else:
        scheduler = verl.F.get_cosine_schedule_with_warmup(opt, num_warmup_steps=warmup, num_training_steps=total, **options)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(steps):
        opt.step()
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    return lrs


SCHEDULES = [("constant", {})] + [("cosine", options) for options in (
    {}, {"min_lr_ratio": 0.1}, {"num_cycles": 1.5, "min_lr_ratio": 0.0}, {"zero_indexed_step": False, "min_lr_ratio": 0.3})]


@pytest.mark.parametrize("schedule, options", SCHEDULES)
@pytest.mark.parametrize("warmup_steps, ratio", [(-1, 0.0), (0, 0.0), (3, 0.0), (-1, 0.25), (5, 0.5), (-1, 1.0)])
@pytest.mark.parametrize("total", [1, 7, 20])
def test_learning_rate_schedules_are_verls(verl, schedule, options, warmup_steps, ratio, total):
    cfg = ActorConfig(lr=1e-3, lr_warmup_steps=warmup_steps, lr_warmup_steps_ratio=ratio, lr_scheduler_type=schedule,
                      **options)
    warmup = optim.num_warmup_steps(cfg, total)
    assert warmup == (warmup_steps if warmup_steps > 0 else int(ratio * total))  # verl's FSDP engine's rule
    theirs = verl_lrs(verl, schedule, total + 3, warmup, total, **options)
    ours = [optim.learning_rate(cfg, step, total) for step in range(total + 4)]
    assert ours == pytest.approx(theirs, rel=1e-12, abs=0)


def test_verls_optimizer_defaults_are_ours(verl):
    """verl's composed config (in its wheel) against our defaults, for actor and critic."""
    with zipfile.ZipFile(verl.root.parent / WHEEL) as wheel:
        tree = yaml.safe_load(wheel.read("verl/trainer/config/_generated_ppo_trainer.yaml"))
    ours = OurConfig()
    for theirs, section in ((tree["actor_rollout_ref"]["actor"]["optim"], ours.actor), (tree["critic"]["optim"], ours.critic)):
        assert (section.lr, section.weight_decay, section.betas, section.grad_clip) == (
            theirs["lr"], theirs["weight_decay"], theirs["betas"], theirs["clip_grad"])
        for name in ("lr_warmup_steps", "lr_warmup_steps_ratio", "lr_scheduler_type", "min_lr_ratio", "num_cycles",
                     "zero_indexed_step"):
            assert getattr(section, name) == theirs[name], name
    actor = tree["actor_rollout_ref"]["actor"]
    assert (ours.actor.tau_pos, ours.actor.tau_neg) == (actor["tau_pos"], actor["tau_neg"])
    for name, value in actor["policy_loss"].items():
        if name != "_target_":
            assert getattr(ours.actor.policy_loss, name) == value, name


@pytest.mark.parametrize("seed", range(10))
def test_sum_pi_squared_is_verls(verl, seed):
    logits = torch.randn(3, 5, 17, generator=torch.Generator().manual_seed(seed)) * [0.1, 1.0, 30.0][seed % 3]
    same(A.calculate_sum_pi_squared_from_logits(logits), verl.F.calculate_sum_pi_squared_from_logits(logits))
