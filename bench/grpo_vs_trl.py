"""GRPO training speed, side by side: TRL's GRPOTrainer and verl_runtime on the same workload.

Same model directory (same starting weights), prompts, samples per prompt, completion length, reward rule,
learning rate, no KL term, one optimizer step per batch (bench/README.md says how each is matched).
Each side runs warm-up + timed steps; the median timed step gives steps/s and generated tokens/s.

    python bench/grpo_vs_trl.py --preset cpu [--steps 5] [--warmup 2] [--only trl|ours] [--json FILE]
    python bench/grpo_vs_trl.py --rounds 3              # every side 3 times, interleaved: each round's ratios
    python bench/grpo_vs_trl.py --engines builtin,hf,vllm   # ours with each rollout engine (default: all installed)
    python bench/grpo_vs_trl.py --engines builtin-compile   # builtin with rollout.compile=true (needs a C++ compiler)
    python bench/grpo_vs_trl.py --preset gpu            # needs a CUDA GPU
    python bench/grpo_vs_trl.py --only ours --workers 2 # ours on 1 worker (in-process) and on 2 Ray workers
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

# Offline and quiet before transformers is imported: nothing can be downloaded here, nothing is reported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # verl_runtime from this checkout

from _workload import PRESETS, SideRun, Workload  # noqa: E402

BENCH = Path(__file__).resolve().parent
SIDES = {"trl": "TRL GRPOTrainer", "ours": "verl_runtime"}
# verl_runtime's rollout engines (rollout.name); builtin-compile: builtin with rollout.compile=true, which on the CPU
# compiles its decode step (on CUDA builtin compiles anyway)
ENGINES = ("builtin", "builtin-compile", "hf", "vllm")


def installed_engines(preset: str) -> list[str]:
    import importlib.util

    from verl_runtime.rollout.builtin import cpp_compiler

    available = {
        "vllm": importlib.util.find_spec("vllm") is not None,
        "builtin-compile": preset == "cpu" and cpp_compiler() is not None,
    }
    return [e for e in ENGINES if available.get(e, True)]


@dataclass
class Result:
    side: str
    engine: str  # ours: the rollout engine; TRL: its own generate
    step_times_s: list[float]  # timed steps only
    tokens_per_step: int
    response_length: float  # mean over all steps, as the trainer itself reports it
    padded_length: float  # the shortest step's longest response: every step generated and trained this far

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_times_s)

    @property
    def steps_per_s(self) -> float:
        return 1.0 / self.median_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.median_s


def run_side(side: str, engine: str, w: Workload, model: str, steps: int, warmup: int, out: Path, workers: int = 1,
             threads: int | None = None):
    """Warm-up + timed steps of one trainer, in a fresh process (bench/_side.py says why); its SideRun. threads:
    torch's threads in that process (OMP_NUM_THREADS), as many as the cores where None."""
    out.mkdir(parents=True)
    command = [sys.executable, str(BENCH / "_side.py"), side, engine, w.preset, model, str(warmup + steps), str(workers),
               str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    finished = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if finished.returncode != 0:
        raise RuntimeError(f"{side} ({engine}) failed:\n{finished.stdout[-4000:]}")
    run = SideRun(**json.loads((out / "side.json").read_text()))
    if len(run.step_times_s) != warmup + steps:
        raise RuntimeError(f"{side}: expected {warmup + steps} step times, got {len(run.step_times_s)}")
    return run


def timed(side: str, engine: str, w: Workload, run: SideRun, warmup: int) -> Result:
    return Result(side, engine, run.step_times_s[warmup:], w.tokens_per_step, run.response_length, run.padded_length)


def render(w: Workload, rounds: list[list[Result]], steps: int, warmup: int) -> str:
    """The table: per trainer the median over every round's timed steps, and its ratio to TRL's steps/s (with more
    than one round: the median of the rounds' ratios, each taken within its round, and their range)."""
    lines = [
        f"preset {w.preset}: {w.prompts} prompts x {w.samples} samples x {w.new_tokens} tokens, {w.dtype} on "
        f"{w.device}; median of {steps} steps after {warmup} warm-up" + (f", {len(rounds)} rounds" if len(rounds) > 1 else ""),
        f"{'trainer':<32}{'s/step':>9}{'steps/s':>9}{'tokens/s':>10}{'len mean/pad':>14}{'vs TRL':>9}",
    ]
    for i, r in enumerate(rounds[0]):
        runs = [results[i] for results in rounds]
        merged = Result(r.side, r.engine, [t for run in runs for t in run.step_times_s], r.tokens_per_step,
                        statistics.mean(run.response_length for run in runs), min(run.padded_length for run in runs))
        length = f"{merged.response_length:.1f}/{merged.padded_length:.0f}"
        name = SIDES[r.side] if r.side == "trl" else f"{SIDES[r.side]} ({r.engine})"
        ratios = [ratio_to_trl(results, i) for results in rounds]
        ratio = ""
        if None not in ratios:
            ratio = f"{statistics.median(ratios):>8.2f}x"
            if len(ratios) > 1:
                ratio += f"  (rounds {min(ratios):.2f}x-{max(ratios):.2f}x)"
        lines.append(f"{name:<32}{merged.median_s:>9.3f}{merged.steps_per_s:>9.2f}{merged.tokens_per_s:>10,.0f}"
                     f"{length:>14}{ratio}")
    return "\n".join(lines)


def ratio_to_trl(results: list[Result], i: int) -> float | None:
    """Result i's steps/s over TRL's in the same round; None for TRL itself or without a TRL run."""
    trl = next((r for r in results if r.side == "trl"), None)
    if trl is None or results[i] is trl:
        return None
    return results[i].steps_per_s / trl.steps_per_s


def run_scaling(w: Workload, model: str, steps: int, warmup: int, tmp: Path, workers: int) -> tuple[str, dict]:
    """Ours on 1 worker (in-process, the default) and on `workers` Ray workers, the same batch and seed: s/step,
    tokens/s, the rollout phase's wall time (every worker generates its share of the prompts) and its share of one
    worker's, and the controller's own share of a step (the time outside the workers' methods: dispatch, transfers,
    advantages, metrics)."""
    lines = [f"{'workers':<21}{'s/step':>9}{'tokens/s':>10}{'scaling':>9}{'rollout s':>11}{'of 1':>7}"
             f"{'controller':>12}"]
    base = base_gen = None
    figures = {}
    for n in (1, workers):
        # one worker as each Ray worker is: one CPU (Ray gives a worker of trainer.cpus_per_worker=1 one thread)
        threads = 1 if n == 1 and w.device == "cpu" else None
        run = run_side("ours", "builtin", w, model, steps, warmup, tmp / f"ours-{n}-workers", workers=n, threads=threads)
        median = statistics.median(run.step_times_s[warmup:])
        gen = statistics.median(run.gen_s[warmup:])
        overhead = statistics.median(c / t for c, t in zip(run.controller_s[warmup:], run.step_times_s[warmup:]))
        base, base_gen = base or median, base_gen or gen
        where = "in-process, 1 CPU" if n == 1 and w.device == "cpu" else "in-process" if n == 1 else "Ray"
        lines.append(f"{f'{n} ({where})':<21}{median:>9.3f}{w.tokens_per_step / median:>10,.0f}"
                     f"{base / median:>8.2f}x{gen:>11.3f}{gen / base_gen:>6.0%}{overhead:>12.1%}")
        figures[n] = {"s_per_step": median, "rollout_s": gen, "rollout_of_one": gen / base_gen, "controller": overhead,
                      "response_length": run.response_length}
    return "\n".join(lines), figures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    p.add_argument("--steps", type=int, default=5, help="timed steps per side (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--only", choices=sorted(SIDES), help="run one side only")
    p.add_argument("--rounds", type=int, default=1, help="run every side this many times, interleaved (the machine's "
                   "speed drifts: each round's ratio is taken within it)")
    p.add_argument("--json", type=Path, help="also write the results to this file")
    p.add_argument("--engines", help="ours' rollout engines, comma-separated (default: every installed one of "
                   f"{','.join(ENGINES)})")
    p.add_argument("--workers", type=int, help="also run ours on 1 and on N workers (Ray): scaling and controller overhead")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        p.error("--steps and --rounds must be >= 1 and --warmup >= 0")
    if args.workers is not None and args.workers < 2:
        p.error("--workers must be 2 or more (1 worker is the in-process run it is compared with)")

    w = PRESETS[args.preset]
    import torch

    if w.device == "cuda" and not torch.cuda.is_available():
        print("error: the gpu preset needs a CUDA GPU and none is visible here; use --preset cpu", file=sys.stderr)
        return 2

    from _models import model_dir

    engines = args.engines.split(",") if args.engines else installed_engines(args.preset)
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        p.error(f"unknown engine(s) {', '.join(unknown)}: choose from {', '.join(ENGINES)}")
    runs = [("trl", "generate")] if args.only != "ours" else []
    runs += [("ours", e) for e in engines] if args.only != "trl" else []
    with tempfile.TemporaryDirectory(prefix="grpo_vs_trl-") as d:
        tmp = Path(d)
        model = model_dir(w, tmp)
        rounds = [
            [
                timed(side, engine, w, run_side(side, engine, w, model, args.steps, args.warmup,
                                                 tmp / f"round-{n}" / f"{side}-{engine}"), args.warmup)
                for side, engine in runs
            ]
            for n in range(args.rounds)
        ]
        print(render(w, rounds, args.steps, args.warmup))
        scaling = None
        if args.workers:
            text, scaling = run_scaling(w, model, args.steps, args.warmup, tmp, args.workers)
            print(text)

    if args.json:
        payload = {
            "workload": asdict(w),
            "steps": args.steps,
            "warmup": args.warmup,
            "rounds": [
                [
                    {**asdict(r), "median_s": r.median_s, "steps_per_s": r.steps_per_s, "tokens_per_s": r.tokens_per_s}
                    for r in results
                ]
                for results in rounds
            ],
            "workers": scaling,  # --workers: ours on 1 and N workers, the rollout phase's share included
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
