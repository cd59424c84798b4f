"""Generation alone: the rollout engines on one preset's batch, taking turns in one process.

Every engine generates from the same model object and prompts (the preset's prompts x samples x new tokens);
after warm-up calls (a compiled engine compiles in them) the engines alternate call by call, so the machine's
drifting speed reaches them alike. Reports the median time of a generate call, tokens/s (prompts x samples x new
tokens per call) and the ratio to transformers' generate (the `hf` engine).

    python bench/generation.py --preset cpu                      # builtin, builtin-compile (with a C++ compiler), hf
    python bench/generation.py --preset gpu --engines builtin,hf # on a CUDA machine (builtin compiles there anyway)
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # verl_runtime from this checkout

from _workload import PRESETS, chat, engine_options, prompt_texts  # noqa: E402
from grpo_vs_trl import installed_engines  # noqa: E402


def make_engine(engine: str, model, tokenizer, device):
    from verl_runtime.rollout import make_rollout_engine

    name, compile = engine_options(engine)
    options = {} if name == "hf" else {"compile": compile}
    return make_rollout_engine(name, model, tokenizer, device, **options)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    p.add_argument("--calls", type=int, default=15, help="timed calls per engine (median reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per engine first")
    p.add_argument("--engines", help="comma-separated, from builtin, builtin-compile and hf (default: every one "
                   "that runs here)")
    p.add_argument("--json", type=Path, help="also write the results to this file")
    args = p.parse_args(argv)
    w = PRESETS[args.preset]

    import torch

    if w.device == "cuda" and not torch.cuda.is_available():
        print("error: the gpu preset needs a CUDA GPU and none is visible here; use --preset cpu", file=sys.stderr)
        return 2
    names = args.engines.split(",") if args.engines else [e for e in installed_engines(w.preset) if e != "vllm"]
    unknown = sorted(set(names) - {"builtin", "builtin-compile", "hf"})
    if unknown:
        p.error(f"unknown engine(s) {', '.join(unknown)}: choose from builtin, builtin-compile, hf")

    from _models import model_dir
    from verl_runtime.models import load_causal_lm, load_tokenizer
    from verl_runtime.rollout import SamplingParams

    with tempfile.TemporaryDirectory(prefix="generation-") as d:
        path = model_dir(w, Path(d))
        model = load_causal_lm(path, getattr(torch, w.dtype), w.device)
        tokenizer = load_tokenizer(path)
    prompts = [
        tokenizer.apply_chat_template(chat(text), add_generation_prompt=True, tokenize=True, return_dict=False)
        for text in prompt_texts(w.prompts)
    ]
    params = SamplingParams(n=w.samples, temperature=1.0, max_new_tokens=w.new_tokens)
    engines = {name: make_engine(name, model, tokenizer, w.device) for name in names}
    for engine in engines.values():
        for _ in range(args.warmup):
            engine.generate(prompts, params)
    times = {name: [] for name in engines}
    for _ in range(args.calls):
        for name, engine in engines.items():
            if w.device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            engine.generate(prompts, params)
            if w.device == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - started)

    tokens = w.prompts * w.samples * w.new_tokens
    print(f"preset {w.preset}: {w.prompts} prompts x {w.samples} samples x {w.new_tokens} tokens, {w.dtype} on "
          f"{w.device}; median of {args.calls} calls after {args.warmup} warm-up, engines alternating")
    print(f"{'engine':<18}{'ms/call':>9}{'tokens/s':>10}{'vs hf':>8}")
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, median in medians.items():
        ratio = f"{medians['hf'] / median:>7.2f}x" if "hf" in medians else ""
        print(f"{name:<18}{median * 1000:>9.1f}{tokens / median:>10,.0f}{ratio}")
    if args.json:
        results = {name: {"median_s": median, "tokens_per_s": tokens / median} for name, median in medians.items()}
        args.json.write_text(json.dumps({"workload": asdict(w), "calls": args.calls, "engines": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
