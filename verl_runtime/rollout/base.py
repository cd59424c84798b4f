"""What every rollout engine takes and returns, so the trainer does not care which engine generated."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

import torch

from verl_runtime.models import position_ids_from_mask


@dataclass
class SamplingParams:
    n: int = 1  # samples per prompt, grouped: prompt i's samples are rows i*n .. i*n+n-1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k filtering (verl's convention)
    max_new_tokens: int = 64
    do_sample: bool = True  # False: greedy
    seed: int | None = None  # None: draw from the global torch RNG
    # left-pad the prompts to at least this width: with several workers the controller's longest prompt, so that every
    # worker's batch has one width (and the same padding as one worker's would)
    prompt_width: int | None = None

    def __post_init__(self):
        # Every engine reads greedy from do_sample alone: here temperature 0 becomes it, before any logits / 0.
        if self.temperature == 0:
            self.do_sample, self.temperature = False, logit_temperature(self.temperature)


def logit_temperature(temperature: float) -> float:
    """What logits are divided by, when sampling and when the trainer recomputes log-probs: the temperature, where
    0 asks for greedy decoding (as in vLLM and transformers), whose log-probs are the model's own (temperature 1)."""
    return temperature if temperature > 0 else 1.0


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor  # [B, P+R] prompt (left-padded) + response (right-padded)
    attention_mask: torch.Tensor  # [B, P+R]: prompt mask, then response_mask
    position_ids: torch.Tensor  # [B, P+R]
    responses: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R]: 1 up to and including the first EOS, 0 after
    prompt_length: int
    # [B, R] the sampler's log-prob of each response token (0 where masked), from engines that report it
    rollout_log_probs: torch.Tensor | None = None


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutBatch:
        """Sample params.n responses for each prompt (token ids), grouped by prompt."""

    def sync_weights(self, model) -> None:
        """Make the engine generate with the given (just updated) policy weights."""


def logprob_diff(rollout_log_probs: torch.Tensor, log_probs: torch.Tensor, response_mask: torch.Tensor) -> float:
    """Mean |sampler - trainer| log-prob over the response tokens (the metric rollout/logprob_diff)."""
    mask = response_mask.bool()
    return (rollout_log_probs[mask] - log_probs[mask]).abs().mean().item() if mask.any() else 0.0


def left_pad(prompts: list[list[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as a left-padded [B, P] id tensor and its attention mask; P is the longest prompt, or `width` if wider."""
    width = max(max(len(p) for p in prompts), width or 0)
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    return ids, mask


def mask_after_first_eos(responses: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """1 up to and including each row's first EOS, 0 after it (all 1 when a row has no EOS)."""
    is_eos = torch.isin(responses, torch.tensor(eos_ids, device=responses.device)).long()
    eos_before = torch.cumsum(is_eos, dim=-1) - is_eos
    return (eos_before == 0).long()


def assemble_batch(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor, eos_ids: list[int]
) -> RolloutBatch:
    """Join left-padded prompts with right-padded responses; positions continue from each prompt's last token."""
    response_mask = mask_after_first_eos(responses, eos_ids)
    prompt_positions = position_ids_from_mask(prompt_mask)
    steps = torch.arange(1, responses.shape[1] + 1, device=responses.device)
    response_positions = prompt_positions[:, -1:] + steps
    return RolloutBatch(
        input_ids=torch.cat([prompt_ids, responses], dim=1),
        attention_mask=torch.cat([prompt_mask, response_mask], dim=1),
        position_ids=torch.cat([prompt_positions, response_positions], dim=1),
        responses=responses,
        response_mask=response_mask,
        prompt_length=prompt_ids.shape[1],
    )


@contextlib.contextmanager
def eval_mode(model):
    """model in eval mode inside the block and as it was after it; switched only when it is training (a switch
    walks every module, a tenth of a millisecond that the trainer would pay twice a step for nothing)."""
    if not model.training:
        yield
        return
    model.eval()
    try:
        yield
    finally:
        model.train()
