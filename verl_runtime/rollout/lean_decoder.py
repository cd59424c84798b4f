"""A lean decode path for Llama-family models (Qwen2, Llama, Mistral) on the CPU, on ``lean_model.Blocks``.

Keys and values go into a preallocated [B, kv_heads, total, head_dim] tensor at the cursor; each step attends over
the filled prefix with a mask built once per call. Rows come in groups of ``repeats`` samples of one prompt: the
prefill runs each distinct prompt once and copies its keys and values to every row of its group.
``lean_model.lean_path_applies`` says when it is used; everything else decodes through the model's forward.
"""

from __future__ import annotations

import torch

from verl_runtime.lean_model import Blocks, prompt_attention_mask
from verl_runtime.models import position_ids_from_mask


class LeanDecoder:
    """One generate call's decoding: prefill() the left-padded prompts, then step(tokens) once per new token.

    prompt_ids [B, P] hold each prompt ``repeats`` times in a row. Both methods return logits [B, V] of the last
    position. Weights are read afresh at every call, so weights the optimizer updated in place are used next time.
    """

    def __init__(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int, repeats: int):
        self.blocks = Blocks(model)
        self.prompt_ids, self.prompt_mask, self.repeats = prompt_ids, prompt_mask, repeats
        rows, prompt_length = prompt_ids.shape
        total = prompt_length + max_new_tokens
        weight = model.model.embed_tokens.weight
        shape = (rows, self.blocks.kv_heads, total, self.blocks.head_dim)
        self.keys = [weight.new_empty(shape) for _ in model.model.layers]
        self.values = [weight.new_empty(shape) for _ in model.model.layers]

        # Positions as the trainer computes them: counting real prompt tokens, then one per generated token.
        positions = position_ids_from_mask(prompt_mask)
        steps = torch.arange(1, max_new_tokens + 1, device=prompt_ids.device)
        self.cos, self.sin = self.blocks.rotary(torch.cat([positions, positions[:, -1:] + steps], dim=1))

        # Keys a query may see: the real prompt tokens and every generated one (finished rows keep feeding pads
        # and attending, as transformers' generate does; their tokens are masked out afterwards).
        visible = torch.cat([prompt_mask.bool(), prompt_mask.new_ones(rows, max_new_tokens, dtype=torch.bool)], 1)
        # The decode steps' mask as SDPA uses it inside (0 or -inf added to the scores), converted once, not per step.
        self.step_mask = torch.zeros(rows, 1, 1, total, dtype=weight.dtype, device=weight.device)
        self.step_mask.masked_fill_(~visible[:, None, None, :], -float("inf"))
        self.cursor = prompt_length

    def prefill(self) -> torch.Tensor:
        """Each distinct prompt once (every repeats-th row); its keys, values and logits copied to its group."""
        blocks, group = self.blocks, slice(None, None, self.repeats)
        length = self.prompt_ids.shape[1]
        rotary = (self.cos[group, :, :length], self.sin[group, :, :length])
        mask = prompt_attention_mask(self.prompt_mask[group])
        hidden = blocks.embed(self.prompt_ids[group])
        for (layer, fused), keys, values in zip(blocks.layers(), self.keys, self.values):
            queries, new_keys, new_values = blocks.project(layer, fused, hidden, rotary)
            keys[:, :, :length] = new_keys.repeat_interleave(self.repeats, dim=0)
            values[:, :, :length] = new_values.repeat_interleave(self.repeats, dim=0)
            hidden = blocks.finish(layer, fused, hidden, blocks.attend(queries, new_keys, new_values, mask))
        return blocks.logits(hidden[:, -1:])[:, -1].repeat_interleave(self.repeats, dim=0)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        blocks, start = self.blocks, self.cursor
        end = start + 1
        rotary = (self.cos[:, :, start:end], self.sin[:, :, start:end])
        mask = self.step_mask[..., :end]
        hidden = blocks.embed(tokens[:, None])
        for (layer, fused), keys, values in zip(blocks.layers(), self.keys, self.values):
            queries, new_keys, new_values = blocks.project(layer, fused, hidden, rotary)
            keys[:, :, start:end], values[:, :, start:end] = new_keys, new_values
            attended = blocks.attend(queries, keys[:, :, :end], values[:, :, :end], mask)
            hidden = blocks.finish(layer, fused, hidden, attended)
        self.cursor = end
        return blocks.logits(hidden[:, -1:])[:, -1]
