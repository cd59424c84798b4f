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

import inspect
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

import numpy as np
import torch
import torch.utils.checkpoint

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


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True) -> torch.Tensor:
    """log p(label) for each position: logits (..., vocab), labels (...) -> (...).

    Through log_softmax, as verl does: its fused kernels beat a logsumexp chain, and every caller (actor, reference,
    old log-probs) gets bit-identical values for identical logits, so an on-policy KL starts at exactly zero.
    inplace_backward is verl's signature (its flash-attn cross-entropy's memory option); the numbers do not depend
    on it, and without flash-attn verl ignores it too.
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


def entropy_from_logits_with_chunking(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """verl's (verl/utils/torch_functional.py:248-270): the entropy of logits [N, vocab], chunk_size rows at a time
    in fp32, so the softmax and its product exist for one chunk only."""
    entropy = torch.zeros(logits.shape[0], device=logits.device)
    for start in range(0, logits.shape[0], chunk_size):
        chunk = logits[start : start + chunk_size].float()
        p = torch.nn.functional.softmax(chunk, dim=-1)
        entropy[start : start + chunk_size] = torch.logsumexp(chunk, dim=-1) - torch.sum(p * chunk, dim=-1)
    return entropy


def logprobs_from_hidden_with_chunking(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    chunk_size: int = 2048,
    temperature: float = 1.0,
    with_entropy: bool = False,
    checkpoint: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(label) (and the entropy) of each row of hidden [N, H] under head (hidden -> logits), chunk_size rows at a
    time: the fp32 logits / temperature exist for one chunk only. With checkpoint (training), a chunk's logits are
    recomputed in the backward instead of kept, so the backward too holds one chunk. The same values as
    logprobs_and_entropy_from_logits over head(hidden) at once, row for row."""

    def one(rows: torch.Tensor, picked: torch.Tensor):
        logits = head(rows).float()
        if temperature != 1.0:
            logits = logits / temperature
        if with_entropy:
            return logprobs_and_entropy_from_logits(logits, picked)
        return logprobs_from_logits(logits, picked)

    parts = []
    for start in range(0, hidden.shape[0], chunk_size):
        rows, picked = hidden[start : start + chunk_size], labels[start : start + chunk_size]
        if checkpoint and torch.is_grad_enabled():
            parts.append(torch.utils.checkpoint.checkpoint(one, rows, picked, use_reentrant=False))
        else:
            parts.append(one(rows, picked))
    if not parts:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    if with_entropy:
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return torch.cat(parts), None


def calculate_sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """sum over the vocabulary of p^2 at each position, (..., vocab) -> (...): the optimal token baselines' input."""
    return torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * torch.logsumexp(logits, dim=-1))


def _picked(log_p: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _entropy(p: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    return -(p * log_p).sum(dim=-1)


def sequence_scores_to_token_level(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's score on its last response token, as verl's reward managers do.

    scores (bs,) -> token_level_scores (bs, response_length), zero elsewhere. An empty response's score goes to
    the last column: verl writes it at index valid_response_length - 1 = -1.
    """
    positions = torch.arange(1, response_mask.shape[-1] + 1, device=response_mask.device)
    last = (response_mask.bool() * positions).amax(dim=-1) - 1  # -1 for an empty response
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
# Advantage estimators (verl's registry). Each returns (advantages, returns), both (bs, response_length).
# Outcome estimators take verl's `config` (the `algorithm` node: gamma, lam, norm_adv_by_std_in_grpo, ...) and
# ignore keyword arguments they do not use, as verl's do.
# --------------------------------------------------------------------------------------------------------------

ADV_ESTIMATOR_REGISTRY: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}
ADV_ESTIMATORS = ADV_ESTIMATOR_REGISTRY  # the same dict, under the name the config checks read


def _name(name_or_enum: Any) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def register_adv_est(name_or_enum: Any) -> Callable:
    """Decorator: register an advantage estimator under a name (or an Enum's value), as verl's does.

    Registering a different function under a taken name is an error; re-registering the same one is not.
    """

    def decorator(fn):
        name = _name(name_or_enum)
        if ADV_ESTIMATOR_REGISTRY.get(name, fn) is not fn:
            raise ValueError(f"Adv estimator {name} has already been registered: {ADV_ESTIMATOR_REGISTRY[name]} vs {fn}")
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn

    return decorator


def get_adv_estimator_fn(name_or_enum: Any) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The estimator registered under `algorithm.adv_estimator` (a name or verl's AdvantageEstimator member)."""
    name = _name(name_or_enum)
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(f"unknown adv_estimator {name!r}; use one of: {', '.join(ADV_ESTIMATOR_REGISTRY)}")
    return ADV_ESTIMATOR_REGISTRY[name]


def _config_value(config: Any, key: str, default: Any = None) -> Any:
    """config.key for verl's AlgoConfig, a DictConfig, a dict or a namespace; `default` when absent."""
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def _group_ids(index: Sequence[Any] | torch.Tensor, device: torch.device) -> tuple[torch.Tensor, int]:
    """Dense group ids (0..G-1, in order of first appearance) and G, for the vectorized estimators."""
    keys = index.tolist() if isinstance(index, torch.Tensor) else list(index)
    ids: dict[Any, int] = {}
    dense = [ids.setdefault(key, len(ids)) for key in keys]
    return torch.tensor(dense, dtype=torch.long, device=device), len(ids)


@register_adv_est("gae")
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
    whitening). Masked tokens (padding, or tool output inside a multi-turn response) are skipped: they carry
    the next valid token's value and advantage through, so a sequence's chain is unbroken.
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


@register_adv_est("grpo")
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: each sequence's score minus its group's mean, divided by the group's std (+ epsilon).

    The std is the unbiased one (torch.std). `norm_adv_by_std_in_grpo=False` keeps only the mean (Dr. GRPO);
    as in verl this is the argument, not `config`, that decides. A group of one has no baseline: verl uses
    mean 0 and std 1, so its advantage is its score / (1 + eps). Ties give std 0 and advantage 0.
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


@register_adv_est("grpo_vectorized")
@torch.no_grad()
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO without the per-group loop (verl's grpo_vectorized): the same numbers, statistics in float32."""
    scores = token_level_rewards.sum(dim=-1)
    group, n_groups = _group_ids(index, scores.device)
    s = scores.float()
    count = torch.zeros(n_groups, device=s.device).index_add_(0, group, torch.ones_like(s))
    mean = torch.zeros(n_groups, device=s.device).index_add_(0, group, s) / count.clamp_min(1.0)
    centred = s - mean[group]
    var = torch.zeros(n_groups, device=s.device).index_add_(0, group, centred * centred) / (count - 1).clamp_min(1.0)
    std = var.clamp(min=0.0).sqrt()
    single = count <= 1  # a group of one: mean 0, std 1, as in compute_grpo_outcome_advantage
    mean, std = mean.masked_fill(single, 0.0), std.masked_fill(single, 1.0)
    centred = scores - mean[group]
    scalars = centred / (std[group] + epsilon) if norm_adv_by_std_in_grpo else centred
    advantages = scalars.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("grpo_passk")
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO (Chen et al. 2025, arXiv:2503.19595): only each group's best sample gets an advantage,
    r_max - r_second, divided by the group's std (+ epsilon) when `config.norm_adv_by_std_in_grpo` (default True;
    as in verl it is the config, not the argument, that decides here). Ties: torch.topk's pick, as in verl.
    """
    if config is None:
        raise ValueError("grpo_passk needs `config` (the algorithm config: norm_adv_by_std_in_grpo)")
    norm = _config_value(config, "norm_adv_by_std_in_grpo", True)
    scores = token_level_rewards.sum(dim=-1)
    advantages = torch.zeros_like(scores)
    for rows in _group_rows(index):
        if len(rows) < 2:
            raise ValueError(f"Pass@k requires at least 2 samples per group. Got {len(rows)} for group {index[rows[0]]}.")
        group = scores[rows]
        top, top_at = torch.topk(group, 2)
        advantage = top[0] - top[1]
        advantages[rows[int(top_at[0])]] = advantage / (group.std() + epsilon) if norm else advantage
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("reinforce_plus_plus_baseline")
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
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


@register_adv_est("rloo")
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024): each score minus the mean of the *other* scores of its group,
    written as verl writes it: n/(n-1) * score - n/(n-1) * group mean. A group of one keeps its raw score.
    `epsilon` is accepted for verl's signature and unused, as in verl.
    """
    scores = token_level_rewards.sum(dim=-1)
    advantages = scores.clone()
    for rows in _group_rows(index):
        n = len(rows)
        if n > 1:
            group = scores[rows]
            advantages[rows] = group * n / (n - 1) - group.mean() * n / (n - 1)
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("opo")
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al. 2025, arXiv:2505.23585): score minus the length-weighted mean score of its group
    (0 for a group of one). A group whose responses are all empty gets baseline 0 here; verl divides 0 by 0.
    """
    lengths = response_mask.sum(dim=-1).to(token_level_rewards.dtype)
    scores = token_level_rewards.sum(dim=-1)
    advantages = scores.clone()
    for rows in _group_rows(index):
        if len(rows) > 1:
            weight = lengths[rows]
            total = weight.sum()
            baseline = (weight * scores[rows]).sum() / total if total > 0 else torch.zeros_like(total)
            advantages[rows] = scores[rows] - baseline
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("reinforce_plus_plus")
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    gamma: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted return-to-go per token, whitened over the whole batch.

    The discount is `config.gamma` (verl 0.9.1's signature); `gamma=` still works, and so does a number in
    `config`'s place (this module's older signature). As in verl 0.9.1, masked tokens are skipped, not
    restarts: inside a multi-turn response the return carries through tool-output spans unchanged, and
    rewards that sit on masked tokens are dropped; returns are 0 on masked tokens.
    """
    if gamma is None:
        gamma = config if isinstance(config, (int, float)) else _config_value(config, "gamma")
    if gamma is None:
        raise ValueError("reinforce_plus_plus needs config.gamma (or gamma=)")
    valid = response_mask.bool()
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        candidate = token_level_rewards[:, t] + gamma * running
        returns[:, t] = torch.where(valid[:, t], candidate, 0.0)
        running = torch.where(valid[:, t], candidate, running)
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@register_adv_est("remax")
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023): return-to-go minus the reward of a greedy response to the same prompt.

    The trainer's fit() generates the greedy baselines (SingleControllerTrainer.greedy_baselines), as verl's does.
    """
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns


@register_adv_est("gpg")
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al. 2025): alpha * (score - group mean) / f_norm, alpha = batch size / non-zero scores.

    As in verl the `alpha` argument is overwritten by that ratio, and a group of one has mean 0.
    """
    scores = token_level_rewards.sum(dim=-1)
    alpha = len(scores) / torch.count_nonzero(scores).clamp(min=1)
    centred = scores.clone()
    for rows in _group_rows(index):
        if len(rows) > 1:
            centred[rows] = scores[rows] - scores[rows].mean()
    advantages = (alpha * centred / f_norm).unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("rloo_vectorized")
@torch.no_grad()
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO without the loop (verl's rloo_vectorized). Unlike `rloo`, a group of one gets advantage 0."""
    scores = token_level_rewards.sum(dim=-1)
    group, n_groups = _group_ids(index, scores.device)
    count = torch.bincount(group, minlength=n_groups)[group].to(scores.dtype)
    group_sum = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, group, scores)[group]
    advantages = (count * scores - group_sum) / (count - 1).clamp_min(1) * (count > 1)
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("gdpo")
@torch.no_grad()
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    batch: Mapping[str, torch.Tensor] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (arXiv:2601.05242): GRPO-normalise each reward component within its group, sum them with
    `config.gdpo_reward_weights` (default 1 each), whiten over the batch. The components are the
    `config.gdpo_reward_keys` columns of `non_tensor_batch`, placed on the last response token as verl does
    (from `batch`'s prompts and attention_mask); without config, non_tensor_batch and batch, the one component
    is token_level_rewards.
    """
    components, weights = [token_level_rewards], None
    if config is not None and non_tensor_batch is not None and batch is not None:
        keys = _config_value(config, "gdpo_reward_keys")
        if not keys:
            raise ValueError("GDPO requires 'algorithm.gdpo_reward_keys', the reward components compute_score returns")
        prompt_length = batch["prompts"].size(1)
        last = batch["attention_mask"][:, prompt_length:].sum(dim=1) - 1
        components = []
        for key in keys:
            if key not in non_tensor_batch:
                raise ValueError(f"GDPO reward key '{key}' not found in non_tensor_batch: {list(non_tensor_batch)}")
            component = torch.zeros_like(response_mask, dtype=torch.float32)
            rows = torch.arange(component.size(0), device=component.device)
            component[rows, last] = torch.tensor(np.asarray(non_tensor_batch[key], dtype=np.float32), device=component.device)
            components.append(component)
        weights = _config_value(config, "gdpo_reward_weights")
    weights = torch.tensor(list(weights) if weights is not None else [1.0] * len(components), dtype=torch.float32,
                           device=token_level_rewards.device)
    total = None
    for weight, component in zip(weights, components):
        normalised, _ = compute_grpo_outcome_advantage(component, response_mask, index, epsilon, norm_adv_by_std_in_grpo)
        total = weight * normalised if total is None else total + weight * normalised
    advantages = masked_whiten(total, response_mask) * response_mask
    return advantages, advantages


def _zero_tail(baselines: torch.Tensor, row_of: list[int], lengths: torch.Tensor) -> None:
    """verl's handle_zero_tail: past the second-longest response of a group, the unique longest has baseline 0."""
    ordered = torch.sort(lengths).values
    longest, second = int(ordered[-1]), int(ordered[-2])
    at = (lengths == longest).nonzero(as_tuple=True)[0]
    if at.numel() == 1 and longest > second:
        baselines[row_of[int(at[0])], second:] = 0.0


@register_adv_est("optimal_token_baseline")
@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal token baseline: a per-timestep baseline B_t = sum(G_t W_t) / sum(W_t) over the group, with
    W_t the cumulative sum of 1 - 2 pi_j + sum(pi^2) (times the squared IS weights if given).
    `sum_pi_squared` is the actor's sum over the vocabulary of p^2 at each token (calculate_sum_pi_squared_from_logits).
    """
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    w = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights**2
    w_cumulative = (w * response_mask).cumsum(dim=-1)
    baselines = torch.zeros_like(returns)
    for rows in _group_rows(index):
        if len(rows) == 1:
            continue  # no baseline: the advantage is the return
        at = torch.tensor(rows, device=returns.device)
        w_group, mask_group = w_cumulative[at], response_mask[at]
        numerator = (returns[at] * w_group * mask_group).sum(dim=0)
        baselines[at] = (numerator / ((w_group * mask_group).sum(dim=0) + epsilon)).unsqueeze(0).expand(len(rows), -1)
        if handle_zero_tail:
            _zero_tail(baselines, rows, mask_group.sum(dim=-1))
    return (returns - baselines) * response_mask, returns


@register_adv_est("tir_optimal_token_baseline")
@torch.no_grad()
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | torch.Tensor,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The optimal token baseline over the response tokens only (multi-turn, tool output masked): each row's
    valid tokens are packed to the left, the baseline is computed per packed position, then unpacked. Empty
    responses take no part and get advantage 0.
    """
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    w = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights**2
    w_cumulative = (w * response_mask).cumsum(dim=-1)
    lengths = response_mask.sum(dim=-1).to(dtype=torch.long)
    width = int(lengths.max()) if lengths.numel() else 0
    packed_w = w_cumulative.new_zeros((len(lengths), width))
    packed_returns = torch.zeros_like(packed_w)
    valid = response_mask.bool()
    for row, length in enumerate(lengths.tolist()):
        if length:
            packed_w[row, :length], packed_returns[row, :length] = w_cumulative[row, valid[row]], returns[row, valid[row]]
    baselines = torch.zeros_like(packed_returns)
    non_empty = [row for row, length in enumerate(lengths.tolist()) if length]
    for rows in _group_rows([index[row] for row in non_empty]):
        rows = [non_empty[r] for r in rows]
        if len(rows) == 1:
            continue
        at = torch.tensor(rows, device=packed_returns.device)
        w_group = packed_w[at]
        baselines[at] = ((packed_returns[at] * w_group).sum(dim=0) / (w_group.sum(dim=0) + epsilon)).to(baselines.dtype)
        if handle_zero_tail:
            _zero_tail(baselines, rows, lengths[at])
    packed_advantages = packed_returns - baselines
    advantages = torch.zeros_like(returns)
    for row in non_empty:
        advantages[row, valid[row]] = packed_advantages[row, : lengths[row]]
    return advantages * response_mask, returns


@dataclass
class AlgoArgs:
    """The `algorithm` settings the estimators read from verl's `config` (a stand-in for verl's AlgoConfig)."""

    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


def compute_advantage(
    adv_estimator: Any,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Sequence[Any] | torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    reward_baselines: torch.Tensor | None = None,
    config: Any = None,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Call the registered estimator with the inputs it needs, as verl's ray_trainer.compute_advantage does:
    GAE gets gamma and lam, GRPO gets norm_adv_by_std_in_grpo, every other estimator gets `config` (built from
    gamma/lam/norm_adv_by_std_in_grpo when not given), `index` and `reward_baselines` when there are any, and the
    optimal token baselines the actor's `old_log_probs` and `sum_pi_squared` (and the rollout correction's
    `rollout_is_weights`, where there are any).
    """
    name = _name(adv_estimator)
    fn = get_adv_estimator_fn(name)
    if name == "gae":
        if values is None:
            raise ValueError("adv_estimator 'gae' needs the critic's values")
        return fn(token_level_rewards, values, response_mask, gamma, lam)
    params = inspect.signature(fn).parameters
    if "index" in params and params["index"].default is inspect.Parameter.empty and index is None:
        raise ValueError(f"adv_estimator {name!r} needs `index`, the group id of each row")
    if "reward_baselines" in params and reward_baselines is None:
        raise ValueError(f"adv_estimator {name!r} needs reward_baselines (the reward of a greedy generation per "
                         "prompt), which the trainer makes in fit() but step() cannot: its samples come generated")
    if "sum_pi_squared" in params and (sum_pi_squared is None or old_log_probs is None):
        raise ValueError(f"adv_estimator {name!r} needs the actor's sum_pi_squared and old_log_probs")
    if name == "grpo":
        return fn(token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    kwargs: dict[str, Any] = {
        "token_level_rewards": token_level_rewards,
        "response_mask": response_mask,
        "config": config if config is not None else AlgoArgs(gamma, lam, norm_adv_by_std_in_grpo),
    }
    if index is not None:
        kwargs["index"] = index
    if reward_baselines is not None:
        kwargs["reward_baselines"] = reward_baselines
    if "sum_pi_squared" in params:
        kwargs.update(old_log_probs=old_log_probs, sum_pi_squared=sum_pi_squared, rollout_is_weights=rollout_is_weights)
    return fn(**kwargs)


# --------------------------------------------------------------------------------------------------------------
# Loss aggregation
# --------------------------------------------------------------------------------------------------------------

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum")


def _safe(denominator: torch.Tensor | int | float) -> torch.Tensor | int | float:
    """A count to divide by: 1 where it is 0, so an empty batch gives loss 0 (verl: 0 / 0 = NaN) and no NaN grad."""
    if isinstance(denominator, torch.Tensor):
        return torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    return denominator if denominator else 1


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: torch.Tensor | int | None = None,
    global_batch_size: torch.Tensor | int | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss matrix to a scalar, as verl 0.9.1's agg_loss.

    - token-mean: sum over valid tokens / number of valid tokens.
    - token-sum: sum over valid tokens.
    - seq-mean-token-sum: per-sequence token sum, averaged over the non-empty sequences.
    - seq-mean-token-mean: per-sequence token mean, averaged over the non-empty sequences.
    - seq-mean-token-sum-norm: seq-mean-token-sum / `loss_scale_factor` (default: response_length, a constant
      as in Dr. GRPO).
    A fully masked row counts in no mode. An all-masked batch gives 0 (verl: NaN).

    Gradient accumulation: by default the denominators come from this (micro-)batch, so micro-batches of
    unequal token counts would be weighted wrongly. Pass the *mini-batch* totals instead -- `batch_num_tokens`
    (valid tokens) and `global_batch_size` (non-empty sequences), see `make_global_batch_info` -- and the
    micro-batch losses *sum* to the full mini-batch loss. Every mode is multiplied by `dp_size`, for gradients
    that data parallelism averages over ranks (verl requires the totals when dp_size > 1).
    """
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = loss_mask.sum()
        return masked_sum(loss_mat, loss_mask) / _safe(batch_num_tokens) * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; use one of: {', '.join(LOSS_AGG_MODES)}")

    tokens_per_row = loss_mask.sum(dim=-1)
    seq_losses = masked_sum(loss_mat, loss_mask, axis=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_losses / (tokens_per_row + 1e-8)
    non_empty = (tokens_per_row > 0).float()
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError("global_batch_size is required when dp_size > 1")
        global_batch_size = non_empty.sum()
    loss = masked_sum(seq_losses, non_empty) / _safe(global_batch_size) * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return loss


def make_global_batch_info(response_mask: torch.Tensor, loss_scale_factor: float | None = None) -> dict[str, Any]:
    """The mini-batch totals that make micro-batch losses add up to the mini-batch loss (see `agg_loss`).

    Compute once per mini-batch, then pass as `global_batch_info=` to the loss functions of each micro-batch.
    `global_batch_size` counts the non-empty rows, the rows agg_loss's seq-mean modes average over.
    """
    info: dict[str, Any] = {
        "batch_num_tokens": response_mask.sum().clamp(min=1),  # an all-padding mini-batch gives loss 0
        "global_batch_size": (response_mask.sum(dim=-1) > 0).sum(),
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
    token_weights: torch.Tensor | None = None,
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
    if token_weights is not None:  # verl's rollout-correction (importance) weights
        pg_losses = pg_losses * token_weights

    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **(global_batch_info or {}))
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


POLICY_LOSS_REGISTRY: dict[str, Callable[..., tuple[torch.Tensor, dict[str, float]]]] = {}


def register_policy_loss(name: str) -> Callable:
    """Decorator: register a policy loss under `actor.policy_loss.loss_mode`, as verl's does."""

    def decorator(fn):
        POLICY_LOSS_REGISTRY[name] = fn
        return fn

    return decorator


def get_policy_loss_fn(name: str) -> Callable[..., tuple[torch.Tensor, dict[str, float]]]:
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(f"Unsupported loss mode: {name}. Supported modes are: {list(POLICY_LOSS_REGISTRY)}")
    return POLICY_LOSS_REGISTRY[name]


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl 0.9.1's registered form of compute_policy_loss: clip ratios from the actor `config` (clip_ratio,
    clip_ratio_low/high, clip_ratio_c, global_batch_info), per-token weights `rollout_is_weights`, metrics as a dict.
    """
    if config is None:
        raise ValueError("compute_policy_loss_vanilla needs the actor config (clip_ratio, ...)")
    clip_ratio = _config_value(config, "clip_ratio")
    low, high = _config_value(config, "clip_ratio_low"), _config_value(config, "clip_ratio_high")
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(
        old_log_prob, log_prob, advantages, response_mask,
        cliprange=clip_ratio, cliprange_low=clip_ratio if low is None else low,
        cliprange_high=clip_ratio if high is None else high, clip_ratio_c=_config_value(config, "clip_ratio_c", 3.0),
        loss_agg_mode=loss_agg_mode, global_batch_info=_config_value(config, "global_batch_info") or {},
        token_weights=rollout_is_weights,
    )
    metrics = {"actor/pg_clipfrac": clipfrac.item(), "actor/ppo_kl": ppo_kl.item(),
               "actor/pg_clipfrac_lower": clipfrac_lower.item()}
    return pg_loss, metrics


def _clip_range(config: Any) -> tuple[float, float]:
    """(clip_ratio_low, clip_ratio_high) of the actor config, each clip_ratio where unset."""
    clip_ratio = _config_value(config, "clip_ratio")
    low, high = _config_value(config, "clip_ratio_low"), _config_value(config, "clip_ratio_high")
    return (clip_ratio if low is None else low), (clip_ratio if high is None else high)


def _policy_loss_value(config: Any, key: str, default: float) -> float:
    """config.policy_loss.<key> (verl's PolicyLossConfig), `default` where unset."""
    value = _config_value(_config_value(config, "policy_loss"), key)
    return default if value is None else value


def _aggregate(pg_losses: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str, config: Any,
               rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """Weight by the rollout-correction weights, if any, and aggregate over the global batch (config's totals)."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **(_config_value(config, "global_batch_info") or {}))


def _clip_metrics(clipfrac: torch.Tensor, ppo_kl: torch.Tensor, clipfrac_lower: torch.Tensor) -> dict[str, float]:
    return {"actor/pg_clipfrac": clipfrac.item(), "actor/ppo_kl": ppo_kl.item(),
            "actor/pg_clipfrac_lower": clipfrac_lower.item()}


def _dppo_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, divergence):
    """DPPO-Binary (arXiv:2602.04879): a REINFORCE term, truncated-IS weighted, masked where the policy moved past the
    divergence bound (clip_ratio_low/high are that bound here, not a ratio clip)."""
    low, high = _clip_range(config)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    clip_ratio_c = _config_value(config, "clip_ratio_c", 20.0)
    truncated_ratio = torch.clamp(ratio, max=clip_ratio_c).detach()
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    if divergence == "tv":
        positive_ok, negative_ok = (prob - old_prob) <= high, (prob - old_prob) >= -low
    else:  # the binary KL between old and new probability of the token
        binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
        positive_ok, negative_ok = (binary_kl <= high) | (prob <= old_prob), (binary_kl <= low) | (prob >= old_prob)
    valid = torch.where(advantages > 0, positive_ok, negative_ok).detach().float()
    pg_losses = -advantages * truncated_ratio * log_prob * valid
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = masked_mean(1.0 - valid, response_mask)
    clipfrac_lower = masked_mean((ratio > clip_ratio_c).float() * valid, response_mask)
    return pg_loss, _clip_metrics(clipfrac, ppo_kl, clipfrac_lower)


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                config=None, rollout_is_weights=None):
    """DPPO-Binary-TV: tokens whose probability moved by more than the bound (total variation) get no gradient."""
    return _dppo_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, "tv")


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                config=None, rollout_is_weights=None):
    """DPPO-Binary-KL: as dppo_tv with the binary KL of the token's probability as the divergence."""
    return _dppo_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, "kl")


@register_policy_loss("gspo")
def compute_policy_loss_gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="seq-mean-token-mean",
                             config=None, rollout_is_weights=None):
    """GSPO (arXiv:2507.18071): PPO's clip on the sequence-level ratio exp(mean log-ratio of the sequence), with each
    token's gradient through its own log-prob. As verl, no dual clip; pg_clipfrac_lower is 0."""
    low, high = _clip_range(config)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = masked_sum(log_ratio, response_mask, axis=-1) / response_mask.sum(dim=-1).clamp(min=1)
    seq_ratio = torch.exp(torch.clamp(log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1), max=10.0))
    unclipped = -advantages * seq_ratio
    clipped = -advantages * torch.clamp(seq_ratio, 1 - low, 1 + high)
    pg_loss = _aggregate(torch.maximum(unclipped, clipped), response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), response_mask)
    return pg_loss, _clip_metrics(clipfrac, masked_mean(-log_ratio, response_mask), torch.tensor(0.0))


@register_policy_loss("sapo")
def compute_policy_loss_sapo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="seq-mean-token-mean",
                             config=None, rollout_is_weights=None):
    """SAPO (arXiv:2511.20347): a smooth sigmoid gate on the ratio instead of a clip, temperature tau_pos for positive
    advantages and tau_neg otherwise. As verl, always aggregated seq-mean-token-mean (loss_agg_mode is not read)."""
    tau_pos = torch.as_tensor(_config_value(config, "tau_pos"), dtype=advantages.dtype, device=advantages.device)
    tau_neg = torch.as_tensor(_config_value(config, "tau_neg"), dtype=advantages.dtype, device=advantages.device)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    taus = torch.where(advantages > 0, tau_pos, tau_neg)
    gates = torch.sigmoid(taus * (torch.exp(log_ratio) - 1.0)) * (4.0 / taus)
    pg_loss = _aggregate(-gates * advantages, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    zero = torch.tensor(0.0)
    return pg_loss, _clip_metrics(zero, masked_mean(-log_ratio, response_mask), zero)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                            config=None, rollout_is_weights=None):
    """GPG (Chu et al. 2025): plain policy gradient, -A * log pi, no ratio and no clip; no metrics."""
    return _aggregate(-log_prob * advantages, response_mask, loss_agg_mode, config, rollout_is_weights), {}


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                 config=None, rollout_is_weights=None):
    """Clip-Cov (arXiv:2505.22617): PPO's clip, plus no gradient for a random clip_cov_ratio share of the tokens whose
    covariance of advantage and log-prob lies in (clip_cov_lb, clip_cov_ub). Draws from torch's global generator."""
    clip_cov_ratio = _policy_loss_value(config, "clip_cov_ratio", 0.0002)
    clip_cov_lb = _policy_loss_value(config, "clip_cov_lb", 1.0)
    clip_cov_ub = _policy_loss_value(config, "clip_cov_ub", 5.0)
    if clip_cov_ratio <= 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be larger than 0, got {clip_cov_ratio}")
    low, high = _clip_range(config)
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clipped_by_ppo = (clipped > unclipped) & (response_mask > 0)
    cov = (advantages - masked_mean(advantages, response_mask)) * (log_prob - masked_mean(log_prob.detach(), response_mask))
    cov[response_mask == 0] = -torch.inf
    cov[clipped_by_ppo] = -torch.inf
    clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    candidates = torch.nonzero((cov < clip_cov_ub) & (cov > clip_cov_lb) & (response_mask > 0))
    if len(candidates) > 0:
        candidates = candidates[torch.randperm(len(candidates))[: min(clip_num, len(candidates))]]
    corr = torch.ones_like(advantages)
    corr[candidates[:, 0], candidates[:, 1]] = 0
    pg_loss = _aggregate(torch.maximum(unclipped, clipped) * corr, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {"actor/pg_clipfrac": masked_mean((corr == 0).float(), response_mask).item(),
                     "actor/ppo_kl": ppo_kl.item()}


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                               config=None, rollout_is_weights=None):
    """KL-Cov (arXiv:2505.22617): the unclipped surrogate, plus ppo_kl_coef * |log-ratio| on the kl_cov_ratio share
    of tokens with the largest covariance of advantage and log-prob. actor/ppo_kl is the mean |log-ratio| here."""
    kl_cov_ratio = _policy_loss_value(config, "kl_cov_ratio", 0.0002)
    ppo_kl_coef = _policy_loss_value(config, "ppo_kl_coef", 1.0)
    if kl_cov_ratio <= 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be larger than 0, got {kl_cov_ratio}")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    with_kl = pg_losses + ppo_kl_coef * log_ratio.abs()
    valid = response_mask > 0
    flat_valid = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    adv, logp = advantages[valid].detach().reshape(-1).cpu(), log_prob[valid].detach().reshape(-1).cpu()
    if len(adv):  # verl: k = min(kl_cov_ratio, n) != 0
        cov = (adv - adv.mean()) * (logp - logp.mean())
        top = flat_valid[torch.topk(cov, max(1, int(len(cov) * kl_cov_ratio)), largest=True).indices]
        rows, cols = top // advantages.shape[1], top % advantages.shape[1]
        pg_losses[rows, cols] = with_kl[rows, cols]
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {"actor/ppo_kl": masked_mean(log_ratio.abs(), response_mask).item()}


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                 config=None, rollout_is_weights=None):
    """GMPO (arXiv:2507.20673): the geometric mean of the clipped token ratios of each sequence times its mean
    advantage, averaged over the (micro-)batch's rows as verl does (loss_agg_mode is not read)."""
    low, high = _clip_range(config)
    log_ratio = log_prob - old_log_prob
    ppo_kl = masked_mean(-log_ratio, response_mask)
    sign = torch.sign(advantages)
    log_ratio_clamped = torch.clamp(log_ratio, -low, high)
    log_ratio_min = sign * torch.min(sign * log_ratio, sign * log_ratio_clamped)
    lengths = response_mask.sum(dim=-1)
    ratio = torch.exp((log_ratio_min * response_mask).sum(dim=-1) / (lengths + 1e-8))
    advantage = (advantages * response_mask).sum(dim=-1) / (lengths + 1e-8)
    pg_losses = -advantage * ratio
    if rollout_is_weights is not None:  # their geometric mean per sequence
        pg_losses = pg_losses * torch.exp(
            (torch.log(rollout_is_weights + 1e-10) * response_mask).sum(dim=-1) / (lengths + 1e-8))
    clipped = torch.ne(log_ratio, log_ratio_clamped)
    clipfrac = masked_mean((clipped * (advantages > 0)).float(), response_mask)
    clipfrac_lower = masked_mean((clipped * (advantages < 0)).float(), response_mask)
    return torch.mean(pg_losses), _clip_metrics(clipfrac, ppo_kl, clipfrac_lower)


@register_policy_loss("dro")
def compute_policy_loss_dro(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                            config=None, rollout_is_weights=None):
    """Direct Reward Optimization: -(A * log pi - dro_beta / 2 * log-ratio^2)."""
    beta = _config_value(_config_value(config, "policy_loss"), "dro_beta")
    if beta is None or beta <= 0:
        raise ValueError("policy_loss.dro_beta must be a positive value when using DRO")
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {"actor/ppo_kl": masked_mean(-log_ratio, response_mask).item()}


@register_policy_loss("cispo")
def compute_policy_loss_cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                              config=None, rollout_is_weights=None):
    """CISPO (arXiv:2506.13585): -sg(clip(ratio)) * A * log pi: the clipped ratio only weights, every token keeps
    its gradient. pg_clipfrac_lower is 0."""
    low, high = _clip_range(config)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - low, 1 + high)
    pg_losses = -clipped_ratio.detach() * advantages * log_prob
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = masked_mean((ratio != clipped_ratio).float(), response_mask)
    return pg_loss, _clip_metrics(clipfrac, masked_mean(-log_ratio, response_mask), torch.tensor(0.0))


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: torch.Tensor | int | None = None,
    global_batch_size: torch.Tensor | int | None = None,
    loss_scale_factor: float | None = None,
    *,
    global_batch_info: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: 0.5 * agg(max((V - R)^2, (clip(V, V_old +- cliprange_value) - R)^2)).

    Returns (vf_loss, vf_clipfrac), the share of tokens where the clipped term was larger. The 0.5 is verl's.
    dp_size .. loss_scale_factor are verl 0.9.1's, passed to agg_loss; `global_batch_info` (a dict of the same
    keys, see make_global_batch_info) is this module's shorthand for them.
    """
    totals = {"dp_size": dp_size, "batch_num_tokens": batch_num_tokens, "global_batch_size": global_batch_size,
              "loss_scale_factor": loss_scale_factor, **(global_batch_info or {})}
    vpreds_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped = (vpreds - returns) ** 2
    clipped = (vpreds_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(unclipped, clipped), response_mask, loss_agg_mode, **totals)
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
