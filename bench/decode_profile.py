"""Where a decode step's time goes on a GPU: the builtin engine's graph path on the gpu preset's batch, timed per step
(the slope between two response lengths, so the prefill and the call's set-up drop out), and the same step run
eagerly under torch.profiler, its CUDA kernels ranked by time.

    python bench/decode_profile.py            # on a CUDA machine (bench/gpu_check.py's generation check times calls)
"""

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from _workload import PRESETS, chat, prompt_texts  # noqa: E402


def main() -> int:
    import torch

    from _models import model_dir
    from verl_runtime.models import load_causal_lm, load_tokenizer
    from verl_runtime.rollout import SamplingParams
    from verl_runtime.rollout.builtin import BuiltinRolloutEngine

    if not torch.cuda.is_available():
        print("decode_profile: no CUDA GPU here", file=sys.stderr)
        return 2
    w = PRESETS["gpu"]
    with tempfile.TemporaryDirectory() as d:
        path = model_dir(w, Path(d))
        model = load_causal_lm(path, torch.bfloat16, "cuda")
        tokenizer = load_tokenizer(path)
    prompts = [tokenizer.apply_chat_template(chat(t), add_generation_prompt=True, tokenize=True, return_dict=False)
               for t in prompt_texts(w.prompts)]
    engine = BuiltinRolloutEngine(model, tokenizer, "cuda")

    def timed(new_tokens: int) -> float:
        params = SamplingParams(n=w.samples, max_new_tokens=new_tokens)
        engine.generate(prompts, params)  # capture for this bucket
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(3):
            engine.generate(prompts, params)
        torch.cuda.synchronize()
        return (time.perf_counter() - started) / 3

    short, long = timed(64), timed(256)
    step = (long - short) / 192
    rows = w.prompts * w.samples
    print(f"graph path: {rows} rows, {step * 1e3:.2f} ms per decode step ({rows / step:,.0f} tokens/s in the loop); "
          f"a call of 256 tokens {long:.3f} s, of 64 {short:.3f} s")

    eager = BuiltinRolloutEngine(model, tokenizer, "cuda", compile=False)
    params = SamplingParams(n=w.samples, max_new_tokens=32)
    eager.generate(prompts, params)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        eager.generate(prompts, params)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=22, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
