"""Worker groups: the controller calls a role (actor, critic, reference, reward) like one local object."""

from verl_runtime.controller.worker_group import ALL, DP_SPLIT, RANK_ZERO, WorkerGroup, chunks, register

__all__ = ["ALL", "DP_SPLIT", "RANK_ZERO", "WorkerGroup", "chunks", "register"]
