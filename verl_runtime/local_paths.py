"""The files and directories a config names on a disk, checked before anything loads.

A run reads data files (data.train_files, data.val_files; ``toy:<task>`` is generated, not read), a reward
function's file (reward.function) and model directories (model.path, critic.model_path, reward.model_path; not
``builtin:...``, and not a Hub id ``org/name`` where no directory of that name exists, as
models.resolve_model_path decides). A missing one would be found after the model load (on a cluster: after the
GPUs are allocated); here it is one line naming its key, before the run directory is created.

Torch-free: ``verl-deploy run`` checks the same list on the host, through a ``locate`` that says where a path of the
config is on the host, or that it cannot be seen from there (verl_deploy.launchers.jobspec.check_paths).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from verl_runtime.data import DATA_SUFFIXES, TOY_PREFIX, TOY_TASKS
from verl_runtime.errors import DataError, ModelError, RewardFunctionError
from verl_runtime.hub import is_hub_id
from verl_runtime.rewards.custom import parse_spec

DATA_FILE, REWARD_FILE, MODEL_DIR = "data file", "reward function file", "model directory"


@dataclass(frozen=True)
class LocalPath:
    key: str  # the config key that names it
    path: str  # as the config writes it
    kind: str  # DATA_FILE | REWARD_FILE | MODEL_DIR


def local_paths(config) -> list[LocalPath]:
    """Every path of config that names something on a disk, in the config's order. A reward.function that is not
    ``path/to/file.py[:name]`` is refused here (RewardFunctionError)."""
    found = []
    for key in ("data.train_files", "data.val_files"):
        for name in getattr(config.data, key.split(".")[1]):
            if name.startswith(TOY_PREFIX):
                task = name.removeprefix(TOY_PREFIX)
                if task not in TOY_TASKS:
                    choices = ", ".join(TOY_PREFIX + t for t in TOY_TASKS)
                    raise DataError(f"{key}: unknown toy task {name!r}: choose one of {choices}")
            else:
                found.append(LocalPath(key, name, DATA_FILE))
    retriever = config.services.retriever
    if retriever.enable and retriever.corpus and not retriever.url:  # read by the retriever the run starts
        found.append(LocalPath("services.retriever.corpus", str(retriever.corpus), DATA_FILE))
    if config.reward.function:
        found.append(LocalPath("reward.function", str(parse_spec(config.reward.function)[0]), REWARD_FILE))
    for key, model in (("model.path", config.model.path), ("critic.model_path", config.critic.model_path),
                       ("reward.model_path", config.reward.model_path)):
        if model and not str(model).startswith("builtin:"):
            found.append(LocalPath(key, str(model), MODEL_DIR))
    return found


def on_this_machine(item: LocalPath) -> Path | None:
    """Where a path of the config is when the trainer runs here: the path itself."""
    return Path(item.path).expanduser()


def check_local_paths(config, locate: Callable[[LocalPath], Path | None] = on_this_machine) -> None:
    """A UserError (one line, naming the key) for the first path of config that is missing or of the wrong kind.
    locate: where an item is on this machine, or None where it cannot be checked from here (a cluster's claim)."""
    for item in local_paths(config):
        where = locate(item)
        if where is not None:
            _check(item, where)


def _check(item: LocalPath, where: Path) -> None:
    shown = item.path if where == Path(item.path).expanduser() else f"{item.path} ({where} here)"
    if item.kind == DATA_FILE:
        if not where.is_file():
            what = "is a directory, not a file" if where.is_dir() else "not found"
            raise DataError(f"{item.key}: data file {shown} {what}: give a {' or '.join(DATA_SUFFIXES)} file in "
                            f"verl's layout (or {TOY_PREFIX}{TOY_TASKS[0]})")
        if where.suffix not in DATA_SUFFIXES:
            raise DataError(f"{item.key}: data file {shown} has an unsupported type '{where.suffix}': use "
                            f"{' or '.join(DATA_SUFFIXES)}")
    elif item.kind == REWARD_FILE:
        if not where.is_file():
            raise RewardFunctionError(f"reward.function: reward function file {shown} not found: give an existing "
                                      "path/to/file.py:function_name")
    elif not where.is_dir():
        if is_hub_id(item.path):
            return  # a Hub id, which the trainer downloads (or finds in the cache)
        raise ModelError(f"{item.key}: model directory {shown} not found: give a local Hugging Face model directory "
                         "(with config.json), a Hub id (org/name) or builtin:tiny")
    elif not (where / "config.json").is_file():
        raise ModelError(f"{item.key}: model directory {shown} has no config.json: give a Hugging Face model "
                         "directory (one written by save_pretrained)")
