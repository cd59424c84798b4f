"""The reward role: decode responses and score them (a rule-based or custom function, or a reward model)."""

from __future__ import annotations

import torch

from verl_runtime.config import Config
from verl_runtime.controller import DP_SPLIT, register
from verl_runtime.errors import UserError
from verl_runtime.rewards import RewardModelScorer, load_reward_fn
from verl_runtime.rewards.custom import call_error, checked_score


class RewardWorker:
    def __init__(self, config: Config, tokenizer, device: torch.device):
        self.tokenizer = tokenizer
        self.spec = config.reward.function  # a user's function: its failures are reported as theirs
        self.function = load_reward_fn(config.reward.function)
        self.reward_model = RewardModelScorer(config.reward.model_path, device) if config.reward.model_path else None

    @register(DP_SPLIT)
    def score(self, batch: dict) -> torch.Tensor:
        """One float score per sample, in batch order."""
        texts = self.decode(batch)
        if self.reward_model is not None:
            scores = self.reward_model.score_chats(batch["raw_prompt"], texts)
        else:
            scores = [
                self.score_one(source, text, truth, extra)
                for source, text, truth, extra in zip(
                    batch["data_source"], texts, batch["ground_truth"], batch["extra_info"]
                )
            ]
        return torch.tensor(scores, dtype=torch.float32)

    def score_one(self, data_source, text: str, ground_truth, extra_info) -> float:
        if not self.spec:  # a built-in scorer: a failure there is a bug of ours, with its traceback
            return float(self.function(data_source, text, ground_truth, extra_info))
        try:
            value = self.function(data_source, text, ground_truth, extra_info)
        except (UserError, torch.OutOfMemoryError):
            raise  # already one line, or made one by the trainer (out_of_memory_hint)
        except Exception as exc:
            raise call_error(self.spec, exc, data_source) from None
        return checked_score(self.spec, value, data_source)

    def decode(self, batch: dict) -> list[str]:
        """Response texts up to (not including) the first EOS."""
        # Whole tensors to lists once: indexing each row as a tensor costs more than the decoding.
        rows, masks = batch["responses"].tolist(), batch["response_mask"].tolist()
        ids = [[token for token, keep in zip(row, mask) if keep] for row, mask in zip(rows, masks)]
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)
