"""The critic (PPO with GAE only): a value model, its optimizer and the clipped value-loss update."""

from __future__ import annotations

from collections import defaultdict

import torch

from verl_runtime.algorithms import compute_value_loss, masked_mean
from verl_runtime import offload
from verl_runtime.config import Config
from verl_runtime.controller import ALL, DP_SPLIT, chunks, register
from verl_runtime.models import load_value_model, response_values
from verl_runtime.workers import optim, parallel
from verl_runtime.workers.actor import MicroBatching, disable_dropout, mixed_precision, token_budget


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
        parallel.broadcast_weights(self.model)  # the value head is freshly initialised on each rank
        sharded = config.critic.strategy == "fsdp" and parallel.world_size() > 1
        if sharded:
            parallel.shard(self.model, offload_policy=config.critic.offload_policy)
        self.optimizer = optim.build_optimizer(self.model, config.critic, sharded=parallel.is_sharded(self.model))
        self.offload = offload.Offload.for_role(config.critic, device, sharded)
        self.offload.release({"model": self.model}, self.optimizer)

    def offload_parts(self, phase: str) -> tuple[dict, torch.optim.Optimizer | None]:
        """A forward needs the model on the device, an update the model and optimizer, a checkpoint nothing unsharded
        (the offloaded state is whole in host memory) or its shards (FSDP gathers them)."""
        if phase == offload.STATE and not parallel.is_sharded(self.model):
            return {}, None
        return {"model": self.model}, (None if phase == offload.FORWARD else self.optimizer)

    def _values(self, batch: dict) -> torch.Tensor:
        cfg = self.config.critic
        packed = self.config.model.use_remove_padding if cfg.use_remove_padding is None else cfg.use_remove_padding
        with self.mixed_precision():
            values = response_values(
                self.model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["responses"].shape[1],
                packed=packed,
            )
        return values.float()

    def _split(self, size: int, forward: bool) -> MicroBatching:
        """verl's critic micro-batches: fixed sizes, or (use_dynamic_bsz) the forward's or the update's token budget."""
        cfg = self.config.critic
        name = "forward_max_token_len_per_gpu" if forward else "ppo_max_token_len_per_gpu"
        tokens = (cfg.forward_max_token_len_per_gpu if forward else None) or cfg.ppo_max_token_len_per_gpu
        return MicroBatching(size, *token_budget(self.config, cfg.use_dynamic_bsz, tokens, "critic", name))

    @register(DP_SPLIT)
    @offload.phase(offload.FORWARD)
    def compute_values(self, batch: dict) -> torch.Tensor:
        """Values [B, R] of the states before each response token, masked to the response."""
        split = self._split(self.config.critic.ppo_micro_batch_size_per_gpu or len(batch["responses"]), forward=True)
        with torch.inference_mode():
            values = split.per_sample(batch, lambda micro: self._values(micro) * micro["response_mask"])
        return values.clone()

    @register(DP_SPLIT)
    @offload.phase(offload.TRAIN)
    def update(self, batch: dict, mini_batch_size: int, lr: float | None = None) -> dict[str, float]:
        """Fit the values to the returns: PPO epochs over mini-batches, micro-batch gradient accumulation.
        ``lr``: this step's learning rate (the controller's schedule); None keeps the optimizer's."""
        cfg = self.config.critic
        if lr is not None:
            optim.set_learning_rate(self.optimizer, lr)
        stats = defaultdict(list)
        split = self._split(cfg.ppo_micro_batch_size_per_gpu or mini_batch_size, forward=False)
        self.model.train()
        for _ in range(self.config.actor.ppo_epochs):
            for mini in chunks(batch, mini_batch_size // parallel.world_size()):  # this rank's share of it
                info = parallel.global_batch_info(mini["response_mask"])
                totals = defaultdict(float)
                self.optimizer.zero_grad(set_to_none=True)
                for micro in split.micro_batches(mini)[0]:
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
                values, grad_norm = parallel.finish_mini_batch(
                    self.model, self.optimizer, totals, cfg.grad_clip, "critic/vf_loss", "critic.lr", cfg.lr
                )
                for key, value in values.items():
                    stats[key].append(value)
                stats["critic/grad_norm"].append(grad_norm)
        self.model.eval()
        return {key: sum(v) / len(v) for key, v in stats.items()}

    @register(ALL)
    @offload.phase(offload.STATE)
    def state_dict(self) -> dict | None:
        """The whole model and optimizer state (rank 0 returns it; every rank takes part under FSDP)."""
        state = parallel.full_state(self.model, self.optimizer)
        if self.offload.active:  # no device copy of it outlives the phase
            state = offload.to_host(state)
        return state if parallel.rank() == 0 else None

    @register(ALL)
    @offload.phase(offload.STATE)
    def load_state_dict(self, state: dict) -> None:
        parallel.load_full_state(self.model, self.optimizer, state)
