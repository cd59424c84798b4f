"""The workload through verl_runtime's public API: a GRPO config, a data file, SingleControllerTrainer.fit()."""

import contextlib
import json
import statistics
from pathlib import Path

from _workload import SideRun, Workload, chat, engine_options, prompt_texts

REWARD_FN = f"{Path(__file__).resolve().parent / '_reward.py'}:compute_score"


def write_data(w: Workload, total_steps: int, path: Path) -> Path:
    """verl-layout rows, enough distinct prompts that one epoch covers every step."""
    rows = [
        {
            "data_source": "bench/letter",
            "prompt": chat(text),
            "ability": "toy",
            "reward_model": {"style": "rule", "ground_truth": "a"},
            "extra_info": {"index": i},
        }
        for i, text in enumerate(prompt_texts(w.prompts * total_steps))
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def ours_config(
    w: Workload, model_dir: str, data_file: Path, total_steps: int, run_dir: Path, workers: int = 1, engine: str = "builtin"
):
    from verl_runtime.config import get_default_config

    c = get_default_config("grpo")
    c.model.path = model_dir
    c.model.dtype = w.dtype
    c.model.gradient_checkpointing = False
    c.data.train_files = [str(data_file)]
    c.data.batch_size = w.prompts
    c.data.max_response_length = w.new_tokens
    c.data.shuffle = True
    c.rollout.name, c.rollout.compile = engine_options(engine)
    c.rollout.n = w.samples
    c.rollout.temperature = 1.0
    c.rollout.log_prob_micro_batch_size_per_gpu = w.micro_batch
    # One optimizer step per batch, in micro-batches of micro_batch sequences; no KL term anywhere.
    c.actor.ppo_epochs = 1
    c.actor.ppo_mini_batch_size = w.prompts
    c.actor.ppo_micro_batch_size_per_gpu = w.micro_batch
    c.actor.lr = w.lr
    c.actor.weight_decay = 0.0
    c.actor.grad_clip = 1.0
    c.actor.use_kl_loss = False
    c.actor.entropy_coeff = 0.0
    c.algorithm.use_kl_in_reward = False
    c.reward.function = REWARD_FN
    c.trainer.device = w.device
    c.trainer.seed = w.seed
    c.trainer.total_training_steps = total_steps
    c.trainer.run_dir = str(run_dir)
    c.trainer.resume = "disable"
    c.trainer.test_freq = -1
    c.trainer.save_freq = -1
    c.trainer.n_workers = workers  # more than 1: Ray actors, data-parallel over gloo (NCCL on GPUs)
    return c


def run_ours(
    w: Workload, model_dir: str, total_steps: int, out_dir: Path, workers: int = 1, engine: str = "builtin"
) -> SideRun:
    from verl_runtime.trainer import SingleControllerTrainer

    data = write_data(w, total_steps, out_dir / "train.jsonl")
    run_dir = out_dir / "run"
    config = ours_config(w, model_dir, data, total_steps, run_dir, workers, engine)
    # The trainer's console lines go to a file, so the benchmark prints only its table.
    with open(out_dir / "console.log", "w") as log, contextlib.redirect_stdout(log):
        trainer = SingleControllerTrainer(config)
        trainer.fit()
        trainer.close()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [m for m in map(json.loads, filter(None, lines)) if "timing_s/step" in m]
    return SideRun(
        [s["timing_s/step"] for s in steps],
        statistics.mean(s["response_length/mean"] for s in steps),
        min(s["response_length/max"] for s in steps),
        controller_s=[s["timing_s/controller"] for s in steps],
        gen_s=[s["timing_s/gen"] for s in steps],
    )
