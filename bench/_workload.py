"""The GRPO workload both trainers run: presets, prompts and the shared numbers."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Workload:
    preset: str
    prompts: int            # prompts per step
    samples: int            # completions per prompt (GRPO group size)
    new_tokens: int         # completion length: every step generates and trains this many tokens per sequence
    dtype: str              # "float32" | "bfloat16"
    device: str             # "cpu" | "cuda"
    micro_batch: int        # sequences per forward/backward pass (gradient accumulation up to the whole batch)
    lr: float = 1e-5
    seed: int = 0

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples

    @property
    def accumulation(self) -> int:
        return self.sequences // self.micro_batch

    @property
    def tokens_per_step(self) -> int:
        return self.sequences * self.new_tokens


PRESETS = {
    "cpu": Workload("cpu", prompts=8, samples=4, new_tokens=64, dtype="float32", device="cpu", micro_batch=32),
    "gpu": Workload("gpu", prompts=32, samples=8, new_tokens=256, dtype="bfloat16", device="cuda", micro_batch=32),
    # the rollout on several CPU workers (--workers): a model whose decode step is arithmetic, not per-operation
    # overhead (bench/_models.py BENCH_SHAPE), so that a worker with half the rows takes about half the time
    "cpu-scaling": Workload("cpu-scaling", prompts=32, samples=4, new_tokens=64, dtype="float32", device="cpu",
                            micro_batch=32),
}


def prompt_texts(n: int) -> list[str]:
    """n distinct short prompts for the letter task; the data cycles when a run needs more."""
    return [f"Task {i}: write the letter a as often as you can." for i in range(n)]


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@dataclass
class SideRun:
    """What one trainer reports: the wall time of every step (warm-up included) and its response lengths
    (mean, and the shortest per-step maximum: the padded length every step's generate and update ran over)."""

    step_times_s: list[float]
    response_length: float
    padded_length: float
    controller_s: list[float] = field(default_factory=list)  # ours: per step, time outside the workers' methods
    gen_s: list[float] = field(default_factory=list)  # ours: per step, the rollout phase's wall time (timing_s/gen)


def engine_options(engine: str) -> tuple[str, bool | None]:
    """rollout.name and rollout.compile of a bench engine name: builtin-compile is builtin with compile=true."""
    name, _, variant = engine.partition("-")
    return name, True if variant == "compile" else None
