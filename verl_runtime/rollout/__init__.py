"""Rollout engines behind one interface (see base.py): "hf" (transformers generate)."""

from verl_runtime.errors import ConfigError
from verl_runtime.rollout.base import RolloutBatch, RolloutEngine, SamplingParams

ENGINES = ("hf",)


def make_rollout_engine(name: str, model, tokenizer, device) -> RolloutEngine:
    """The rollout engine called name, generating with model (the actor's policy)."""
    if name == "hf":
        from verl_runtime.rollout.hf import HFRolloutEngine

        return HFRolloutEngine(model, tokenizer, device)
    raise ConfigError(f"unknown rollout engine {name!r}: choose one of {', '.join(ENGINES)}")


__all__ = ["ENGINES", "RolloutBatch", "RolloutEngine", "SamplingParams", "make_rollout_engine"]
