"""The GPU check: what this project claims on a GPU, run on a CUDA machine with only torch and transformers (no
Docker, vLLM or Ray needed), summarised in one JSON file.

    make gpu-check                                  # = python bench/gpu_check.py --out runs/gpu-check.json
    python bench/gpu_check.py --preset cpu          # a rehearsal of every step on the CPU (tiny model)

Checks, each pass / fail / skip with its figures:
    nvml        doctor's NVIDIA checks on this driver (verl_deploy.doctor)
    greedy      builtin's greedy tokens equal transformers' (hf) on the preset's model and dtype
    generation  tokens/s of builtin and hf at the preset's batch (gpu: 256 sequences x 256 new tokens); target
    grpo        GRPO steps through verl_runtime with builtin and hf, and TRL's GRPOTrainer beside them when TRL is
                installed (bench/grpo_vs_trl.py); target: builtin >= 4x TRL on the gpu preset
    multi_gpu   2 workers, data-parallel and FSDP, where there are 2+ GPUs and Ray is installed
    plan        `verl-deploy plan`'s per-phase prediction against torch.cuda.max_memory_allocated for our runtime's
                steps (bench/plan_accuracy.py's GPU cases: the Qwen2.5-0.5B shape in bf16, GRPO with and without
                checkpointing, PPO with a critic), and the whole step's peak; target: within 10%
    offload     the same GRPO step with and without CPU offload (actor.param_offload, optimizer_offload,
                ref.param_offload): the whole step's torch.cuda.max_memory_allocated against the plan, each within
                10%, the saving measured against the saving planned, and the actor's parameters and AdamW state on
                the GPU between steps (0 bytes with offload: verl_runtime.offload.resident_bytes). The cpu preset
                rehearses it on the quickstart, where device and host are one memory: the plan predicts no change

Without a CUDA GPU, the gpu preset says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
BENCH = Path(__file__).resolve().parent
# verl_runtime and verl_deploy from this checkout, and the pure-Python wheels `make gpu-check-wheels` put in
# .gpu-wheels/ (nvidia-ml-py for the NVML checks), importable as they are; the bench scripts it starts see them too.
PATHS = [str(BENCH.parent), str(BENCH.parent / "installer"), *map(str, sorted((BENCH.parent / ".gpu-wheels").glob("*.whl")))]
sys.path[:0] = PATHS
os.environ["PYTHONPATH"] = os.pathsep.join([*PATHS, *filter(None, [os.environ.get("PYTHONPATH")])])

from _workload import PRESETS, chat, prompt_texts  # noqa: E402

# On one H200 (issue #13): TRL took 9.7 s/step on the gpu preset; transformers' generate with a static cache and
# torch.compile made 28.5k tokens/s.
TARGETS = {"gpu": {"generation_tokens_per_s": 40_000, "grpo_vs_trl": 4.0}, "cpu": {}}


def nvml() -> dict:
    import torch

    from verl_deploy.doctor import diagnose

    if torch.cuda.is_available() and importlib.util.find_spec("pynvml") is None:
        return {"status": "fail", "failed": ["nvidia-ml-py is not installed: `make gpu-check-wheels` carries it"]}
    findings = [f for f in diagnose().findings if f.area == "nvidia"]
    failed = [f"{f.name}: {f.message}" for f in findings if f.status == "fail"]
    return {"status": "fail" if failed else "pass", "failed": failed,
            "findings": {f.name: f"{f.status}: {f.message}" for f in findings}}


def greedy(preset: str, new_tokens: int = 32) -> dict:
    """builtin and hf decode the same prompts greedily from one model object: their tokens must be equal."""
    import torch

    from _models import model_dir
    from verl_runtime.models import load_causal_lm, load_tokenizer
    from verl_runtime.rollout import SamplingParams, make_rollout_engine

    w = PRESETS[preset]
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as d:
        path = model_dir(w, Path(d))
        model = load_causal_lm(path, getattr(torch, w.dtype), w.device)
        tokenizer = load_tokenizer(path)
    prompts = [tokenizer.apply_chat_template(chat(t), add_generation_prompt=True, tokenize=True, return_dict=False)
               for t in prompt_texts(8)]
    params = SamplingParams(n=1, max_new_tokens=new_tokens, do_sample=False)
    out = {name: make_rollout_engine(name, model, tokenizer, w.device).generate(prompts, params) for name in ("builtin", "hf")}
    ours, theirs = (out[n].responses * out[n].response_mask for n in ("builtin", "hf"))
    same = (ours == theirs).all(dim=1)
    return {"status": "pass" if bool(same.all()) else "fail", "rows_equal": f"{int(same.sum())} of {len(prompts)}",
            "new_tokens": new_tokens, "dtype": w.dtype}


def bench(script: str, preset: str, args: list[str], timeout_s: int) -> tuple[dict | None, str]:
    """Run one bench/ script with --json; its results and the tail of what it printed."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as d:
        out = Path(d) / "result.json"
        cmd = [sys.executable, str(BENCH / script), "--preset", preset, *args, "--json", str(out)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout_s} s"
        text = (done.stdout + done.stderr).strip()
        return (json.loads(out.read_text()) if done.returncode == 0 and out.exists() else None), text[-1500:]


def generation(preset: str) -> dict:
    result, printed = bench("generation.py", preset, ["--engines", "builtin,hf", "--calls", "5", "--warmup", "2"], 900)
    if result is None:
        return {"status": "fail", "output": printed}
    speeds = {name: round(r["tokens_per_s"]) for name, r in result["engines"].items()}
    target = TARGETS[preset].get("generation_tokens_per_s")
    status = "pass" if not target or speeds["builtin"] >= target else "fail"
    return {"status": status, "tokens_per_s": speeds, "target_builtin": target,
            "builtin_vs_hf": round(speeds["builtin"] / speeds["hf"], 2)}


def grpo(preset: str) -> dict:
    trl = importlib.util.find_spec("trl") is not None
    args = ["--engines", "builtin,hf", "--steps", "3", "--warmup", "1"] + ([] if trl else ["--only", "ours"])
    result, printed = bench("grpo_vs_trl.py", preset, args, 1800)
    if result is None:
        return {"status": "fail", "output": printed}
    s_per_step = {f"{r['side']}-{r['engine']}" if r["side"] == "ours" else "trl": round(r["median_s"], 3)
                  for r in result["rounds"][0]}
    check = {"s_per_step": s_per_step, "steps": result["steps"]}
    target = TARGETS[preset].get("grpo_vs_trl")
    if not trl:
        return {"status": "pass", **check, "trl": "skipped: TRL is not installed (carry its wheels)"}
    ratio = round(s_per_step["trl"] / s_per_step["ours-builtin"], 2)
    return {"status": "pass" if not target or ratio >= target else "fail", **check, "builtin_vs_trl": ratio,
            "target": target}


def multi_gpu(preset: str) -> dict:
    import torch

    if preset != "gpu" or torch.cuda.device_count() < 2:
        return {"status": "skip", "why": "fewer than 2 GPUs"}
    if importlib.util.find_spec("ray") is None:
        return {"status": "skip", "why": "several workers run as Ray actors and Ray is not installed"}
    result, printed = bench("grpo_vs_trl.py", preset, ["--only", "ours", "--engines", "builtin", "--steps", "2",
                                                       "--warmup", "1", "--workers", "2"], 1800)
    return {"status": "pass" if result else "fail", "output": printed[-600:]}


def plan(preset: str) -> dict:
    """The planner against what torch allocated: each phase's peak beyond what existed before it, and the whole step's
    torch.cuda.max_memory_allocated, on the gpu preset's cases (the cpu preset rehearses the quickstart case with
    torch.profiler's CPU memory events; its target is the CPU benchmark's 15%)."""
    import plan_accuracy

    with tempfile.TemporaryDirectory(prefix="gpu-check-plan-") as d:
        workdir = Path(d)
        os.environ.setdefault("VERL_DEPLOY_CACHE", str(workdir / "cache"))
        if preset == "gpu":
            model = plan_accuracy.gpu_model(workdir / "qwen2.5-0.5b-shape")
            results = [plan_accuracy.run_case(name, spec, model, workdir, plan_accuracy.GPU_COMMON)
                       for name, spec in plan_accuracy.GPU_CASES.items()]
            target = plan_accuracy.GPU_TARGET
        else:
            spec = plan_accuracy.CASES["quickstart"]
            results = [plan_accuracy.run_case("quickstart", spec, spec["model"], workdir)]
            target = plan_accuracy.TARGET
    worst = max(plan_accuracy.worst_error(r) for r in results)
    figures = {f"{r['case']} {row['phase']}": f"{row['measured_bytes'] / 2**20:.0f} MiB measured, "
               f"{row.get('planned_as_run_bytes', row['predicted_bytes']) / 2**20:.0f} planned "
               f"({row.get('error_as_run', row['error']):+.1%})" for r in results for row in r["rows"]}
    figures.update({f"{r['case']} whole step": f"{r['whole_step']['measured_bytes'] / 2**30:.2f} GiB "
                    f"max_memory_allocated, {r['whole_step']['predicted_bytes'] / 2**30:.2f} planned "
                    f"({r['whole_step']['error']:+.1%})" for r in results if r.get("whole_step")})
    return {"status": "pass" if worst <= target else "fail", "worst_error": round(worst, 4), "target": target,
            "figures": figures}


def offload(preset: str) -> dict:
    """CPU offload on the GPU: planned vs torch.cuda.max_memory_allocated for the step with and without it."""
    import plan_accuracy

    with tempfile.TemporaryDirectory(prefix="gpu-check-offload-") as d:
        workdir = Path(d)
        os.environ.setdefault("VERL_DEPLOY_CACHE", str(workdir / "cache"))
        if preset == "gpu":
            model = plan_accuracy.gpu_model(workdir / "qwen2.5-0.5b-shape")
            plain, off = (plan_accuracy.run_case(name, spec, model, workdir, plan_accuracy.GPU_COMMON)
                          for name, spec in plan_accuracy.GPU_OFFLOAD_CASES.items())
        else:
            spec = plan_accuracy.CASES["quickstart"]
            plain, off = (plan_accuracy.run_case(name, {**spec, "set": [*spec["set"], *extra]}, spec["model"], workdir)
                          for name, extra in (("quickstart", []), ("quickstart-offload", plan_accuracy.OFFLOAD)))
    figures = {"actor state on the device between steps, with offload": off["actor_resident_between_steps"],
               "planned host memory for the offloaded state": f"{off['planned_host_bytes'] / 2**30:.2f} GiB"}
    if preset != "gpu":  # the CPU: the moves are no-ops; per-phase peaks must not change, as planned
        ratios = [row["measured_bytes"] / base["measured_bytes"] for row, base in zip(off["rows"], plain["rows"])
                  if base["measured_bytes"]]
        worst = max(abs(r - 1) for r in ratios)
        figures["per-phase peak, offload / plain (planned 1.00: device is host memory)"] = [round(r, 3) for r in ratios]
        return {"status": "pass" if worst <= plan_accuracy.TARGET else "fail", "worst_error": round(worst, 4),
                "figures": figures}
    measured = {r["case"]: r["whole_step"]["measured_bytes"] for r in (plain, off)}
    planned = {r["case"]: r["whole_step"]["predicted_bytes"] for r in (plain, off)}
    saving = {"measured": measured["gpu-grpo"] - measured["gpu-grpo-offload"],
              "planned": planned["gpu-grpo"] - planned["gpu-grpo-offload"]}
    worst = max(abs(r["whole_step"]["error"]) for r in (plain, off))
    for r in (plain, off):
        figures[f"{r['case']} whole step"] = (f"{r['whole_step']['measured_bytes'] / 2**30:.2f} GiB max_memory_allocated"
                                              f", {r['whole_step']['predicted_bytes'] / 2**30:.2f} planned "
                                              f"({r['whole_step']['error']:+.1%})")
    figures["saving"] = (f"{saving['measured'] / 2**30:.2f} GiB measured, {saving['planned'] / 2**30:.2f} planned")
    left = off["actor_resident_between_steps"]
    ok = worst <= plan_accuracy.GPU_TARGET and saving["measured"] > 0 and left["params"] == left["optimizer"] == 0
    return {"status": "pass" if ok else "fail", "worst_error": round(worst, 4), "target": plan_accuracy.GPU_TARGET,
            "figures": figures}


CHECKS = {"nvml": nvml, "greedy": greedy, "generation": generation, "grpo": grpo, "multi_gpu": multi_gpu, "plan": plan,
          "offload": offload}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="gpu")
    p.add_argument("--out", type=Path, default=Path("runs/gpu-check.json"), help="the JSON summary")
    p.add_argument("--only", help="comma-separated checks to run (default: all of " + ", ".join(CHECKS) + ")")
    args = p.parse_args(argv)
    import torch

    if PRESETS[args.preset].device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU is visible here (torch.cuda.is_available() is False): run it on a machine "
              "with an NVIDIA GPU, or rehearse it with --preset cpu", file=sys.stderr)
        return 2
    wanted = args.only.split(",") if args.only else list(CHECKS)
    summary = {"preset": args.preset, "torch": torch.__version__, "cuda": torch.version.cuda,
               "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], "checks": {}}
    for name in wanted:
        started = time.monotonic()
        try:
            result = CHECKS[name](args.preset) if name != "nvml" else CHECKS[name]()
        except Exception as exc:  # a check that breaks is a failed check; the others still run
            result = {"status": "fail", "error": f"{type(exc).__name__}: {exc}"[:800]}
        result["seconds"] = round(time.monotonic() - started, 1)
        summary["checks"][name] = result
        print(f"gpu-check {name}: {result['status']} ({result['seconds']} s) "
              + json.dumps({k: v for k, v in result.items() if k not in ("status", "seconds", "output", "findings")}),
              flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    failed = [name for name, r in summary["checks"].items() if r["status"] == "fail"]
    print(f"gpu-check: {len(wanted) - len(failed)} of {len(wanted)} checks did not fail; summary: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
