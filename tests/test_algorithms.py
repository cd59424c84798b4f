"""verl_runtime.algorithms against values computed by hand on small tensors, one test per branch.

Where a hand value is not practical (whitening, random inputs), the expectation is written out as the
formula verl documents, computed independently here with plain Python loops.
"""

import math
import statistics

import numpy as np
import pytest
import torch

from verl_runtime import algorithms as A

T = torch.tensor


def close(actual, expected, atol=1e-6):
    actual, expected = torch.as_tensor(actual).double(), torch.as_tensor(expected).double()
    torch.testing.assert_close(actual, expected, atol=atol, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- helpers


def test_masked_mean_and_whiten_ignore_padding_even_when_it_is_nan():
    values = T([1.0, 2.0, 3.0, float("nan")])
    mask = T([1, 1, 1, 0])
    close(A.masked_mean(values, mask), 2.0)
    # unbiased variance of 1, 2, 3 is 1, so whitening is just centring.
    close(A.masked_var(values, mask), 1.0)
    close(A.masked_whiten(values, mask)[:3], [-1.0, 0.0, 1.0])
    close(A.masked_whiten(values, mask, shift_mean=False)[:3], [1.0, 2.0, 3.0])
    close(A.masked_mean(T([5.0, 6.0]), T([0, 0])), 0.0)  # empty mask: 0, not NaN


def test_masked_var_needs_two_values():
    with pytest.raises(ValueError, match="at least two"):
        A.masked_var(T([1.0, 2.0]), T([1, 0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_and_entropy_from_logits(dtype):
    # softmax([0, ln 3]) = [1/4, 3/4]
    logits = T([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]], dtype=dtype)
    labels = T([[1, 0]])
    atol = 1e-6 if dtype == torch.float32 else 2e-2
    close(A.logprobs_from_logits(logits, labels), [[math.log(0.75), math.log(0.25)]], atol=atol)
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    close(A.entropy_from_logits(logits), [[entropy, entropy]], atol=atol)
    log_probs, entropies = A.logprobs_and_entropy_from_logits(logits, labels)
    close(log_probs, [[math.log(0.75), math.log(0.25)]], atol=atol)
    close(entropies, [[entropy, entropy]], atol=atol)


@pytest.mark.parametrize("weights", [(1.0, 0.0), (0.0, 1.0), (0.7, -0.3)])
def test_the_fused_log_prob_and_entropy_gradients_are_autograds(weights):
    """Its written-out backward against autograd through log_softmax, gather and the entropy formula, in float64,
    for a loss of the log-probs alone, of the entropy alone (an entropy bonus), and of both."""
    logits = torch.randn(3, 5, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(11, (3, 5), generator=torch.Generator().manual_seed(1))
    mix = torch.randn(2, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def gradient(log_prob_and_entropy):
        z = logits.clone().requires_grad_()
        log_probs, entropy = log_prob_and_entropy(z)
        loss = 0.0
        for weight, term, m in zip(weights, (log_probs, entropy), mix):
            if weight:
                loss = loss + weight * (term * m).sum()
        loss.backward()
        return z.grad

    def by_autograd(z):
        return A.logprobs_from_logits(z, labels), A.entropy_from_logits(z)

    fused = gradient(lambda z: A.logprobs_and_entropy_from_logits(z, labels))
    torch.testing.assert_close(fused, gradient(by_autograd), atol=1e-12, rtol=0)

def test_sequence_scores_land_on_the_last_response_token():
    # an empty response's score goes to the last column (verl: index valid_response_length - 1 = -1);
    # with a hole in the mask (multi-turn) it is the last response token, not the token count - 1
    mask = T([[1, 1, 0], [1, 1, 1], [0, 0, 0], [1, 0, 1]])
    scores = T([1.0, 2.0, 3.0, 4.0])
    close(A.sequence_scores_to_token_level(scores, mask), [[0, 1, 0], [0, 0, 2], [0, 0, 3], [0, 0, 4]])


# ---------------------------------------------------------------------------------------------- advantages


def test_gae_three_tokens_by_hand_with_padding_carried_through():
    # Row 0, gamma=1, lam=0.5, V=0.5 everywhere, reward 1 at the end:
    #   t2: delta = 1 - .5 = .5          A2 = .5
    #   t1: delta = 0 + .5 - .5 = 0      A1 = 0 + .5 * .5 = .25
    #   t0: delta = 0                    A0 = .5 * .25 = .125
    # Row 1, last token is padding (its value 9 must be skipped): A2 = 0 carried, then
    #   t1: delta = 2 + 0 - 1 = 1        A1 = 1
    #   t0: delta = 0 + 1 - 1 = 0        A0 = .5 * 1 = .5
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = T([[0.5, 0.5, 0.5], [1.0, 1.0, 9.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    advantages, returns = A.compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=0.5)

    raw = [0.125, 0.25, 0.5, 0.5, 1.0]
    mean, std = statistics.mean(raw), statistics.stdev(raw)
    close(returns, [[0.625, 0.75, 1.0], [1.5, 2.0, 9.0]])
    close(advantages[mask.bool()], [(a - mean) / std for a in raw], atol=1e-5)


def test_gae_discount_by_hand():
    # gamma=.5, lam=1 on one token then the reward: delta1 = 1 - .2 = .8, delta0 = .5 * .2 - .4 = -.3,
    # A0 = -.3 + .5 * .8 = .1. Returns = A + V.
    _, returns = A.compute_gae_advantage_return(T([[0.0, 1.0]]), T([[0.4, 0.2]]), T([[1, 1]]), gamma=0.5, lam=1.0)
    close(returns, [[0.5, 1.0]])


def test_gae_matches_verls_recurrence_on_random_input_with_gaps_in_the_mask():
    """verl's loop, restated per row: masked tokens blend in the carried value and advantage."""
    g = torch.Generator().manual_seed(3)
    rewards, values = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    mask = T([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]])
    gamma, lam = 0.9, 0.7
    raw = []
    for r, v, m in zip(rewards.tolist(), values.tolist(), mask.tolist()):
        next_value, last, row = 0.0, 0.0, [0.0] * 6
        for t in reversed(range(6)):
            candidate = r[t] + gamma * next_value - v[t] + gamma * lam * last
            next_value = v[t] * m[t] + (1 - m[t]) * next_value
            last = candidate * m[t] + (1 - m[t]) * last
            row[t] = last
        raw.append(row)
    valid = [a for row, m in zip(raw, mask.tolist()) for a, k in zip(row, m) if k]
    mean, std = statistics.mean(valid), statistics.stdev(valid)

    advantages, returns = A.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    close(returns, T(raw) + values, atol=1e-5)
    close(advantages, (T(raw) - mean) / std, atol=1e-5)  # verl whitens every entry, padding included


def test_grpo_normalises_by_group_mean_and_std_and_leaves_groups_of_one_alone():
    rewards = A.sequence_scores_to_token_level(T([1.0, 0.0, 1.0, 1.0, 1.0, 3.0]), torch.ones(6, 2))
    mask = T([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 0]])
    index = np.array(["a", "a", "b", "b", "b", "c"], dtype=object)

    advantages, returns = A.compute_grpo_outcome_advantage(rewards, mask, index)
    # a: mean .5, unbiased std sqrt(.5); b: all equal -> 0; c alone: score / (1 + eps)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    expected = T([a, -a, 0.0, 0.0, 0.0, 3.0 / (1 + 1e-6)]).unsqueeze(-1) * mask
    close(advantages, expected)
    close(returns, expected)

    dr_grpo, _ = A.compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    close(dr_grpo, T([0.5, -0.5, 0.0, 0.0, 0.0, 3.0]).unsqueeze(-1) * mask)


def test_index_may_be_a_list_or_an_int_tensor():
    rewards = T([[1.0], [0.0], [2.0]])
    mask = torch.ones(3, 1)
    expected, _ = A.compute_grpo_outcome_advantage(rewards, mask, np.array([7, 7, 8]))
    close(A.compute_grpo_outcome_advantage(rewards, mask, [7, 7, 8])[0], expected)
    close(A.compute_grpo_outcome_advantage(rewards, mask, T([7, 7, 8]))[0], expected)


def test_rloo_subtracts_the_mean_of_the_others():
    scores = T([1.0, 0.0, 3.0, 0.0, 0.0, 5.0])
    rewards = A.sequence_scores_to_token_level(scores, torch.ones(6, 2))
    mask = T([[1, 1], [1, 1], [1, 1], [1, 0], [1, 1], [1, 1]])
    advantages, _ = A.compute_rloo_outcome_advantage(rewards, mask, [0, 0, 1, 1, 1, 2])
    # pair: 1 - 0, 0 - 1; triple: 3 - 0, 0 - 1.5, 0 - 1.5; alone: raw score
    close(advantages, T([1.0, -1.0, 3.0, -1.5, -1.5, 5.0]).unsqueeze(-1) * mask)
    # verl writes it as n/(n-1) * (score - group mean): same numbers
    close(advantages[2, 0], 3 / 2 * (3.0 - 1.0))


def test_reinforce_plus_plus_discounts_and_skips_masked_tokens():
    # Row 1 has a reward on its padding token: it must not flow back into the response (verl 0.9.1: the
    # return on a masked token is 0 and the running return carries over it unchanged).
    rewards = T([[0.0, 0.0, 1.0], [0.0, 1.0, 5.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    advantages, returns = A.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    close(returns, [[0.25, 0.5, 1.0], [0.5, 1.0, 0.0]])
    valid = [0.25, 0.5, 1.0, 0.5, 1.0]
    mean, std = statistics.mean(valid), statistics.stdev(valid)
    expected = [[(v - mean) / std for v in valid[:3]], [(v - mean) / std for v in valid[3:]] + [0.0]]
    close(advantages, expected, atol=1e-5)


def test_reinforce_plus_plus_baseline_centres_per_group_then_whitens_over_tokens():
    rewards = A.sequence_scores_to_token_level(T([2.0, 0.0, 4.0]), torch.ones(3, 2))
    mask = T([[1, 1], [1, 1], [1, 0]])
    advantages, _ = A.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, ["p", "p", "q"])
    # centred: p -> 1, -1; q alone -> 4 (mean 0). Tokens: 1, 1, -1, -1, 4.
    tokens = [1.0, 1.0, -1.0, -1.0, 4.0]
    mean, std = statistics.mean(tokens), statistics.stdev(tokens)
    w = [(x - mean) / std for x in tokens]
    close(advantages, [[w[0], w[1]], [w[2], w[3]], [w[4], 0.0]], atol=1e-5)


def test_registry_names_and_dispatch():
    assert {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"} <= set(A.ADV_ESTIMATORS)
    rewards = A.sequence_scores_to_token_level(T([1.0, 0.0, 2.0, 2.0]), torch.ones(4, 3))
    mask = T([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    values = torch.linspace(0, 1, 12).reshape(4, 3)
    index = ["x", "x", "y", "y"]
    calls = {
        "gae": A.compute_gae_advantage_return(rewards, values, mask, 0.9, 0.8),
        "grpo": A.compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False),
        "rloo": A.compute_rloo_outcome_advantage(rewards, mask, index),
        "reinforce_plus_plus": A.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, 0.9),
        "reinforce_plus_plus_baseline": A.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index),
    }
    for name, (expected_adv, expected_ret) in calls.items():
        adv, ret = A.compute_advantage(
            name, rewards, mask, index=index, values=values, gamma=0.9, lam=0.8, norm_adv_by_std_in_grpo=False
        )
        close(adv, expected_adv)
        close(ret, expected_ret)
    with pytest.raises(ValueError, match="use one of: gae, grpo"):
        A.get_adv_estimator_fn("ppo")
    with pytest.raises(ValueError, match="needs `index`"):
        A.compute_advantage("grpo", rewards, mask)
    with pytest.raises(ValueError, match="critic"):
        A.compute_advantage("gae", rewards, mask)


def test_grpo_and_rloo_match_verls_per_row_formulas_on_random_groups():
    """verl's loops, restated: group stats per uid, then a per-row formula."""
    g = torch.Generator().manual_seed(0)
    index = np.array([f"u{i % 5}" for i in range(23)], dtype=object)  # groups of 5 and 4
    rewards = torch.rand(23, 6, generator=g)
    mask = (torch.rand(23, 6, generator=g) > 0.3).long()
    scores = rewards.sum(-1).tolist()
    groups = {uid: [s for s, u in zip(scores, index) if u == uid] for uid in set(index)}
    grpo = [(s - statistics.mean(groups[u])) / (statistics.stdev(groups[u]) + 1e-6) for s, u in zip(scores, index)]
    rloo = [(s - statistics.mean(groups[u])) * len(groups[u]) / (len(groups[u]) - 1) for s, u in zip(scores, index)]
    close(A.compute_grpo_outcome_advantage(rewards, mask, index)[0], T(grpo).unsqueeze(-1) * mask, atol=1e-5)
    close(A.compute_rloo_outcome_advantage(rewards, mask, index)[0], T(rloo).unsqueeze(-1) * mask, atol=1e-5)


# ---------------------------------------------------------------------------------------------- aggregation


LOSS = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = T([[1, 1, 0], [1, 1, 1]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 18 / 5),  # (1+2+4+5+6) / 5 tokens
        ("seq-mean-token-sum", (3 + 15) / 2),
        ("seq-mean-token-mean", (1.5 + 5) / 2),
        ("seq-mean-token-sum-norm", (3 / 3 + 15 / 3) / 2),  # normalised by response_length 3
    ],
)
def test_each_aggregation_mode(mode, expected):
    close(A.agg_loss(LOSS, MASK, mode), expected)


def test_token_sum_norm_uses_a_constant_scale_factor_when_given():
    close(A.agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=6), (3 / 6 + 15 / 6) / 2)


def test_unknown_aggregation_mode_names_the_valid_ones():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-sum"):
        A.agg_loss(LOSS, MASK, "mean")


@pytest.mark.parametrize("mode", A.LOSS_AGG_MODES)
def test_micro_batch_losses_sum_to_the_mini_batch_loss(mode):
    g = torch.Generator().manual_seed(1)
    loss_mat = torch.randn(7, 5, generator=g, dtype=torch.float64)
    lengths = T([5, 1, 3, 0, 4, 2, 5])  # uneven, and one empty response
    mask = (torch.arange(5) < lengths.unsqueeze(-1)).long()
    full = A.agg_loss(loss_mat, mask, mode)

    info = A.make_global_batch_info(mask)
    for sizes in ([2, 2, 2, 1], [1, 3, 3], [7]):
        parts = zip(loss_mat.split(sizes), mask.split(sizes))
        accumulated = sum(A.agg_loss(m, k, mode, **info) for m, k in parts)
        close(accumulated, full, atol=1e-12)


def test_micro_batch_normalisation_matters_for_token_mean():
    """Why the totals are needed: averaging per-micro-batch token means weights short batches too much."""
    mask = T([[1, 1, 1, 1], [1, 0, 0, 0]])
    loss_mat = T([[1.0, 1.0, 1.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    naive = sum(A.agg_loss(m, k, "token-mean") for m, k in zip(loss_mat.split(1), mask.split(1))) / 2
    close(naive, 3.0)  # (1 + 5) / 2
    close(A.agg_loss(loss_mat, mask, "token-mean"), 9 / 5)


def test_loss_functions_accept_the_mini_batch_totals_and_gradients_accumulate_exactly():
    g = torch.Generator().manual_seed(2)
    old, adv = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    mask = (torch.arange(4) < T([4, 1, 2, 3, 4, 1]).unsqueeze(-1)).long()
    logp_full = (old + 0.3 * torch.randn(6, 4, generator=g)).requires_grad_()
    A.compute_policy_loss(old, logp_full, adv, mask, cliprange=0.2, loss_agg_mode="token-mean")[0].backward()

    logp_micro = logp_full.detach().clone().requires_grad_()
    info = A.make_global_batch_info(mask)
    for rows in (slice(0, 2), slice(2, 3), slice(3, 6)):
        loss, *_ = A.compute_policy_loss(
            old[rows], logp_micro[rows], adv[rows], mask[rows], cliprange=0.2, global_batch_info=info
        )
        loss.backward()
    close(logp_micro.grad, logp_full.grad)


# ---------------------------------------------------------------------------------------------- losses


def test_policy_loss_clips_both_sides_and_dual_clips_negative_advantages():
    # token: A,  ratio -> unclipped, clipped(0.8..1.2) -> PPO max -> dual cap (A<0: -3A) -> loss
    #   1: +1, 1.5 -> -1.5, -1.2 -> -1.2 (upper clip)                           -> -1.2
    #   2: +1, 0.5 -> -0.5, -0.8 -> -0.5 (no clip)                              -> -0.5
    #   3: -1, 0.5 ->  0.5,  0.8 ->  0.8 (lower clip)      cap 3                 ->  0.8
    #   4: -1, 5.0 ->  5.0,  1.2 ->  5.0 (no PPO clip)     cap 3 (dual clip)     ->  3.0
    #   5: padding with a wild ratio: ignored
    ratios = T([[1.5, 0.5, 0.5, 5.0, 100.0]])
    advantages = T([[1.0, 1.0, -1.0, -1.0, -7.0]])
    mask = T([[1, 1, 1, 1, 0]])
    old = torch.zeros(1, 5)
    log_prob = torch.log(ratios).requires_grad_()

    pg_loss, clipfrac, ppo_kl, clipfrac_lower = A.compute_policy_loss(old, log_prob, advantages, mask, cliprange=0.2)
    close(pg_loss, (-1.2 - 0.5 + 0.8 + 3.0) / 4)
    close(clipfrac, 2 / 4)
    close(clipfrac_lower, 1 / 4)
    close(ppo_kl, -(math.log(1.5) + 2 * math.log(0.5) + math.log(5.0)) / 4)

    pg_loss.backward()
    # d/dlogp of -A*r is -A*r where the unclipped term is active, 0 where clipped or dual-capped or masked.
    close(log_prob.grad, [[0.0, -0.5 / 4, 0.0, 0.0, 0.0]])


def test_policy_loss_asymmetric_clip_higher():
    # cliprange_high 0.28: ratio 1.25 is no longer clipped, 1.5 clips at 1.28; cliprange_low stays 0.2.
    ratios = T([[1.25, 1.5, 0.7]])
    advantages = T([[1.0, 1.0, -1.0]])
    pg_loss, clipfrac, _, _ = A.compute_policy_loss(
        torch.zeros(1, 3), torch.log(ratios), advantages, torch.ones(1, 3), cliprange=0.2, cliprange_high=0.28
    )
    close(pg_loss, (-1.25 - 1.28 + 0.8) / 3)
    close(clipfrac, 2 / 3)


def test_policy_loss_rejects_bad_clip_settings():
    args = (torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    with pytest.raises(ValueError, match="needs cliprange"):
        A.compute_policy_loss(*args)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        A.compute_policy_loss(*args, cliprange=0.2, clip_ratio_c=1.0)


def test_value_loss_clips_around_the_old_values_and_halves():
    # token: vpred, old value, return -> clipped vpred (+-0.5) -> losses (unclipped, clipped) -> max
    #   1: 2.0, 1, 2 -> 1.5 -> (0, .25)      -> .25  clipped
    #   2: 1.2, 1, 0 -> 1.2 -> (1.44, 1.44)  -> 1.44
    #   3: 0.0, 1, 0 -> 0.5 -> (0, .25)      -> .25  clipped
    #   4: padding
    vpreds, values, returns = T([[2.0, 1.2, 0.0, 50.0]]), T([[1.0, 1.0, 1.0, 0.0]]), T([[2.0, 0.0, 0.0, 0.0]])
    mask = T([[1, 1, 1, 0]])
    vf_loss, vf_clipfrac = A.compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    close(vf_loss, 0.5 * (0.25 + 1.44 + 0.25) / 3)
    close(vf_clipfrac, 2 / 3)
    seq_sum, _ = A.compute_value_loss(vpreds, returns, values, mask, 0.5, loss_agg_mode="seq-mean-token-sum")
    close(seq_sum, 0.5 * (0.25 + 1.44 + 0.25))


def test_entropy_loss_aggregates_token_entropy():
    logits = torch.zeros(1, 3, 4)  # uniform over 4: entropy ln 4 on every token
    logits[0, 2] = T([100.0, 0.0, 0.0, 0.0])  # padding, near-zero entropy, masked anyway
    close(A.compute_entropy_loss(logits, T([[1, 1, 0]])), math.log(4))
    close(A.compute_entropy_loss(logits, T([[1, 1, 0]]), "seq-mean-token-sum"), 2 * math.log(4))


# ---------------------------------------------------------------------------------------------- KL


DELTA = math.log(2.0)  # logprob - ref_logprob: the policy gives the token twice the reference's probability


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("kl", DELTA),
        ("k1", DELTA),
        ("abs", DELTA),
        ("mse", 0.5 * DELTA**2),
        ("k2", 0.5 * DELTA**2),
        # k3 = r - log r - 1 with r = p_ref / p = 1/2
        ("low_var_kl", 0.5 + DELTA - 1),
        ("k3", 0.5 + DELTA - 1),
    ],
)
def test_each_kl_estimator(name, expected):
    logprob, ref = T([math.log(0.5)]), T([math.log(0.25)])
    close(A.kl_penalty(logprob, ref, name), [expected])
    close(A.kl_penalty(ref, logprob, "abs"), [DELTA])  # abs is symmetric


def test_k3_is_clamped_for_stability():
    # ref_logprob - logprob = 30 is clamped to 20, and e^20 - 21 is clamped to 10.
    close(A.kl_penalty(T([-30.0]), T([0.0]), "k3"), [10.0])


@pytest.mark.parametrize("name", ["k1+", "k3+", "low_var_kl+", "abs+", "k2+"])
def test_straight_through_variants_have_the_estimators_value_and_k2s_gradient(name):
    logprob = T([math.log(0.5)], dtype=torch.float64).requires_grad_()
    ref = T([math.log(0.25)], dtype=torch.float64)
    value = A.kl_penalty(logprob, ref, name)
    close(value, A.kl_penalty(logprob.detach(), ref, name.removesuffix("+")))
    value.sum().backward()
    close(logprob.grad, [DELTA])  # d/dlogp of (logp - ref)^2 / 2


def test_plain_k3_gradient_differs_from_k2():
    logprob = T([math.log(0.5)]).requires_grad_()
    A.kl_penalty(logprob, T([math.log(0.25)]), "k3").sum().backward()
    close(logprob.grad, [1 - 0.5])  # d/dlogp (r - log r - 1) = 1 - r


def test_unknown_kl_estimator_names_the_valid_ones():
    with pytest.raises(ValueError, match="use one of: kl, k1"):
        A.kl_penalty(T([0.0]), T([0.0]), "full")


def test_apply_kl_penalty_subtracts_beta_times_kl_on_response_tokens():
    scores = T([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    old = T([[0.2, 0.4, 9.0], [0.1, 0.1, 0.1]])
    ref = T([[0.0, 0.0, 0.0], [0.0, 0.0, 0.4]])
    mask = T([[1, 1, 0], [1, 1, 1]])
    rewards, current_kl = A.apply_kl_penalty(scores, old, ref, mask, kl_coef=0.5, kl_penalty_type="kl")
    close(rewards, [[-0.1, 0.8, 0.0], [-0.05, -0.05, 2.15]])
    # per-sequence means: (0.2 + 0.4) / 2 = 0.3 and (0.1 + 0.1 - 0.3) / 3 = -1/30
    close(current_kl, (0.3 - 1 / 30) / 2)


def test_fixed_controller_never_moves():
    ctrl = A.FixedKLController(kl_coef=0.05)
    ctrl.update(current_kl=100.0, n_steps=256)
    assert ctrl.value == 0.05


def test_adaptive_controller_moves_toward_the_target_with_a_clipped_error():
    ctrl = A.AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    ctrl.update(current_kl=9.0, n_steps=1000)  # error 0.5 clipped to 0.2: x (1 + 0.2 * 0.1)
    close(ctrl.value, 0.1 * 1.02)
    ctrl.update(current_kl=6.6, n_steps=1000)  # error 0.1: x 1.01
    close(ctrl.value, 0.1 * 1.02 * 1.01)
    ctrl.update(current_kl=0.0, n_steps=1000)  # error -1 clipped to -0.2: x 0.98
    close(ctrl.value, 0.1 * 1.02 * 1.01 * 0.98)


def test_get_kl_controller_reads_verls_config_keys():
    from types import SimpleNamespace as NS

    assert isinstance(A.get_kl_controller(NS(type="fixed", kl_coef=0.1)), A.FixedKLController)
    adaptive = A.get_kl_controller(NS(type="adaptive", kl_coef=0.2, target_kl=0.1, horizon=100))
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.2, 0.1, 100)
    with pytest.raises(ValueError, match="horizon must be positive"):
        A.get_kl_controller(NS(type="adaptive", kl_coef=0.2, target_kl=0.1, horizon=0))
    with pytest.raises(ValueError, match="'fixed' or 'adaptive'"):
        A.get_kl_controller(NS(type="pid", kl_coef=0.2))


def test_the_names_config_accepts_are_the_names_implemented_here():
    from verl_runtime import config

    untrainable = {"gdpo"}  # see config.ADV_ESTIMATORS
    assert set(config.ADV_ESTIMATORS) == set(A.ADV_ESTIMATORS) - untrainable
    assert set(config.POLICY_LOSSES) == set(A.POLICY_LOSS_REGISTRY)
    assert set(config.LOSS_AGG_MODES) == set(A.LOSS_AGG_MODES)
    for name in config.KL_PENALTIES:
        A.kl_penalty(T([0.1]), T([0.0]), name)
