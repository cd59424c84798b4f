"""verl 0.9.1's own functions against ours, on seeded random inputs and on the edge cases.

verl's files come from its PyPI wheel (tests/verl_wheel.py downloads it into the pytest cache); nothing of verl
is installed. Where verl returns NaN (an all-masked batch) we return 0: those cases are tested as such.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

import verl_runtime.algorithms as A
from verl_wheel import verl  # verl: the fixture

CASES = 50


class Config(dict):
    """What verl's functions read from `config`: attributes and .get, as an OmegaConf DictConfig gives."""

    __getattr__ = dict.get


def same(ours, theirs, atol=1e-5):
    torch.testing.assert_close(torch.as_tensor(ours).double(), torch.as_tensor(theirs).double(), atol=atol, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- random batches


def batch(seed: int, min_tokens: int = 0):
    """A random batch: rows of any length (empty ones too), masks with holes (multi-turn) in some cases, groups
    of one or more samples, tied scores in some cases (0/1 outcomes), rewards on the last token or dense."""
    g = np.random.default_rng(seed)
    bs, length = int(g.integers(1, 9)), int(g.integers(1, 8))
    lengths = g.integers(0, length + 1, size=bs)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)
    if g.random() < 0.4:  # holes: tool output inside the response
        mask = mask * (g.random((bs, length)) < 0.7)
    while mask.sum() < min_tokens:  # the whitening estimators need at least two tokens
        mask[g.integers(bs), g.integers(length)] = 1.0
        if bs * length < min_tokens:
            return batch(seed + 1000, min_tokens)
    groups = g.integers(0, max(1, bs // 2) + 1, size=bs)
    index = np.array([f"uid-{k}" for k in groups], dtype=object)
    if g.random() < 0.5:
        scores = g.integers(0, 2, size=bs).astype(np.float32)  # ties
        rewards = np.zeros((bs, length), np.float32)
        rewards[np.arange(bs), length - 1] = scores
    else:
        rewards = g.normal(size=(bs, length)).astype(np.float32)
    values = g.normal(size=(bs, length)).astype(np.float32)
    return torch.from_numpy(rewards), torch.from_numpy(mask), index, torch.from_numpy(values)


SEEDS = range(CASES)


# ---------------------------------------------------------------------------------------------- advantages


@pytest.mark.parametrize("seed", SEEDS)
def test_gae(verl, seed):
    rewards, mask, _, values = batch(seed, min_tokens=2)
    gamma, lam = [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0)][seed % 3]
    ours = A.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    theirs = verl.core_algos.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    for a, b in zip(ours, theirs):
        same(a, b)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("name", ["grpo", "grpo_vectorized"])
def test_grpo_with_and_without_std_norm(verl, seed, norm, name):
    rewards, mask, index, _ = batch(seed)
    ours = A.get_adv_estimator_fn(name)(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    theirs = verl.core_algos.get_adv_estimator_fn(name)(rewards.clone(), mask, index, norm_adv_by_std_in_grpo=norm)
    for a, b in zip(ours, theirs):
        same(a, b)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "name", ["rloo", "rloo_vectorized", "opo", "gpg", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]
)
def test_outcome_estimators_through_the_registry_with_verls_config(verl, seed, name):
    needs_whitening = name.startswith("reinforce_plus_plus")
    rewards, mask, index, _ = batch(seed, min_tokens=2 if needs_whitening else 0)
    config = Config(gamma=[1.0, 0.9, 0.0][seed % 3], lam=1.0, norm_adv_by_std_in_grpo=True)
    kwargs = {"token_level_rewards": rewards, "response_mask": mask, "config": config, "index": index}
    ours = A.get_adv_estimator_fn(name)(**kwargs)
    theirs = verl.core_algos.get_adv_estimator_fn(name)(**{**kwargs, "token_level_rewards": rewards.clone()})
    for a, b in zip(ours, theirs):
        if name == "opo":  # a group of only empty responses: verl's baseline is 0/0 (NaN), ours 0
            b = torch.nan_to_num(b, nan=0.0)
        same(a, b)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk(verl, seed, norm):
    rewards, mask, _, _ = batch(seed)
    if len(rewards) < 2:
        rewards, mask = rewards.repeat(2, 1), mask.repeat(2, 1)
    index = np.array([f"uid-{i // 2}" for i in range(len(rewards) - len(rewards) % 2)] + ["uid-0"] * (len(rewards) % 2))
    config = Config(norm_adv_by_std_in_grpo=norm)
    ours = A.compute_grpo_passk_outcome_advantage(rewards, mask, index, config=config)
    theirs = verl.core_algos.compute_grpo_passk_outcome_advantage(rewards, mask, index, config=config)
    for a, b in zip(ours, theirs):
        same(a, b)


@pytest.mark.parametrize("seed", range(10))
def test_remax_given_the_greedy_baselines(verl, seed):
    rewards, mask, _, values = batch(seed)
    baselines = values[:, 0]
    ours = A.compute_remax_outcome_advantage(rewards, baselines, mask)
    theirs = verl.core_algos.compute_remax_outcome_advantage(rewards, baselines, mask)
    for a, b in zip(ours, theirs):
        same(a, b)


def test_reinforce_plus_plus_with_holes_carries_the_return_over_tool_output(verl):
    # one multi-turn response: tokens, a tool-output span (mask 0, with a reward on it), tokens again
    rewards = torch.tensor([[0.0, 0.0, 7.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0, 0.0]])
    config = Config(gamma=0.5)
    ours = A.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config)
    theirs = verl.core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config)
    same(ours[1], theirs[1])
    same(ours[1][0], [0.25, 0.5, 0.0, 0.0, 1.0])  # the reward on the tool output is dropped
    same(ours[0], theirs[0])
    # our older keyword and positional spellings still work
    same(A.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)[0], theirs[0])
    same(A.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, 0.5)[0], theirs[0])


def test_single_sample_groups_and_ties(verl):
    rewards = torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 3.0]])
    mask = torch.ones(4, 2)
    index = np.array(["tie", "tie", "tie", "alone"], dtype=object)
    for name in ["grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "opo", "gpg", "reinforce_plus_plus_baseline"]:
        kwargs = {"token_level_rewards": rewards, "response_mask": mask, "index": index, "config": Config(gamma=1.0)}
        ours = A.get_adv_estimator_fn(name)(**kwargs)
        same(ours[0], verl.core_algos.get_adv_estimator_fn(name)(**{**kwargs, "token_level_rewards": rewards.clone()})[0])
    with pytest.raises(ValueError, match="at least 2 samples"):
        A.compute_grpo_passk_outcome_advantage(rewards, mask, index, config=Config())


def test_the_whitening_estimators_refuse_an_all_masked_batch_as_verl_does(verl):
    rewards, mask = torch.ones(2, 3), torch.zeros(2, 3)
    for fn in (A.compute_reinforce_plus_plus_outcome_advantage, verl.core_algos.compute_reinforce_plus_plus_outcome_advantage):
        with pytest.raises(ValueError):
            fn(rewards, mask, config=Config(gamma=1.0))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_optimal_token_baselines(verl, seed, name):
    rewards, mask, index, values = batch(seed)
    if len(set(index)) == len(index) and len(index) > 1:
        index[1] = index[0]  # at least one group of two
    g = torch.Generator().manual_seed(seed)
    kwargs = {"token_level_rewards": rewards, "response_mask": mask, "index": index,
              "old_log_probs": -torch.rand(mask.shape, generator=g), "sum_pi_squared": torch.rand(mask.shape, generator=g),
              "rollout_is_weights": [None, torch.rand(mask.shape, generator=g)][seed % 2], "handle_zero_tail": seed % 3 > 0}
    ours = A.get_adv_estimator_fn(name)(**kwargs)
    theirs = verl.core_algos.get_adv_estimator_fn(name)(**kwargs)
    for a, b in zip(ours, theirs):
        same(a, b)


@pytest.mark.parametrize("seed", SEEDS)
def test_gdpo_with_and_without_reward_components(verl, seed):
    rewards, mask, index, _ = batch(seed, min_tokens=2)
    ours = A.compute_gdpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=seed % 2 == 0)
    theirs = verl.core_algos.compute_gdpo_outcome_advantage(rewards.clone(), mask, index, norm_adv_by_std_in_grpo=seed % 2 == 0)
    same(ours[0], theirs[0])
    g = np.random.default_rng(seed)
    bs, length = mask.shape
    prompts = torch.zeros(bs, 2, dtype=torch.long)
    lengths = torch.from_numpy(g.integers(1, length + 1, size=bs))
    attention = torch.cat([torch.ones(bs, 2, dtype=torch.long), (torch.arange(length) < lengths[:, None]).long()], dim=1)
    components = {"format": g.integers(0, 2, size=bs).astype(float), "accuracy": g.random(bs)}
    config = Config(gdpo_reward_keys=["format", "accuracy"], gdpo_reward_weights=[[1.0, 1.0], [0.3, 2.0]][seed % 2])
    kwargs = {"config": config, "non_tensor_batch": components, "batch": {"prompts": prompts, "attention_mask": attention}}
    ours = A.compute_gdpo_outcome_advantage(rewards, mask, index, **kwargs)
    theirs = verl.core_algos.compute_gdpo_outcome_advantage(rewards.clone(), mask, index, **kwargs)
    same(ours[0], theirs[0])


def test_registry_names_are_verls(verl):
    assert set(A.ADV_ESTIMATOR_REGISTRY) == set(verl.core_algos.ADV_ESTIMATOR_REGISTRY)
    # verl's enum members work as names
    for member in verl.core_algos.AdvantageEstimator:
        assert A.get_adv_estimator_fn(member) is A.get_adv_estimator_fn(member.value)


def test_register_adv_est_is_verls_decorator():
    @A.register_adv_est("test_only_constant")
    def constant(token_level_rewards, response_mask, config=None, **kwargs):
        return response_mask, response_mask

    try:
        assert A.get_adv_estimator_fn("test_only_constant") is constant
        mask = torch.ones(1, 2)
        assert A.compute_advantage("test_only_constant", mask, mask)[0] is mask  # compute_advantage reads the registry
        A.register_adv_est("test_only_constant")(constant)  # the same function again: fine
        with pytest.raises(ValueError, match="already been registered"):
            A.register_adv_est("test_only_constant")(lambda **kwargs: None)
    finally:
        del A.ADV_ESTIMATOR_REGISTRY["test_only_constant"]


# ---------------------------------------------------------------------------------------------- aggregation, losses


MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum"]


def test_every_verl_mode_is_here():
    assert set(A.LOSS_AGG_MODES) == set(MODES)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", MODES)
def test_agg_loss(verl, seed, mode):
    _, mask, _, loss_mat = batch(seed, min_tokens=1)
    same(A.agg_loss(loss_mat, mask, mode), verl.core_algos.agg_loss(loss_mat, mask, mode))
    # the global-batch parameters, as verl 0.9.1 defines them
    totals = {"dp_size": 1 + seed % 3, "batch_num_tokens": 3 + seed, "global_batch_size": 2 + seed % 5,
              "loss_scale_factor": [None, 4, 7][seed % 3]}
    same(A.agg_loss(loss_mat, mask, mode, **totals), verl.core_algos.agg_loss(loss_mat, mask, mode, **totals))


@pytest.mark.parametrize("mode", MODES)
def test_agg_loss_all_masked_batch_is_zero_where_verl_gives_nan(verl, mode):
    loss_mat, mask = torch.randn(3, 4), torch.zeros(3, 4)
    theirs = verl.core_algos.agg_loss(loss_mat, mask, mode)
    assert torch.isnan(theirs) or theirs == 0
    assert A.agg_loss(loss_mat, mask, mode) == 0
    with pytest.raises(ValueError, match="required when dp_size > 1"):
        A.agg_loss(loss_mat, mask, "seq-mean-token-mean" if mode == "token-mean" else "token-mean", dp_size=2)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", MODES)
def test_policy_loss_values_and_gradients(verl, seed, mode):
    _, mask, _, advantages = batch(seed, min_tokens=1)
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(mask.shape, generator=g) * 3
    new = (old + 0.5 * torch.randn(mask.shape, generator=g)).requires_grad_()
    clip = {"cliprange": 0.2, "cliprange_low": [None, 0.1][seed % 2], "cliprange_high": [None, 0.28][seed % 2],
            "clip_ratio_c": 3.0}

    def run(fn, log_prob):
        outputs = fn(old, log_prob, advantages, mask, loss_agg_mode=mode, **clip)
        outputs[0].backward()
        return outputs

    ours = run(A.compute_policy_loss, new)
    grad, new.grad = new.grad, None
    with pytest.warns(Warning):  # verl marks its compute_policy_loss deprecated
        theirs = run(verl.core_algos.compute_policy_loss, new)
    for a, b in zip(ours, theirs):
        same(a.detach(), b.detach())
    same(grad, new.grad)


@pytest.mark.parametrize("seed", range(10))
def test_vanilla_policy_loss_reads_the_actor_config(verl, seed):
    _, mask, _, advantages = batch(seed, min_tokens=1)
    old = -torch.rand(mask.shape)
    new = old + 0.3 * torch.randn(mask.shape)
    weights = torch.rand(mask.shape)
    config = Config(clip_ratio=0.2, clip_ratio_low=0.15, clip_ratio_high=None, clip_ratio_c=2.5,
                    global_batch_info={"batch_num_tokens": int(mask.sum()) + 3, "global_batch_size": 9})
    ours = A.get_policy_loss_fn("vanilla")(old, new, advantages, mask, "seq-mean-token-mean", config, weights)
    theirs = verl.core_algos.get_policy_loss_fn("vanilla")(old, new, advantages, mask, "seq-mean-token-mean", config, weights)
    same(ours[0], theirs[0])
    assert ours[1] == pytest.approx(theirs[1], abs=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", MODES)
def test_value_loss(verl, seed, mode):
    returns, mask, _, values = batch(seed, min_tokens=1)
    vpreds = values + torch.randn(values.shape, generator=torch.Generator().manual_seed(seed))
    totals = {} if seed % 2 else {"dp_size": 2, "batch_num_tokens": 11, "global_batch_size": 5, "loss_scale_factor": 3}
    ours = A.compute_value_loss(vpreds, returns, values, mask, 0.5, mode, **totals)
    theirs = verl.core_algos.compute_value_loss(vpreds, returns, values, mask, 0.5, mode, **totals)
    for a, b in zip(ours, theirs):
        same(a, b)
    # this module's shorthand for the same totals
    same(A.compute_value_loss(vpreds, returns, values, mask, 0.5, mode, global_batch_info=totals)[0], theirs[0])


# ---------------------------------------------------------------------------------------------- KL, helpers


KL_TYPES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("kind", KL_TYPES + [k + "+" for k in KL_TYPES])
def test_kl_penalty_values_and_gradients(verl, seed, kind):
    g = torch.Generator().manual_seed(seed)
    ref = -torch.rand(4, 6, generator=g) * 5
    logprob = (ref + torch.randn(4, 6, generator=g) * [0.1, 1.0, 30.0][seed % 3]).requires_grad_()  # 30: clamps
    ours = A.kl_penalty(logprob, ref, kind)
    ours.sum().backward()
    grad, logprob.grad = logprob.grad, None
    theirs = verl.core_algos.kl_penalty(logprob, ref, kind)
    theirs.sum().backward()
    same(ours.detach(), theirs.detach())
    same(grad, logprob.grad)


@pytest.mark.parametrize("seed", range(10))
def test_masked_helpers_and_logits_helpers(verl, seed):
    rewards, mask, _, values = batch(seed, min_tokens=2)
    same(A.masked_mean(values, mask), verl.F.masked_mean(values, mask))
    same(A.masked_mean(values, mask, axis=-1), verl.F.masked_mean(values, mask, axis=-1))
    same(A.masked_var(values, mask), verl.F.masked_var(values, mask))
    same(A.masked_whiten(values, mask), verl.F.masked_whiten(values, mask))
    logits = torch.randn(*mask.shape, 13, generator=torch.Generator().manual_seed(seed))
    labels = torch.randint(13, mask.shape, generator=torch.Generator().manual_seed(seed))
    same(A.entropy_from_logits(logits), verl.F.entropy_from_logits(logits))
    same(A.logprobs_from_logits(logits, labels), verl.F.logprobs_from_logits(logits, labels))


def test_kl_controllers(verl):
    ours, theirs = A.AdaptiveKLController(0.2, 0.1, 100), verl.core_algos.AdaptiveKLController(0.2, 0.1, 100)
    for kl in [0.0, 0.05, 0.1, 0.5, 3.0]:
        ours.update(kl, 16)
        theirs.update(kl, 16)
        assert ours.value == pytest.approx(theirs.value)


# ---------------------------------------------------------------------------------------------- rewards

from verl_runtime.rewards import default_compute_score, gsm8k, math_dapo, math_reward  # noqa: E402

RESPONSES = [
    "",
    "   ",
    "Natalia sold 48/2 = 24 clips in May.\nAltogether she sold 48+24 = 72 clips.\n#### 72",
    "#### 1,000",
    "The answer is #### $1,000.50",
    "#### -3",
    "I think it is 72.",
    "#### 72\n#### 73",
    "so 3.5 and then .",
    "x" * 400 + " #### 5",
    "#### 5" + "y" * 400,
    "The answer is $\\boxed{\\frac{1}{2}}$.",
    "\\boxed{0.5}",
    "\\boxed{\\dfrac12}",
    "\\boxed{50\\%}",
    "\\boxed{50\\\\%}",
    "\\boxed{10^{\\circ}}",
    "\\boxed {3}",
    "\\boxed 3$ and more",
    "\\boxed{\\text{(A)}}",
    "\\boxed{x = 4}",
    "\\boxed{3/4}",
    "\\boxed{\\sqrt2}",
    "\\boxed{5 \\text{ cm}}",
    "\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}",
    "unclosed \\boxed{3",
    "\\fbox{4}",
    "\\boxed{}",
    "Answer: 204",
    "Answer: $\\frac{3}{4}$ dollars",
    "answer : 1,234\nmore text",
    "Answer: x = 12 units",
    "\\boxed{12} Answer: 13",
    "\\frac",
    "\\boxed{\\frac}",
    "\\boxed{\\sqrt}",
]
TRUTHS = ["72", "1000", "1000.50", "-3", "5", "\\frac{1}{2}", "0.5", "50", "10", "3", "4", "\\frac{3}{4}",
          "\\sqrt{2}", "(3,\\frac{\\pi}{2})", "204", "12", "1234", "(A)", ""]


@pytest.mark.parametrize("response", RESPONSES)
def test_scorers_on_real_looking_strings(verl, response, capsys):
    for truth in TRUTHS:
        for method in ("strict", "flexible"):
            assert gsm8k.compute_score(response, truth, method=method) == verl.gsm8k.compute_score(response, truth, method=method)
            assert gsm8k.extract_solution(response, method) == verl.gsm8k.extract_solution(response, method)
        assert math_reward.compute_score(response, truth) == verl.math_reward.compute_score(response, truth)
        assert math_reward.is_equiv(response, truth) == verl.math_reward.is_equiv(response, truth)
        ours, theirs = math_dapo.compute_score(response, truth), verl.math_dapo.compute_score(response, truth)
        assert ours == theirs
    boxed = verl.math_reward.last_boxed_only_string(response)
    assert math_reward.last_boxed_only_string(response) == boxed
    try:
        expected = verl.math_reward.strip_string(response)
    except Exception:
        expected = Exception
    try:
        got = math_reward.strip_string(response)
    except Exception:
        got = Exception
    assert got == expected


SOURCES = ["openai/gsm8k", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
           "math", "math_dapo", "math_dapo_reasoning", "aime2024", "aime_2025"]


@pytest.mark.parametrize("source", SOURCES)
def test_default_compute_score_routes_each_source_as_verl(verl, source, capsys):
    for response in RESPONSES:
        for truth in TRUTHS:
            theirs = verl.reward_score.default_compute_score(source, response, truth)
            theirs = theirs["score"] if isinstance(theirs, dict) else theirs
            assert default_compute_score(source, response, truth) == theirs, (response, truth)


# ---------------------------------------------------------------------------------------------- metric names

from verl_runtime import trainer  # noqa: E402


def fake_step(with_critic: bool):
    """A small step's batch: 3 samples, one of them aborted (empty response)."""
    prompt, response = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]]), torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    batch = {
        "prompts": torch.zeros(3, 3, dtype=torch.long), "responses": torch.zeros(3, 3, dtype=torch.long),
        "attention_mask": torch.cat([prompt, response], dim=1), "response_mask": response.float(),
        "token_level_scores": torch.rand(3, 3), "token_level_rewards": torch.rand(3, 3),
        "advantages": torch.randn(3, 3), "returns": torch.randn(3, 3),
    }
    if with_critic:
        batch["values"] = torch.randn(3, 3)
    return batch


# the phases our trainer times in a step (gen, reward, ref, values, old_log_prob, adv, update_*, testing, step)
OUR_PHASES = ["gen", "reward", "ref", "values", "old_log_prob", "adv", "update_critic", "update_actor", "testing", "step"]


@pytest.mark.parametrize("with_critic", [True, False])
def test_our_step_metric_names_are_verls(verl, with_critic):
    batch = fake_step(with_critic)
    timing = {name: 0.5 for name in OUR_PHASES}
    source = (verl.root / "verl/trainer/ppo/ray_trainer.py").read_text()
    for phase in OUR_PHASES:  # verl times a phase of this name
        assert f'marked_timer("{phase}"' in source or phase == "ref" and "str(Role.RefPolicy)" in source
    proto = verl.DataProto(batch=batch, non_tensor_batch={}, meta_info={"global_token_num": batch["attention_mask"].sum(-1).tolist()})
    theirs = {
        **verl.metric_utils.compute_data_metrics(proto, use_critic=with_critic),
        **verl.metric_utils.compute_timing_metrics(proto, timing),
        **verl.metric_utils.compute_throughout_metrics(proto, timing, n_gpus=1),
    }
    assert '"training/global_step"' in source and '"training/epoch"' in source
    theirs.update({"training/global_step": 1, "training/epoch": 0})

    ours = {
        **trainer.data_metrics(batch, batch["token_level_scores"], batch["token_level_rewards"], max_prompt_length=3),
        **trainer.step_metrics(1, 0, batch, {**timing, "controller": 0.1}),
    }
    assert set(ours) - {"timing_s/controller"} == set(theirs)
    # same values too, where verl's definition is ours
    for name, value in theirs.items():
        assert ours[name] == pytest.approx(value, rel=1e-5), name


def test_our_validation_names_are_verls(verl):
    verl_metrics = verl.metric_utils.process_validation_metrics(
        np.array(["openai/gsm8k"] * 3, dtype=object), ["u0", "u1", "u2"], {"reward": [1.0, 0.0, 1.0]}
    )
    source = (verl.root / "verl/trainer/ppo/ray_trainer.py").read_text()
    assert 'pfx = f"{metric_sec}/{data_source}/{var_name}/{metric_name}"' in source and 'metric_sec = "val-core"' in source
    theirs = {f"val-core/{s}/{var}/{m}": v for s, vars_ in verl_metrics.items() for var, ms in vars_.items() for m, v in ms.items()}
    ours = trainer.validation_metrics({"openai/gsm8k": [1.0, 0.0, 1.0]})
    assert theirs == {"val-core/openai/gsm8k/reward/mean@1": pytest.approx(2 / 3)}
    assert ours["val-core/openai/gsm8k/reward/mean@1"] == pytest.approx(2 / 3)
    assert set(ours) == set(theirs)


def test_the_names_our_cli_reads_are_still_written():
    batch = fake_step(with_critic=False)
    ours = {**trainer.data_metrics(batch, batch["token_level_scores"], batch["token_level_rewards"], 3),
            **trainer.step_metrics(1, 0, batch, {"step": 1.0})}
    assert {"critic/score/mean", "perf/throughput"} <= set(ours)  # installer/verl_deploy/runs.py summarize_metrics
