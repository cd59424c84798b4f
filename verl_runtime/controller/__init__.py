"""Worker groups: the controller calls a role (actor, critic, reference, reward) like one local object.

Two backends: ``WorkerGroup`` (in-process, the default) and ``ray_backend.RayWorkerGroup`` (Ray actors, imported
only when a run uses Ray, so one-worker runs never pay for Ray's start-up).
"""

from verl_runtime.controller.worker_group import (
    ALL, DP_SPLIT, PROMPT_SPLIT, RANK_ZERO, BaseWorkerGroup, WorkerGroup, chunks, register,
)

__all__ = ["ALL", "DP_SPLIT", "PROMPT_SPLIT", "RANK_ZERO", "BaseWorkerGroup", "WorkerGroup", "chunks", "register"]
