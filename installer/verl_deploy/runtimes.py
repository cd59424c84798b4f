"""Which trainer a run uses, as one object per runtime, chosen once (runplan.check_runtime: --runtime, or a resumed
run's record): verl-deploy's own runtime (verl_runtime) or upstream verl's main_ppo. What differs between them for
the host (whether a CONFIG file comes first, the overrides' grammar, where the model and the world size are written,
how the command line names it) is a field here, which callers read instead of comparing names.

An image's side of a runtime (its Dockerfile, pins and variants) is the catalog's: compat.Runtime, read from
docker/variants.yaml; tests/test_runtimes.py holds both lists the same. This module imports nothing of this package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Hydra's override forms, as verl's main_ppo takes them: key=value, +key=value (a new key), ++key=value, ~key.
_HYDRA_OVERRIDE = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][\w.\-\[\]/@]*(=.*)?$", re.S)


def given(overrides, key: str) -> str | None:
    """The value the overrides give a key (the last one wins, as in Hydra), or None; `+key`/`++key` are the key."""
    value = None
    for override in overrides:
        if override.lstrip("+~").split("=", 1)[0] == key and "=" in override:
            value = override.split("=", 1)[1]
    return value


@dataclass(frozen=True)
class Planning:
    """What a trainer offers the memory planner (plan/suggest.py) to make a run fit, and how it counts micro-batches;
    each is how that trainer's code behaves (named beside each field)."""

    offloads_each_role: bool  # critic and reference offload of their own, the reference's entropy chunked
    #                           (verl_runtime/offload.py, models.LogProbMemory); verl: the actor's two offloads
    chunks_in_update: bool  # the head and entropy chunked in the update too; verl: in the old log-probs only
    shards_by_setting: bool  # sharding is a setting to suggest (actor.strategy=fsdp); verl always shards (FSDP)
    offload_policy_alone: bool  # its offload_policy applies as it is (verl_runtime/offload.py); verl's is FSDP2's,
    #                             which needs actor.strategy=fsdp2
    rollout_in_process: bool  # hf/builtin engines hold the KV cache in the trainer: vLLM is a change to suggest
    rollout_tp: bool  # vLLM's tensor parallelism within the node is a change to suggest (verl's rollout spans the
    #                   node's GPUs); ours is planned with its rollout on one GPU, where vLLM's share is the change
    values_budget: bool  # the critic's forward is planned with its own token budget (critic.forward_max_token_len_
    #                      per_gpu); verl's plan takes the critic update's
    micro_per_worker: bool  # micro-batch sizes count sequences per worker, dividing mini-batch x n; verl's
    #                         deprecated global keys count them over all GPUs / sp


@dataclass(frozen=True)
class Trainer:
    """One runtime's rules on the host."""

    name: str  # as --runtime takes it (the catalog's name)
    takes_config: bool  # a CONFIG file of ours may come before the overrides
    hydra_overrides: bool  # overrides kept as given (+key, ++key, ~key); else `+key=v` is `key=v` and ~key refused
    model_keys: tuple[str, str]  # the actor's and the critic's model path, as the user writes them
    world_keys: tuple[str, str] | None  # the overrides that give GPUs per node and nodes; None: the config's
    takes_verl_source: bool  # --verl-source and --entry (a fork of verl) apply
    planning: Planning

    @property
    def own(self) -> bool:
        """verl-deploy's own runtime (the default)."""
        return self is OURS

    @property
    def flag(self) -> str:
        """How a printed command names this runtime: nothing for the default."""
        return "" if self.own else f"--runtime {self.name}"

    def check_overrides(self, overrides) -> tuple[str, ...]:
        """The overrides as this trainer takes them; ValueError (one line) for one it does not take."""
        if self.hydra_overrides:
            for override in overrides:
                if not _HYDRA_OVERRIDE.match(override) or ("=" not in override and not override.startswith("~")):
                    raise ValueError(f"override {override!r} is not one verl takes: key=value, +key=value (a new "
                                     "key), ++key=value or ~key (drop one)")
            return tuple(overrides)
        for override in overrides:
            if "=" not in override:
                hint = " (dropping a key, ~key, is for python -m verl_runtime.main_ppo)" if override.startswith("~") else ""
                raise ValueError(f"override {override!r} needs the form key=value{hint}")
        return tuple(override.lstrip("+") for override in overrides)

    def world(self, overrides) -> tuple[int | None, int | None]:
        """GPUs per node and nodes as the overrides give them (world_keys; None where not given, and for a trainer
        whose config holds them); ValueError (one line) for one that is not a whole number."""
        if self.world_keys is None:
            return None, None
        counts = []
        for key in self.world_keys:
            text = given(overrides, key)
            if text is not None and not text.isdigit():
                raise ValueError(f"{key}={text} is not a count: give a whole number")
            counts.append(None if text is None else int(text))
        return counts[0], counts[1]

    def check_verl_source(self, flag: str = "--verl-source") -> None:
        """ValueError (one line) for --verl-source or --entry (a fork of verl, its command) given to a trainer that is
        not verl's."""
        if not self.takes_verl_source:
            raise ValueError(f"{flag} is upstream verl's: add --runtime verl")

    def check_config(self, config) -> None:
        """ValueError (one line) for a CONFIG file given to a trainer that takes none."""
        if config is not None and not self.takes_config:
            raise ValueError(f"--runtime {self.name} takes no CONFIG file ({config}): verl's config is its overrides, "
                             f"`verl-deploy run --runtime {self.name} -- KEY=VALUE ...` (its own YAML files are Hydra "
                             "configs, composed by verl in its image)")


OURS = Trainer(name="verl-deploy", takes_config=True, hydra_overrides=False,
               model_keys=("model.path", "critic.model_path"), world_keys=None, takes_verl_source=False,
               planning=Planning(offloads_each_role=True, chunks_in_update=True, shards_by_setting=True,
                                 offload_policy_alone=True, rollout_in_process=True, rollout_tp=False, values_budget=True, micro_per_worker=True))
VERL = Trainer(name="verl", takes_config=False, hydra_overrides=True,
               model_keys=("actor_rollout_ref.model.path", "critic.model.path"),
               world_keys=("trainer.n_gpus_per_node", "trainer.nnodes"), takes_verl_source=True,
               planning=Planning(offloads_each_role=False, chunks_in_update=False, shards_by_setting=False,
                                 offload_policy_alone=False, rollout_in_process=False, rollout_tp=True, values_budget=False,
                                 micro_per_worker=False))
TRAINERS = {trainer.name: trainer for trainer in (OURS, VERL)}


def trainer(name: str | None) -> Trainer:
    """The runtime named (None: the default); ValueError (one line) naming the others."""
    if name is None:
        return OURS
    try:
        return TRAINERS[name]
    except KeyError:
        raise ValueError(f"--runtime {name!r}: use {' or '.join(TRAINERS)}") from None
