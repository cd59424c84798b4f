"""Seconds per step, synchronous against trainer.mode=separate_async, on the CPU, in one run.

    python bench/async_rollout.py [--steps 8] [--warmup 2] [--sync-threads 1|2] [--json FILE]

Both runs train the same preset (a Qwen2-shape model of bench/_models.py BENCH_SHAPE, random weights; GRPO on the
toy letter task, 4 prompts x 4 samples x 64 new tokens, the builtin engine; generation and the update take about
equal shares of a sync step, as on a GPU) as `python -m verl_runtime train`, one after the other. separate_async runs
on two CPU workers, one torch thread each: the trainer, and one rollout worker that generates the next batch while
the trainer updates on this one (rollout.nnodes=1, rollout.n_gpus_per_node=1, one batch ahead). The sync run is one
worker doing both, one torch thread (the ceiling of the overlap is then about 2x); `--sync-threads 2` gives it both
cores instead. Reported: the median of timing_s/step over the timed steps (the warm-up steps left out), the speedup
(sync / async), and the async run's mean staleness.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from _models import bench_shape_model  # noqa: E402

PRESET = {
    "data.train_files": "toy:letter", "data.toy_size": 256, "data.batch_size": 4, "data.max_prompt_length": 64,
    "data.max_response_length": 64, "rollout.name": "builtin", "rollout.n": 4, "algorithm.adv_estimator": "grpo",
    "actor.lr": 1e-5, "actor.use_kl_loss": False, "trainer.device": "cpu", "trainer.seed": 1,
    "trainer.val_before_train": False, "trainer.test_freq": -1, "trainer.save_freq": -1, "trainer.tensorboard": False,
    "trainer.resume": "disable",
}
ASYNC = {"trainer.mode": "separate_async", "rollout.nnodes": 1, "rollout.n_gpus_per_node": 1}


def train(model: str, run_dir: Path, steps: int, extra: dict, threads: int | None) -> list[dict]:
    """One run as `python -m verl_runtime train`; its metrics, step by step."""
    settings = {**PRESET, **extra, "model.path": model, "trainer.total_training_steps": steps,
                "trainer.run_dir": str(run_dir)}
    command = [sys.executable, "-m", "verl_runtime", "train", str(ROOT / "examples" / "quickstart.yaml")]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"error: the {extra.get('trainer.mode', 'sync')} run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if "timing_s/step" in row]


def median_of(rows: list[dict], key: str, warmup: int) -> float:
    return statistics.median(row[key] for row in rows[warmup:] if key in row)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out at the start of each run")
    parser.add_argument("--sync-threads", type=int, default=1,
                        help="torch threads of the sync run (1: one worker's, as each async worker has; 2: all cores)")
    parser.add_argument("--prompts", type=int, default=PRESET["data.batch_size"], help="prompts per step")
    parser.add_argument("--new-tokens", type=int, default=PRESET["data.max_response_length"], help="tokens per response")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    total = args.warmup + args.steps
    size = {"data.batch_size": args.prompts, "data.max_response_length": args.new_tokens}
    with tempfile.TemporaryDirectory() as tmp:
        model = bench_shape_model(Path(tmp) / "model")
        sync = train(model, Path(tmp) / "sync", total, size, args.sync_threads)
        separate = train(model, Path(tmp) / "async", total, {**size, **ASYNC}, None)
    result = {
        "sync_s_per_step": median_of(sync, "timing_s/step", args.warmup),
        "async_s_per_step": median_of(separate, "timing_s/step", args.warmup),
        "staleness_mean": statistics.mean(row["training/off_policy/trajectory_staleness/mean"] for row in separate),
        "sync_gen_s": median_of(sync, "timing_s/gen", args.warmup),
        "sync_update_s": median_of(sync, "timing_s/update_actor", args.warmup),
        "async_wait_prev_gen_s": median_of(separate, "timing_s/wait_prev_gen", args.warmup),
        "async_update_s": median_of(separate, "timing_s/update_actor", args.warmup),
        "sync_threads": args.sync_threads,
        "steps": args.steps,
        "preset": {"prompts": args.prompts, "samples": PRESET["rollout.n"], "new_tokens": args.new_tokens,
                   "model": "bench/_models.py BENCH_SHAPE"},
    }
    result["speedup"] = result["sync_s_per_step"] / result["async_s_per_step"]
    print(f"sync {result['sync_s_per_step']:.3f} s/step (gen {result['sync_gen_s']:.3f}, update "
          f"{result['sync_update_s']:.3f}; {args.sync_threads} threads) | separate_async "
          f"{result['async_s_per_step']:.3f} s/step (waited {result['async_wait_prev_gen_s']:.3f}, update "
          f"{result['async_update_s']:.3f}; 1 + 1 threads) | speedup {result['speedup']:.2f}x | staleness "
          f"{result['staleness_mean']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
