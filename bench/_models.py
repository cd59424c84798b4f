"""The model directory of a preset. Both trainers load this one directory, so they start from the same weights."""

import os
from pathlib import Path

from _workload import Workload

# Qwen2.5-0.5B's shape (random weights: nothing can be downloaded here).
QWEN25_05B = dict(
    hidden_size=896,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)


# A Qwen2-architecture model large enough that the vocabulary and the layers both weigh (random weights, the built-in
# byte-level tokenizer, whose ids all lie in this vocabulary), untied so the lm_head is a matrix of its own.
BENCH_SHAPE = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=1024, vocab_size=8192, max_position_embeddings=2048, tie_word_embeddings=False)


def bench_shape_model(folder: Path) -> str:
    """BENCH_SHAPE with random weights (seed 0) and the built-in tokenizer, written to folder."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from verl_runtime.models import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny"))
    config = Qwen2Config(**BENCH_SHAPE, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def model_dir(w: Workload, tmp: Path) -> str:
    """The preset's model: builtin:tiny, or the Qwen2.5-0.5B shape written once per seed into $VERL_BENCH_MODELS when
    that is set (bench/gpu_check.py shares one between its checks), else into tmp."""
    from verl_runtime.models import resolve_model_path

    tiny = resolve_model_path("builtin:tiny")
    if w.preset == "cpu-scaling":
        return bench_shape_model(tmp / "bench-shape")
    shared = os.environ.get("VERL_BENCH_MODELS")
    folder = Path(shared) / f"qwen2.5-0.5b-shape-seed{w.seed}" if shared else tmp / "qwen2.5-0.5b-shape"
    return tiny if w.preset == "cpu" else _write_qwen25_shape(tiny, folder, w.seed)


def _write_qwen25_shape(tokenizer_dir: str, out: Path, seed: int) -> str:
    """Random Qwen2.5-0.5B-shape weights with the built-in tokenizer (its ids all lie inside the large vocab); a
    folder already written is reused."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return str(out)

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = Qwen2Config(**QWEN25_05B, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)
