"""Offload leaves nothing behind: every tensor the roles own (weights, gradients, optimizer state, the rollout's
copies and caches) followed through every phase of real training steps.

On a CPU-only machine device and host are one memory, so a move is a no-op and a part left behind cannot show. Here
the CPU stands in for two memories: ``offload.transfer`` (the one copy every move makes) copies, and remembers
which storages it made in "host memory". Then, at the end of each phase:

- every storage a moved part had on the device before the phase ended must be gone: a copy that something still
  holds (an engine's own copy of the weights, a cache, a closure, autograd) is a copy left on the device, which on a
  GPU is exactly the memory offload was to save;
- every tensor a role can reach that is still in device memory must belong to a part its settings keep there.

On a GPU the same is measured in bytes (tests/test_offload.py's gpu test, bench/gpu_check.py's offload check).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from verl_runtime import offload
from verl_runtime.config import load_config
from verl_runtime.trainer import SingleControllerTrainer

EVERY_OFFLOAD = ["actor.param_offload=true", "actor.optimizer_offload=true", "ref.param_offload=true",
                 "critic.param_offload=true", "critic.optimizer_offload=true"]


class TwoMemories:
    """The CPU as device and host memory: offload.transfer copies; the storages moves put in host memory are
    recorded (weakly), so that any tensor can be told to be in host or device memory."""

    def __init__(self, monkeypatch):
        self.to_host = False
        self.host: dict[int, StorageWeakRef] = {}
        release = offload.Offload.release

        def releasing(offloader, *args, **kwargs):
            self.to_host = True
            try:
                return release(offloader, *args, **kwargs)
            finally:
                self.to_host = False

        def copying(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
            moved = tensor.to(device, copy=True)
            if self.to_host:
                self.host[moved.untyped_storage().data_ptr()] = StorageWeakRef(moved.untyped_storage())
            return moved

        monkeypatch.setattr(offload, "transfer", copying)
        monkeypatch.setattr(offload.Offload, "release", releasing)

    def on_device(self, tensor: torch.Tensor) -> bool:
        ref = self.host.get(tensor.untyped_storage().data_ptr())
        return ref is None or ref.expired()


def owned_tensors(worker) -> dict[str, torch.Tensor]:
    """Every tensor a worker can reach, by where it is: its models' parameters, gradients and buffers (and tensors
    modules hold as plain attributes), its optimizer's state, and whatever tensors its rollout engine and other
    attributes hold (copies of the weights, KV caches). Walked with a stack, not a recursive closure: a closure that
    names itself is a reference cycle, which would keep what it found alive until the collector runs."""
    found: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    stack = [(worker, type(worker).__name__, 0)]
    while stack:
        obj, path, depth = stack.pop()
        if id(obj) in seen or depth > 8:
            continue
        seen.add(id(obj))
        children = []
        if isinstance(obj, torch.Tensor):
            found[path] = obj
            if obj.grad is not None:
                found[path + ".grad"] = obj.grad
        elif isinstance(obj, nn.Module):
            children = [(f"{path}.{name}", t) for name, t in [*obj.named_parameters(), *obj.named_buffers()]]
            children += [(f"{path}.{name}", v) for name, v in vars(obj).items() if not name.startswith("_")]
        elif isinstance(obj, torch.optim.Optimizer):
            children = [(f"{path}.state[{index}].{key}", value) for index, state in enumerate(obj.state.values())
                        for key, value in state.items()]
        elif isinstance(obj, dict):
            children = [(f"{path}[{key!r}]", value) for key, value in obj.items()]
        elif isinstance(obj, (list, tuple)):
            children = [(f"{path}[{index}]", value) for index, value in enumerate(obj)]
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith(("verl_runtime", "transformers.cache")):
            children = [(f"{path}.{name}", value) for name, value in vars(obj).items() if name != "config"]
        stack.extend((child, child_path, depth + 1) for child_path, child in children)
    return found


def part_of(path: str) -> str:
    """The offload part a tensor belongs to: the optimizer's state, or the models' (rollout copies included)."""
    return "optimizer" if ".optimizer.state" in path else "params"


class Follower:
    """At the end of every phase of every worker: nothing moved is left on the device, and what is on the device is
    what the worker's settings keep there."""

    def __init__(self, memories: TwoMemories, workers: list, monkeypatch):
        self.memories, self.phases, self.problems, self.released = memories, [], [], set()
        by_offload = {id(w.offload): w for w in workers}
        release = offload.Offload.release  # the recording one

        def followed(offloader, models, optimizer=None):
            worker = by_offload.get(id(offloader))
            before = {}
            if worker is not None:
                moving = {k for k, on in (("params", offloader.params), ("optimizer", offloader.optimizer)) if on}
                before = {path: StorageWeakRef(t.untyped_storage()) for path, t in owned_tensors(worker).items()
                          if part_of(path) in moving and memories.on_device(t) and t.numel()}
            release(offloader, models, optimizer)
            if worker is None:
                return
            self.released.update(name for name, model in models.items() if model is not None)
            # no gc.collect(): a copy that only a reference cycle keeps is on the device until the collector runs
            name = type(worker).__name__
            self.phases.append(name)
            left = [path for path, ref in before.items() if not ref.expired()]
            if left:
                self.problems.append(f"{name}: {len(left)} moved tensors still held on the device after its phase, "
                                     f"e.g. {left[:3]}")
            kept = {part for part, on in (("params", offloader.params), ("optimizer", offloader.optimizer)) if not on}
            stray = [path for path, t in owned_tensors(worker).items()
                     if memories.on_device(t) and t.numel() > 1 and part_of(path) not in kept]
            if stray:
                self.problems.append(f"{name}: {len(stray)} tensors on the device its settings move to host memory, "
                                     f"e.g. {stray[:3]}")

        monkeypatch.setattr(offload.Offload, "release", followed)


def _trainer(tmp_path, *settings, steps: int = 2) -> SingleControllerTrainer:
    config = load_config(None, ["model.path=builtin:tiny", "trainer.device=cpu", "data.train_files=toy:letter",
                                "trainer.val_before_train=false", "trainer.resume=disable", "data.batch_size=4",
                                "rollout.n=2", "data.max_response_length=8", "actor.use_kl_loss=true",
                                "actor.ppo_epochs=2", f"trainer.total_training_steps={steps}", "trainer.save_freq=-1",
                                f"trainer.run_dir={tmp_path / 'run'}", *settings], warn=False)
    torch.manual_seed(0)
    return SingleControllerTrainer(config)


def _follow(tmp_path, monkeypatch, *settings, steps: int = 2) -> Follower:
    memories = TwoMemories(monkeypatch)
    trainer = _trainer(tmp_path, *settings, steps=steps)
    workers = [group.workers[0] for group in (trainer.actor, trainer.ref, trainer.critic) if group is not None]
    follower = Follower(memories, workers, monkeypatch)
    trainer.fit()
    return follower


ENGINES = {
    "hf": ["rollout.name=hf"],
    "builtin": ["rollout.name=builtin"],
    # the static-cache path in the autocast dtype: the engine's own bf16 copy of the weights and its KV cache
    "builtin, static cache, bf16 copy": ["rollout.name=builtin", "rollout.compile=false", "model.dtype=bfloat16"],
}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_every_offloaded_part_leaves_the_device_after_each_phase(engine, tmp_path, monkeypatch):
    if "static cache" in engine:  # what CUDA runs (there with its step captured), eagerly on the CPU
        from verl_runtime.rollout import builtin

        init = builtin.BuiltinRolloutEngine.__init__
        monkeypatch.setattr(builtin.BuiltinRolloutEngine, "__init__",
                            lambda self, *args, **kwargs: init(self, *args, **{**kwargs, "static_cache": True}))
    follower = _follow(tmp_path, monkeypatch, "algorithm.adv_estimator=gae", *EVERY_OFFLOAD, *ENGINES[engine])
    assert {"ActorWorker", "ReferenceWorker", "CriticWorker"} <= set(follower.phases)
    if "static cache" in engine:  # the engine's own copy moved, not the trained model, around each rollout
        assert "rollout weights" in follower.released
    assert follower.problems == []


def test_optimizer_offload_alone_keeps_the_weights_and_moves_only_the_state(tmp_path, monkeypatch):
    follower = _follow(tmp_path, monkeypatch, "actor.optimizer_offload=true", steps=1)
    assert "ActorWorker" in follower.phases and follower.problems == []


def test_the_follower_sees_a_copy_left_behind(tmp_path, monkeypatch):
    """The check itself: an engine that keeps its own reference to the weights (as a cache of them would) fails."""
    memories = TwoMemories(monkeypatch)
    trainer = _trainer(tmp_path, "actor.param_offload=true", "rollout.name=hf", steps=1)
    actor = trainer.actor.workers[0]
    follower = Follower(memories, [actor], monkeypatch)
    generate = actor.rollout.generate

    def caching(*args, **kwargs):  # an engine that keeps the weights it sampled from, as a cache of them would
        actor.rollout.kept = [p.data for p in actor.model.parameters()]
        return generate(*args, **kwargs)

    actor.rollout.generate = caching
    trainer.fit()
    assert follower.problems and "still held on the device" in follower.problems[0]
