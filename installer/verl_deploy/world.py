"""A run's world size, resolved once: GPUs per node x nodes, from --gpus/--nodes or else the trainer's own keys
(ours: trainer.n_gpus_per_node/trainer.nnodes in the loaded config; verl: the same keys among its overrides,
runtimes.Trainer.world_keys). The run plan (launchers.jobspec.build_spec) and the memory planner (plan.core) both
read it from here. ValueError (one line) where the flags and the config disagree.

A lower layer: it imports sizes and runtimes, nothing of plan/, launchers/ or doctor/.
"""

from __future__ import annotations

from types import SimpleNamespace

from verl_deploy import runtimes, sizes
from verl_deploy.sizes import Gpus


def world_size(gpus: Gpus, nodes: int) -> int | None:
    """Trainer workers, one per GPU: GPUs per node x nodes (None for none or --gpus all: the runtime counts them)."""
    return gpus.number * nodes if gpus.number else None


def derive_world(trainer, gpus: Gpus | None, nodes: int | None) -> tuple[Gpus, int]:
    """--gpus and --nodes, derived from verl's trainer.n_gpus_per_node and trainer.nnodes when not given (None; GPUs
    only where trainer.device is not cpu); ValueError (one line) where the flags and the config disagree."""
    per_node, config_nodes = trainer.n_gpus_per_node, trainer.nnodes
    given, gpus = gpus is not None, gpus or Gpus()
    sizes.parse_nodes(nodes)
    if per_node is not None and gpus.number is not None and gpus.wanted and gpus.number != per_node:
        raise ValueError(f"trainer.n_gpus_per_node={per_node} but --gpus {gpus} gives {gpus.number} per node: drop "
                         "one of them or make them equal")
    if config_nodes is not None and nodes is not None and nodes != config_nodes:
        raise ValueError(f"trainer.nnodes={config_nodes} but --nodes {nodes}: drop one of them or make them equal")
    if not given and per_node is not None and trainer.device != "cpu":
        gpus = Gpus(count=per_node)
    return gpus, nodes or config_nodes or 1


def verl_world(overrides, gpus: Gpus | None, nodes: int | None) -> tuple[Gpus, int]:
    """--gpus and --nodes for an upstream verl run: the flags, else its trainer.n_gpus_per_node/trainer.nnodes
    overrides; ValueError (one line) where they disagree or no GPU count is known (verl trains on GPUs only, and
    its default of 8 per node would ask for GPUs the host may not have)."""
    per_node, config_nodes = runtimes.VERL.world(overrides)
    gpus, nodes = derive_world(SimpleNamespace(n_gpus_per_node=per_node, nnodes=config_nodes, device="cuda"),
                               gpus, nodes)
    if gpus.number is None or not gpus.wanted:
        raise ValueError(f"upstream verl trains on GPUs and needs their count per node: pass --gpus N (or "
                         f"{runtimes.VERL.world_keys[0]}=N){'; --gpus all is not a count' if gpus.count < 0 else ''}")
    return gpus, nodes


def check_world(config, gpus: Gpus, nodes: int):
    """Check a loaded config of ours against the world size (sizes that must divide it), so that a mistake stops
    here with the trainer's own one-line message, not after an image is started or a job scheduled. Returns the
    config, with trainer.n_workers set to the world size: one worker per GPU asked for (None for --gpus all on one
    node: the runtime counts them)."""
    from verl_runtime.config import validate
    from verl_runtime.errors import UserError

    world = world_size(gpus, nodes)
    asked = config.trainer.n_workers
    if world and asked is not None and asked != world:
        raise ValueError(f"trainer.n_workers={asked} but --gpus {gpus} x --nodes {nodes} gives {world} GPUs, one "
                         "worker each: drop trainer.n_workers or change --gpus/--nodes")
    if world:
        config.trainer.n_workers = world  # as `--set trainer.n_workers=<world>` will tell the trainer
        try:
            validate(config)
        except UserError as exc:
            raise ValueError(str(exc)) from None
    return config
