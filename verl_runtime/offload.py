"""A role's parameters, gradients and optimizer state in host memory while no phase uses them (verl's CPU offload).

verl 0.9.1 has two mechanisms, and so do we:

- Between phases (``fsdp_config.param_offload`` / ``optimizer_offload``; ours: ``actor.param_offload``, ...): the
  model (with its gradients) and AdamW's state go to the CPU after start-up and after each phase, and come back
  before the next. A forward-only phase (log-probs, values, a rollout on the trained weights) brings back the
  parameters alone, an update the parameters and the optimizer (verl/workers/engine/base.py:314-336,
  BaseEngineCtx._context_switch; verl/workers/engine/fsdp/transformer_impl.py:226-231 and 844-867; the moves are
  verl/utils/fsdp_utils.py:196-261: ``model.to("cpu", non_blocking=True)`` for FSDP2, each optimizer state tensor
  ``.to("cpu", non_blocking=True)``, which PyTorch stages in pinned memory). On one worker and sharded alike.
- FSDP2's own (``fsdp_config.offload_policy``; ours: ``actor.offload_policy``): ``fully_shard(...,
  offload_policy=CPUOffloadPolicy(pin_memory=True))`` keeps the sharded parameters, their gradients and the
  optimizer's step on the CPU always and copies one unit at a time to the device for its forward and backward
  (transformer_impl.py:451-463). Where the model is not sharded (one worker, or strategy dp) there is no FSDP unit
  to stream: it falls back to the between-phase moves of both (`Offload.for_role`).

The numbers do not change: the same tensors, moved. On a CPU-only machine device and host are one memory, so the
moves are no-ops there; ``placement`` records where each part is meant to be (what the CPU tests check), and on a
GPU ``resident_bytes`` measures where it is (tests marked gpu, bench/gpu_check.py).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import torch
from torch import nn

DEVICE, HOST = "device", "host"


@dataclass
class Offload:
    """Which of one role's parts live in host memory between phases, and the moves that keep them there."""

    device: torch.device
    params: bool = False  # the models' parameters and gradients
    optimizer: bool = False  # the optimizer's state
    placement: dict[str, str] = field(default_factory=dict)  # part ("model", "optimizer", ...) -> DEVICE | HOST

    @classmethod
    def for_role(cls, section, device: torch.device, sharded: bool) -> Offload:
        """The between-phase moves a config section asks for (actor, critic: param_offload, optimizer_offload,
        offload_policy; ref: param_offload). offload_policy on a sharded model is FSDP's business (see shard);
        unsharded it means both moves."""
        policy = getattr(section, "offload_policy", False) and not sharded
        return cls(torch.device(device), params=section.param_offload or policy,
                   optimizer=getattr(section, "optimizer_offload", False) or policy)

    @property
    def host(self) -> torch.device:
        return torch.device("cpu")

    @property
    def active(self) -> bool:
        return self.params or self.optimizer

    def release(self, models: dict[str, nn.Module], optimizer: torch.optim.Optimizer | None = None) -> None:
        """After a phase (and at start-up): the offloaded parts to host memory."""
        if self.params:
            for name, model in models.items():
                if model is not None:
                    _move_model(model, self.host)
                    self.placement[name] = HOST
        if self.optimizer and optimizer is not None:
            _move_optimizer(optimizer, self.host)
            self.placement["optimizer"] = HOST
        if self.active and self.device.type == "cuda":
            torch.cuda.empty_cache()  # as verl's offload does: the freed blocks go back to the driver

    def load(self, models: dict[str, nn.Module], optimizer: torch.optim.Optimizer | None = None) -> None:
        """Before a phase: the parts it needs back on the device."""
        if self.params:
            for name, model in models.items():
                if model is not None:
                    _move_model(model, self.device)
                    self.placement[name] = DEVICE
        if self.optimizer and optimizer is not None:
            _move_optimizer(optimizer, self.device)
            self.placement["optimizer"] = DEVICE

    @contextlib.contextmanager
    def phase(self, models: dict[str, nn.Module], optimizer: torch.optim.Optimizer | None = None):
        """The parts a phase uses on the device for its duration, in host memory again afterwards (on error too)."""
        self.load(models, optimizer)
        try:
            yield
        finally:
            self.release(models, optimizer)


def phase(name: str):
    """A worker method that runs with the parts its `offload_parts(name)` names on the device, in host memory again
    afterwards. A train phase (one that returns an optimizer) frees the gradients on its way out, as verl's
    EngineTrainModeCtx does (zero_grad_on_exit; each update starts from zero_grad anyway)."""

    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            offload = self.offload
            if not offload.active:
                return method(self, *args, **kwargs)
            models, optimizer = self.offload_parts(name)
            with offload.phase(models, optimizer):
                try:
                    return method(self, *args, **kwargs)
                finally:
                    if optimizer is not None and name == TRAIN:
                        optimizer.zero_grad(set_to_none=True)
        return call

    return wrap


ROLLOUT, FORWARD, TRAIN, STATE = "rollout", "forward", "train", "state"  # the phases a worker names


def transfer(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The one copy between device and host memory that every move makes (non-blocking: PyTorch stages a device to
    host copy in pinned memory). On a CPU-only machine it returns the tensor itself; the CPU tests stand in a copying
    one, so that a part left behind after a move shows (tests/test_offload_tracking.py)."""
    return tensor.to(device, non_blocking=True)


@torch.no_grad()
def _move_model(model: nn.Module, device: torch.device) -> None:
    # What Module.to does, with every tensor through transfer(): each parameter's .grad moves with it, buffers too,
    # and the Parameter objects the optimizer holds stay the same objects
    model._apply(lambda tensor: transfer(tensor, device))


@torch.no_grad()
def _move_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for group in optimizer.param_groups:
        # AdamW's step counter is a CPU scalar unless the kernel is fused or capturable, which want it beside the
        # parameters: it comes back to the device only then
        steps_on_device = bool(group.get("fused") or group.get("capturable"))
        for parameter in group["params"]:
            state = optimizer.state.get(parameter, {})
            for key, value in state.items():
                if not isinstance(value, torch.Tensor):
                    continue
                if device.type == "cpu" or value.dim() > 0 or steps_on_device:
                    state[key] = transfer(value, device)


def to_host(tree):
    """A (nested) state dict with every tensor in host memory (what stays on the device is dropped with it)."""
    if isinstance(tree, torch.Tensor):
        return transfer(tree, torch.device("cpu")) if tree.device.type != "cpu" else tree
    if isinstance(tree, dict):
        return {key: to_host(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_host(value) for value in tree)
    return tree


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor's shard under FSDP


def _bytes_on(tensors, device_type: str) -> int:
    total = 0
    for tensor in tensors:
        local = _local(tensor)
        if local.device.type == device_type:
            total += local.numel() * local.element_size()
    return total


def resident_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None, device) -> dict[str, int]:
    """Bytes of the model's parameters, their gradients and the optimizer's state that live on `device`'s type
    (this rank's shards under FSDP). On the CPU with device cpu this is everything, offloaded or not."""
    kind = torch.device(device).type
    params = list(model.parameters())
    states = [value for state in (optimizer.state.values() if optimizer is not None else ())
              for value in state.values() if isinstance(value, torch.Tensor)]
    return {
        "params": _bytes_on(params, kind),
        "grads": _bytes_on([p.grad for p in params if p.grad is not None], kind),
        "optimizer": _bytes_on(states, kind),
    }
