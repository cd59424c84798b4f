"""Attention over packed rows (use_remove_padding) without a [N, N] mask: each sequence attends causally to itself.

Given packed rows and no attention mask, transformers builds a block-diagonal [N, N] mask from the position ids
(masking_utils.find_packed_sequence_indices) for sdpa, which keeps a float copy of it in every layer for the
backward: N^2 memory, more than the padding it removes. Flash-attention's varlen kernel takes the sequences'
boundaries (cu_seq_lens) instead. This registers an attention implementation of transformers' AttentionInterface
that does the same with torch's own scaled_dot_product_attention, one sequence at a time (is_causal, no mask: the
flash kernel where torch has one), so memory scales with the real tokens on any device. It is switched on only
around the packed forward (``active``); every other forward keeps the model's own implementation.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

NAME = "verl_runtime_packed"


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query [1, heads, N, d], key/value [1, kv_heads, N, d] -> ([1, N, heads, d], None), as transformers' sdpa."""
    bounds = kwargs["cu_seq_lens_q"].tolist()
    parts = [
        F.scaled_dot_product_attention(query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
                                       is_causal=True, scale=scaling, enable_gqa=True)
        for start, end in zip(bounds[:-1], bounds[1:])
    ]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs):
    return None  # the sequences' boundaries travel as cu_seq_lens, not as a mask


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, packed_attention)
    AttentionMaskInterface.register(NAME, _no_mask)


@contextlib.contextmanager
def active(model):
    """Inside the block the model (and its submodules, which share its config) attend with packed_attention."""
    _register()
    configs = {id(c): c for c in (model.config, *(getattr(m, "config", None) for m in model.modules())) if c is not None}
    saved = {key: config._attn_implementation for key, config in configs.items()}
    try:
        for config in configs.values():
            config._attn_implementation = NAME
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation = saved[key]


def boundaries(attention_mask: torch.Tensor) -> dict:
    """The packed sequences' cumulative lengths, as transformers' flash-attention kwargs name them."""
    lengths = attention_mask.sum(-1)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=attention_mask.device)
    cu[1:] = torch.cumsum(lengths, 0)
    longest = int(lengths.max()) if len(lengths) else 0
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
