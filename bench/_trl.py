"""The workload through TRL's GRPOTrainer."""

import statistics
import time

from _reward import trl_reward
from _workload import SideRun, Workload, chat, prompt_texts


def _step_timer():
    """A callback that records the time between consecutive optimizer steps (generation included)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.marks: list[float] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.marks = [time.perf_counter()]

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())

        @property
        def step_times(self) -> list[float]:
            return [b - a for a, b in zip(self.marks, self.marks[1:])]

    return StepTimer()


def trl_config(w: Workload, total_steps: int, out_dir: str):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=out_dir,
        # TRL's batch sizes count completions. One generation of prompts x samples feeds exactly one optimizer
        # step, taken in micro-batches of micro_batch completions.
        per_device_train_batch_size=w.micro_batch,
        gradient_accumulation_steps=w.accumulation,
        steps_per_generation=w.accumulation,
        num_generations=w.samples,
        num_iterations=1,
        max_completion_length=w.new_tokens,
        # EOS is suppressed until the last token, so every completion is exactly new_tokens long.
        generation_kwargs={"min_new_tokens": w.new_tokens},
        temperature=1.0,
        beta=0.0,
        learning_rate=w.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=total_steps,
        # Same numerics as ours: weights in the preset's dtype, no activation recomputation.
        model_init_kwargs={"dtype": w.dtype},
        bf16=w.dtype == "bfloat16",
        gradient_checkpointing=False,
        use_cpu=w.device == "cpu",
        seed=w.seed,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )


def run_trl(w: Workload, model_dir: str, total_steps: int, out_dir: str) -> SideRun:
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    rows = [{"prompt": chat(p)} for p in prompt_texts(w.prompts * total_steps)]
    timer = _step_timer()
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=trl_reward,
        args=trl_config(w, total_steps, out_dir),
        train_dataset=Dataset.from_list(rows),
        callbacks=[timer],
    )
    trainer.remove_callback(PrinterCallback)  # metrics are still logged every step, just not printed
    trainer.train()
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    return SideRun(
        timer.step_times,
        statistics.mean(h["completions/mean_length"] for h in logs),
        min(h["completions/max_length"] for h in logs),
    )
