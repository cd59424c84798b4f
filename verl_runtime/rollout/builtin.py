"""The built-in decoder: our own decode loop over the model's forward, faster than transformers' generate.

Prefill once, then one forward per token with a KV cache; sampling (temperature, top-k, top-p) runs batched on the
device with a seeded generator; rows stop at EOS and the loop ends when every row has. Each sampled token's
log-prob (log_softmax(logits / T), what ``models.response_log_probs`` recomputes) comes back with the batch.

On the CPU, Llama-family models (Qwen2, Llama, Mistral) decode through ``lean_decoder.LeanDecoder``: the same
block maths on the model's own weights without transformers' per-step overhead (masks, cache objects, modules),
about twice as fast with tiny models, each prompt prefilled once for its n samples; ``lean_model.lean_path_applies``
says when (everything else takes the model's forward). With compile=True its decode step is compiled once per run
(torch.compile, which needs a C++ compiler on the CPU; the slabs are padded up to a length bucket so later calls
reuse the graph): a few percent faster per step with tiny models, for some seconds of compiling at the first call.
On CUDA the decode step runs as a CUDA graph: the model's forward is compiled once per run
(``torch.compile(mode="reduce-overhead")``) over a static KV cache, with batch and cache length padded up to
buckets so later calls reuse the captured graphs. On the CPU a dynamic cache without compilation is faster (the
static cache attends over its whole preallocated length at every step).
"""

from __future__ import annotations

import copy
import shutil
from contextlib import nullcontext

import torch

from verl_runtime.errors import ConfigError
from verl_runtime.lean_model import lean_path_applies
from verl_runtime.models import position_ids_from_mask
from verl_runtime.rollout.base import (
    RolloutBatch, SamplingParams, assemble_batch, eval_mode, left_pad, mask_after_first_eos,
)
from verl_runtime.rollout.hf import eos_token_ids
from verl_runtime.rollout.lean_decoder import LeanDecoder

# Compiled shapes are padded up to these multiples, so a run captures a handful of graphs, not one per call.
BATCH_BUCKET = 8
LENGTH_BUCKET = 128
LEAN_LENGTH_BUCKET = 64  # the lean step attends over its whole slab, so a finer bucket wastes less


class BuiltinRolloutEngine:
    """Generates with the actor's own model object (colocated, like the HF engine).

    compile: None picks CUDA graphs on CUDA and eager decoding elsewhere; True/False force it (on the CPU, True
    compiles the lean decode step, and needs a C++ compiler). Compiling the model's forward implies the static
    cache; static_cache=True alone runs that cache eagerly (how the CPU tests check that path).
    lean=False decodes through the model's forward even where the lean path applies (how the tests compare both).

    Under autocast (fp32 master weights, bf16 compute: the actor on a GPU) the static cache cannot take the model
    as is: rotary embeddings leave keys in fp32 while values come out in bf16, and the cache holds one dtype. So
    the static path decodes with a copy of the weights in the autocast dtype, which sync_weights refreshes in place
    (fixed addresses, as the CUDA graphs need). The dynamic-cache path uses the actor's model directly.
    """

    def __init__(
        self, model, tokenizer, device, compile: bool | None = None, static_cache: bool = False, lean: bool = True
    ):
        self.model = model
        self.device = torch.device(device)
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.compile = self.device.type == "cuda" if compile is None else compile
        if self.compile and self.device.type == "cpu" and not cpp_compiler():
            raise ConfigError("compiling the decode step on the CPU needs a C++ compiler (g++ or clang++) on the "
                              "PATH: install one, or set rollout.compile=false")
        self.static_cache = self.compile or static_cache
        self.lean = lean and not static_cache  # the static cache belongs to the model-forward path
        self._step = None  # the compiled forward, built on first use and kept for the run
        self._advance = None  # the compiled lean decode step and sampling, likewise
        self._cache = None  # the static KV cache of the last shape, reused so captured graphs stay valid
        self._cache_key = None  # (batch, length, dtype) of self._cache
        self._copy = None  # the weights in the autocast dtype, for the static path under autocast

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutBatch:
        rows = [prompt for prompt in prompts for _ in range(params.n)]
        prompt_ids, prompt_mask = left_pad(rows, self.pad_id)
        prompt_ids, prompt_mask = prompt_ids.to(self.device), prompt_mask.to(self.device)
        model = self._decoding_model()
        # The copy already holds the compute dtype: autocast would only add casts (and break the cache).
        no_autocast = nullcontext() if model is self.model else torch.autocast(self.device.type, enabled=False)
        with eval_mode(model), torch.inference_mode(), no_autocast:
            responses, log_probs = self._decode(model, prompt_ids, prompt_mask, params)
        # Clone out of inference mode: the trainer feeds these ids to forward passes that need autograd.
        batch = assemble_batch(prompt_ids, prompt_mask, responses.clone(), self.eos_ids)
        batch.rollout_log_probs = log_probs.clone() * batch.response_mask
        return batch

    def sync_weights(self, model) -> None:
        """Refresh the autocast-dtype copy, if there is one, in place; otherwise generation already runs on the
        trained model object (optimizer steps update its parameters in place, which captured CUDA graphs read)."""
        if self._copy is None:
            return
        with torch.no_grad():
            for target, source in zip(self._copy.parameters(), model.parameters()):
                target.copy_(source)

    def _decoding_model(self):
        if not (self.static_cache and _autocast_on(self.device)):
            return self.model
        dtype = torch.get_autocast_dtype(self.device.type)
        if self._copy is None or next(self._copy.parameters()).dtype != dtype:
            self._copy = copy.deepcopy(self.model).to(dtype).requires_grad_(False)
            for parameter in self._copy.parameters():
                parameter.grad = None  # the actor's last gradients came along with deepcopy
            self._step = None  # graphs are captured over the copy's parameters
        return self._copy

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
            decoder = _ForwardDecoder(self, model, prompt_ids, prompt_mask, params.max_new_tokens)
        logits = decoder.prefill()
        width = logits.shape[0]  # the compiled path pads the batch up to a bucket
        # Every step's random draws at once, from a private seeded generator (or the global RNG without a seed).
        draws = torch.rand(
            params.max_new_tokens, width, 1, dtype=torch.float64, device=self.device,
            generator=_generator(params.seed, self.device),
        )
        eos = torch.tensor(self.eos_ids, device=self.device)
        finished = torch.zeros(width, dtype=torch.bool, device=self.device)
        step_tokens, step_log_probs = sample(logits.float(), params, draws[0])
        tokens, log_probs = [], []
        for t in range(1, params.max_new_tokens + 1):
            tokens.append(step_tokens)
            log_probs.append(step_log_probs)
            finished |= torch.isin(step_tokens, eos)
            if t == params.max_new_tokens or bool(finished[:rows].all()):
                break
            # Finished rows keep sampling (rows never see each other); what follows their EOS is padded below.
            step_tokens, step_log_probs = advance(decoder, step_tokens, params, draws[t])
        responses = torch.full((rows, params.max_new_tokens), self.pad_id, dtype=torch.long, device=self.device)
        responses[:, : len(tokens)] = torch.stack(tokens, dim=1)[:rows]
        responses.masked_fill_(mask_after_first_eos(responses, self.eos_ids) == 0, self.pad_id)
        sampled_log_probs = torch.zeros(rows, params.max_new_tokens, device=self.device)
        sampled_log_probs[:, : len(tokens)] = torch.stack(log_probs, dim=1)[:rows]
        return responses, sampled_log_probs

    def _kv_cache(self, batch: int, length: int, dtype: torch.dtype):
        from transformers import DynamicCache, StaticCache

        if not self.static_cache:
            return DynamicCache(config=self.model.config)
        key = (batch, length, dtype)  # the cache's tensors take the dtype of the first keys they store
        if self._cache is not None and self._cache_key == key:
            self._cache.reset()
            return self._cache
        self._cache, self._cache_key = StaticCache(config=self.model.config, max_cache_len=length), key
        return self._cache

    def _compiled_advance(self):
        if self._advance is None:
            # One graph for the lean step and its sampling: every shape stays the same from step to step.
            # cpp_wrapper: the graph's kernels are called from generated C++, not Python, which with a step of
            # small kernels saves about a sixth of it (and costs some seconds more at the first compile).
            self._advance = torch.compile(_advance, fullgraph=True, dynamic=False, options={"cpp_wrapper": True})
        return self._advance

    def _compiled_step(self, model):
        if self._step is None:
            # fullgraph: a graph break would split the CUDA graph and bring the per-step launch overhead back.
            # dynamic=False: one static graph per bucket shape, never a shape-generic one.
            self._step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True, dynamic=False)
        return self._step


class _ForwardDecoder:
    """Decoding through the model's own forward with a transformers cache: every architecture, and the compiled
    CUDA-graph path (static cache, batch and length padded up to buckets)."""

    def __init__(self, engine: BuiltinRolloutEngine, model, prompt_ids, prompt_mask, max_new_tokens: int):
        device, static = engine.device, engine.static_cache
        rows, prompt_length = prompt_ids.shape
        width = rows
        if static:
            # Pad the batch with copies of row 0 (a real prompt: an all-padding row would give NaN logits).
            width = _round_up(rows, BATCH_BUCKET) if engine.compile else rows
            extra = width - rows
            prompt_ids = torch.cat([prompt_ids, prompt_ids[:1].expand(extra, -1)])
            prompt_mask = torch.cat([prompt_mask, prompt_mask[:1].expand(extra, -1)])
        total = prompt_length + max_new_tokens
        length = _round_up(total, LENGTH_BUCKET) if engine.compile else total
        self.cache = engine._kv_cache(width, length, next(model.parameters()).dtype)
        cache_length = self.cache.get_max_length() if static else total
        # One mask for the whole run: generated tokens attend (1) and finished rows keep feeding pad tokens, as
        # transformers' generate does; causality hides the not-yet-written slots.
        self.mask = torch.ones(width, cache_length, dtype=torch.long, device=device)
        self.mask[:, :prompt_length] = prompt_mask
        self.positions = position_ids_from_mask(prompt_mask)
        self.prompt_ids, self.static, self.compile, self.device = prompt_ids, static, engine.compile, device
        self.model = model
        self.forward = engine._compiled_step(model) if engine.compile else model
        self.cursor = prompt_length

    def prefill(self) -> torch.Tensor:
        prompt_length = self.prompt_ids.shape[1]
        return self.model(
            input_ids=self.prompt_ids,
            attention_mask=self.mask if self.static else self.mask[:, :prompt_length],
            position_ids=self.positions,
            cache_position=torch.arange(prompt_length, device=self.device),
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        cursor = self.cursor
        self.cursor += 1
        position = self.positions[:, -1:] + (cursor - self.prompt_ids.shape[1] + 1)
        if self.compile:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's logits are consumed
        return self.forward(
            input_ids=tokens[:, None],
            attention_mask=self.mask if self.static else self.mask[:, : cursor + 1],
            position_ids=position,
            cache_position=torch.tensor([cursor], device=self.device),
            past_key_values=self.cache,
            use_cache=True,
        ).logits[:, -1]


def _advance(decoder, tokens: torch.Tensor, params: SamplingParams, draws: torch.Tensor):
    """Feed tokens [B] and sample the next ones: (tokens, log-probs), as sample() returns them."""
    return sample(decoder.step(tokens).float(), params, draws)


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
        cumulative = kept.cumsum(dim=-1, dtype=torch.float64)
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


def _autocast_on(device: torch.device) -> bool:
    return torch.is_autocast_enabled(device.type)


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
