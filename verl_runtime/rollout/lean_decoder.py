"""A lean decode path for Llama-family models (Qwen2, Llama, Mistral) on the CPU, on ``lean_model.Blocks``.

Keys and values go into a preallocated [B * kv_heads, total, head_dim] tensor at the cursor; each step attends over
the filled prefix with an additive mask made once per call. Rows come in groups of ``repeats`` samples of one
prompt: the prefill runs each distinct prompt once and copies its keys and values to every row of its group.
``lean_model.lean_path_applies`` says when it is used; everything else decodes through the model's forward.

A decode step with a small model is bound by the number of operations, not by arithmetic (each costs a few
microseconds), so the step is written with as few as the maths allows: hidden states stay [B, D]; each RMSNorm's
weight is folded into the projection after it, so the step applies only 1/rms; residual additions ride on the
matmuls (addmm); rotary is one complex product (lean_model.rotate).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from verl_runtime.lean_model import Blocks, attention_bias, prompt_attention_mask, rotate
from verl_runtime.models import position_ids_from_mask


class LeanDecoder:
    """One generate call's decoding: prefill() the left-padded prompts, then step(tokens) once per new token.

    prompt_ids [B, P] hold each prompt ``repeats`` times in a row. Both methods return logits [B, V] of the last
    position. Weights are read afresh at every call, so weights the optimizer updated in place are used next time.
    """

    def __init__(
        self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int, repeats: int,
        static_length: int | None = None,
    ):
        """static_length: slabs of that many slots, each step attending over all of them (the mask hides the
        slots not written yet), so that every step has the same shapes, as a compiled step needs. Without it each
        step attends over the slots written so far, which is faster eagerly."""
        self.blocks = blocks = Blocks(model)
        self.prompt_ids, self.prompt_mask, self.repeats = prompt_ids, prompt_mask, repeats
        rows, prompt_length = prompt_ids.shape
        self.static = static_length is not None
        total = static_length or prompt_length + max_new_tokens
        # One [rows * kv_heads, total, d] slab per layer (and no other view of it: a compiled step that writes
        # through one view and reads through another copies the whole slab at every step).
        shape = (rows * blocks.kv_heads, total, blocks.head_dim)
        self.keys = [model.model.embed_tokens.weight.new_zeros(shape) for _ in model.model.layers]
        self.values = [model.model.embed_tokens.weight.new_zeros(shape) for _ in model.model.layers]

        # Positions as the trainer computes them: counting real prompt tokens, then one per generated token.
        positions = position_ids_from_mask(prompt_mask)
        steps = torch.arange(1, total - prompt_length + 1, device=prompt_ids.device)
        self.rotation = blocks.rotary(torch.cat([positions, positions[:, -1:] + steps], dim=1))  # [B, 1, total, d/2, 2]

        # Keys a query may see: the real prompt tokens, then each generated slot from the step that fills it on
        # (finished rows keep feeding tokens and attending; what follows their EOS is masked out afterwards).
        generated = prompt_mask.new_zeros(rows, total - prompt_length, dtype=torch.bool)
        visible = torch.cat([prompt_mask.bool(), generated], dim=1)
        # [rows * kv_heads, 1, total]: each row's mask repeated for its kv heads, as the key slabs are laid out.
        self.step_bias = attention_bias(visible, blocks.dtype).repeat_interleave(blocks.kv_heads, dim=0)[:, None]
        # The slot the next step writes, as a tensor: a compiled step takes it as an input, not a constant.
        self.cursor = torch.tensor([prompt_length], device=prompt_ids.device)
        self.step_weights = [StepWeights.of(layer, fused) for layer, fused in blocks.layers()]
        self.embedding, self.final_norm = model.model.embed_tokens.weight, model.model.norm
        self.final_eps = _epsilon(self.final_norm)

    def prefill(self) -> torch.Tensor:
        """Each distinct prompt once (every repeats-th row); its keys, values and logits copied to its group."""
        blocks, group = self.blocks, slice(None, None, self.repeats)
        length = self.prompt_ids.shape[1]
        rotation = self.rotation[group, :, :length]
        bias = attention_bias(prompt_attention_mask(self.prompt_mask[group]), blocks.dtype)
        hidden = blocks.embed(self.prompt_ids[group])
        for (layer, fused), keys, values in zip(blocks.layers(), self.keys, self.values):
            queries, new_keys, new_values = blocks.project(layer, fused, hidden, rotation)
            keys[:, :length] = new_keys.repeat_interleave(self.repeats, dim=0).flatten(0, 1)
            values[:, :length] = new_values.repeat_interleave(self.repeats, dim=0).flatten(0, 1)
            hidden = blocks.finish(layer, fused, hidden, blocks.attend(queries, new_keys, new_values, bias))
        return blocks.logits(hidden[:, -1:])[:, -1].repeat_interleave(self.repeats, dim=0)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits after feeding tokens [B] at the cursor. One query per row: the query heads of one kv head attend
        together as one matmul with the mask added, a softmax and one matmul."""
        blocks, cursor = self.blocks, self.cursor
        rows = tokens.shape[0]
        heads, kv_heads, head_dim = blocks.heads, blocks.kv_heads, blocks.head_dim
        rotation = self.rotation[:, 0].index_select(1, cursor)  # [B, 1, d/2, 2]
        seen = slice(None) if self.static else slice(None, int(cursor) + 1)  # eagerly, the slots written by now
        bias = self.step_bias.index_fill_(2, cursor, 0.0)[..., seen]  # this step's slot becomes visible
        hidden = self.embedding.index_select(0, tokens)  # [B, D]
        for w, keys, values in zip(self.step_weights, self.keys, self.values):
            qkv = _linear(_normalized(hidden, w.input_eps), w.qkv, w.qkv_bias).view(rows, -1, head_dim)
            rotated = rotate(qkv[:, : heads + kv_heads], rotation)
            keys.index_copy_(1, cursor, rotated[:, heads:].reshape(-1, 1, head_dim))
            values.index_copy_(1, cursor, qkv[:, heads + kv_heads :].reshape(-1, 1, head_dim))
            queries = rotated[:, :heads].reshape(rows * kv_heads, heads // kv_heads, head_dim)
            scores = torch.baddbmm(bias, queries, keys[:, seen].transpose(1, 2), alpha=blocks.scale)
            attended = torch.bmm(scores.softmax(dim=-1), values[:, seen]).view(rows, -1)
            hidden = _linear(attended, w.o, w.o_bias, residual=hidden)
            gate, up = _linear(_normalized(hidden, w.post_eps), w.gate_up, w.gate_up_bias).chunk(2, dim=-1)
            hidden = _linear(F.silu(gate).mul_(up), w.down, w.down_bias, residual=hidden)
        cursor += 1
        normed = (_normalized(hidden, self.final_eps) * self.final_norm.weight)[:, None]
        return blocks.model.lm_head(normed)[:, -1]  # the module with the forward's shapes: its hooks fire as there


class StepWeights(NamedTuple):
    """One layer's tensors for the decode step, transposed for matmuls; each RMSNorm's weight is folded into the
    projection that follows it (norm(x) W^T = (x * rstd)(W * weight)^T), so the step applies only the 1/rms. (In
    bf16 the folded weight is rounded once more, within the dtype's own noise.)"""

    input_eps: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_eps: torch.Tensor
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None

    @classmethod
    def of(cls, layer, fused) -> StepWeights:
        o_proj, down_proj = layer.self_attn.o_proj, layer.mlp.down_proj
        input_norm, post_norm = layer.input_layernorm, layer.post_attention_layernorm
        return cls(
            _epsilon(input_norm), (fused.qkv_weight * input_norm.weight).t(), fused.qkv_bias,
            o_proj.weight.t(), o_proj.bias,
            _epsilon(post_norm), (fused.gate_up_weight * post_norm.weight).t(), fused.gate_up_bias,
            down_proj.weight.t(), down_proj.bias,
        )


def _normalized(x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """x / rms(x) over the last axis, in fp32 as transformers computes it (RMSNorm without its weight); eps is a
    0-dim tensor so that mean + eps is one operation."""
    x32 = x.float()
    norm = torch.linalg.vector_norm(x32, dim=-1, keepdim=True)
    return (x32 * torch.addcmul(eps, norm, norm, value=1 / x.shape[-1]).rsqrt_()).to(x.dtype)


def _epsilon(norm) -> torch.Tensor:
    return torch.tensor(norm.variance_epsilon, device=norm.weight.device)


def _linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None = None):
    """x W^T (+ bias) (+ residual) for a transposed weight, with the residual added inside the matmul."""
    if residual is None:
        return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)
    out = torch.addmm(residual, x, weight_t)
    return out if bias is None else out.add_(bias)
