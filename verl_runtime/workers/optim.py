"""The optimizer and its learning-rate schedule, as verl 0.9.1's FSDP engine builds them.

The optimizer is torch's AdamW with the section's lr, weight_decay and betas (verl's build_optimizer). The schedule
is verl's get_constant_schedule_with_warmup or get_cosine_schedule_with_warmup (verl/utils/torch_functional.py)
written as a pure function of the step: the controller, which counts the steps, gives each update its learning rate,
so a resumed run continues the schedule from its step with nothing more in the checkpoint.

Both read an actor or critic config section: lr, weight_decay, betas, lr_warmup_steps, lr_warmup_steps_ratio,
lr_scheduler_type, min_lr_ratio, num_cycles, zero_indexed_step (verl's ``*.optim.*`` names).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from verl_runtime.errors import TrainingError

def build_optimizer(model: nn.Module, cfg: Any, sharded: bool) -> torch.optim.AdamW:
    """AdamW over the model's trainable parameters (all of them, or LoRA's adapters): the fused kernel (one pass over
    all parameters, a third of foreach's time on the CPU) unless FSDP shards them, where the default implementation
    handles the DTensors."""
    return torch.optim.AdamW(trainable(model), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas),
                             fused=not sharded)


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The parameters the optimizer steps, in the model's order (checkpoints index the optimizer state by it)."""
    return [parameter for parameter in model.parameters() if parameter.requires_grad]


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def needs_total_steps(cfg: Any) -> bool:
    """Whether the schedule depends on the run's length: a cosine decay, or a warm-up given as a ratio of it."""
    return cfg.lr_scheduler_type == "cosine" or (cfg.lr_warmup_steps <= 0 and cfg.lr_warmup_steps_ratio > 0)


def num_warmup_steps(cfg: Any, total_steps: int) -> int:
    """lr_warmup_steps where positive, else lr_warmup_steps_ratio x the run's steps (verl's FSDP engine)."""
    return cfg.lr_warmup_steps if cfg.lr_warmup_steps > 0 else int(cfg.lr_warmup_steps_ratio * total_steps)


def learning_rate(cfg: Any, step: int, total_steps: int | None) -> float:
    """The learning rate after `step` scheduler steps (0: the first update's), as verl's LambdaLR gives it.

    As in verl the warm-up starts from 0: with warm-up, the first update has learning rate 0."""
    if total_steps is None:
        if needs_total_steps(cfg):
            raise TrainingError(
                f"the {cfg.lr_scheduler_type} learning-rate schedule needs the run's length: set trainer.total_training_steps")
        total_steps = 0
    return cfg.lr * lr_factor(cfg, step, total_steps)


def lr_factor(cfg: Any, step: int, total_steps: int) -> float:
    warmup = num_warmup_steps(cfg, total_steps)
    if cfg.lr_scheduler_type == "constant":
        return float(step) / float(max(1.0, warmup)) if step < warmup else 1.0
    if not cfg.zero_indexed_step:  # torchtitan's counting
        step += 1
    if step < warmup:
        return float(step) / float(max(1, warmup))
    min_lr_ratio = cfg.min_lr_ratio or 0.0
    progress = float(step - warmup) / float(max(1, total_steps - warmup))
    x = math.cos(math.pi * float(cfg.num_cycles) * 2.0 * progress)
    return max(min_lr_ratio, x * (1 - min_lr_ratio) * 0.5 + (1 + min_lr_ratio) * 0.5)
