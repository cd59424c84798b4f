"""The critic (PPO with GAE only): a value model, its optimizer and the clipped value-loss update."""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import nn

from verl_runtime.algorithms import compute_value_loss, make_global_batch_info, masked_mean
from verl_runtime.config import Config
from verl_runtime.controller import DP_SPLIT, RANK_ZERO, chunks, register
from verl_runtime.errors import TrainingError
from verl_runtime.models import load_value_model, response_values
from verl_runtime.workers.actor import disable_dropout, mixed_precision


class CriticWorker:
    def __init__(self, config: Config, device: torch.device):
        self.config = config
        self.mixed_precision = mixed_precision(config.model.dtype, device)
        self.model = load_value_model(
            config.critic.model_path or config.model.path, torch.float32, device,
            gradient_checkpointing=config.model.gradient_checkpointing,
        )
        disable_dropout(self.model)
        self.model.eval()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.critic.lr, weight_decay=config.critic.weight_decay
        )

    def _values(self, batch: dict) -> torch.Tensor:
        with self.mixed_precision():
            values = response_values(
                self.model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["responses"].shape[1]
            )
        return values.float()

    @register(DP_SPLIT)
    def compute_values(self, batch: dict) -> torch.Tensor:
        """Values [B, R] of the states before each response token, masked to the response."""
        size = self.config.critic.ppo_micro_batch_size_per_gpu or len(batch["responses"])
        with torch.inference_mode():
            values = torch.cat([self._values(micro) * micro["response_mask"] for micro in chunks(batch, size)])
        return values.clone()

    @register(DP_SPLIT)
    def update(self, batch: dict, mini_batch_size: int) -> dict[str, float]:
        """Fit the values to the returns: PPO epochs over mini-batches, micro-batch gradient accumulation."""
        cfg = self.config.critic
        stats = defaultdict(list)
        self.model.train()
        for _ in range(self.config.actor.ppo_epochs):
            for mini in chunks(batch, mini_batch_size):
                info = make_global_batch_info(mini["response_mask"])
                totals = defaultdict(float)
                self.optimizer.zero_grad(set_to_none=True)
                for micro in chunks(mini, cfg.ppo_micro_batch_size_per_gpu or mini_batch_size):
                    mask = micro["response_mask"]
                    vpreds = self._values(micro)
                    vf_loss, vf_clipfrac = compute_value_loss(
                        vpreds, micro["returns"], micro["values"], mask, cfg.cliprange_value,
                        loss_agg_mode=cfg.loss_agg_mode, global_batch_info=info,
                    )
                    vf_loss.backward()
                    share = mask.sum() / info["batch_num_tokens"]
                    totals["critic/vf_loss"] += vf_loss.detach()
                    totals["critic/vf_clipfrac"] += vf_clipfrac.detach() * share
                    totals["critic/vpred_mean"] += masked_mean(vpreds.detach(), mask) * share
                grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
                values = {key: float(value) for key, value in totals.items()}
                if not (math.isfinite(values["critic/vf_loss"]) and math.isfinite(float(grad_norm))):
                    raise TrainingError(
                        f"the critic diverged (loss {values['critic/vf_loss']:.4g}, gradient norm {float(grad_norm):.4g}): "
                        f"lower critic.lr (now {cfg.lr:g}) or check the rewards"
                    )
                self.optimizer.step()
                for key, value in values.items():
                    stats[key].append(value)
                stats["critic/grad_norm"].append(float(grad_norm))
        self.model.eval()
        metrics = {key: sum(v) / len(v) for key, v in stats.items()}
        metrics["critic/lr"] = cfg.lr
        return metrics

    @register(RANK_ZERO)
    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    @register(RANK_ZERO)
    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
