"""The process backend: each worker of a role is a child process of the controller (spawned, not forked: a child
gets its own torch, CUDA context and threads), serving one call at a time over a pipe.

The rollout's own workers (trainer.mode=separate_async) run so on one node without Ray: generation runs in them
while the controller trains, each on its own device (a GPU of its own, or its share of the CPU cores). Calls and
results travel pickled (tensors as bytes, in host memory). A child ends with the controller: it reads end-of-file
on its pipe when the controller is gone, however that happened.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable

import torch

from verl_runtime.controller.worker_group import BaseWorkerGroup, move
from verl_runtime.errors import TrainingError, UserError


class ProcessWorkerGroup(BaseWorkerGroup):
    """One role on `len(envs)` child processes; rank r's process gets the environment envs[r] (CUDA_VISIBLE_DEVICES,
    say) and `threads` torch threads, and builds its worker with build(config, tokenizer, device, rank, world)."""

    def __init__(self, role: str, worker_class: type, build: Callable, config, device: str, envs: list[dict],
                 threads: int):
        import torch.multiprocessing as mp

        self.role, self.worker_class, self.world_size = role, worker_class, len(envs)
        context = mp.get_context("spawn")
        self.processes, self.pipes = [], []
        for rank, env in enumerate(envs):
            ours, theirs = context.Pipe()
            process = context.Process(target=serve, name=f"{role}-worker-{rank}", daemon=True,
                                      args=(theirs, build, config, device, rank, len(envs), env, threads))
            process.start()
            theirs.close()
            self.processes.append(process)
            self.pipes.append(ours)
        self._ready = False
        self._failure: str | None = None  # why the workers stopped, once one died

    def wait_ready(self) -> None:
        """Block until every child has built its worker (they build side by side with the controller's own)."""
        if not self._ready:
            for rank in range(self.world_size):
                self._receive(rank, "start-up")
            self._ready = True

    def run(self, name, args_per_rank, kwargs):
        self.wait_ready()
        for rank, args in enumerate(args_per_rank):
            self._send(rank, name, (name, args, kwargs))
        return [self._receive(rank, name) for rank in range(len(args_per_rank))]

    def _send(self, rank: int, what: str, message: Any) -> None:
        if not self.pipes:
            raise self._stopped()
        try:
            self.pipes[rank].send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._died(rank, what)

    def _stopped(self) -> TrainingError:
        return TrainingError(self._failure or f"the {self.role} workers were stopped")

    def _receive(self, rank: int, what: str) -> tuple[Any, float]:
        if not self.pipes:
            raise self._stopped()
        try:
            status, value, seconds = pickle.loads(self.pipes[rank].recv_bytes())
        except (EOFError, ConnectionResetError, OSError):
            self._died(rank, what)
        if status == "error":
            error, trace = value
            if isinstance(error, UserError):
                raise error
            raise TrainingError(f"the {self.role} worker of rank {rank} failed during {what}: "
                                f"{type(error).__name__}: {error}\n{trace}") from None
        return value, seconds

    def _died(self, rank: int, what: str):
        if not self.processes:
            raise self._stopped()
        process = self.processes[rank]
        process.join(timeout=5)
        self._failure = f"the {self.role} worker of rank {rank} died during {what} (exit code {process.exitcode})"
        self.close()
        raise self._stopped()  # and so does every later call: the first failure is the one to read

    def close(self) -> None:
        """Stop the children (they hold nothing to save: the controller has the trained weights)."""
        processes, pipes = self.processes, self.pipes
        self.processes, self.pipes = [], []
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        for pipe in pipes:
            pipe.close()


def serve(pipe: Connection, build: Callable, config, device: str, rank: int, world: int, env: dict,
          threads: int) -> None:
    """A child's life: build the worker, then run one call after another until the pipe closes."""
    os.environ.update(env)
    torch.set_num_threads(threads)
    started = time.perf_counter()
    try:
        worker = build(config, device, rank, world)
    except BaseException as error:  # noqa: BLE001 - every failure goes back to the controller
        _reply(pipe, "error", _portable(error), time.perf_counter() - started)
        return
    _reply(pipe, "ok", None, time.perf_counter() - started)
    while True:
        try:
            name, args, kwargs = pickle.loads(pipe.recv_bytes())
        except (EOFError, OSError):
            return  # the controller is gone
        started = time.perf_counter()
        try:
            result = move(getattr(worker, name)(*args, **kwargs), torch.device("cpu"))
        except BaseException as error:  # noqa: BLE001
            _reply(pipe, "error", _portable(error), time.perf_counter() - started)
            continue
        _reply(pipe, "ok", result, time.perf_counter() - started)


def _reply(pipe: Connection, status: str, value: Any, seconds: float) -> None:
    try:
        pipe.send_bytes(pickle.dumps((status, value, seconds), protocol=pickle.HIGHEST_PROTOCOL))
    except (BrokenPipeError, OSError):
        pass  # the controller is gone


def _portable(error: BaseException) -> tuple[BaseException, str]:
    """The error and its trace, as something the controller can unpickle (else a RuntimeError with its text)."""
    trace = "".join(traceback.format_exception(error)).rstrip()
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - an exception type that does not travel
        error = RuntimeError(f"{type(error).__name__}: {error}")
    return error, trace
