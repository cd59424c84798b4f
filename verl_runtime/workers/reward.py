"""The reward role: decode responses and score them (a rule-based or custom function, or a reward model)."""

from __future__ import annotations

import torch

from verl_runtime.config import Config
from verl_runtime.controller import DP_SPLIT, register
from verl_runtime.rewards import RewardModelScorer, load_reward_fn


class RewardWorker:
    def __init__(self, config: Config, tokenizer, device: torch.device):
        self.tokenizer = tokenizer
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
                float(self.function(source, text, truth, extra))
                for source, text, truth, extra in zip(
                    batch["data_source"], texts, batch["ground_truth"], batch["extra_info"]
                )
            ]
        return torch.tensor(scores, dtype=torch.float32)

    def decode(self, batch: dict) -> list[str]:
        """Response texts up to (not including) the first EOS."""
        # Whole tensors to lists once: indexing each row as a tensor costs more than the decoding.
        rows, masks = batch["responses"].tolist(), batch["response_mask"].tolist()
        ids = [[token for token, keep in zip(row, mask) if keep] for row, mask in zip(rows, masks)]
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)
