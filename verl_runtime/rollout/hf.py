"""Rollout with transformers' generate, on the very model object the actor trains."""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import torch

from verl_runtime.errors import TrainingError
from verl_runtime.rollout.base import RolloutBatch, SamplingParams, assemble_batch, eval_mode, left_pad


class HFRolloutEngine:
    """Samples with ``model.generate``: left-padded prompts, each repeated n times, KV cache on.

    sync_weights is a no-op: the engine holds the same model object the actor updates (colocated, shared
    parameters), so every optimizer step is already what the next generate() samples from. Engines with their own
    copy of the weights (vLLM) must copy them in sync_weights.
    """

    def __init__(self, model, tokenizer, device):
        self.model = model
        self.device = torch.device(device)
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = eos_token_ids(model, tokenizer)
        # The logits of the last position only, in the prefill too ([rows, prompt, vocab] would be the rollout's
        # largest tensor by far): generate asks for it itself in the releases we run (5.17, 5.19), and explicitly a
        # release that does not cannot differ
        accepts = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.keep_last = {"logits_to_keep": 1} if accepts else {}

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutBatch:
        rows = [prompt for prompt in prompts for _ in range(params.n)]
        prompt_ids, prompt_mask = left_pad(rows, self.pad_id, params.prompt_width)
        prompt_ids, prompt_mask = prompt_ids.to(self.device), prompt_mask.to(self.device)
        config = hf_generation_config(params, self.eos_ids, self.pad_id)
        with (
            eval_mode(self.model), torch.inference_mode(), _seeded(params.seed, self.device),
            _only(self.model, config), _diverged_policy_named(),
        ):
            sequences = self.model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **self.keep_last)
        # Clone out of inference mode: the trainer feeds these ids to forward passes that need autograd.
        responses = sequences[:, prompt_ids.shape[1] :].clone()
        missing = params.max_new_tokens - responses.shape[1]  # generate stops early once every row hit EOS
        if missing > 0:
            responses = torch.nn.functional.pad(responses, (0, missing), value=self.pad_id)
        return assemble_batch(prompt_ids, prompt_mask, responses, self.eos_ids)

    def sync_weights(self, model) -> None:
        """Nothing to copy: generation runs on the trained model object itself (see the class docstring)."""


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the model's generation-config EOS ids."""
    ids = [tokenizer.eos_token_id]
    configured = model.generation_config.eos_token_id
    ids += configured if isinstance(configured, list) else [configured]
    return list(dict.fromkeys(i for i in ids if i is not None))


def hf_generation_config(params: SamplingParams, eos_ids: list[int], pad_id: int):
    """A GenerationConfig that applies exactly the sampling knobs in params and nothing else."""
    from transformers import GenerationConfig

    common = dict(max_new_tokens=params.max_new_tokens, eos_token_id=eos_ids, pad_token_id=pad_id, use_cache=True)
    if not params.do_sample:
        return GenerationConfig(do_sample=False, **common)
    return GenerationConfig(
        do_sample=True,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=max(params.top_k, 0),  # 0 disables top-k in transformers, as -1 does in verl
        **common,
    )


@contextmanager
def _only(model, config):
    """Generate with config alone: generate() fills unset fields from model.generation_config (a checkpoint's
    repetition_penalty or top_k, say), which would sample from a distribution the log-probs do not describe."""
    saved = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = saved


@contextmanager
def _diverged_policy_named():
    """torch.multinomial's error on inf/nan probabilities, as what it means here (weights an update blew up)."""
    try:
        yield
    except RuntimeError as exc:
        if "probability tensor contains" not in str(exc):
            raise
        raise TrainingError("the actor diverged (its next-token probabilities are not finite): lower actor.lr "
                            "or check the rewards") from exc


@contextmanager
def _seeded(seed: int | None, device: torch.device):
    """Seed sampling reproducibly without disturbing the caller's RNG streams."""
    if seed is None:
        yield
        return
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
