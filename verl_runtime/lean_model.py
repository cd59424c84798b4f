"""Llama-family models (Qwen2, Llama, Mistral) run as plain tensor maths on the HF modules' own weights.

With small models on the CPU most of a transformers forward is Python overhead (mask creation, cache objects,
rotary calls, dozens of small modules), not arithmetic. This module runs the same block structure directly:
embedding; per layer RMSNorm, one matmul for q/k/v and one for gate/up (weights stacked at every call, so in-place
optimizer updates and autograd both reach the real parameters), rotary, scaled_dot_product_attention, o_proj,
residual, RMSNorm, SiLU-gated MLP, residual; final norm; lm_head. Two users:

- ``rollout.lean_decoder.LeanDecoder``: prefill and one-token decode steps over a preallocated KV cache.
- ``shared_prefix_logits``: the training forward of GRPO batches, whose samples of one prompt share it: each distinct
  prompt runs once and its keys and values are shared by all its samples' responses (exactly the same maths as
  running every row whole; gradients from all samples add up in the shared prompt).

``lean_path_applies`` says when: other architectures, a non-CPU device, autocast, a sliding window shorter than the
sequence, an activation other than SiLU and rope types that rescale with the sequence length (dynamic, longrope)
take the model's own forward. Pad slots of a prompt attend only to themselves (a fully masked row would make NaN
keys for later layers); real tokens never attend to pad slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

ARCHITECTURES = ("qwen2", "llama", "mistral")  # one block structure: RMSNorm, rotary GQA attention, gated MLP
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def lean_path_applies(model, device: torch.device, total_length: int) -> bool:
    """Whether this module computes exactly what the model's forward does, for sequences of total_length."""
    if device.type != "cpu" or torch.is_autocast_enabled(device.type):
        return False
    return lean_maths_apply(model, total_length)


def lean_maths_apply(model, total_length: int) -> bool:
    """Whether the model is one block structure this module (and rollout.graph_decoder) writes out, for sequences of
    total_length: on any device, in any dtype."""
    config = model.config
    if hasattr(model, "peft_config"):
        return False  # LoRA adapters add their B @ A x in their modules' own forward
    if config.model_type not in ARCHITECTURES or config.hidden_act != "silu":
        return False
    if getattr(model.model.rotary_emb, "rope_type", "default") in LENGTH_DEPENDENT_ROPE:
        return False
    attention = model.model.layers[0].self_attn
    if model.training and (getattr(attention, "attention_dropout", 0.0) or model.is_gradient_checkpointing):
        return False  # dropout and activation checkpointing live in the modules' own forward
    if _sharded(model):
        return False  # FSDP gathers each layer's shards in hooks around the modules' forward
    window = getattr(config, "sliding_window", None)  # None unless a sliding window is in use
    return window is None or total_length <= window


def _sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


class Blocks:
    """One model's layers as functions of hidden states; build one per forward (it stacks the current weights)."""

    def __init__(self, model):
        self.model, self.core, config = model, model.model, model.config
        attention = self.core.layers[0].self_attn
        self.head_dim, self.scale = attention.head_dim, attention.scaling
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.dtype = self.core.embed_tokens.weight.dtype
        self.fused = [FusedWeights.of(layer) for layer in self.core.layers]

    def layers(self):
        return zip(self.core.layers, self.fused)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.core.embed_tokens(ids)  # the module: its padding_idx row gets no gradient, as in the forward

    def rotary(self, positions: torch.Tensor) -> torch.Tensor:
        """The rotations [B, 1, L, head_dim / 2, 2] (cos, sin pairs) for positions [B, L], from the model's own rotary
        module (every rope variant whose frequencies do not depend on the sequence length stays right)."""
        cos, sin = self.core.rotary_emb(self.core.embed_tokens.weight, positions)
        half = self.head_dim // 2  # both halves of cos and sin hold the same frequencies
        return torch.stack([cos[..., :half], sin[..., :half]], dim=-1).float()[:, None]  # broadcast over heads

    def project(self, layer, fused, hidden: torch.Tensor, rotary) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [B, heads, L, d] and keys, values [B, kv_heads, L, d] of hidden [B, L, D]; q and k rotated."""
        rows, length, _ = hidden.shape
        x = rms_norm(hidden, layer.input_layernorm)
        qkv = F.linear(x, fused.qkv_weight, fused.qkv_bias).view(rows, length, -1, self.head_dim).transpose(1, 2)
        # split, not slicing: its backward is one cat, where each slice's would fill a zero tensor of qkv's size
        qk, values = qkv.split([self.heads + self.kv_heads, self.kv_heads], dim=1)
        queries, keys = rotate(qk, rotary).split([self.heads, self.kv_heads], dim=1)  # rotated in one go
        return queries, keys, values

    def attend(self, queries, keys, values, bias: torch.Tensor) -> torch.Tensor:
        """Attention [B, L, heads * d] of queries [B, heads, L, d]; bias is additive (0 or -inf, see attention_bias)."""
        rows, _, length, _ = queries.shape
        attended = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=bias, scale=self.scale, enable_gqa=True
        )
        return attended.transpose(1, 2).reshape(rows, length, -1)

    def finish(self, layer, fused, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of the layer: o_proj of attended [B, L, heads * d] and residual, then the gated MLP and residual."""
        hidden = hidden + linear(attended, layer.self_attn.o_proj)
        gate, up = F.linear(
            rms_norm(hidden, layer.post_attention_layernorm), fused.gate_up_weight, fused.gate_up_bias
        ).chunk(2, -1)
        return hidden + linear(F.silu(gate) * up, layer.mlp.down_proj)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # The lm_head module itself (not its weight): forward hooks on the output embeddings still fire.
        return self.model.lm_head(rms_norm(hidden, self.core.norm))


def prompt_attention_mask(prompt_mask: torch.Tensor) -> torch.Tensor:
    """[B, 1, P, P] boolean: causal over the real tokens of left-padded prompts; pad slots see only themselves."""
    length = prompt_mask.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=prompt_mask.device).tril()
    eye = torch.eye(length, dtype=torch.bool, device=prompt_mask.device)
    return (causal & prompt_mask.bool()[:, None, None, :]) | eye


def attention_bias(sees: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive form of a boolean mask (0 where a query sees a key, -inf elsewhere), made once per forward:
    attention converts a boolean mask to this inside every call, and takes the float one faster."""
    return torch.zeros(sees.shape, dtype=dtype, device=sees.device).masked_fill_(~sees, -float("inf"))


def shared_prefix_logits(model, input_ids, attention_mask, position_ids, response_length: int) -> torch.Tensor:
    """Logits [B, R, V] that predict the last R tokens of each row, the rows' equal prompts computed once
    (shared_prefix_hidden, then the lm_head module itself: forward hooks on the output embeddings still fire)."""
    return model.lm_head(shared_prefix_hidden(model, input_ids, attention_mask, position_ids, response_length))


def shared_prefix_hidden(model, input_ids, attention_mask, position_ids, response_length: int) -> torch.Tensor:
    """The final-norm hidden states [B, R, H] that predict the last R tokens of each row, the rows' equal prompts
    computed once.

    Rows are prompt (left-padded, the first T - R columns) then response; rows whose prompt columns (ids, mask and
    positions) are equal share one prompt computation. A response token sees its row's real prompt tokens and the
    response tokens up to itself that attention_mask keeps, as in the model's forward.
    """
    rows, total = input_ids.shape
    prompt_length = total - response_length
    prompt_key = torch.cat([c[:, :prompt_length] for c in (input_ids, attention_mask, position_ids)], dim=1)
    prompts, owner = torch.unique(prompt_key, dim=0, return_inverse=True)  # owner[row]: its prompt
    prompt_ids, prompt_mask, prompt_positions = prompts.split(prompt_length, dim=1)
    response_ids, response_mask = input_ids[:, prompt_length:], attention_mask[:, prompt_length:]

    blocks = Blocks(model)
    prompt_rotary = blocks.rotary(prompt_positions)
    response_rotary = blocks.rotary(position_ids[:, prompt_length:])
    prompt_bias = attention_bias(prompt_attention_mask(prompt_mask), blocks.dtype)
    causal = torch.ones(response_length, response_length, dtype=torch.bool, device=input_ids.device).tril()
    response_sees = torch.cat(
        [
            prompt_mask.bool()[owner][:, None, None, :].expand(-1, 1, response_length, -1),
            causal & response_mask.bool()[:, None, None, :],
        ],
        dim=-1,
    )  # [B, 1, R, P + R]
    response_bias = attention_bias(response_sees, blocks.dtype)

    prompt_hidden, response_hidden = blocks.embed(prompt_ids), blocks.embed(response_ids)
    for layer, fused in blocks.layers():
        queries, keys, values = blocks.project(layer, fused, prompt_hidden, prompt_rotary)
        attended = blocks.attend(queries, keys, values, prompt_bias)
        response_queries, response_keys, response_values = blocks.project(layer, fused, response_hidden, response_rotary)
        response_attended = blocks.attend(
            response_queries,
            torch.cat([keys[owner], response_keys], dim=2),
            torch.cat([values[owner], response_values], dim=2),
            response_bias,
        )
        prompt_hidden = blocks.finish(layer, fused, prompt_hidden, attended)
        response_hidden = blocks.finish(layer, fused, response_hidden, response_attended)
    # Position t predicts token t + 1: the prompt's last position, then every response position but the last.
    return rms_norm(torch.cat([prompt_hidden[owner, -1:], response_hidden[:, :-1]], dim=1), blocks.core.norm)


@dataclass
class FusedWeights:
    """One layer's q/k/v and gate/up projections stacked, so each group is one matmul.

    The rows of q and k are reordered within each head from transformers' half-split layout (x1 | x2, rotated as
    x1 + i x2) to interleaved pairs (x1[0], x2[0], x1[1], x2[1], ...), so that rotary is one complex product. Queries
    and keys share the order, so their dot products, and everything after them, are unchanged.
    """

    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    gate_up_weight: torch.Tensor
    gate_up_bias: torch.Tensor | None

    @classmethod
    def of(cls, layer) -> FusedWeights:
        attention, mlp = layer.self_attn, layer.mlp
        head_dim = attention.head_dim
        q, k = (_Interleaved(p, head_dim) for p in (attention.q_proj, attention.k_proj))
        qkv = _stacked(q, k, attention.v_proj)
        return cls(*qkv, *_stacked(mlp.gate_proj, mlp.up_proj))


class _Interleaved:
    """A q or k projection's weight and bias with each head's rows in the interleaved order."""

    def __init__(self, projection: torch.nn.Linear, head_dim: int):
        self.weight = _interleave(projection.weight, head_dim)
        self.bias = None if projection.bias is None else _interleave(projection.bias, head_dim)


def _interleave(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[heads * head_dim, ...] rows, each head's two halves interleaved (row j of the first half, then of the second)."""
    split = rows.unflatten(0, (-1, 2, head_dim // 2))  # [heads, which half, index within the half, ...]
    return split.transpose(1, 2).flatten(0, 2)


def _stacked(*projections) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight and bias (None when they have none) of one Linear that computes all of projections at once."""
    weight = torch.cat([p.weight for p in projections])
    return weight, None if projections[0].bias is None else torch.cat([p.bias for p in projections])


def linear(x: torch.Tensor, module: torch.nn.Linear) -> torch.Tensor:
    return F.linear(x, module.weight, module.bias)


def rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """transformers' RMSNorm (Qwen2RMSNorm, LlamaRMSNorm, MistralRMSNorm): fp32 statistics, weight in x's dtype."""
    if x.dtype != torch.float32:
        return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon).to(x.dtype)
    if torch.is_grad_enabled():
        return _RMSNorm.apply(x, norm.weight, norm.variance_epsilon)
    # The same maths in one call (the weight applied last, as transformers does).
    return F.rms_norm(x, (x.shape[-1],), norm.weight, eps=norm.variance_epsilon)


class _RMSNorm(torch.autograd.Function):
    """fp32 RMSNorm with its backward written out: autograd through the composite (a power, a mean, an addition, a
    reciprocal square root and two products) runs about twice as many passes over the activations."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.square().mean(-1, keepdim=True).add_(eps))
        normed = x * rstd
        ctx.save_for_backward(normed, rstd, weight)
        return normed * weight

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        normed, rstd, weight = ctx.saved_tensors
        grad_weight = (grad * normed).flatten(0, -2).sum(0) if ctx.needs_input_grad[1] else None
        g = grad * weight  # the gradient at the normed activations
        grad_x = (g - normed * (g * normed).mean(-1, keepdim=True)).mul_(rstd) if ctx.needs_input_grad[0] else None
        return grad_x, grad_weight, None


def rotate(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [..., head_dim] in the interleaved layout (see FusedWeights): each pair of neighbours is
    a complex number, turned by the matching (cos, sin) pair of rotation [..., head_dim / 2, 2]. Eagerly that is one
    complex product, where transformers' half-split layout (x * cos + rotate_half(x) * sin) takes four passes over x
    and as many in the backward; inductor generates no code for complex numbers, so a compiled graph gets the same
    product in real arithmetic, which it fuses."""
    pairs = x.float().unflatten(-1, (-1, 2))
    if torch.compiler.is_compiling():
        (real, imaginary), (cos, sin) = pairs.unbind(-1), rotation.unbind(-1)
        turned = torch.stack([real * cos - imaginary * sin, real * sin + imaginary * cos], dim=-1)
    else:
        turned = torch.view_as_real(torch.view_as_complex(pairs) * torch.view_as_complex(rotation))
    return turned.flatten(-2).to(x.dtype)
