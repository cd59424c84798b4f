"""The tensor maths of RL post-training: advantages, losses, KL.

Every function here is pure torch (no I/O, no state except the KL controllers) and follows the semantics and
argument names of verl's `verl/trainer/ppo/core_algos.py` and `verl/utils/torch_functional.py`, so a result
computed here can be compared number for number with verl's.

Shapes: `(bs, response_length)` for every per-token tensor; `response_mask` is 1 on response tokens up to and
including EOS and 0 on padding. `index` holds one group id per row (the prompt's uid: a numpy array, a list or
an int tensor); rows that share an id are samples of the same prompt.

Read top to bottom: helpers, advantage estimators (+ registry), loss aggregation, losses, KL.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch

# --------------------------------------------------------------------------------------------------------------
# Helpers (verl.utils.torch_functional)
# --------------------------------------------------------------------------------------------------------------


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is set; NaN or inf in masked-out places cannot leak in."""
    return (torch.where(mask.bool(), values, 0.0) * mask).sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is set (0 for an empty mask, as verl's 1e-8 guard gives)."""
    return masked_sum(values, mask, axis) / (mask.sum(dim=axis) + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `values` where `mask` is set, Bessel-corrected by default."""
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count < 2:
            raise ValueError("masked_var needs at least two unmasked values; use a larger (mini-)batch")
        variance = variance * count / (count - 1)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Standardise `values` with the mean and variance of its unmasked entries (all entries are transformed)."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) for each position: logits (..., vocab), labels (...) -> (...).

    Through log_softmax, as verl does: its fused kernels beat a logsumexp chain, and every caller (actor, reference,
    old log-probs) gets bit-identical values for identical logits, so an on-policy KL starts at exactly zero.
    """
    return _picked(torch.log_softmax(logits, dim=-1), labels)


def logprobs_and_entropy_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logprobs_from_logits and entropy_from_logits from one log_softmax (the same values, bit for bit)."""
    return _LogProbAndEntropy.apply(logits, labels)


class _LogProbAndEntropy(torch.autograd.Function):
    """The picked log-probs and the entropy, with the backward written out from the probabilities the entropy
    needs anyway: d log p(y) / dz = onehot(y) - p and dH / dz = -p (log p + H). Autograd instead fills a
    vocabulary-sized zero tensor for gather's backward and runs log_softmax's backward over it."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor):
        ctx.set_materialize_grads(False)  # an output left out of the loss (the entropy, mostly) gets no gradient
        log_p = torch.log_softmax(logits, dim=-1)
        p = log_p.exp()
        entropy = _entropy(p, log_p)
        ctx.save_for_backward(p, log_p, entropy, labels)
        return _picked(log_p, labels), entropy

    @staticmethod
    def backward(ctx, grad_picked: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        p, log_p, entropy, labels = ctx.saved_tensors
        grad = None
        if grad_picked is not None:
            grad = (p * -grad_picked[..., None]).scatter_add_(-1, labels[..., None], grad_picked[..., None])
        if grad_entropy is not None:
            from_entropy = p * (log_p + entropy[..., None]) * grad_entropy[..., None]
            grad = from_entropy.neg_() if grad is None else grad.sub_(from_entropy)
        return grad, None


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: (..., vocab) -> (...)."""
    log_p = torch.log_softmax(logits, dim=-1)
    return _entropy(log_p.exp(), log_p)


def _picked(log_p: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _entropy(p: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    return -(p * log_p).sum(dim=-1)


def sequence_scores_to_token_level(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's score on its last response token, as verl's reward managers do.

    scores (bs,) -> token_level_scores (bs, response_length), zero elsewhere.
    """
    last = (response_mask.sum(dim=-1).long() - 1).clamp(min=0)
    token_level = torch.zeros(response_mask.shape, dtype=scores.dtype, device=scores.device)
    token_level[torch.arange(len(scores), device=scores.device), last] = scores
    return token_level


def _group_rows(index: Sequence[Any] | torch.Tensor) -> list[list[int]]:
    """Row numbers of each group, in order of first appearance."""
    keys = index.tolist() if isinstance(index, torch.Tensor) else index
    rows: dict[Any, list[int]] = defaultdict(list)
    for row, key in enumerate(keys):
        rows[key].append(row)
    return list(rows.values())


# --------------------------------------------------------------------------------------------------------------
# Advantage estimators. Each returns (advantages, returns), both (bs, response_length).
# --------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016) with a critic; advantages whitened over the mask.

    A_t = delta_t + gamma * lam * A_{t+1},  delta_t = r_t + gamma * V_{t+1} - V_t,  returns = A + V (before
    whitening). Masked tokens are skipped: they carry the next valid token's value and advantage through, so
    a sequence's chain is unbroken and padding after EOS contributes nothing.
    """
    valid = response_mask.bool()
    next_value = torch.zeros_like(values[:, 0])
    running_advantage = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * running_advantage
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        running_advantage = torch.where(valid[:, t], candidate, running_advantage)
        advantages[:, t] = running_advantage
    returns = advantages + values
    return masked_whiten(advantages, response_mask), returns


@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: each sequence's score minus its group's mean, divided by the group's std (+ epsilon).

    The std is the unbiased one (torch.std). `norm_adv_by_std_in_grpo=False` keeps only the mean (Dr. GRPO).
    A group of one has no baseline: verl uses mean 0 and std 1, so its advantage is its score (/ (1 + eps)).
    """
    scores = token_level_rewards.sum(dim=-1)
    advantages = torch.empty_like(scores)
    for rows in _group_rows(index):
        group = scores[rows]
        if len(rows) == 1:
            mean, std = torch.zeros_like(group), torch.ones_like(group)
        else:
            mean, std = group.mean(), group.std()
        centred = group - mean
        advantages[rows] = centred / (std + epsilon) if norm_adv_by_std_in_grpo else centred
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024): each score minus the mean of the *other* scores of its group.

    Equal to n/(n-1) * (score - group mean), which is how verl writes it. A group of one keeps its raw score.
    `epsilon` is accepted for verl's signature and unused, as in verl.
    """
    scores = token_level_rewards.sum(dim=-1)
    advantages = scores.clone()
    for rows in _group_rows(index):
        if len(rows) > 1:
            group = scores[rows]
            advantages[rows] = group - (group.sum() - group) / (len(rows) - 1)
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted return-to-go per token, whitened over the whole batch.

    The running return restarts at masked tokens, so rewards after EOS never reach the response.
    """
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * response_mask[:, t]
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: score minus its group's mean (0 for a group of one), then whitened over the batch.

    `epsilon` is accepted for verl's signature and unused, as in verl.
    """
    scores = token_level_rewards.sum(dim=-1)
    centred = scores.clone()
    for rows in _group_rows(index):
        if len(rows) > 1:
            centred[rows] = scores[rows] - scores[rows].mean()
    per_token = centred.unsqueeze(-1) * response_mask
    advantages = masked_whiten(per_token, response_mask) * response_mask
    return advantages, advantages


ADV_ESTIMATORS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "gae": compute_gae_advantage_return,
    "grpo": compute_grpo_outcome_advantage,
    "rloo": compute_rloo_outcome_advantage,
    "reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage,
    "reinforce_plus_plus_baseline": compute_reinforce_plus_plus_baseline_outcome_advantage,
}


def get_adv_estimator_fn(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The estimator registered under `algorithm.adv_estimator` = `name`."""
    if name not in ADV_ESTIMATORS:
        raise ValueError(f"unknown adv_estimator {name!r}; use one of: {', '.join(ADV_ESTIMATORS)}")
    return ADV_ESTIMATORS[name]


def compute_advantage(
    adv_estimator: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Sequence[Any] | torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Call the named estimator with the inputs it needs (the role of verl's ray_trainer.compute_advantage)."""
    fn = get_adv_estimator_fn(adv_estimator)
    if adv_estimator == "gae":
        if values is None:
            raise ValueError("adv_estimator 'gae' needs the critic's values")
        return fn(token_level_rewards, values, response_mask, gamma, lam)
    if adv_estimator == "reinforce_plus_plus":
        return fn(token_level_rewards, response_mask, gamma)
    if index is None:
        raise ValueError(f"adv_estimator {adv_estimator!r} needs `index`, the group id of each row")
    if adv_estimator == "grpo":
        return fn(token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    return fn(token_level_rewards, response_mask, index)


# --------------------------------------------------------------------------------------------------------------
# Loss aggregation
# --------------------------------------------------------------------------------------------------------------

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    batch_num_tokens: torch.Tensor | int | None = None,
    global_batch_size: int | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss matrix to a scalar.

    - token-mean: sum over valid tokens / number of valid tokens.
    - seq-mean-token-sum: per-sequence sum of tokens, averaged over sequences.
    - seq-mean-token-mean: per-sequence mean of tokens, averaged over sequences.
    - seq-mean-token-sum-norm: per-sequence sum / `loss_scale_factor` (default: response_length, a constant
      as in Dr. GRPO), averaged over sequences. This is current verl; older verl omitted the average.

    Gradient accumulation: by default the denominators come from this (micro-)batch, so micro-batches of
    unequal token counts would be weighted wrongly. Pass the *mini-batch* totals instead -- `batch_num_tokens`
    (valid tokens) and `global_batch_size` (sequences), see `make_global_batch_info` -- and the micro-batch
    losses *sum* to the full mini-batch loss: call backward on each and do not divide by the number of
    micro-batches. (Under data parallelism with gradient averaging, multiply by the number of ranks.)
    """
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            return masked_mean(loss_mat, loss_mask)
        return masked_sum(loss_mat, loss_mask) / batch_num_tokens

    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = masked_sum(loss_mat, loss_mask, axis=-1)
        if loss_agg_mode == "seq-mean-token-sum-norm":
            seq_losses = seq_losses / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = masked_sum(loss_mat, loss_mask, axis=-1) / (loss_mask.sum(dim=-1) + 1e-8)
    else:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; use one of: {', '.join(LOSS_AGG_MODES)}")
    # Every row counts as a sequence (an all-padding row adds 0), as in verl.
    num_seqs = loss_mat.shape[0] if global_batch_size is None else global_batch_size
    return seq_losses.sum() / num_seqs


def make_global_batch_info(response_mask: torch.Tensor, loss_scale_factor: float | None = None) -> dict[str, Any]:
    """The mini-batch totals that make micro-batch losses add up to the mini-batch loss (see `agg_loss`).

    Compute once per mini-batch, then pass as `global_batch_info=` to the loss functions of each micro-batch.
    """
    info: dict[str, Any] = {
        "batch_num_tokens": response_mask.sum().clamp(min=1),  # an all-padding mini-batch gives loss 0
        "global_batch_size": response_mask.shape[0],
    }
    if loss_scale_factor is not None:
        info["loss_scale_factor"] = loss_scale_factor
    return info


# --------------------------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------------------------


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    global_batch_info: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate with dual clip. Returns (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower).

    Per token: max(-A * r, -A * clip(r, 1 - cliprange_low, 1 + cliprange_high)), r = pi / pi_old; for A < 0
    that is further capped at -A * clip_ratio_c (dual clip, Ye et al. 2020), so a runaway ratio cannot make
    the loss unbounded. pg_clipfrac: share of tokens where the clipped term won; pg_clipfrac_lower: share
    where the dual cap bit; ppo_kl: mean of log(pi_old / pi) (k1 from the old policy).
    """
    cliprange_low = cliprange if cliprange_low is None else cliprange_low
    cliprange_high = cliprange if cliprange_high is None else cliprange_high
    if cliprange_low is None or cliprange_high is None:
        raise ValueError("compute_policy_loss needs cliprange, or both cliprange_low and cliprange_high")
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be greater than 1.0 for dual-clip PPO, got {clip_ratio_c}")

    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # keeps exp() finite
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)

    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clipped_loss = torch.maximum(unclipped, clipped)
    pg_clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), response_mask)

    negative = advantages < 0
    dual_cap = -advantages * clip_ratio_c
    pg_clipfrac_lower = masked_mean((torch.gt(clipped_loss, dual_cap) & negative).float(), response_mask)
    pg_losses = torch.where(negative, torch.minimum(clipped_loss, dual_cap), clipped_loss)

    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **(global_batch_info or {}))
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    global_batch_info: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: 0.5 * agg(max((V - R)^2, (clip(V, V_old +- cliprange_value) - R)^2)).

    Returns (vf_loss, vf_clipfrac), the share of tokens where the clipped term was larger. The 0.5 is verl's.
    """
    vpreds_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped = (vpreds - returns) ** 2
    clipped = (vpreds_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(
        torch.maximum(unclipped, clipped), response_mask, loss_agg_mode, **(global_batch_info or {})
    )
    vf_clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac


def compute_entropy_loss(
    logits: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    global_batch_info: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """Aggregated token entropy of logits (bs, response_length, vocab); the trainer subtracts coef * this."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode, **(global_batch_info or {}))


# --------------------------------------------------------------------------------------------------------------
# KL: estimators (for the KL loss and the KL-in-reward penalty) and the coefficient controllers
# --------------------------------------------------------------------------------------------------------------

KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def _kl_estimate(logprob: torch.Tensor, ref_logprob: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimates from sampled tokens (Schulman, "Approximating KL divergence")."""
    if estimator in ("kl", "k1"):
        return logprob - ref_logprob
    if estimator == "abs":
        return (logprob - ref_logprob).abs()
    if estimator in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if estimator in ("low_var_kl", "k3"):
        # k3 = r - log r - 1 with r = pi_ref / pi: unbiased and never negative. Clamped as verl does.
        log_r = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.clamp(torch.exp(log_r) - log_r - 1, min=-10, max=10)
    names = ", ".join(KL_ESTIMATORS)
    raise ValueError(f"unknown kl_penalty {estimator!r}; use one of: {names} (add '+' for a k2 gradient)")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate named by `kl_penalty`: kl/k1, abs, mse/k2, low_var_kl/k3.

    A trailing '+' (e.g. "k3+") is verl's straight-through variant: the value of the named estimator with the
    gradient of k2, whose expected gradient is the true KL gradient (k1's and k3's are not).
    """
    value = _kl_estimate(logprob, ref_logprob, kl_penalty.removesuffix("+"))
    if not kl_penalty.endswith("+"):
        return value
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + value.detach()


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kl_penalty_type: str = "kl",
) -> tuple[torch.Tensor, float]:
    """KL in the reward: token_level_rewards = token_level_scores - kl_coef * KL (on response tokens).

    Returns the rewards and the batch's KL (per-sequence token mean, averaged over sequences), the figure
    verl logs as `actor/reward_kl_penalty` and feeds to `kl_ctrl.update(current_kl, n_steps=batch_size)`.
    """
    kld = kl_penalty(old_log_prob, ref_log_prob, kl_penalty_type) * response_mask
    token_level_rewards = token_level_scores - kl_coef * kld
    current_kl = masked_mean(kld, response_mask, axis=-1).mean().item()
    return token_level_rewards, current_kl


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


class AdaptiveKLController:
    """Moves the coefficient toward a target KL (Ziegler et al. 2019, arXiv:1909.08593).

    Each update multiplies the value by 1 + e * n_steps / horizon, where e = current_kl / target_kl - 1
    clipped to [-0.2, 0.2].
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


def get_kl_controller(kl_ctrl: Any) -> FixedKLController | AdaptiveKLController:
    """Controller from a config node with verl's `algorithm.kl_ctrl` keys: type, kl_coef, target_kl, horizon."""
    if kl_ctrl.type == "fixed":
        return FixedKLController(kl_coef=kl_ctrl.kl_coef)
    if kl_ctrl.type == "adaptive":
        if kl_ctrl.horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be positive, got {kl_ctrl.horizon}")
        return AdaptiveKLController(kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {kl_ctrl.type!r}; use 'fixed' or 'adaptive'")
