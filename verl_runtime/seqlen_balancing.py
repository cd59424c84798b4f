"""Micro-batches cut by a token budget (verl's use_dynamic_bsz), balanced as verl 0.9.1 balances them.

verl/utils/seqlen_balancing.py is the source: ``calculate_workload`` (:27-46), ``karmarkar_karp`` (:49-210, the
largest differencing method), ``get_seqlen_balanced_partitions`` (:213-255) and ``rearrange_micro_batches``
(:348-480: as few micro-batches as the budget allows, more until every one fits, the heaviest in the middle).
The partitions index the batch; ``restore_order`` puts per-sample results back in the batch's order
(``restore_dynamic_batch``, :564). tests/test_memory_settings.py checks the partitions against verl's wheel.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import torch

from verl_runtime.errors import ConfigError


def calculate_workload(seqlens: torch.Tensor) -> torch.Tensor:
    """verl's estimate of a sequence's compute (dense blocks of a 7B model plus attention): 24576 L + L^2."""
    return 24576 * seqlens + seqlens**2


def karmarkar_karp(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """verl's Karmarkar-Karp k-way partition of seqlen_list's indices (the same sets in the same order)."""

    class Set:
        def __init__(self) -> None:
            self.sum, self.items = 0, []

        def add(self, idx: int, val: int) -> None:
            self.items.append((idx, val))
            self.sum += val

        def merge(self, other: Set) -> None:
            for idx, val in other.items:
                self.add(idx, val)

        def __lt__(self, other: Set) -> bool:
            if self.sum != other.sum:
                return self.sum < other.sum
            if len(self.items) != len(other.items):
                return len(self.items) < len(other.items)
            return self.items < other.items

    class State:
        def __init__(self, items: list[tuple[int, int]], k: int) -> None:
            self.k, self.sets = k, [Set() for _ in range(k)]
            for i, (idx, seqlen) in enumerate(items):
                self.sets[i].add(idx, seqlen)
            self.sets = sorted(self.sets, reverse=True)

        def merge(self, other: State) -> None:
            for i in range(self.k):
                self.sets[i].merge(other.sets[self.k - 1 - i])
            self.sets = sorted(self.sets, reverse=True)

        @property
        def spread(self) -> int:
            return self.sets[0].sum - self.sets[-1].sum

        def __lt__(self, other: State) -> bool:  # the largest spread pops first
            if self.spread != other.spread:
                return self.spread > other.spread
            return self.sets[0] > other.sets[0]

    ordered = sorted((seqlen, i) for i, seqlen in enumerate(seqlen_list))
    heap: list[State] = []
    if equal_size:
        for offset in range(0, len(ordered), k_partitions):
            items = [(idx, seqlen) for seqlen, idx in ordered[offset : offset + k_partitions]]
            heapq.heappush(heap, State(items, k_partitions))
    else:
        for seqlen, idx in ordered:
            heapq.heappush(heap, State([(idx, seqlen)], k_partitions))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    return [[idx for idx, _ in s.items] for s in heap[0].sets]


def get_seqlen_balanced_partitions(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """k_partitions index lists (each sorted) whose sums of seqlen_list are balanced; none empty."""
    partitions = karmarkar_karp(seqlen_list, k_partitions, equal_size)
    if any(not p for p in partitions):
        raise ValueError(f"{len(seqlen_list)} items cannot fill {k_partitions} partitions")
    return [sorted(p) for p in partitions]


def rearrange_micro_batches(seqlens: list[int], max_token_len: int, min_count: int = 1) -> list[list[int]]:
    """The samples (by index) of each micro-batch of at most max_token_len real tokens, as verl cuts one rank's
    share (no forced groups; min_count: the micro-batch count every rank must reach, verl's same_micro_num_in_dp)."""
    count = min(len(seqlens), max(math.ceil(sum(seqlens) / max_token_len), min_count))
    workloads = calculate_workload(torch.tensor(seqlens, dtype=torch.long)).tolist()
    while True:
        partitions = get_seqlen_balanced_partitions(workloads, count, equal_size=False)
        if all(sum(seqlens[i] for i in p) <= max_token_len for p in partitions) or count == len(seqlens):
            break
        count += 1
    partitions.sort(key=lambda p: (sum(workloads[i] for i in p), p[0]), reverse=True)
    return partitions[::2][::-1] + partitions[1::2]  # the lighter ones at both ends, as verl's pipelines want


def same_count_on_all_ranks(count: int) -> int:
    """The largest micro-batch count of all ranks (verl's same_micro_num_in_dp): under FSDP every forward is a
    collective, so all ranks must run as many."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return count
    total = torch.tensor([count], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    return int(total.item())


def token_budget_split(batch: dict[str, Any], max_token_len: int, key: str, sync=same_count_on_all_ranks) -> list[list[int]]:
    """rearrange_micro_batches over a batch's real tokens (attention_mask's sum per row). A padded row wider than
    the budget cannot be cut: a one-line error names the key to raise. sync(count) -> the count all ranks use."""
    mask = batch["attention_mask"]
    if mask.shape[1] > max_token_len:
        raise ConfigError(f"{key}={max_token_len} is below the sequences' length ({mask.shape[1]} tokens: prompt + "
                         f"response limits): raise it to at least {mask.shape[1]}")
    seqlens = mask.sum(-1).tolist()
    partitions = rearrange_micro_batches(seqlens, max_token_len)
    wanted = sync(len(partitions)) if sync else len(partitions)
    if wanted != len(partitions):  # another rank needs more micro-batches: FSDP's collectives want the same count
        partitions = rearrange_micro_batches(seqlens, max_token_len, min_count=wanted)
    return partitions


def select(batch: dict[str, Any], indices: list[int]) -> dict[str, Any]:
    """The samples at indices of every field (tensors and lists alike)."""
    index = torch.tensor(indices, dtype=torch.long)
    return {key: value[index.to(value.device)] if torch.is_tensor(value) else [value[i] for i in indices]
            for key, value in batch.items()}


def restore_order(parts: list[torch.Tensor], partitions: list[list[int]]) -> torch.Tensor:
    """Per-sample results of the micro-batches (in partition order) back in the batch's order."""
    order = torch.tensor([i for p in partitions for i in p], dtype=torch.long)
    joined = torch.cat(parts)
    return joined[torch.argsort(order).to(joined.device)]

