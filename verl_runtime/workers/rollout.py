"""The rollout's own worker (trainer.mode=separate_async): a copy of the policy and an engine, on a device of its own.

It only generates. The controller pushes the trained weights to it after each update (``load_weights``), tagged
with their version, the number of updates they hold; every sample it returns carries the version that generated it.
Calls reach it one at a time, in the order they were made (a worker process serves one call after another), so a
push made while it generates waits for that generation to end: a push never cuts a generation short.
"""

from __future__ import annotations

import copy

import torch

from verl_runtime.config import Config
from verl_runtime.controller import ALL, PROMPT_SPLIT, register
from verl_runtime.models import load_causal_lm
from verl_runtime.rollout import SamplingParams
from verl_runtime.workers import parallel
from verl_runtime.workers.actor import disable_dropout, make_engine, mixed_precision, sample

VERSION_KEY = "weight_version"  # per sample: the weights' version (updates they hold) that generated it


class RolloutWorker:
    def __init__(self, config: Config, tokenizer, device: torch.device, rank: int | None = None,
                 world_size: int | None = None):
        """rank, world_size: this worker's place in the rollout's pool (None: its torch.distributed group's, as a Ray
        pool sets up; a process of the process backend is given them)."""
        self.rank = parallel.rank() if rank is None else rank
        self.world_size = parallel.world_size() if world_size is None else world_size
        # vLLM holds its own copy of the weights on the GPU: the policy this worker loads pushes into it from host
        # memory, and with the GPU its own, it never sleeps between generations
        vllm = config.rollout.name == "vllm"
        if vllm:
            config = copy.deepcopy(config)
            config.rollout.enable_sleep_mode = False
        self.model = load_causal_lm(config.model.path, torch.float32, torch.device("cpu") if vllm else device)
        disable_dropout(self.model)
        self.model.eval()
        self.precision = mixed_precision(config.model.dtype, device)
        self.engine = make_engine(config, self.model, tokenizer, device)
        self.version = 0

    @register(PROMPT_SPLIT)
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> dict:
        """Sample this worker's share of the prompts, as the actor's generate does; each sample's weight version."""
        if not prompt_ids:
            return {}
        batch = sample(self.engine, prompt_ids, params, self.precision, self.rank, self.world_size)
        batch[VERSION_KEY] = [self.version] * len(batch["responses"])
        return batch

    @register(ALL)
    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Generate with these weights, `version` updates into the run, from the next call on."""
        self.model.load_state_dict(state)
        self.engine.sync_weights(self.model)
        self.version = version

    @register(ALL)
    def set_rng_state(self, state: torch.Tensor) -> None:
        """Continue the controller's random stream: a run that generates nothing ahead (max_off_policy_threshold=0)
        draws the same samples as a synchronous one."""
        torch.set_rng_state(state)

    @register(ALL)
    def weight_version(self) -> int:
        return self.version


def build_rollout_worker(config: Config, device: str, rank: int, world_size: int) -> RolloutWorker:
    """What a rollout worker process builds (controller/process_backend.py): seeded as the controller is, so that
    its model loads and samples the same numbers."""
    from verl_runtime.allocator import keep_freed_memory
    from verl_runtime.models import load_tokenizer
    from verl_runtime.seeding import seed_everything

    if torch.device(device).type == "cpu":
        keep_freed_memory()
    seed_everything(config.trainer.seed)
    return RolloutWorker(config, load_tokenizer(config.model.path), torch.device(device), rank, world_size)
