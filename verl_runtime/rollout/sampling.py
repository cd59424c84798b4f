"""Sampling from logits on the device: what every built-in decode path (eager, compiled, graph-captured) shares."""

from __future__ import annotations

import torch

from verl_runtime.rollout.base import SamplingParams


def sample(logits: torch.Tensor, params: SamplingParams, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens [B] and their log-probs log_softmax(logits / T) [B], from fp32 logits [B, V] and one uniform
    draw in [0, 1) per row, draws [B, 1] (unused under greedy decoding).

    Filtering follows transformers' order (temperature, top-k, top-p); the log-prob is of the temperature-scaled,
    unfiltered distribution, as the trainer recomputes it. Greedy decoding reports the same quantity.

    Sampling inverts the cumulative distribution, in float64 so that even a large vocabulary's smallest
    probabilities keep their share: one draw per row, where drawing one race time per vocabulary entry (what
    torch.multinomial does inside) costs more than the rest of the sampler on the CPU.
    """
    scaled = logits if params.temperature == 1.0 else logits / params.temperature
    probabilities = scaled.softmax(dim=-1)
    if not params.do_sample:
        tokens = scaled.argmax(dim=-1, keepdim=True)
    else:
        filtered = _top_p(_top_k(scaled, params.top_k), params.top_p)
        kept = probabilities if filtered is scaled else filtered.softmax(dim=-1)
        cumulative = kept.to(torch.float64).cumsum_(dim=-1)  # in place: one float64 copy, not two
        # (1 - u) * total lies in (0, total]: the first entry at or above it ends a token of positive probability.
        tokens = torch.searchsorted(cumulative, (1 - draws) * cumulative[:, -1:])
    return tokens.squeeze(-1), probabilities.gather(-1, tokens).log_().squeeze(-1)


def _top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= scores.shape[-1]:
        return scores
    kth = torch.topk(scores, k).values[..., -1:]
    return scores.masked_fill(scores < kth, -float("inf"))


def _top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches p (transformers' TopPLogitsWarper)."""
    if p >= 1.0:
        return scores
    sorted_scores, order = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - p)
    remove[..., -1:] = False  # always keep the most likely token
    return scores.masked_fill(remove.scatter(-1, order, remove), -float("inf"))
