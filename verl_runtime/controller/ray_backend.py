"""The Ray backend: each worker is a Ray actor process holding the roles placed on its slot (CPUs or one GPU),
created in a placement group; a RayWorkerGroup calls one role on them with the same dispatch modes as in-process.

Placement (trainer.placement): ``colocated`` (the default) is one pool of trainer.n_workers processes, each holding
the actor with its rollout engine, the reference, the reward and the critic -- they share the slot and pass no weights
around. ``split`` gives the critic a pool of its own (e.g. cheaper GPUs). Each pool is one torch.distributed group
(gloo on CPU, NCCL on GPU) for data-parallel training (see workers/parallel.py).

Imported only when a run uses Ray (several workers, or a cluster to join): one-worker runs never start Ray.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any, Callable

import torch

from verl_runtime import oom
from verl_runtime.config import Config
from verl_runtime.controller.worker_group import BaseWorkerGroup, move
from verl_runtime.errors import ConfigError, TrainingError, UserError
from verl_runtime.seeding import seed_everything


def uses_ray(config: Config) -> bool:
    return config.trainer.n_workers > 1 or bool(config.ray.address or os.environ.get("RAY_ADDRESS"))


def start_worker_groups(
    config: Config, roles: list[str], build_roles: Callable, role_classes: dict[str, type]
) -> dict[str, RayWorkerGroup]:
    """Join (or start) Ray, check that the placement fits, and start one worker group per role. The caller hands
    over how roles are built (`build_roles(config, roles, tokenizer, device)`) and their classes: the controller
    knows the workers, not the other way round."""
    import ray

    joining = connect(config)
    device = worker_device(config.trainer.device, ray.cluster_resources())
    slot = {"CPU": config.trainer.cpus_per_worker, **({"GPU": 1} if device == "cuda" else {})}
    pools = [roles]
    if config.trainer.placement == "split" and "critic" in roles:
        pools = [[role for role in roles if role != "critic"], ["critic"]]
    # A cluster being joined may still be gaining nodes (they start beside this one): give them a minute.
    resources = wait_until_fits(slot, config.trainer.n_workers, len(pools), seconds=60 if joining else 0)
    print(f"[INFO] Ray cluster: {sum(node['Alive'] for node in ray.nodes())} node(s), {resources.get('CPU', 0):g} "
          f"CPUs, {resources.get('GPU', 0):g} GPUs", flush=True)
    groups = {}
    for pool_roles in pools:
        pool = Pool.start(config, pool_roles, slot, device, build_roles)
        groups.update({role: RayWorkerGroup(role, pool, role_classes[role]) for role in pool_roles})
    return groups


def start_rollout_group(config: Config, world: int, build_roles: Callable, worker_class: type) -> RayWorkerGroup:
    """The rollout's own pool (trainer.mode=separate_async) beside the trainer's, `world` workers on slots of their
    own (GPUs the trainer's pools left free)."""
    import ray

    connect(config)
    device = worker_device(config.trainer.device, ray.cluster_resources())
    slot = {"CPU": config.trainer.cpus_per_worker, **({"GPU": 1} if device == "cuda" else {})}
    pools = 1 + (config.trainer.placement == "split" and config.algorithm.adv_estimator == "gae")
    for resource, amount in slot.items():
        needed, have = amount * (config.trainer.n_workers * pools + world), ray.cluster_resources().get(resource, 0)
        if needed > have:
            raise ConfigError(f"trainer.mode=separate_async needs {needed:g} {resource}s ({config.trainer.n_workers} "
                              f"trainer worker(s) x {pools} pool(s) + {world} rollout worker(s), x {amount:g}) but the "
                              f"Ray cluster has {have:g}: add nodes or GPUs, or lower rollout.n_gpus_per_node")
    return RayWorkerGroup("rollout", Pool.start(config, ["rollout"], slot, device, build_roles, n=world), worker_class)


def connect(config: Config) -> bool:
    """ray.init unless this process is connected already; whether it joins a cluster started elsewhere."""
    import ray

    joining = bool(config.ray.address or os.environ.get("RAY_ADDRESS"))
    if not ray.is_initialized():
        ray.init(
            # not joining: "local" starts a new cluster (None could pick up a stale one that `ray start` left behind)
            address=config.ray.address if joining else "local",
            num_cpus=None if joining else config.ray.num_cpus,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
    return joining


def worker_device(name: str, resources: dict[str, float]) -> str:
    """The workers' device: the cluster's GPUs decide (the controller itself may have none)."""
    if name == "auto":
        return "cuda" if resources.get("GPU", 0) >= 1 else "cpu"
    return name


def wait_until_fits(slot: dict[str, float], n_workers: int, n_pools: int, seconds: float) -> dict[str, float]:
    """The cluster's resources once the placement fits them; check_fits' error after `seconds`."""
    import ray

    deadline = time.monotonic() + seconds
    while True:
        resources = ray.cluster_resources()
        try:
            check_fits(slot, n_workers, n_pools, resources)
            return resources
        except ConfigError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(1)


def check_fits(slot: dict[str, float], n_workers: int, n_pools: int, resources: dict[str, float]) -> None:
    for resource, amount in slot.items():
        needed, have = amount * n_workers * n_pools, resources.get(resource, 0)
        if needed > have:
            pools = " x 2 pools (trainer.placement=split)" if n_pools > 1 else ""
            raise ConfigError(
                f"the placement needs {needed:g} {resource}s (trainer.n_workers={n_workers}{pools} x {amount:g}) but "
                f"the Ray cluster has {have:g}: lower trainer.n_workers"
                f"{' or trainer.cpus_per_worker' if resource == 'CPU' else ''}, or add nodes"
            )


class WorkerProcess:
    """One Ray actor: the roles of one slot, rank `rank` of its pool's torch.distributed group."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.roles: dict[str, Any] = {}
        self.device = torch.device("cpu")

    def rendezvous_address(self) -> str:
        """host:port where rank 0 accepts the others."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return f"{ray.util.get_node_ip_address()}:{port}"

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def setup(self, config: Config, roles: list[str], device: str, master: str, build_roles: Callable) -> None:
        import torch.distributed as dist

        from verl_runtime.models import load_tokenizer

        self.device = torch.device(device)  # Ray shows a GPU worker its one GPU as cuda:0
        # Before joining the process group: this builds builtin:tiny on a fresh node, and inside an initialised
        # torch.distributed group transformers' save_pretrained writes the model files on rank 0 only.
        tokenizer = load_tokenizer(config.model.path)
        if self.world_size > 1:
            backend = "nccl" if device == "cuda" else "gloo"
            dist.init_process_group(backend, init_method=f"tcp://{master}", rank=self.rank, world_size=self.world_size)
        seed_everything(config.trainer.seed)  # as the in-process trainer does before building its roles
        self.roles = build_roles(config, roles, tokenizer, self.device)

    def call(self, role: str, method: str, *args, **kwargs) -> tuple[Any, float]:
        """A role's method on this worker's device; its result on the CPU and the seconds it took."""
        started = time.perf_counter()
        with oom.carried():  # what this worker was running, on an out-of-memory error, for the controller's line
            result = getattr(self.roles[role], method)(*move(args, self.device), **kwargs)
        return move(result, torch.device("cpu")), time.perf_counter() - started


class Pool:
    """The Ray actors of one placement group, and the roles they hold."""

    def __init__(self, actors: list, placement, roles: list[str]):
        self.actors, self.placement, self.roles = actors, placement, roles

    @classmethod
    def start(cls, config: Config, roles: list[str], slot: dict[str, float], device: str, build_roles: Callable,
              n: int | None = None) -> Pool:
        """n: the pool's workers (None: trainer.n_workers)."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        n = n or config.trainer.n_workers
        # GPU workers pack onto few nodes (fast links between GPUs); CPU workers spread to use every node's cores.
        placement = placement_group([slot] * n, strategy="PACK" if device == "cuda" else "SPREAD")
        if not placement.wait(timeout_seconds=60):
            ray.util.remove_placement_group(placement)
            raise ConfigError(f"Ray could not place {n} workers of {slot} within 60 s: no node has such a slot free; "
                              "lower trainer.n_workers or trainer.cpus_per_worker")
        remote = ray.remote(WorkerProcess)
        actors = [
            remote.options(
                num_cpus=slot["CPU"], num_gpus=slot.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement, placement_group_bundle_index=rank),
            ).remote(rank, n)
            for rank in range(n)
        ]
        pool = cls(actors, placement, roles)
        master = pool.gather([actors[0].rendezvous_address.remote()], "start-up")[0]
        pool.gather([actor.setup.remote(config, roles, device, master, build_roles) for actor in actors], "start-up")
        nodes = len(set(pool.gather([actor.node_id.remote() for actor in actors], "start-up")))
        print(f"[INFO] {n} Ray worker(s) for {', '.join(roles)} on {nodes} node(s), {device}", flush=True)
        return pool

    def gather(self, refs: list, what: str) -> list:
        """The results of one call per rank, in rank order. The first failure ends the pool (the other ranks may be
        waiting for the failed one inside a collective) and the failure that says most is raised (see fail)."""
        import ray
        from ray.exceptions import GetTimeoutError

        while True:
            try:
                return ray.get(refs, timeout=1.0)  # the common case: one wait for all ranks
            except GetTimeoutError:
                pass  # a rank is still busy: look below for one that failed, which it may be waiting for
            except Exception:
                pass  # a rank failed: found below
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                if (error := outcome(ref)) is not None:
                    self.fail(refs, (refs.index(ref), error), what)

    def fail(self, refs: list, first: tuple[int, BaseException], what: str) -> None:
        """Stop the pool after a rank's failure (`first`: its rank and error), take every rank's result, and raise the
        failure that says most (most_telling).

        Every result is taken because a result that holds an error and is never taken is one that Ray reports by
        itself when its reference goes: "Unhandled error (...)" and the worker's raw traceback on the controller's
        stderr, after the run's own line. Ranks that fail one after another leave such a result: on a loaded machine
        the second rank's out-of-memory error arrives after the first one was raised and before the stop reaches
        that rank, and the console's last line was torch's raw error instead of the run's."""
        import ray

        self.close()  # ranks waiting for the failed one inside a collective end only so
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=SETTLE_S)  # stopped ranks' results: at once, as a rule
        errors = {refs.index(ref): error for ref in ready if (error := outcome(ref)) is not None}
        raise_failure(self.roles, *most_telling(first, errors), what)

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        if self.actors:
            ray.util.remove_placement_group(self.placement)
        self.actors = []


SETTLE_S = 10.0  # how long a failed pool's stopped ranks are given to report their results


def outcome(ref) -> BaseException | None:
    """The error the result of a finished call (ray.wait found it ready) holds, taking it: Ray then reports it no more
    by itself; None for a result."""
    import ray
    from ray.exceptions import GetTimeoutError

    try:
        ray.get(ref, timeout=SETTLE_S)
    except GetTimeoutError:
        return None
    except Exception as exc:
        return exc
    return None


def cause_of(error: BaseException) -> BaseException:
    """What a worker raised (a RayTaskError carries it as its cause), else the error itself (a dead worker)."""
    from ray.exceptions import RayTaskError

    return error.cause if isinstance(error, RayTaskError) and error.cause is not None else error


def most_telling(first: tuple[int, BaseException], errors: dict[int, BaseException]) -> tuple[int, BaseException]:
    """The failure to raise of a pool's ranks: running out of memory (any rank's: a peer's broken collective or a
    stop only follows it), else a user's error (one line), else the first failure; the first one wins a tie."""
    candidates = [first, *errors.items()]
    for telling in (lambda error: oom.out_of_memory_kind(error) is not None,
                    lambda error: isinstance(error, UserError)):
        found = next(((rank, error) for rank, error in candidates if telling(cause_of(error))), None)
        if found is not None:
            return found
    return first


def raise_failure(roles: list[str], rank: int, error: BaseException, what: str) -> None:
    """A rank's failure, raised: a dead worker as one line naming it; a user's error (a reward function's, a model's,
    the config's) as its one line, not Ray's trace; running out of memory as the worker's error itself, which the
    controller words (oom.translated); anything else as Ray raised it."""
    from ray.exceptions import RayActorError

    if isinstance(error, RayActorError):
        reason = next((line.strip() for line in str(error).splitlines() if line.strip()), "no reason given")
        raise TrainingError(
            f"the {'/'.join(roles)} worker of rank {rank} died during {what} ({reason[:160]})"
        ) from None
    cause = cause_of(error)
    if isinstance(cause, UserError) or oom.out_of_memory_kind(cause):
        raise cause from None
    raise error


class RayWorkerGroup(BaseWorkerGroup):
    """One role on a pool of Ray actors."""

    def __init__(self, role: str, pool: Pool, worker_class: type):
        self.role, self.pool = role, pool
        self.world_size = len(pool.actors)
        self.worker_class = worker_class  # its methods' dispatch modes say how a batch is split and joined

    def run(self, name, args_per_rank, kwargs):
        actors = self.pool.actors
        if not actors:
            raise TrainingError(f"the {self.role} workers were stopped after an earlier failure")
        refs = [actor.call.remote(self.role, name, *args, **kwargs) for actor, args in zip(actors, args_per_rank)]
        return self.pool.gather(refs, f"{self.role}.{name}")

    def close(self) -> None:
        self.pool.close()
