"""A worker group runs one role on several workers; calling a method dispatches to them and collects the result.

Each worker method says how (verl's ``@register(dispatch_mode=...)``, much smaller):

- ``ALL``: every worker gets the same arguments; the results come back as a list.
- ``DP_SPLIT``: the first argument, a batch (a dict of tensors and lists), is split into one equal chunk per worker
  along the sample dimension -- padded to a multiple of the group size by repeating its first samples, so that every
  rank runs the same number of forward passes (collectives need that) -- and the results are joined back
  (tensors concatenated and unpadded, metrics averaged).
- ``RANK_ZERO``: only the first worker runs it (e.g. saving a checkpoint).
- ``PROMPT_SPLIT``: the first argument, a list of prompts, is split into one contiguous slice per worker, as equal as
  the count allows (a prompt's samples are made on one worker), and the second, the sampling parameters, gets the
  whole list's longest prompt as the width every worker pads to; the workers' batches are concatenated in order
  (the rollout: every worker generates its share).

The in-process backend below keeps the workers in this process, so a call is a plain method call; the Ray backend
(``ray_backend.RayWorkerGroup``) runs them as Ray actors. Both record ``compute_s``: the time spent inside worker
methods (the slowest rank per call), so the controller's own overhead is the rest of a step.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch

ALL = "all"
DP_SPLIT = "dp split"
RANK_ZERO = "rank zero"
PROMPT_SPLIT = "prompt split"


def register(dispatch: str) -> Callable:
    """Mark a worker method as callable through a WorkerGroup, with its dispatch mode."""

    def mark(method: Callable) -> Callable:
        method.dispatch = dispatch
        return method

    return mark


def dispatch_mode(worker_class: type, name: str) -> str:
    dispatch = getattr(getattr(worker_class, name, None), "dispatch", None)
    if dispatch is None:
        raise AttributeError(f"{worker_class.__name__}.{name} is not a registered worker method")
    return dispatch


class BaseWorkerGroup:
    """Dispatch and collect; a backend supplies ``world_size``, ``worker_class`` and ``run``."""

    world_size: int
    worker_class: type
    compute_s: float = 0.0

    def run(self, name: str, args_per_rank: Sequence[tuple], kwargs: dict) -> list[tuple[Any, float]]:
        """Run method `name` on ranks 0..len(args_per_rank)-1; each rank's (result, seconds inside the method)."""
        raise NotImplementedError

    def __getattr__(self, name: str) -> Callable:
        if name.startswith("_"):
            raise AttributeError(name)
        dispatch = dispatch_mode(self.worker_class, name)

        def call(*args, **kwargs):
            if dispatch == RANK_ZERO:
                return self._timed(name, [args], kwargs)[0]
            if dispatch == ALL:
                return self._timed(name, [args] * self.world_size, kwargs)
            if dispatch == PROMPT_SPLIT:
                prompts, params, *rest = args
                slices = split_prompts(prompts, self.world_size)
                if self.world_size > 1:
                    params = replace(params, prompt_width=max(map(len, prompts), default=0))
                shares = self._timed(name, [(part, params, *rest) for part in slices], kwargs)
                return collect([share for share, part in zip(shares, slices) if part])  # ranks given no prompt
            batch, *rest = args
            parts, pad = split_batch(batch, self.world_size)
            return unpad(collect(self._timed(name, [(part, *rest) for part in parts], kwargs)), pad)

        return call

    def _timed(self, name: str, args_per_rank: Sequence[tuple], kwargs: dict) -> list:
        outputs = self.run(name, args_per_rank, kwargs)
        self.compute_s += max(seconds for _, seconds in outputs)
        return [result for result, _ in outputs]


class WorkerGroup(BaseWorkerGroup):
    """In-process backend: the workers are objects in this process."""

    def __init__(self, workers: list):
        self.workers = workers
        self.world_size = len(workers)
        self.worker_class = type(workers[0])

    def run(self, name, args_per_rank, kwargs):
        outputs = []
        for worker, args in zip(self.workers, args_per_rank):
            started = time.perf_counter()
            result = getattr(worker, name)(*args, **kwargs)
            outputs.append((result, time.perf_counter() - started))
        return outputs


def split_prompts(prompts: list, parts: int) -> list[list]:
    """`parts` contiguous slices of a prompt list, their sizes differing by one at most (the first ones larger)."""
    size, extra = divmod(len(prompts), parts)
    bounds = [0]
    for rank in range(parts):
        bounds.append(bounds[-1] + size + (rank < extra))
    return [prompts[start:end] for start, end in zip(bounds, bounds[1:])]


def split_batch(batch: dict[str, Any], parts: int) -> tuple[list[dict[str, Any]], int]:
    """`parts` equal contiguous chunks of every tensor and list of a batch, and how many samples were added as padding
    (the first samples again) to make the batch size a multiple of `parts`."""
    if parts == 1:
        return [batch], 0
    size = len(next(iter(batch.values())))
    pad = -size % parts
    if pad:
        batch = {key: value[:size] + value[:pad] if isinstance(value, list) else torch.cat([value, value[:pad]])
                 for key, value in batch.items()}
    chunk = (size + pad) // parts
    return chunks(batch, chunk), pad


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


def unpad(result: Any, pad: int) -> Any:
    """Drop the outputs of the padding samples (the last `pad` rows of joined tensors and lists)."""
    if not pad:
        return result
    if isinstance(result, dict):
        return {key: unpad(value, pad) for key, value in result.items()}
    if isinstance(result, (torch.Tensor, list)):
        return result[:-pad]
    return result


def chunks(batch: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """Consecutive slices of `size` samples (the last may be smaller): mini- and micro-batches."""
    total = len(next(iter(batch.values())))
    return [{key: value[start : start + size] for key, value in batch.items()} for start in range(0, total, size)]


def move(value: Any, device: torch.device) -> Any:
    """Tensors (also inside dicts, lists and tuples) on `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: move(item, device) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and any(isinstance(item, (torch.Tensor, dict)) for item in value):
        return type(value)(move(item, device) for item in value)
    return value
