"""A lean decode path for Llama-family models (Qwen2, Llama, Mistral) on the CPU, on ``lean_model.Blocks``.

Keys and values go into a preallocated [B * kv_heads, total, head_dim] tensor at the cursor; each step attends over
the filled prefix with an additive mask made once per call. Rows come in groups of ``repeats`` samples of one
prompt: the prefill runs each distinct prompt once and copies its keys and values to every row of its group.
``lean_model.lean_path_applies`` says when it is used; everything else decodes through the model's forward.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from verl_runtime.lean_model import Blocks, attention_bias, prompt_attention_mask, rms_norm, rotate
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
        # One [rows * kv_heads, total, d] slab per layer: a decode step's attention is then two batched matmuls.
        shape = (rows * blocks.kv_heads, total, blocks.head_dim)
        self.keys = [model.model.embed_tokens.weight.new_zeros(shape) for _ in model.model.layers]
        self.values = [model.model.embed_tokens.weight.new_zeros(shape) for _ in model.model.layers]

        # Positions as the trainer computes them: counting real prompt tokens, then one per generated token.
        positions = position_ids_from_mask(prompt_mask)
        steps = torch.arange(1, total - prompt_length + 1, device=prompt_ids.device)
        self.cos, self.sin = blocks.rotary(torch.cat([positions, positions[:, -1:] + steps], dim=1))

        # Keys a query may see: the real prompt tokens, then each generated slot from the step that fills it on
        # (finished rows keep feeding tokens and attending; what follows their EOS is masked out afterwards).
        generated = prompt_mask.new_zeros(rows, total - prompt_length, dtype=torch.bool)
        visible = torch.cat([prompt_mask.bool(), generated], dim=1)
        # [rows * kv_heads, 1, total]: each row's mask repeated for its kv heads, as the key slabs are laid out.
        self.step_bias = attention_bias(visible, blocks.dtype).repeat_interleave(blocks.kv_heads, dim=0)[:, None]
        # The slot the next step writes, as a tensor: a compiled step takes it as an input, not a constant.
        self.cursor = torch.tensor([prompt_length], device=prompt_ids.device)
        self.step_weights = [StepWeights.of(layer, fused) for layer, fused in blocks.layers()]

    def prefill(self) -> torch.Tensor:
        """Each distinct prompt once (every repeats-th row); its keys, values and logits copied to its group."""
        blocks, group = self.blocks, slice(None, None, self.repeats)
        length = self.prompt_ids.shape[1]
        rotary = (self.cos[group, :, :length], self.sin[group, :, :length])
        bias = attention_bias(prompt_attention_mask(self.prompt_mask[group]), blocks.dtype)
        hidden = blocks.embed(self.prompt_ids[group])
        for (layer, fused), keys, values in zip(blocks.layers(), self.keys, self.values):
            queries, new_keys, new_values = blocks.project(layer, fused, hidden, rotary)
            for slab, new in ((keys, new_keys), (values, new_values)):
                slab[:, :length] = new.repeat_interleave(self.repeats, dim=0).flatten(0, 1)
            hidden = blocks.finish(layer, fused, hidden, blocks.attend(queries, new_keys, new_values, bias))
        return blocks.logits(hidden[:, -1:])[:, -1].repeat_interleave(self.repeats, dim=0)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits after feeding tokens [B] at the cursor. One query per row, so the layer is written for that shape:
        heads stay in one axis ([B, heads, d]) and attention is one matmul with the mask added, softmax and one
        matmul. Python time is a good part of a step with small models: the weights come from plain tuples, not
        module lookups."""
        blocks, cursor = self.blocks, self.cursor
        rows = tokens.shape[0]
        heads, kv_heads, head_dim = blocks.heads, blocks.kv_heads, blocks.head_dim
        cos, sin = self.cos[:, 0].index_select(1, cursor), self.sin[:, 0].index_select(1, cursor)  # [B, 1, d]
        seen = slice(None) if self.static else slice(None, int(cursor) + 1)  # eagerly, the slots written by now
        bias = self.step_bias.index_fill_(2, cursor, 0.0)[..., seen]  # this step's slot becomes visible
        hidden = blocks.embed(tokens[:, None])
        for w, keys, values in zip(self.step_weights, self.keys, self.values):
            qkv = F.linear(rms_norm(hidden, w.input_norm), w.qkv_weight, w.qkv_bias).view(rows, -1, head_dim)
            rotated = rotate(qkv[:, : heads + kv_heads], cos, sin)
            keys.index_copy_(1, cursor, rotated[:, heads:].reshape(-1, 1, head_dim))
            values.index_copy_(1, cursor, qkv[:, heads + kv_heads :].reshape(-1, 1, head_dim))
            # The query heads of one kv head attend together: [B * kv_heads, heads / kv_heads, d].
            queries = rotated[:, :heads].reshape(rows * kv_heads, heads // kv_heads, head_dim)
            scores = torch.baddbmm(bias, queries, keys[:, seen].transpose(1, 2), alpha=blocks.scale)
            attended = torch.bmm(scores.softmax(dim=-1), values[:, seen]).view(rows, 1, heads * head_dim)
            hidden = hidden + F.linear(attended, w.o_weight, w.o_bias)
            gate, up = F.linear(rms_norm(hidden, w.post_norm), w.gate_up_weight, w.gate_up_bias).chunk(2, -1)
            hidden = hidden + F.linear(F.silu(gate) * up, w.down_weight, w.down_bias)
        cursor += 1
        return blocks.logits(hidden)[:, -1]


class Norm(NamedTuple):
    weight: torch.Tensor
    variance_epsilon: float


class StepWeights(NamedTuple):
    """One layer's tensors for the decode step (the modules' own parameters, and the stacked projections)."""

    input_norm: Norm
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_weight: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: Norm
    gate_up_weight: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down_weight: torch.Tensor
    down_bias: torch.Tensor | None

    @classmethod
    def of(cls, layer, fused) -> StepWeights:
        o_proj, down_proj = layer.self_attn.o_proj, layer.mlp.down_proj
        norms = [Norm(n.weight, n.variance_epsilon) for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        return cls(
            norms[0], fused.qkv_weight, fused.qkv_bias, o_proj.weight, o_proj.bias,
            norms[1], fused.gate_up_weight, fused.gate_up_bias, down_proj.weight, down_proj.bias,
        )
