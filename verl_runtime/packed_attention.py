"""Attention over packed rows (use_remove_padding) without a [N, N] mask: each sequence attends causally to itself.

Given packed rows and no attention mask, transformers builds a block-diagonal [N, N] mask from the position ids
(masking_utils.find_packed_sequence_indices) for sdpa, which keeps a float copy of it in every layer for the
backward: N^2 memory, more than the padding it removes. Flash-attention's varlen kernel takes the sequences'
boundaries (cu_seq_lens) instead. This registers an attention implementation of transformers' AttentionInterface
that does the same with torch's own scaled_dot_product_attention, one sequence at a time (is_causal, no mask: the
flash kernel where torch has one), so memory scales with the real tokens on any device.

``install`` makes it the model's implementation for good: gradient checkpointing recomputes a layer in the
backward, long after the forward, and must meet the same attention. A call without the boundaries (every padded
forward, generate) is transformers' sdpa exactly, and so is the mask, except inside ``packing()``.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

NAME = "verl_runtime_packed"
_packing = False  # inside packing(): the packed forward, whose sequences' boundaries replace the mask


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query [1, heads, N, d], key/value [1, kv_heads, N, d] -> ([1, N, heads, d], None), as transformers' sdpa."""
    if "cu_seq_lens_q" not in kwargs:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    bounds = kwargs["cu_seq_lens_q"].tolist()
    parts = [
        F.scaled_dot_product_attention(query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
                                       is_causal=True, scale=scaling, enable_gqa=True)
        for start, end in zip(bounds[:-1], bounds[1:])
    ]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def _mask(*args, **kwargs):
    from transformers.masking_utils import sdpa_mask

    return None if _packing else sdpa_mask(*args, **kwargs)


def install(model) -> None:
    """packed_attention as the attention of model and its submodules (which share or hold configs); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, packed_attention)
    AttentionMaskInterface.register(NAME, _mask)
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and getattr(config, "_attn_implementation", None) in ("sdpa", NAME):
            config._attn_implementation = NAME


@contextlib.contextmanager
def packing():
    """The packed forward: no mask is made (the boundaries travel as cu_seq_lens, see boundaries)."""
    global _packing
    _packing, before = True, _packing
    try:
        yield
    finally:
        _packing = before


def boundaries(attention_mask: torch.Tensor) -> dict:
    """The packed sequences' cumulative lengths, as transformers' flash-attention kwargs name them."""
    lengths = attention_mask.sum(-1)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=attention_mask.device)
    cu[1:] = torch.cumsum(lengths, 0)
    longest = int(lengths.max()) if len(lengths) else 0
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
