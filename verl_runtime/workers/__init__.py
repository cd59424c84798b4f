"""The roles one controller drives: actor (policy + rollout + PPO update), critic, reference, reward.

A batch passed between them is a dict: tensors (input_ids, attention_mask, position_ids, responses,
response_mask, and later old_log_prob, ref_log_prob, values, advantages, returns) and per-sample lists
(uid, data_source, ground_truth, extra_info, raw_prompt).
"""

import torch

from verl_runtime.allocator import keep_freed_memory
from verl_runtime.workers.actor import ActorWorker
from verl_runtime.workers.critic import CriticWorker
from verl_runtime.workers.reference import ReferenceWorker
from verl_runtime.workers.reward import RewardWorker
from verl_runtime.workers.rollout import RolloutWorker

# rollout: the rollout's own workers (trainer.mode=separate_async), in a pool of their own
ROLE_CLASSES = {"actor": ActorWorker, "critic": CriticWorker, "ref": ReferenceWorker, "reward": RewardWorker,
                "rollout": RolloutWorker}


def build_roles(config, roles: list[str], tokenizer, device) -> dict:
    """The role objects named in `roles`, built in ROLE_CLASSES' order (the same random stream in any process)."""
    if torch.device(device).type == "cpu":
        keep_freed_memory()  # activations are freed and allocated again every step
    built = {}
    for name in (name for name in ROLE_CLASSES if name in roles):
        if name in ("actor", "reward", "rollout"):
            built[name] = ROLE_CLASSES[name](config, tokenizer, device)
        else:
            built[name] = ROLE_CLASSES[name](config, device)
    return built


__all__ = ["ROLE_CLASSES", "ActorWorker", "CriticWorker", "ReferenceWorker", "RewardWorker", "RolloutWorker",
           "build_roles"]
