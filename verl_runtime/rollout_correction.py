"""verl 0.9.1's rollout correction (verl/trainer/ppo/rollout_corr_helper.py): importance-sampling weights and
rejection masks between the rollout engine's log-probs and the trainer's, with verl's names, arguments and metrics.

Pure tensor functions, compared number for number with verl's by tests/test_rollout_correction.py. One difference
of form: compute_rollout_correction_and_rejection_mask returns the weights as a tensor (verl wraps them in a
DataProto). Where they are used: trainer.py (decoupled mode, once per batch) and workers/actor.py (bypass mode,
per micro-batch, in compute_policy_loss_bypass_mode).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from verl_runtime.algorithms import agg_loss, compute_policy_loss, masked_mean, masked_sum
from verl_runtime.rollout_thresholds import (
    IS_LEVELS,
    SAFETY_BOUND,
    SUPPORTED_ROLLOUT_RS_OPTIONS,
    TOKEN_LEVEL_ROLLOUT_RS_OPTIONS,
    parse_rollout_is_threshold,
    parse_rollout_rs_thresholds,
    parse_rollout_rs,
)

def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The response mask with tokens (or whole sequences) whose divergence estimate (k1, k2, k3 of the log-ratio
    train/rollout, per token or summed/averaged/maxed per sequence) is out of bounds set to 0; every option must pass."""
    if rollout_rs is None or not isinstance(rollout_rs, str):
        raise ValueError("rollout_rs must be a non-empty string (comma separated for multiple options).")
    if rollout_rs_threshold is None:
        raise ValueError("rollout_rs_threshold must be provided for rejection sampling.")
    if log_ratio.shape[0] == 0:
        return response_mask, {}
    options = parse_rollout_rs(rollout_rs)
    specs = parse_rollout_rs_thresholds(options, rollout_rs_threshold)

    safe = torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND)
    per_token = {"k1": -safe, "k2": 0.5 * safe**2, "k3": torch.exp(safe) - 1.0 - safe}
    mask_bool = response_mask.bool()
    seq_valid_mask = response_mask.sum(dim=-1) > 0
    combined_mask = torch.ones_like(response_mask, dtype=log_ratio.dtype)
    metrics: dict[str, float] = {}

    def seq_max(values: torch.Tensor) -> torch.Tensor:
        top = values.masked_fill(~mask_bool, float("-inf")).max(dim=-1).values
        return torch.where(top == float("-inf"), torch.zeros_like(top), top)

    reducers = {"sum": lambda v: masked_sum(v, response_mask, axis=-1),
                "mean": lambda v: masked_mean(v, response_mask, axis=-1), "max": seq_max}
    for option in options:
        k1 = option.endswith("k1")
        upper, lower = specs[option]["upper"], specs[option]["lower"]
        upper_log = math.log(upper) if k1 else None
        lower_log = math.log(lower) if k1 else None
        token_stat = per_token[option[-2:]]
        level = "token" if option in TOKEN_LEVEL_ROLLOUT_RS_OPTIONS else "sequence"
        seq_stat = None if level == "token" else reducers[option.split("_")[1]](token_stat)
        stat = token_stat if seq_stat is None else seq_stat
        keep = (stat >= lower_log) & (stat <= upper_log) if k1 else stat <= upper
        if seq_stat is not None:
            keep = keep.unsqueeze(-1).expand_as(mask_bool)
            token_stat = seq_stat.unsqueeze(-1).expand_as(response_mask)
        metrics.update(compute_rs_metrics(
            option_name=option, rs_statistic=token_stat, response_mask=response_mask, seq_valid_mask=seq_valid_mask,
            level=level, per_sequence_values=seq_stat, rollout_rs_threshold=upper_log if k1 else upper,
            rollout_rs_threshold_lower=lower_log if k1 else 0.0, apply_lower_threshold=k1,
        ))
        keep_mask = keep.to(dtype=log_ratio.dtype)
        combined_mask = combined_mask * keep_mask
        seq_keep = (~((~keep) & mask_bool)).all(dim=-1)
        valid = seq_valid_mask.float()
        metrics[f"rollout_rs_{option}_masked_fraction"] = masked_mean(1 - keep_mask, response_mask).item()
        metrics[f"rollout_rs_{option}_seq_masked_fraction"] = (
            (((1.0 - seq_keep.to(log_ratio.dtype)) * valid).sum() / valid.sum()).item() if valid.sum() > 0 else 0.0
        )
    metrics["rollout_rs_masked_fraction"] = masked_mean(1 - combined_mask, response_mask).item()
    kept = (combined_mask > 0.5) & mask_bool
    metrics["rollout_rs_seq_masked_fraction"] = (~kept & mask_bool).any(dim=-1).float().mean().item()
    return (response_mask * combined_mask).to(dtype=response_mask.dtype), metrics


def compute_rs_metrics(
    option_name: str,
    rs_statistic: torch.Tensor,
    response_mask: torch.Tensor,
    seq_valid_mask: torch.Tensor,
    *,
    level: str,
    per_sequence_values: torch.Tensor | None,
    rollout_rs_threshold: float,
    rollout_rs_threshold_lower: float,
    apply_lower_threshold: bool,
) -> dict[str, float]:
    """verl's per-option rejection metrics: the statistic's mean/max/min/std, fractions beyond the bounds, and the
    same per sequence (rollout_rs_<option>_*)."""
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    prefix, mask_bool = f"rollout_rs_{option_name}", response_mask.bool()
    high, low = rollout_rs_threshold, rollout_rs_threshold_lower
    seq = per_sequence_values if per_sequence_values is not None else masked_mean(rs_statistic, response_mask, axis=-1)
    seq = seq.squeeze(-1) if seq.dim() > 1 else seq
    seq = seq[seq_valid_mask]
    metrics = {f"{prefix}_mean": masked_mean(rs_statistic, response_mask).item()}
    by_sequence = level == "sequence" and seq.numel() > 0
    if by_sequence:
        metrics[f"{prefix}_max"], metrics[f"{prefix}_min"] = seq.max().item(), seq.min().item()
        metrics[f"{prefix}_fraction_high"] = (seq > high).float().mean().item()
        metrics[f"{prefix}_fraction_low"] = (seq < low).float().mean().item() if apply_lower_threshold else 0.0
    else:
        metrics[f"{prefix}_max"] = rs_statistic.masked_fill(~mask_bool, float("-inf")).max().item()
        metrics[f"{prefix}_min"] = rs_statistic.masked_fill(~mask_bool, float("inf")).min().item()
        metrics[f"{prefix}_fraction_high"] = masked_mean((rs_statistic > high).float(), response_mask).item()
        metrics[f"{prefix}_fraction_low"] = (
            masked_mean((rs_statistic < low).float(), response_mask).item() if apply_lower_threshold else 0.0
        )
    metrics[f"{prefix}_std"] = _clamped_std(rs_statistic, response_mask, low if apply_lower_threshold else 0.0, high)
    if seq.numel() > 0:
        metrics.update({
            f"{prefix}_seq_mean": seq.mean().item(), f"{prefix}_seq_std": seq.std().item() if seq.numel() > 1 else 0.0,
            f"{prefix}_seq_max": seq.max().item(), f"{prefix}_seq_min": seq.min().item(),
            f"{prefix}_seq_max_deviation": seq.abs().max().item(),
            f"{prefix}_seq_fraction_high": (seq > high).float().mean().item(),
        })
        if apply_lower_threshold:
            metrics[f"{prefix}_seq_fraction_low"] = (seq < low).float().mean().item()
    else:
        for name in ("seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation", "seq_fraction_high",
                     "seq_fraction_low"):
            metrics[f"{prefix}_{name}"] = 0.0
    return metrics


def _clamped_std(values: torch.Tensor, response_mask: torch.Tensor, low: float, high: float) -> float:
    """The masked standard deviation of values clamped to [low, high] (0 for fewer than two tokens), as verl's."""
    if response_mask.sum() <= 1:
        return 0.0
    clamped = values.clamp(min=low, max=high)
    var = masked_mean(clamped.square(), response_mask) - masked_mean(clamped, response_mask).square()
    return torch.sqrt(torch.clamp(var, min=0.0)).item()


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: str | float = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Detached importance weights pi_train / pi_rollout per token, or per sequence (the product over its tokens),
    truncated at the threshold (TIS) or zeroed outside "lower_upper" (IcePop); 0 on padding; optionally divided
    by their batch mean."""
    if rollout_is not in IS_LEVELS:
        raise ValueError(f"Invalid rollout_is: {rollout_is}. Must be one of {set(IS_LEVELS)}.")
    upper, lower = parse_rollout_is_threshold(rollout_is_threshold)
    if rollout_is == "token":
        log_ratio_for_metrics = log_ratio
        raw = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
    else:
        log_ratio_for_metrics = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(log_ratio_for_metrics, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * response_mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    metrics = compute_is_metrics(weights, raw, log_ratio_for_metrics, response_mask, rollout_is, upper, lower)
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = masked_mean(((raw < lower) | (raw > upper)).float(), response_mask).item()
    weights = weights.detach()  # the weights change the measure, not the objective
    if rollout_is_batch_normalize:
        if rollout_is == "token":
            mean = masked_mean(weights, response_mask)
        else:
            seq_weights = masked_mean(weights, response_mask, axis=-1)
            seq_mask = (response_mask.sum(dim=-1) > 0).to(dtype=weights.dtype)
            mean = (seq_weights * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
        if mean > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = mean.item()
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def compute_is_metrics(
    rollout_is_weights: torch.Tensor,
    raw_rollout_is_weights: torch.Tensor,
    log_ratio_for_metrics: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str,
    rollout_is_threshold: float,
    rollout_is_threshold_lower: float | None = None,
) -> dict[str, float]:
    """verl's importance-weight metrics: mean/max/min/std, fractions beyond the bounds, effective sample size, and
    per-sequence statistics (rollout_is_*)."""
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    weights, raw = rollout_is_weights, raw_rollout_is_weights
    lower = 1.0 / rollout_is_threshold if rollout_is_threshold_lower is None else rollout_is_threshold_lower
    metrics = {}
    if rollout_is == "sequence":
        log_upper = torch.log(torch.tensor(rollout_is_threshold, device=weights.device))
        log_lower = torch.log(torch.tensor(lower, device=weights.device))
        metrics["rollout_is_max"] = torch.exp(torch.clamp(log_ratio_for_metrics.max(), max=SAFETY_BOUND)).item()
        metrics["rollout_is_min"] = torch.exp(log_ratio_for_metrics.min()).item()
        metrics["rollout_is_mean"] = masked_mean(weights, response_mask).item()
        metrics["rollout_is_ratio_fraction_high"] = (log_ratio_for_metrics > log_upper).float().mean().item()
        metrics["rollout_is_ratio_fraction_low"] = (log_ratio_for_metrics < log_lower).float().mean().item()
    else:
        mask_bool = response_mask.bool()
        metrics["rollout_is_mean"] = masked_mean(weights, response_mask).item()
        metrics["rollout_is_ratio_fraction_high"] = masked_mean((raw > rollout_is_threshold).float(), response_mask).item()
        metrics["rollout_is_ratio_fraction_low"] = masked_mean((raw < lower).float(), response_mask).item()
        metrics["rollout_is_max"] = weights.masked_fill(~mask_bool, float("-inf")).max().item()
        metrics["rollout_is_min"] = weights.masked_fill(~mask_bool, float("inf")).min().item()
    metrics["rollout_is_std"] = _clamped_std(weights, response_mask, 0.0, rollout_is_threshold)
    for_ess = weights.clamp(min=0.0, max=rollout_is_threshold)
    normalized = for_ess / (masked_mean(for_ess, response_mask) + 1e-8)
    mean_square = masked_mean(normalized.square(), response_mask).item()
    # 0 where IcePop zeroed every weight (verl divides by zero there and stops)
    metrics["rollout_is_eff_sample_size"] = 1.0 / mean_square if mean_square > 0 else 0.0
    if weights.dim() > 1:
        seq_mean = masked_mean(weights, response_mask, axis=-1)
        metrics["rollout_is_seq_mean"] = seq_mean.mean().item()
        metrics["rollout_is_seq_std"] = seq_mean.std().item() if seq_mean.numel() > 1 else 0.0
        metrics["rollout_is_seq_max"] = seq_mean.max().item()
        metrics["rollout_is_seq_min"] = seq_mean.min().item()
        metrics["rollout_is_seq_max_deviation"] = (seq_mean - 1.0).abs().max().item()
        raw_seq_mean = masked_mean(raw, response_mask, axis=-1)  # a mean of truncated weights never exceeds the bound
        metrics["rollout_is_seq_fraction_high"] = (raw_seq_mean > rollout_is_threshold).float().mean().item()
        metrics["rollout_is_seq_fraction_low"] = (raw_seq_mean < lower).float().mean().item()
    return metrics


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """(IS weights or None, the response mask after rejection, metrics under rollout_corr/): verl's one entry."""
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(f"log-prob shapes {tuple(old_log_prob.shape)}, {tuple(rollout_log_prob.shape)} and the "
                         f"response mask's {tuple(response_mask.shape)} differ")
    log_ratio = old_log_prob - rollout_log_prob
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    mask = response_mask.clone()
    if rollout_rs is not None:
        if rollout_rs_threshold is None:
            raise ValueError("rollout_rs_threshold must be explicitly provided when rollout_rs is enabled.")
        mask, rs_metrics = compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, mask, {f"rollout_corr/{key}": value for key, value in metrics.items()}


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None, response_mask: torch.Tensor
) -> dict[str, Any]:
    """The gap between the two policies: KL (direct and k3), perplexities, their log difference and ratio, and
    the chi-squared divergence per token and per sequence."""
    assert response_mask.any(), "Expected at least one valid token in response_mask"
    train_mean = masked_mean(old_log_prob, response_mask, axis=-1)
    metrics = {"training_ppl": torch.exp(-train_mean).mean().item(), "training_log_ppl": (-train_mean).mean().item()}
    if rollout_log_prob is None:
        return metrics
    log_ratio = old_log_prob - rollout_log_prob
    metrics["kl"] = masked_mean(rollout_log_prob - old_log_prob, response_mask).item()
    metrics["k3_kl"] = masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask).item()
    rollout_mean = masked_mean(rollout_log_prob, response_mask, axis=-1)
    metrics["rollout_ppl"] = torch.exp(-rollout_mean).mean().item()
    metrics["rollout_log_ppl"] = (-rollout_mean).mean().item()
    log_ppl_diff = rollout_mean - train_mean
    metrics["log_ppl_diff"] = log_ppl_diff.mean().item()
    metrics["log_ppl_abs_diff"] = log_ppl_diff.abs().mean().item()
    metrics["log_ppl_diff_max"] = log_ppl_diff.max().item()
    metrics["log_ppl_diff_min"] = log_ppl_diff.min().item()
    metrics["ppl_ratio"] = torch.exp(log_ppl_diff).mean().item()
    rho = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
    metrics["chi2_token"] = (masked_mean(rho.square(), response_mask) - 1.0).item()
    log_ratio_sum = torch.clamp(masked_sum(log_ratio, response_mask, axis=-1), min=-SAFETY_BOUND, max=SAFETY_BOUND)
    metrics["chi2_seq"] = (torch.exp(2.0 * log_ratio_sum).mean() - 1.0).item()
    return metrics


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    global_batch_info: dict | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE, -A * log pi (times the detached IS weights, if any), without clipping; actor/ppo_kl against the
    rollout policy."""
    pg_losses = -advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **(global_batch_info or {}))
    return pg_loss, {"actor/ppo_kl": masked_mean(rollout_log_prob - log_prob, response_mask).item()}


def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    actor_config: Any,
    rollout_correction: Any,
    global_batch_info: dict | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's bypass mode (old_log_prob is the rollout's): IS weights and rejection of the current policy against the
    rollout's, per micro-batch, then REINFORCE with the weights (loss_type=reinforce) or PPO-clip without them
    (ppo_clip: the ratio is already pi / pi_rollout)."""
    rc = rollout_correction
    with torch.no_grad():
        weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
            log_prob, old_log_prob, response_mask, rc.rollout_is, rc.rollout_is_threshold,
            rc.rollout_is_batch_normalize, rc.rollout_rs, rc.rollout_rs_threshold,
        )
    if rc.loss_type == "reinforce":
        pg_loss, pg_metrics = compute_policy_loss_reinforce(
            old_log_prob, log_prob, advantages, mask, loss_agg_mode, global_batch_info, weights
        )
    elif rc.loss_type == "ppo_clip":
        pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(
            old_log_prob, log_prob, advantages, mask, cliprange=actor_config.clip_ratio,
            cliprange_low=actor_config.clip_ratio_low, cliprange_high=actor_config.clip_ratio_high,
            clip_ratio_c=actor_config.clip_ratio_c, loss_agg_mode=loss_agg_mode, global_batch_info=global_batch_info,
        )
        pg_metrics = {"actor/pg_clipfrac": clipfrac.item(), "actor/ppo_kl": ppo_kl.item(),
                      "actor/pg_clipfrac_lower": clipfrac_lower.item()}
    else:
        raise ValueError(f"Invalid loss_type: {rc.loss_type}. Must be 'reinforce' or 'ppo_clip'.")
    return pg_loss, {**pg_metrics, **metrics}
