"""A lean decode path for Llama-family models (Qwen2, Llama, Mistral) on the CPU.

With tiny models a decode step is mostly Python overhead inside transformers' forward (mask creation, cache
objects, rotary calls, dozens of small modules), not arithmetic. This path runs the same block structure on the HF
modules' weights, read afresh at every call (weights the optimizer updates in place are used at the next call):
embedding; per layer RMSNorm, one matmul for q/k/v and one for gate/up (their weights stacked once per call),
rotary, keys and values written into a preallocated [B, kv_heads, total, head_dim] tensor at the cursor,
scaled_dot_product_attention over the filled prefix with a boolean mask built once per call, o_proj, residual,
RMSNorm, SiLU-gated MLP, residual; final norm; lm_head.

Rotary cos/sin come from the model's own rotary module (every rope variant whose frequencies do not depend on the
sequence length stays right), computed once per call for every position the call will use.

``lean_decoding_applies`` says when it is used; everything else decodes through the model's forward: other
architectures, a CUDA (or any non-CPU) device, autocast, a sliding window shorter than the sequence, an activation
other than SiLU, and rope types that rescale with the sequence length (dynamic, longrope).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verl_runtime.models import position_ids_from_mask

ARCHITECTURES = ("qwen2", "llama", "mistral")  # one block structure: RMSNorm, rotary GQA attention, gated MLP
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def lean_decoding_applies(model, device: torch.device, total_length: int) -> bool:
    """Whether LeanDecoder decodes this model exactly as its forward does, for sequences of total_length."""
    config = model.config
    if device.type != "cpu" or torch.is_autocast_enabled(device.type):
        return False
    if config.model_type not in ARCHITECTURES or config.hidden_act != "silu":
        return False
    if getattr(model.model.rotary_emb, "rope_type", "default") in LENGTH_DEPENDENT_ROPE:
        return False
    window = getattr(config, "sliding_window", None)  # None unless a sliding window is in use
    return window is None or total_length <= window


class LeanDecoder:
    """One generate call's decoding: prefill() the left-padded prompts, then step(tokens) once per new token.

    Both return fp-dtype logits [B, V] of the last position. Pad slots of the prompt attend only to themselves (a
    fully masked row would make NaN keys for later layers); real tokens never attend to pad slots.
    """

    def __init__(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int):
        self.model = model
        self.core = model.model
        self.prompt_ids = prompt_ids
        rows, prompt_length = prompt_ids.shape
        total = prompt_length + max_new_tokens
        config, weight = model.config, self.core.embed_tokens.weight
        attention = self.core.layers[0].self_attn
        self.head_dim, self.scale = attention.head_dim, attention.scaling
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.fused = [_FusedWeights.of(layer) for layer in self.core.layers]
        shape = (rows, config.num_key_value_heads, total, self.head_dim)
        self.keys = [weight.new_empty(shape) for _ in self.core.layers]
        self.values = [weight.new_empty(shape) for _ in self.core.layers]

        # Positions as the trainer computes them: counting real prompt tokens, then one per generated token.
        positions = position_ids_from_mask(prompt_mask)
        steps = torch.arange(1, max_new_tokens + 1, device=prompt_ids.device)
        positions = torch.cat([positions, positions[:, -1:] + steps], dim=1)
        cos, sin = self.core.rotary_emb(weight, positions)
        # rotate_half(x) = cat(-x2, x1) = x.roll(half) with its first half negated: the sign moves into sin.
        half = self.head_dim // 2
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        self.cos, self.sin = cos[:, None], sin[:, None]  # [B, 1, total, head_dim]: broadcast over heads

        # Keys a query may see: the real prompt tokens and every generated one (finished rows keep feeding pads
        # and attending, as transformers' generate does; their tokens are masked out afterwards).
        self.visible = torch.cat([prompt_mask.bool(), prompt_mask.new_ones(rows, max_new_tokens, dtype=torch.bool)], 1)
        self.visible = self.visible[:, None, None, :]  # [B, 1, 1, total]
        # The decode steps' mask as SDPA uses it inside (0 or -inf added to the scores), converted once, not per step.
        self.step_mask = torch.zeros(self.visible.shape, dtype=weight.dtype, device=weight.device)
        self.step_mask.masked_fill_(~self.visible, -float("inf"))
        self.cursor = 0

    def prefill(self) -> torch.Tensor:
        length = self.prompt_ids.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=self.prompt_ids.device).tril()
        mask = (causal & self.visible[..., :length]) | torch.eye(length, dtype=torch.bool, device=causal.device)
        return self._forward(self.prompt_ids, mask)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._forward(tokens[:, None], self.step_mask[..., : self.cursor + 1])

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        start, end = self.cursor, self.cursor + ids.shape[1]
        cos, sin = self.cos[:, :, start:end], self.sin[:, :, start:end]
        rows, length = ids.shape
        heads, kv_heads = self.heads, self.kv_heads
        hidden = F.embedding(ids, self.core.embed_tokens.weight)
        for layer, fused, keys, values in zip(self.core.layers, self.fused, self.keys, self.values):
            x = _rms_norm(hidden, layer.input_layernorm)
            qkv = F.linear(x, fused.qkv_weight, fused.qkv_bias).view(rows, length, -1, self.head_dim).transpose(1, 2)
            qk = _rotate(qkv[:, : heads + kv_heads], cos, sin)  # queries and keys in one go
            keys[:, :, start:end] = qk[:, heads:]
            values[:, :, start:end] = qkv[:, heads + kv_heads :]
            out = F.scaled_dot_product_attention(
                qk[:, :heads], keys[:, :, :end], values[:, :, :end], attn_mask=mask, scale=self.scale, enable_gqa=True
            )
            hidden = hidden + _linear(out.transpose(1, 2).reshape(rows, length, -1), layer.self_attn.o_proj)
            gate, up = F.linear(
                _rms_norm(hidden, layer.post_attention_layernorm), fused.gate_up_weight, fused.gate_up_bias
            ).chunk(2, -1)
            hidden = hidden + _linear(F.silu(gate) * up, layer.mlp.down_proj)
        self.cursor = end
        # The lm_head module itself (not its weight): forward hooks on the output embeddings still fire.
        return self.model.lm_head(_rms_norm(hidden[:, -1:], self.core.norm))[:, -1]


@dataclass
class _FusedWeights:
    """One layer's q/k/v and gate/up projections stacked, so each group is one matmul per step."""

    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    gate_up_weight: torch.Tensor
    gate_up_bias: torch.Tensor | None

    @classmethod
    def of(cls, layer) -> _FusedWeights:
        attention, mlp = layer.self_attn, layer.mlp
        qkv = _stacked(attention.q_proj, attention.k_proj, attention.v_proj)
        return cls(*qkv, *_stacked(mlp.gate_proj, mlp.up_proj))


def _stacked(*projections: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight and bias (None when they have none) of one Linear that computes all of projections at once."""
    weight = torch.cat([p.weight for p in projections])
    return weight, None if projections[0].bias is None else torch.cat([p.bias for p in projections])


def _linear(x: torch.Tensor, module: torch.nn.Linear) -> torch.Tensor:
    return F.linear(x, module.weight, module.bias)


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """transformers' RMSNorm (Qwen2RMSNorm, LlamaRMSNorm, MistralRMSNorm): fp32 statistics, weight in x's dtype."""
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half(x) * sin == x.roll(half) * signed_sin (see LeanDecoder)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin
