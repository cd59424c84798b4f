"""Typed configuration: dataclass defaults per algorithm, YAML files, dotted ``--set`` overrides, validation.

Keys follow verl's names where verl has one (``actor.ppo_mini_batch_size``, ``algorithm.adv_estimator``, ...)
and the single-controller tutorial's keys are real keys (``data.batch_size``, ``train.num_epochs``,
``model.pretrained_model_name_or_path``). Aliases map a second spelling onto the one stored value, verl's full
names among them (``actor_rollout_ref.actor.optim.lr`` is ``actor.lr``); every other key of verl 0.9.1's tree is
accepted with a one-line warning or refused with a one-line reason, as :mod:`verl_runtime.verl_keys` says.
Every problem is a :class:`ConfigError` with one line that names the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

from verl_runtime import verl_keys
from verl_runtime.errors import ConfigError

ALGORITHMS = ("ppo", "grpo", "rloo", "reinforce_plus_plus")
# The names of verl_runtime.algorithms' registries the trainer can run (torch-free here, so the host can check a
# config; tests/test_algorithms.py holds them equal). Not here: remax (a greedy baseline generation per prompt),
# gdpo (several reward components), the optimal-token baselines (the actor's sum of p^2): this trainer makes none.
ADV_ESTIMATORS = ("gae", "grpo", "grpo_vectorized", "grpo_passk", "rloo", "rloo_vectorized", "opo", "gpg",
                  "reinforce_plus_plus", "reinforce_plus_plus_baseline")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum")
KL_PENALTIES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k2+", "k3+", "low_var_kl+")


@dataclass
class DataConfig:
    # Parquet/jsonl files in verl's row layout, or "toy:<task>" for a generated toy task (see data.make_toy_rows).
    train_files: list[str] = field(default_factory=lambda: ["toy:letter"])
    val_files: list[str] = field(default_factory=list)
    batch_size: int = 8  # prompts per step (verl: data.train_batch_size)
    val_batch_size: int | None = 64  # prompts per validation generate call (None: all at once, as verl's null)
    max_prompt_length: int = 256
    max_response_length: int = 64
    truncation: str = "error"  # error | left | right | filter
    shuffle: bool = True
    apply_chat_template: bool = True
    toy_size: int = 512  # rows of a "toy:" train set (its validation set gets a quarter)


@dataclass
class ModelConfig:
    pretrained_model_name_or_path: str = "builtin:tiny"  # a local HF directory, or builtin:tiny
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16
    gradient_checkpointing: bool = False

    @property
    def path(self) -> str:
        return self.pretrained_model_name_or_path

    @path.setter
    def path(self, value: str) -> None:
        self.pretrained_model_name_or_path = value


@dataclass
class ActorConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    ppo_mini_batch_size: int | None = None  # prompts per optimizer step; None: data.batch_size (one update per step)
    ppo_micro_batch_size_per_gpu: int | None = None  # samples per forward/backward; None: the whole mini-batch
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    strategy: str = "dp"  # with several workers: dp (each holds the whole model) | fsdp (FSDP2 shards it across them)


@dataclass
class CriticConfig:
    model_path: str | None = None  # None: the actor's model
    lr: float = 1e-5
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    cliprange_value: float = 0.5
    ppo_micro_batch_size_per_gpu: int | None = None
    loss_agg_mode: str = "token-mean"
    strategy: str = "dp"  # dp | fsdp, as actor.strategy


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = 16


@dataclass
class RolloutConfig:
    name: str = "hf"  # hf (transformers generate) | builtin (our decode loop, CUDA graphs on GPU) | vllm
    n: int = 1  # samples per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    log_prob_micro_batch_size_per_gpu: int = 16
    # builtin only: compile the decode step. null: on CUDA (CUDA graphs), not on the CPU; true on the CPU: faster
    # steps for some seconds of compiling at the start of the run (needs a C++ compiler); false: never
    compile: bool | None = None
    # vllm only (verl's names): GPU memory share for weights + KV cache, tensor-parallel GPUs, KV cache freed while training
    gpu_memory_utilization: float = 0.5
    tensor_model_parallel_size: int = 1
    enable_sleep_mode: bool = True


@dataclass
class RewardConfig:
    function: str | None = None  # "path/to/file.py:fn" with verl's signature; None: the built-in scorers
    model_path: str | None = None  # a sequence-classification reward model directory, used instead of a function


@dataclass
class KLControlConfig:
    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "gae"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)


@dataclass
class TrainerConfig:
    experiment_name: str = "default"
    run_dir: str | None = None  # None: runs/<experiment_name>
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 1
    num_epochs: int = 1  # verl: trainer.total_epochs
    total_training_steps: int | None = None  # stop earlier than num_epochs
    test_freq: int = -1  # validate every N steps (and at the end); -1: never
    val_before_train: bool = True  # as verl: validate before the first step (when data.val_files is set)
    save_freq: int = -1  # checkpoint every N steps; checkpoints are also written at the end and on SIGTERM/SIGINT/SIGHUP
    keep_last: int = 2  # checkpoints kept
    resume: str = "auto"  # auto: continue from the run directory's latest checkpoint | disable
    tensorboard: bool = False
    # Workers: 1 runs every role in this process. More (or a Ray cluster to join) runs them as Ray actors, one per
    # slot of cpus_per_worker CPUs (or one GPU), training data-parallel (actor.strategy / critic.strategy).
    # null (the default): one per visible GPU on CUDA, else 1. `verl-deploy run` sets it to --gpus x --nodes.
    n_workers: int | None = None
    # verl's names for the world size: n_workers = n_gpus_per_node x nnodes (null: not given)
    n_gpus_per_node: int | None = None
    nnodes: int | None = None
    cpus_per_worker: int = 1
    placement: str = "colocated"  # colocated: all roles share the workers | split: the critic gets its own n_workers


@dataclass
class RayConfig:
    address: str | None = None  # a running cluster to join ("host:6379", "auto"); RAY_ADDRESS too. None: start one here
    num_cpus: int | None = None  # CPUs of a Ray started here (None: all of this host's)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    @property
    def train(self) -> TrainerConfig:
        """The tutorial's name for the trainer section (``config.train.num_epochs``)."""
        return self.trainer

    @property
    def run_dir(self) -> Path:
        return Path(self.trainer.run_dir or Path("runs") / self.trainer.experiment_name)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# verl keys whose value is translated, not only renamed (see _from_verl).
_TRANSLATED = (
    "trainer.logger", "data.filter_overlong_prompts", "custom_reward_function.path", "custom_reward_function.name",
    "reward.custom_reward_function.path", "reward.custom_reward_function.name", "reward_model.enable",
    "reward.reward_model.enable",
)

# Second spellings of a key (the tutorial's, then verl's: verl_keys.RULES) -> the stored key. A prefix alias maps a
# whole section.
ALIASES = {
    "model.path": "model.pretrained_model_name_or_path",
    "train": "trainer",
    **{
        rule.pattern: rule.target
        for rule in verl_keys.RULES
        if rule.kind == verl_keys.MAPS and rule.pattern not in _TRANSLATED and rule.pattern != rule.target
    },
}

# What each algorithm changes from the defaults (verl's example scripts for each estimator).
_GROUP_PRESET = {
    "rollout.n": 4,
    "actor.use_kl_loss": True,
    "actor.kl_loss_coef": 0.001,
    "actor.kl_loss_type": "low_var_kl",
}
PRESETS = {
    "ppo": {"algorithm.adv_estimator": "gae"},
    "grpo": {"algorithm.adv_estimator": "grpo", **_GROUP_PRESET},
    "rloo": {"algorithm.adv_estimator": "rloo", **_GROUP_PRESET},
    "reinforce_plus_plus": {"algorithm.adv_estimator": "reinforce_plus_plus", **_GROUP_PRESET},
}
_PRESET_OF_ESTIMATOR = {
    "gae": "ppo",
    "grpo": "grpo",
    "rloo": "rloo",
    "reinforce_plus_plus": "reinforce_plus_plus",
    "reinforce_plus_plus_baseline": "reinforce_plus_plus",
    # group estimators: the GRPO preset's samples per prompt
    "grpo_vectorized": "grpo",
    "grpo_passk": "grpo",
    "opo": "grpo",
    "gpg": "grpo",
    "rloo_vectorized": "rloo",
}


def get_default_config(algo: str = "ppo") -> Config:
    """The default configuration for one of ppo, grpo, rloo, reinforce_plus_plus."""
    if algo not in PRESETS:
        raise ConfigError(f"unknown algorithm {algo!r}{_suggest(algo, ALGORITHMS)} (choose one of {', '.join(ALGORITHMS)})")
    config = Config()
    for key, value in PRESETS[algo].items():
        set_value(config, key, value)
    return config


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), warn: bool = True) -> Config:
    """Defaults for the file's algorithm, then the YAML file, then ``key=value`` overrides; validated.

    Overrides take verl's (Hydra's) forms too: ``+key=value`` (add) and ``++key=value`` are ``key=value``, and
    ``~key`` drops what the file or an earlier override set (back to the default). verl's keys are translated, or
    warned about (one ``warning:`` line on stderr each, unless ``warn`` is false) or refused (verl_keys.RULES)."""
    values: dict[str, tuple[Any, str]] = {}  # dotted key -> (value, where it came from)
    if path is not None:
        for key, value in _flatten(_read_yaml(Path(path))).items():
            values[_canonical(key)] = (value, f"in {path}")
    for item in overrides:
        key, value = parse_override(item)
        key = _canonical(key)
        values.pop(key, None)  # the last one given counts, in its place (~key: none does)
        if value is not DELETE:
            values[key] = (value, "in --set")
    values = _from_verl(values, warn)
    estimator = values.get("algorithm.adv_estimator", ("gae", ""))[0]
    config = get_default_config(_PRESET_OF_ESTIMATOR.get(str(estimator), "ppo"))
    for key, (value, origin) in values.items():
        set_value(config, key, value, origin)
    _set_world_size(config)
    validate(config)
    return config


DELETE = object()  # the value of a `~key` override


def parse_override(item: str) -> tuple[str, Any]:
    """``a.b=c`` -> ("a.b", c) with c read as YAML (16 -> int, true/True -> bool, null -> None, [a, b] -> list,
    'quoted' -> str); Hydra's ``+a.b=c`` and ``++a.b=c`` are the same; ``~a.b`` -> ("a.b", DELETE)."""
    if item.startswith("~") and "=" not in item:
        return item[1:].strip(), DELETE
    key, sep, text = item.partition("=")
    key = key.strip().lstrip("+")
    if not sep or not key:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    if isinstance(value, str) and "${" in value:
        raise ConfigError(f"{key}: interpolations ({value}) are not supported here: give the value itself")
    return key, value


def set_value(config: Config, key: str, value: Any, origin: str = "") -> None:
    """Set a dotted key, coercing the value to the field's type."""
    key = _canonical(key)
    *parents, name = key.split(".")
    target: Any = config
    for part in parents:
        if not dataclasses.is_dataclass(target) or part not in _field_types(target):
            _unknown_key(key, origin)
        target = getattr(target, part)
    types_ = _field_types(target) if dataclasses.is_dataclass(target) else {}
    if name not in types_ or dataclasses.is_dataclass(types_[name]):
        _unknown_key(key, origin)
    setattr(target, name, _coerce(key, value, types_[name]))


def all_keys(node: Any = None, prefix: str = "") -> list[str]:
    """Every settable dotted key, e.g. ``actor.lr``."""
    node = Config if node is None else node
    keys = []
    for name, tp in _field_types(node).items():
        if dataclasses.is_dataclass(tp):
            keys += all_keys(tp, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def validate(config: Config) -> None:
    """Check choices and that batch sizes divide; raise one ConfigError for the first problem."""
    _check_choice("algorithm.adv_estimator", config.algorithm.adv_estimator, ADV_ESTIMATORS)
    _check_choice("actor.loss_agg_mode", config.actor.loss_agg_mode, LOSS_AGG_MODES)
    _check_choice("critic.loss_agg_mode", config.critic.loss_agg_mode, LOSS_AGG_MODES)
    _check_choice("actor.kl_loss_type", config.actor.kl_loss_type, KL_PENALTIES)
    _check_choice("algorithm.kl_penalty", config.algorithm.kl_penalty, KL_PENALTIES)
    _check_choice("algorithm.kl_ctrl.type", config.algorithm.kl_ctrl.type, ("fixed", "adaptive"))
    _check_choice("data.truncation", config.data.truncation, ("error", "left", "right", "filter"))
    _check_choice("model.dtype", config.model.dtype, ("auto", "float32", "bfloat16", "float16"))
    _check_choice("trainer.device", config.trainer.device, ("auto", "cpu", "cuda"))
    _check_choice("trainer.resume", config.trainer.resume, ("auto", "disable"))
    _check_choice("rollout.name", config.rollout.name, ("hf", "builtin", "vllm"))
    _check_choice("trainer.placement", config.trainer.placement, ("colocated", "split"))
    _check_choice("actor.strategy", config.actor.strategy, ("dp", "fsdp"))
    _check_choice("critic.strategy", config.critic.strategy, ("dp", "fsdp"))

    positive = {
        "data.batch_size": config.data.batch_size,
        "data.val_batch_size": config.data.val_batch_size,
        "data.max_prompt_length": config.data.max_prompt_length,
        "data.max_response_length": config.data.max_response_length,
        "rollout.n": config.rollout.n,
        "actor.ppo_epochs": config.actor.ppo_epochs,
        "actor.ppo_mini_batch_size": mini_batch_size(config),
        "actor.ppo_micro_batch_size_per_gpu": config.actor.ppo_micro_batch_size_per_gpu,
        "critic.ppo_micro_batch_size_per_gpu": config.critic.ppo_micro_batch_size_per_gpu,
        "ref.log_prob_micro_batch_size_per_gpu": config.ref.log_prob_micro_batch_size_per_gpu,
        "rollout.log_prob_micro_batch_size_per_gpu": config.rollout.log_prob_micro_batch_size_per_gpu,
        "trainer.num_epochs": config.trainer.num_epochs,
        "trainer.keep_last": config.trainer.keep_last,
        "trainer.total_training_steps": config.trainer.total_training_steps,
        "trainer.n_workers": config.trainer.n_workers,
        "trainer.cpus_per_worker": config.trainer.cpus_per_worker,
    }
    for key, value in positive.items():
        if value is not None and value < 1:  # None: unset (see the field's comment)
            raise ConfigError(f"{key} must be at least 1, got {value}")

    batch, mini, n = config.data.batch_size, mini_batch_size(config), config.rollout.n
    if batch % mini:
        raise ConfigError(f"data.batch_size ({batch}) must be a multiple of actor.ppo_mini_batch_size ({mini})")
    micro_sizes = {
        "actor.ppo_micro_batch_size_per_gpu": config.actor.ppo_micro_batch_size_per_gpu,
        "critic.ppo_micro_batch_size_per_gpu": config.critic.ppo_micro_batch_size_per_gpu,
    }
    for key, micro in micro_sizes.items():
        if micro and (mini * n) % micro:
            raise ConfigError(
                f"actor.ppo_mini_batch_size * rollout.n ({mini} * {n} = {mini * n} samples) must be a multiple of "
                f"{key} ({micro})"
            )
    workers = config.trainer.n_workers  # None: known once the trainer sees its GPUs (resolve_world_size)
    if workers and (mini * n) % workers:
        raise ConfigError(
            f"actor.ppo_mini_batch_size * rollout.n ({mini} * {n} = {mini * n} samples) must be a multiple of "
            f"trainer.n_workers ({workers}): each worker trains on an equal share"
        )
    if config.algorithm.adv_estimator in ("grpo", "rloo") and n < 2:
        raise ConfigError(f"algorithm.adv_estimator={config.algorithm.adv_estimator} compares samples of one prompt: set rollout.n to 2 or more")


def mini_batch_size(config: Config) -> int:
    """Prompts per optimizer step (actor.ppo_mini_batch_size, or the whole batch when unset)."""
    return config.actor.ppo_mini_batch_size or config.data.batch_size


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=False)


# Keys that differ between starts of one run by design: where it is, and whether it resumes.
_NOT_A_CHANGE = ("trainer.run_dir", "trainer.resume")


def diff_configs(old_yaml: str, new: Config) -> dict[str, list]:
    """{dotted key: [old, new]} for each value that differs between a saved config.yaml and a config (a key missing
    on one side counts as None there). An unreadable old file gives {}: there is nothing to compare with."""
    try:
        old = yaml.safe_load(old_yaml)
    except yaml.YAMLError:
        return {}
    if not isinstance(old, dict):
        return {}
    before, after = _flatten(old), _flatten(yaml.safe_load(to_yaml(new)))  # both as YAML reads them back
    keys = list(after) + [key for key in before if key not in after]  # in the config's own order
    return {
        key: [before.get(key), after.get(key)]
        for key in keys
        if key not in _NOT_A_CHANGE and before.get(key) != after.get(key)
    }


# --- helpers -----------------------------------------------------------------------------------------------------


def _from_verl(values: dict[str, tuple[Any, str]], warn: bool) -> dict[str, tuple[Any, str]]:
    """Our keys as they are; verl's keys that are not ours translated (verl_keys.RULES): warned about and dropped,
    refused in one line, or turned into our keys. Unknown keys are left for set_value to name."""
    ours = set(all_keys())
    out: dict[str, tuple[Any, str]] = {}
    reward_path = reward_name = None  # (value, origin) of verl's custom_reward_function.{path,name}
    reward_model_enabled = None
    for key, (value, origin) in values.items():
        rule = None if key in ours else verl_keys.rule_for(key)
        if rule is None:
            out[key] = (value, origin)
        elif rule.kind == verl_keys.IGNORED:
            if warn:
                _warn(f"{key} has no effect here: {rule.reason}")
        elif rule.kind == verl_keys.REFUSED:
            if not any(_same_value(value, ok) for ok in rule.accepts):
                accepted = " or ".join("null" if ok is None else repr(ok) for ok in rule.accepts)
                unless = f" (accepted: {accepted})" if accepted else ""
                raise ConfigError(f"{key}={value!r} {origin} is refused: {rule.reason}{unless}")
        elif key == "trainer.logger":
            loggers = [value] if isinstance(value, str) else list(value or [])
            out["trainer.tensorboard"] = ("tensorboard" in loggers, origin)
            others = [name for name in loggers if name not in ("console", "tensorboard")]
            if others and warn:
                _warn(f"trainer.logger: {', '.join(map(str, others))} not here: metrics go to the console and "
                      "metrics.jsonl (and TensorBoard with tensorboard)")
        elif key == "data.filter_overlong_prompts":
            if _coerce(key, value, bool):
                out["data.truncation"] = ("filter", origin)
        elif key.endswith("custom_reward_function.path"):
            reward_path = (value, origin)
        elif key.endswith("custom_reward_function.name"):
            reward_name = (value, origin)
        elif key.endswith("reward_model.enable"):
            reward_model_enabled = None if value is None else _coerce(key, value, bool)
        else:
            raise AssertionError(f"no translation for {key}")  # a maps rule missing from ALIASES and _TRANSLATED
    if reward_path and reward_path[0]:
        name = reward_name[0] if reward_name and reward_name[0] else ""
        out["reward.function"] = (f"{reward_path[0]}:{name}" if name else str(reward_path[0]), reward_path[1])
    if reward_model_enabled is False:
        out.pop("reward.model_path", None)
    return out


def _same_value(value: Any, accepted: Any) -> bool:
    """value == accepted, where true is not 1 and 0 is not false."""
    return value == accepted and isinstance(value, bool) == isinstance(accepted, bool)


def _set_world_size(config: Config) -> None:
    """trainer.n_gpus_per_node x trainer.nnodes (verl's names) set trainer.n_workers; one line where they disagree."""
    trainer = config.trainer
    if trainer.n_gpus_per_node is None and trainer.nnodes is None:
        return
    if trainer.n_gpus_per_node is None:
        raise ConfigError("trainer.nnodes needs trainer.n_gpus_per_node: the world size is their product")
    for key, value in (("trainer.n_gpus_per_node", trainer.n_gpus_per_node), ("trainer.nnodes", trainer.nnodes)):
        if value is not None and value < 1:
            raise ConfigError(f"{key} must be at least 1, got {value}")
    world = trainer.n_gpus_per_node * (trainer.nnodes or 1)
    if trainer.n_workers is not None and trainer.n_workers != world:
        raise ConfigError(
            f"trainer.n_workers={trainer.n_workers} but trainer.n_gpus_per_node x trainer.nnodes = "
            f"{trainer.n_gpus_per_node} x {trainer.nnodes or 1} = {world}: give one of them, or equal ones"
        )
    trainer.n_workers = world


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (data:, model:, ...) at the top level")
    return data


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _canonical(key: str) -> str:
    """The stored key of a spelling; an alias may lead to another (actor_rollout_ref.model.path -> model.path)."""
    for alias, target in ALIASES.items():
        if key == alias or key.startswith(alias + "."):
            return _canonical(target + key[len(alias) :]) if target != alias else key
    return key


def _field_types(node: Any) -> dict[str, Any]:
    cls = node if isinstance(node, type) else type(node)
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _closest(word: str, choices: typing.Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return matches[0] if matches else None


def _suggest(word: str, choices: typing.Iterable[str]) -> str:
    match = _closest(word, choices)
    return f"; did you mean {match!r}?" if match else ""


def _unknown_key(key: str, origin: str) -> typing.NoReturn:
    keys = all_keys() + list(ALIASES) + sorted(verl_keys.verl_keys() - set(ALIASES))
    match = _same_words(key, keys) or _closest(key, keys)
    if match is None:  # a misspelt name in a known section, e.g. actor.learning_rate
        section, _, name = key.rpartition(".")
        names = {k.rpartition(".")[2]: k for k in keys if k.startswith(section + ".")}
        close = _closest(name, names)
        match = names[close] if close else None
    hint = f"; did you mean {match!r}?" if match else ""
    where = f" {origin}" if origin else ""
    raise ConfigError(f"unknown config key {key!r}{where}{hint}")


def _same_words(key: str, keys: list[str]) -> str | None:
    """The shortest key of the same section whose name holds every word of the given name: trainer.total_steps ->
    trainer.total_training_steps (difflib alone would say trainer.total_epochs, which counts something else)."""
    section, _, name = key.rpartition(".")
    words = set(name.split("_"))
    found = [k for k in keys if k.rpartition(".")[0] == section and words <= set(k.rpartition(".")[2].split("_"))]
    return min(found, key=len) if found and len(words) > 1 else None


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}: unknown value {value!r}{_suggest(str(value), choices)} (choose one of {', '.join(choices)})")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(key, value, option)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is list:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(key, item, args[0]) for item in items]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # YAML reads 1e-6 (no dot) as a string
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    else:
        return value
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")


def _type_name(tp: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_type_name(a) if a is not type(None) else "null" for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return "a list"
    return names.get(tp, getattr(tp, "__name__", str(tp)))
