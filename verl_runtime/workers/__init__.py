"""The roles one controller drives: actor (policy + rollout + PPO update), critic, reference, reward.

A batch passed between them is a dict: tensors (input_ids, attention_mask, position_ids, responses,
response_mask, and later old_log_prob, ref_log_prob, values, advantages, returns) and per-sample lists
(uid, data_source, ground_truth, extra_info, raw_prompt).
"""

from verl_runtime.workers.actor import ActorWorker
from verl_runtime.workers.critic import CriticWorker
from verl_runtime.workers.reference import ReferenceWorker
from verl_runtime.workers.reward import RewardWorker

__all__ = ["ActorWorker", "CriticWorker", "ReferenceWorker", "RewardWorker"]
