"""A worker group runs one role on several workers; calling a method dispatches to them and collects the result.

Each worker method says how (verl's ``@register(dispatch_mode=...)``, much smaller):

- ``ALL``: every worker gets the same arguments; the results come back as a list.
- ``DP_SPLIT``: the first argument, a batch (a dict of tensors and lists), is split into one chunk per worker
  along the sample dimension; the results are joined back (tensors concatenated, metrics averaged).
- ``RANK_ZERO``: only the first worker runs it (e.g. the rollout engine, saving a checkpoint).

The in-process backend below keeps the workers in this process, so a call is a plain method call.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

ALL = "all"
DP_SPLIT = "dp split"
RANK_ZERO = "rank zero"


def register(dispatch: str) -> Callable:
    """Mark a worker method as callable through a WorkerGroup, with its dispatch mode."""

    def mark(method: Callable) -> Callable:
        method.dispatch = dispatch
        return method

    return mark


class WorkerGroup:
    """In-process backend: the workers are objects in this process."""

    def __init__(self, workers: list):
        self.workers = workers

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def __getattr__(self, name: str) -> Callable:
        methods = [getattr(worker, name) for worker in self.workers]
        dispatch = getattr(methods[0], "dispatch", None)
        if dispatch is None:
            raise AttributeError(f"{type(self.workers[0]).__name__}.{name} is not a registered worker method")

        def call(*args, **kwargs):
            if dispatch == RANK_ZERO:
                return methods[0](*args, **kwargs)
            if dispatch == ALL:
                return [method(*args, **kwargs) for method in methods]
            batch, *rest = args
            chunks = split_batch(batch, len(methods))
            return collect([method(chunk, *rest, **kwargs) for method, chunk in zip(methods, chunks)])

        return call


def split_batch(batch: dict[str, Any], parts: int) -> list[dict[str, Any]]:
    """Split every tensor and list of a batch into `parts` contiguous chunks along the first dimension."""
    if parts == 1:
        return [batch]
    size = len(next(iter(batch.values())))
    bounds = [round(i * size / parts) for i in range(parts + 1)]
    return [{key: value[lo:hi] for key, value in batch.items()} for lo, hi in zip(bounds, bounds[1:])]


def collect(outputs: list[Any]) -> Any:
    """Join per-worker outputs: tensors are concatenated, dicts joined key by key, numbers averaged."""
    if len(outputs) == 1:
        return outputs[0]
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outputs)
    if isinstance(first, dict):
        return {key: collect([output[key] for output in outputs]) for key in first}
    if isinstance(first, list):
        return [item for output in outputs for item in output]
    return sum(outputs) / len(outputs)


def chunks(batch: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """Consecutive slices of `size` samples (the last may be smaller): mini- and micro-batches."""
    total = len(next(iter(batch.values())))
    return [{key: value[start : start + size] for key, value in batch.items()} for start in range(0, total, size)]
