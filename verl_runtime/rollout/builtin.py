"""The built-in decoder: our own decode loop, faster than transformers' generate.

Prefill once, then one step per token with a KV cache; sampling (temperature, top-k, top-p) runs batched on the
device from random draws of a seeded generator (rollout.sampling); each sampled token's log-prob (log_softmax(logits /
T), what ``models.response_log_probs`` recomputes) comes back with the batch. Three paths:

- On a GPU, Llama-family models (Qwen2, Llama, Mistral) decode through ``graph_decoder``: the engine's own copy of
  the weights in the compute dtype, a static KV cache per batch-size bucket and the whole decode step, sampling
  included, captured once as a CUDA graph (rollout.compile=false replays the same step eagerly). The copy is the
  rollout's own weights, as vLLM's are: sync_weights refreshes it in place after each update, and offload moves it to
  host memory and drops the KV cache and graphs between rollouts (offload_parts, release_caches).
- On the CPU the same models decode through ``lean_decoder.LeanDecoder`` on the model's own weights, without
  transformers' per-step overhead (masks, cache objects, modules); rollout.compile=true compiles its step
  (torch.compile, which needs a C++ compiler on the CPU). static_cache=True runs the GPU's graph path here, the graph
  an eager call of its step (how the CPU tests check that path).
- Every other model (and LoRA, sliding windows shorter than the sequence) decodes through the model's forward with
  transformers' dynamic cache.
"""

from __future__ import annotations

import shutil

import torch

from verl_runtime.errors import ConfigError
from verl_runtime.lean_model import lean_maths_apply, lean_path_applies
from verl_runtime.models import position_ids_from_mask
from verl_runtime.rollout.base import RolloutBatch, SamplingParams, assemble_batch, eval_mode, left_pad, mask_after_first_eos
from verl_runtime.rollout.graph_decoder import KEEP, Bucket, DecodeWeights, GraphDecoder, Graphs
from verl_runtime.rollout.hf import eos_token_ids
from verl_runtime.rollout.lean_decoder import LeanDecoder
from verl_runtime.rollout.sampling import sample

LEAN_LENGTH_BUCKET = 64  # the compiled lean step attends over its whole slab, so a finer bucket wastes less


class BuiltinRolloutEngine:
    """Generates from the actor's model (the CPU paths) or from its own copy of the weights (the graph path).

    compile: on the CPU, True compiles the lean decode step (needs a C++ compiler); on CUDA, False replays the graph
    path's step eagerly instead of capturing it. static_cache=True takes the graph path on the CPU. dtype: the
    compute dtype of the graph path's copy (the actor passes model.dtype resolved: bf16 on a GPU by default);
    None takes the model's own. lean=False decodes through the model's forward even where the lean path applies (how
    the tests compare both). graphs: what captures the step (graph_decoder.Graphs; the tests pass a stand-in).
    """

    def __init__(self, model, tokenizer, device, compile: bool | None = None, static_cache: bool = False,
                 lean: bool = True, dtype: torch.dtype | None = None, graphs: Graphs | None = None):
        self.model = model
        self.device = torch.device(device)
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = eos_token_ids(model, tokenizer)
        on_gpu = self.device.type == "cuda"
        self.compile = bool(compile) and not on_gpu  # the CPU's compiled lean step
        if self.compile and not cpp_compiler():
            raise ConfigError("compiling the decode step on the CPU needs a C++ compiler (g++ or clang++) on the "
                              "PATH: install one, or set rollout.compile=false")
        self.lean = lean
        self.weights = None  # the graph path's own copy of the weights
        if (on_gpu or static_cache) and lean and lean_maths_apply(model, 1):
            dtype = dtype or next(model.parameters()).dtype
            self.weights = DecodeWeights(model, dtype, self.device)
        capture = on_gpu and compile is not False
        self.graphs = graphs or Graphs(self.device, cuda=None if not capture else torch.cuda)
        self._decoders: dict[Bucket, GraphDecoder] = {}  # per bucket: its KV cache and captured step, reused
        self._advance = None  # the compiled lean decode step and sampling (CPU, compile=True)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutBatch:
        rows = [prompt for prompt in prompts for _ in range(params.n)]
        prompt_ids, prompt_mask = left_pad(rows, self.pad_id, params.prompt_width)
        prompt_ids, prompt_mask = prompt_ids.to(self.device), prompt_mask.to(self.device)
        total = prompt_ids.shape[1] + params.max_new_tokens
        with torch.inference_mode():
            if self.weights is not None and lean_maths_apply(self.model, total):
                # the copy holds the compute dtype and the step casts as autocast would: no autocast around it
                with torch.autocast(self.device.type, enabled=False):
                    tokens, log_probs = self._graph_decode(prompt_ids, prompt_mask, params)
            else:
                with eval_mode(self.model):
                    tokens, log_probs = self._decode(self.model, prompt_ids, prompt_mask, params)
            responses, log_probs = _responses(tokens, log_probs, params.max_new_tokens, self.pad_id, self.eos_ids)
        # Clone out of inference mode: the trainer feeds these ids to forward passes that need autograd.
        batch = assemble_batch(prompt_ids, prompt_mask, responses.clone(), self.eos_ids)
        batch.rollout_log_probs = log_probs.clone() * batch.response_mask
        return batch

    @property
    def owns_weights(self) -> bool:
        """Whether the engine samples from a copy of its own (the graph path), not from the model it was given."""
        return self.weights is not None

    def sync_weights(self, model) -> None:
        """Refresh the graph path's copy in place (captured graphs read it at fixed addresses) from the updated model
        or its whole state dict (gathered from FSDP's shards); the other paths decode the trained model object itself,
        which optimizer steps update in place."""
        if self.weights is not None:
            self.weights.refresh(model)

    def offload_parts(self) -> dict:
        """What of the engine's own lives on the device between rollouts and moves with the weights under offload."""
        return {} if self.weights is None else {"rollout weights": self.weights}

    def release_caches(self) -> None:
        """Drop the KV caches and captured graphs (offload, between rollouts); the next call makes them again."""
        self._decoders.clear()

    # --- the graph path --------------------------------------------------------------------------------------------

    def _graph_decode(self, prompt_ids, prompt_mask, params: SamplingParams):
        rows = prompt_ids.shape[0]
        bucket = Bucket.of(rows, prompt_ids.shape[1] + params.max_new_tokens, params, self.eos_ids)
        decoder = self._decoders.get(bucket)
        if decoder is None:
            while len(self._decoders) >= KEEP:
                self._decoders.pop(next(iter(self._decoders)))
            decoder = self._decoders[bucket] = GraphDecoder(self.weights, bucket, params, self.device, self.graphs)
        decoder.reset(prompt_ids, prompt_mask, params.n, params.max_new_tokens, _generator(params.seed, self.device))
        return decoder.run(rows, params.max_new_tokens)

    # --- the CPU's lean path and the model-forward path -----------------------------------------------------------

    def _decode(self, model, prompt_ids, prompt_mask, params: SamplingParams):
        rows = prompt_ids.shape[0]
        total = prompt_ids.shape[1] + params.max_new_tokens
        advance = _advance
        if self.lean and lean_path_applies(model, self.device, total):
            length = _round_up(total, LEAN_LENGTH_BUCKET) if self.compile else None
            decoder = LeanDecoder(model, prompt_ids, prompt_mask, params.max_new_tokens, params.n, length)
            if self.compile:
                advance = self._compiled_advance()
        else:
            decoder = _ForwardDecoder(model, prompt_ids, prompt_mask, params.max_new_tokens)
        logits = decoder.prefill()
        # Every step's random draws at once, from a private seeded generator (or the global RNG without a seed).
        draws = torch.rand(params.max_new_tokens, rows, 1, dtype=torch.float64, device=self.device,
                           generator=_generator(params.seed, self.device))
        eos = torch.tensor(self.eos_ids, device=self.device)
        finished = torch.zeros(rows, dtype=torch.bool, device=self.device)
        step_tokens, step_log_probs = sample(logits.float(), params, draws[0])
        tokens, log_probs = [], []
        for t in range(1, params.max_new_tokens + 1):
            tokens.append(step_tokens)
            log_probs.append(step_log_probs)
            finished |= torch.isin(step_tokens, eos)
            if t == params.max_new_tokens or bool(finished.all()):
                break
            # Finished rows keep sampling (rows never see each other); what follows their EOS is padded afterwards.
            step_tokens, step_log_probs = advance(decoder, step_tokens, params, draws[t])
        return torch.stack(tokens, dim=1), torch.stack(log_probs, dim=1)

    def _compiled_advance(self):
        if self._advance is None:
            # One graph for the lean step and its sampling: every shape stays the same from step to step.
            # cpp_wrapper: the graph's kernels are called from generated C++, not Python, which with a step of
            # small kernels saves about a sixth of it (and costs some seconds more at the first compile).
            self._advance = torch.compile(_advance, fullgraph=True, dynamic=False, options={"cpp_wrapper": True})
        return self._advance


def _responses(tokens, log_probs, max_new_tokens: int, pad_id: int, eos_ids: list[int]):
    """[rows, max_new_tokens] responses (padded after each row's first EOS and after the last step) and log-probs."""
    rows, steps = tokens.shape
    responses = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=tokens.device)
    responses[:, :steps] = tokens
    responses.masked_fill_(mask_after_first_eos(responses, eos_ids) == 0, pad_id)
    sampled = torch.zeros(rows, max_new_tokens, device=tokens.device)
    sampled[:, :steps] = log_probs
    return responses, sampled


class _ForwardDecoder:
    """Decoding through the model's own forward with transformers' dynamic cache: every architecture."""

    def __init__(self, model, prompt_ids, prompt_mask, max_new_tokens: int):
        from transformers import DynamicCache

        self.model, self.prompt_ids, self.device = model, prompt_ids, prompt_ids.device
        self.cache = DynamicCache(config=model.config)
        # One mask for the whole run: generated tokens attend (1) and finished rows keep feeding tokens, as
        # transformers' generate does.
        total = prompt_ids.shape[1] + max_new_tokens
        self.mask = torch.ones(prompt_ids.shape[0], total, dtype=torch.long, device=self.device)
        self.mask[:, : prompt_ids.shape[1]] = prompt_mask
        self.positions = position_ids_from_mask(prompt_mask)
        self.cursor = prompt_ids.shape[1]

    def prefill(self) -> torch.Tensor:
        prompt_length = self.prompt_ids.shape[1]
        return self.model(
            input_ids=self.prompt_ids, attention_mask=self.mask[:, :prompt_length], position_ids=self.positions,
            cache_position=torch.arange(prompt_length, device=self.device), past_key_values=self.cache,
            use_cache=True, logits_to_keep=1,
        ).logits[:, -1]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        cursor = self.cursor
        self.cursor += 1
        position = self.positions[:, -1:] + (cursor - self.prompt_ids.shape[1] + 1)
        return self.model(
            input_ids=tokens[:, None], attention_mask=self.mask[:, : cursor + 1], position_ids=position,
            cache_position=torch.tensor([cursor], device=self.device), past_key_values=self.cache, use_cache=True,
        ).logits[:, -1]


def _advance(decoder, tokens: torch.Tensor, params: SamplingParams, draws: torch.Tensor):
    """Feed tokens [B] and sample the next ones: (tokens, log-probs), as sample() returns them."""
    return sample(decoder.step(tokens).float(), params, draws)


def _generator(seed: int | None, device: torch.device):
    """A private seeded generator (the global RNG stays untouched), or None: the global RNG."""
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(seed)


def cpp_compiler() -> str | None:
    """torch.compile's CPU backend builds its kernels with the system's C++ compiler."""
    return next(filter(None, map(shutil.which, ("g++", "clang++", "c++"))), None)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
