"""Data parallelism inside a role: the ranks of a Ray worker group form one torch.distributed group.

Each rank holds the same weights (``dp``) or a shard of them (``fsdp``: PyTorch's FSDP2 ``fully_shard``) and trains
on its own slice of the batch. The loss stays *global*: every rank divides by the token and sequence counts of the
whole mini-batch across ranks, and gradients are summed (not averaged), so N ranks x B/N samples give the gradient
of one worker on B samples. In one process (the in-process backend) all of this is a no-op.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from verl_runtime.algorithms import make_global_batch_info
from verl_runtime.errors import TrainingError


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def global_batch_info(response_mask: torch.Tensor) -> dict:
    """make_global_batch_info over the mini-batch slices of all ranks."""
    info = make_global_batch_info(response_mask)
    if world_size() > 1:
        # rows with no response token do not count, as make_global_batch_info (and verl's agg_loss) count them
        rows = float((response_mask.sum(-1) > 0).sum())
        totals = torch.tensor([float(response_mask.sum()), rows], device=response_mask.device)
        dist.all_reduce(totals)
        info["batch_num_tokens"] = totals[0].clamp(min=1)
        info["global_batch_size"] = int(totals[1])
    return info


def sum_across_ranks(values: dict[str, float]) -> dict[str, float]:
    """Per-rank shares of a global quantity (losses, token-weighted fractions) -> the global value on every rank."""
    if world_size() == 1 or not values:
        return values
    keys = sorted(values)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    totals = torch.tensor([float(values[key]) for key in keys], dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    return dict(zip(keys, totals.tolist()))


def sum_gradients(model: nn.Module) -> None:
    """Sum the ranks' gradients: all-reduce replicated weights' in one flat buffer (dp); FSDP has reduce-scattered
    its shards as an average, which times the world size is the sum (gloo has no pre-scaled reduction)."""
    if world_size() == 1:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if is_sharded(model):
        torch._foreach_mul_(grads, float(world_size()))
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def broadcast_weights(model: nn.Module) -> None:
    """Start every rank from rank 0's weights (a freshly initialised head, e.g. the critic's, differs otherwise)."""
    if world_size() == 1:
        return
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)


def shard(model: nn.Module, offload_policy: bool = False) -> nn.Module:
    """FSDP2: shard each decoder layer, then the rest (sum_gradients turns its averaged gradients into sums).

    offload_policy: FSDP2's CPUOffloadPolicy, as verl's fsdp_config.offload_policy (verl/workers/engine/fsdp/
    transformer_impl.py:458-468): the shards, their gradients and the optimizer's step stay in host memory (pinned
    when the device is CUDA) and each unit is copied to the device for its forward and backward."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    options = {}
    if offload_policy:
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    layer_types = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if type(module).__name__ in layer_types:
            fully_shard(module, **options)
    fully_shard(model, **options)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_norm(norm: torch.Tensor) -> float:
    """clip_grad_norm_'s result as a number (a DTensor under FSDP)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def full_model_state(model: nn.Module) -> dict:
    """The whole model's weights (under FSDP a collective: every rank must call it)."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The whole (unsharded) model and optimizer state on every rank, in the plain single-process layout, so a
    checkpoint loads into any worker count and either strategy."""
    if not is_sharded(model):
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    index = {name: i for i, name in enumerate(_trainable_names(model))}  # the optimizer's order (optim.trainable)
    optim_state = {
        "state": {index[name]: value for name, value in optim_state["state"].items()},
        "param_groups": [{**group, "params": [index[name] for name in group["params"]]} for group in optim_state["param_groups"]],
    }
    return {"model": model_state, "optimizer": optim_state}


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """The inverse of full_state."""
    if not is_sharded(model):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    names = _trainable_names(model)
    optim = state["optimizer"]
    optim_state = {
        "state": {names[i]: value for i, value in optim["state"].items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in optim["param_groups"]],
    }
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=optim_state,
                   options=StateDictOptions(full_state_dict=True))


def _trainable_names(model: nn.Module) -> list[str]:
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


def finish_mini_batch(
    model: nn.Module, optimizer, totals: dict, grad_clip: float, loss_key: str, lr_key: str, lr: float
) -> tuple[dict[str, float], float]:
    """Sum gradients and metric shares across ranks, clip, refuse a diverged step, then step the optimizer.

    Returns the mini-batch's metrics (global) and its gradient norm.
    """
    sum_gradients(model)
    grad_norm = float(full_norm(nn.utils.clip_grad_norm_(model.parameters(), grad_clip)))
    values = sum_across_ranks({key: float(value) for key, value in totals.items()})
    if not (math.isfinite(values[loss_key]) and math.isfinite(grad_norm)):
        role = loss_key.split("/")[0]
        raise TrainingError(
            f"the {role} diverged (loss {values[loss_key]:.4g}, gradient norm {grad_norm:.4g}): "
            f"lower {lr_key} (now {lr:g}) or check the rewards"
        )
    optimizer.step()
    return values, grad_norm
