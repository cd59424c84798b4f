"""The reward role: decode responses and score them (a rule-based or custom function, or a reward model); the
reward manager (rewards/managers.py) turns a function's result into the reward and its extra information."""

from __future__ import annotations

import torch

from verl_runtime.config import Config
from verl_runtime.controller import DP_SPLIT, register
from verl_runtime.errors import UserError
from verl_runtime.rewards import RewardModelScorer, compute_score_result, load_reward_fn
from verl_runtime.rewards.custom import call_error, checked_score
from verl_runtime.rewards.managers import managed_reward


class RewardWorker:
    def __init__(self, config: Config, tokenizer, device: torch.device):
        self.tokenizer = tokenizer
        self.spec = config.reward.function  # a user's function: its failures are reported as theirs
        # the built-in scorers' results as verl's default_compute_score gives them (dicts too), for the manager
        self.function = load_reward_fn(config.reward.function) if config.reward.function else compute_score_result
        self.reward_config = config.reward
        self.reward_model = RewardModelScorer(config.reward.model_path, device) if config.reward.model_path else None

    @register(DP_SPLIT)
    def score(self, batch: dict) -> torch.Tensor:
        """One float reward per sample, in batch order."""
        return self.score_details(batch)["scores"]

    @register(DP_SPLIT)
    def score_details(self, batch: dict) -> dict:
        """{"scores": one float reward per sample, "infos": one dict of extra information per sample (verl's
        reward_extra_info: the items of a scorer's dict, dapo's acc and overlong penalty)}, in batch order."""
        texts = self.decode(batch)
        if self.reward_model is not None:
            scores = self.reward_model.score_chats(batch["raw_prompt"], texts)
            return {"scores": torch.tensor(scores, dtype=torch.float32), "infos": [{} for _ in scores]}
        lengths = response_attention(batch).sum(-1).tolist()  # verl's valid_response_length: EOS included
        managed = [
            managed_reward(self.reward_config, self.score_one(source, text, truth, extra), length)
            for source, text, truth, extra, length in zip(
                batch["data_source"], texts, batch["ground_truth"], batch["extra_info"], lengths
            )
        ]
        return {"scores": torch.tensor([reward for reward, _ in managed], dtype=torch.float32),
                "infos": [info for _, info in managed]}

    def score_one(self, data_source, text: str, ground_truth, extra_info) -> float | dict:
        """The scorer's result: a float, or verl's dict with a float "score"."""
        if not self.spec:  # a built-in scorer: a failure there is a bug of ours, with its traceback
            return self.function(data_source, text, ground_truth, extra_info)
        try:
            value = self.function(data_source, text, ground_truth, extra_info)
        except (UserError, torch.OutOfMemoryError):
            raise  # already one line, or made one by the trainer (verl_runtime/oom.py)
        except Exception as exc:
            raise call_error(self.spec, exc, data_source) from None
        score = checked_score(self.spec, value, data_source)
        return {**value, "score": score} if isinstance(value, dict) else score

    def decode(self, batch: dict) -> list[str]:
        return decode_responses(self.tokenizer, batch)


def decode_responses(tokenizer, batch: dict) -> list[str]:
    """Response texts up to (not including) the first EOS; a multi-turn response with its tool responses, as verl
    decodes the attention mask's response part."""
    # Whole tensors to lists once: indexing each row as a tensor costs more than the decoding.
    rows, masks = batch["responses"].tolist(), response_attention(batch).tolist()
    ids = [[token for token, keep in zip(row, mask) if keep] for row, mask in zip(rows, masks)]
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def response_attention(batch: dict):
    """The attention mask's response part: every real response token, tool responses included (the response mask
    leaves those out of the loss; single-turn the two are the same)."""
    return batch["attention_mask"][:, -batch["responses"].shape[1]:]
