"""Rollout engines behind one interface (see base.py): "hf" (transformers generate), "builtin" (our decode loop,
CUDA graphs on GPU), "vllm" (vLLM's offline engine, weights synced in memory)."""

from verl_runtime.errors import ConfigError
from verl_runtime.rollout.base import RolloutBatch, RolloutEngine, SamplingParams

ENGINES = ("hf", "builtin", "vllm")


def make_rollout_engine(name: str, model, tokenizer, device, **options) -> RolloutEngine:
    """The rollout engine called name, generating with model (the actor's policy).

    options go to the vLLM engine (gpu_memory_utilization, tensor_parallel_size, enable_sleep_mode, dtype) and to the
    built-in one (compile); the HF engine takes none.
    """
    if name == "hf":
        from verl_runtime.rollout.hf import HFRolloutEngine

        return HFRolloutEngine(model, tokenizer, device)
    if name == "builtin":
        from verl_runtime.rollout.builtin import BuiltinRolloutEngine

        return BuiltinRolloutEngine(model, tokenizer, device, **options)
    if name == "vllm":
        from verl_runtime.rollout.vllm import VLLMRolloutEngine

        return VLLMRolloutEngine(model, tokenizer, device, **options)
    raise ConfigError(f"unknown rollout engine {name!r}: choose one of {', '.join(ENGINES)}")


__all__ = ["ENGINES", "RolloutBatch", "RolloutEngine", "SamplingParams", "make_rollout_engine"]
