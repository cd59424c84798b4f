"""verl 0.9.1's config keys and what each does here: the one table that config loading and docs/verl.md read.

Every key of verl's composed PPO config (``verl_0_9_1_keys.txt``, extracted from its wheel) falls under the first
rule below whose pattern matches it (``*`` matches any text, dots included):

- ``maps``: the key is a second name of one of ours (one stored value), e.g. ``actor_rollout_ref.actor.optim.lr``
  is ``actor.lr``; where the value is translated (``trainer.logger``), the reason says how;
- ``ignored``: accepted with a one-line warning: it has no effect here, and the reason says why (memory, speed,
  engine plumbing: the numbers do not change);
- ``refused``: ignoring it would change the results, so a value other than the ones listed in ``accepts`` (verl's
  default, which is what we do) stops the run with a one-line reason. The accepted values pass silently.

Keys without a rule of their own here are ours under the same name (``data.train_files``, ``trainer.save_freq``).
A key that is neither is looked up in ``verl_key_history.json`` (every release's keys and values, and the renames:
``key_way_out``, ``value_way_out``), so its refusal names the key verl renamed it to, the release that last had it,
or, in no release, the user's fork (``--verl-source``).
The list is regenerated with ``python -m verl_runtime.verl_keys verl-0.9.1-py3-none-any.whl``.
"""

from __future__ import annotations

import fnmatch
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

VERL_VERSION = "0.9.1"
KEYS_FILE = Path(__file__).with_name("verl_0_9_1_keys.txt")

MAPS, IGNORED, REFUSED = "maps", "ignored", "refused"

# How to run what this runtime does not (Megatron, SGLang, NPUs, multi-modal data...): verl's own trainer, with the
# same command line. Every out-of-scope refusal ends with it (out_of_scope).
RUN_WITH_VERL = "verl-deploy run --runtime verl -- <the same overrides>"


# How to run a fork of verl (a research repository's own copy): its keys and values are in no verl release.
RUN_FORK = "verl-deploy run --runtime verl --verl-source <your repo> -- <the same overrides>"


def out_of_scope(what: str) -> str:
    """The reason of a refusal for something this runtime does not do at all, naming the way to run it."""
    return f"{what}: out of this runtime's scope; run it with {RUN_WITH_VERL}"


def not_here(what: str) -> str:
    """The reason of a refusal for a feature of verl 0.9.1 this runtime lacks: verl's own trainer runs it."""
    return f"{what}; verl runs it: {RUN_WITH_VERL}"


_ENGINES = "verl's Megatron, MindSpeed, TorchTitan and VeOmni engines"

# A key of verl's engine trainer configs only (verl_key_history.json's engine_keys: ppo_megatron_trainer, ...).
ENGINE_ONLY = out_of_scope(f"a key of {_ENGINES}")

# verl's own Hydra config names (main_ppo --config-name): its default is our defaults; the others are out of scope.
VERL_CONFIG_NAMES = {"ppo_trainer": None, "ppo_megatron_trainer": _ENGINES}

# Hydra config-group choices of verl's main_ppo (``model_engine=megatron``): overrides, not keys of the tree.
HYDRA_GROUPS = ("model_engine",)
# Keys verl's scripts write that its tree lacks, which rules here are for: its group choices, keys added with +key
# under a mapping-valued key or an open section (tests/test_verl_cli.py counts a rule for one of them as live).
ADDED_KEYS = ("model_engine", "actor@actor_rollout_ref.actor", "hydra.searchpath",
              "actor_rollout_ref.model.override_config.max_position_embeddings",
              "actor_rollout_ref.model.override_config.attention_dropout",
              "data.apply_chat_template_kwargs.enable_thinking", "data.apply_chat_template_kwargs.reasoning_effort",
              "data.apply_chat_template_kwargs.tools",
              # verl's older name of critic.fsdp, which its recipes still write (retool/run_qwen2-32b_ppo.sh)
              *(f"critic.model.fsdp_config.{name}" for name in ("param_offload", "optimizer_offload", "offload_policy")),
              "actor_rollout_ref.actor.policy_loss.tau_pos", "actor_rollout_ref.actor.policy_loss.tau_neg",
              # DAPO's reward_kwargs, under verl's older reward_model section and its reward section
              *(f"{section}.reward_kwargs.{name}" for section in ("reward_model", "reward") for name in (
                  "max_resp_len", *(f"overlong_buffer_cfg.{key}" for key in ("enable", "len", "penalty_factor", "log")))))
# Sections whose every key is ignored, where a key verl's tree lacks (added with Hydra's +key) is ignored too:
# verl's scripts add FSDP settings (+...fsdp_config.mixed_precision.param_dtype) and Hydra's own (hydra.searchpath).
OPEN_SECTIONS = ("*fsdp_config.*", "critic.fsdp.*", "hydra.*")

# Values of keys that are ours too (after verl's names are mapped) that stop the run: {our key: {value: reason}}.
VALUE_REFUSALS = {
    "rollout.name": {"sglang": out_of_scope("SGLang rollout"), "trtllm": out_of_scope("TensorRT-LLM rollout")},
    "trainer.device": {"npu": out_of_scope("training on Ascend NPUs")},
    "critic.strategy": {name: out_of_scope(_ENGINES) for name in ("megatron", "mindspeed", "veomni", "torchtitan")},
    "trainer.resume": {"resume_path": "resuming from a given checkpoint is not here: a run resumes from its own run "
                                      "directory (trainer.run_dir; verl-deploy run --resume RUN)"},
}
# verl's spellings of the values of keys that are ours too: {our key: {verl's value: ours}}.
# verl 0.9.1's reward managers other than naive and dapo (config.REWARD_MANAGERS), and a recipe's
_OTHER_MANAGERS = {"gdpo": "GDPO's (several reward components, normalized apart)", "rate_limited": "the rate-limited",
                   "remote": "the remote", "batch": "the batched", "prime": "PRIME's"}
VALUE_REFUSALS["reward.manager"] = {name: not_here(f"{what} reward manager is not here (naive and dapo are)")
                                    for name, what in _OTHER_MANAGERS.items()}
# verl's recipe repository's own (recipe/collabllm), in no verl release: a fork's, for verl-deploy
VALUE_REFUSALS["reward.manager"]["collabllm"] = f"CollabLLM's reward manager is verl-recipe's: run it with {RUN_FORK}"
VALUE_REFUSALS["trainer.mode"] = {"colocate_async": not_here(
    "colocate_async (the next batch generated on the trainer's own GPUs during the update) is not here; "
    "trainer.mode=separate_async overlaps them on GPUs of the rollout's own")}
VALUE_SPELLINGS = {"critic.strategy": {"fsdp2": "fsdp"}}


# verl 0.9.1's defaults where ours differ, for a verl command line (one that gives any key of verl's own that is not
# ours): what verl would train with where the line does not say (verl/trainer/config/_generated_ppo_trainer.yaml in
# its wheel; tests/test_verl_defaults.py checks every value against it, and that every other difference is below).
# our key -> (verl's key, verl's default)
VERL_DEFAULTS = {
    "actor.strategy": ("actor_rollout_ref.actor.strategy", "fsdp"),
    "critic.strategy": ("critic.strategy", "fsdp"),
    "data.batch_size": ("data.train_batch_size", 1024),
    "data.val_batch_size": ("data.val_batch_size", None),
    "data.max_prompt_length": ("data.max_prompt_length", 512),
    "data.max_response_length": ("data.max_response_length", 512),
    "model.gradient_checkpointing": ("actor_rollout_ref.model.enable_gradient_checkpointing", True),
    "model.use_remove_padding": ("actor_rollout_ref.model.use_remove_padding", True),
    "critic.use_remove_padding": ("critic.model.use_remove_padding", True),
    "actor.ppo_mini_batch_size": ("actor_rollout_ref.actor.ppo_mini_batch_size", 256),
    "rollout.n": ("actor_rollout_ref.rollout.n", 1),
    "rollout.calculate_log_probs": ("actor_rollout_ref.rollout.calculate_log_probs", True),
    "actor.use_kl_loss": ("actor_rollout_ref.actor.use_kl_loss", False),
    "trainer.num_epochs": ("trainer.total_epochs", 30),
    "rollout.nnodes": ("actor_rollout_ref.rollout.nnodes", 0),
    "trainer.separate_async.parameter_sync_step": ("trainer.v1.separate_async.parameter_sync_step", 4),
}
# verl keys a line of ours may borrow without speaking verl: they say where metrics go, not what is trained, so they
# bring none of verl's defaults (nor does a key verl has and this runtime ignores). config._gives_verls_keys reads it.
BOOKKEEPING_KEYS = ("trainer.logger",)
# Where verl's default differs from ours and ours stays, with why (the test above holds the list complete).
VERL_DEFAULTS_LEFT_OUT = {
    "rollout.tensor_model_parallel_size": "verl's 2: this runtime runs one rollout engine per worker (above 1 it runs "
                                          "the rollout data-parallel where one GPU holds the model)",
    "trainer.n_gpus_per_node": "the launcher's --gpus decide the workers",
    "trainer.mode": "the same sync: verl's actor_rollout_ref.hybrid_engine=true (its default) leaves it so",
    "rollout.n_gpus_per_node": "verl's is trainer.n_gpus_per_node's, which the launcher's --gpus decide here",
    "trainer.nnodes": "the launcher's --nodes decide",
    "trainer.device": "auto is cuda where there is a GPU",
    "trainer.logger": "verl's console and wandb: a tracker is never turned on unasked",
    "trainer.trackers": "as trainer.logger",
    "trainer.project_name": "a name", "trainer.experiment_name": "a name",
    "data.train_files": "an example path of verl's", "data.val_files": "an example path of verl's",
    "critic.model_path": "an example path of verl's (the critic is the actor's model unless given)",
    "reward.function": "verl's compute_score names the function of a file it does not have",
    "reward.model_path": "no reward model unless given, as verl",
    "reward.manager": "null is verl's naive manager, ours by name",
    "rollout.log_prob_micro_batch_size_per_gpu": "verl leaves it to the line (it refuses a line without it)",
    "ref.log_prob_micro_batch_size_per_gpu": "verl leaves it to the line (it refuses a line without it)",
    "actor.lr_scheduler_type": "verl's warmup_style null defers to its lr_scheduler_type, constant as ours",
    "critic.lr_scheduler_type": "as the actor's",
    "actor.clip_ratio_low": "null: clip_ratio's 0.2, verl's value", "actor.clip_ratio_high": "null: clip_ratio's 0.2",
    "algorithm.rollout_correction.rollout_is_threshold": "the same 2.0, kept as text for its upper:lower form",
}


@dataclass(frozen=True)
class Rule:
    pattern: str  # a verl key, or a pattern with * (fnmatch)
    kind: str  # maps | ignored | refused
    target: str = ""  # maps: our key
    reason: str = ""  # why (ignored, refused), or what the mapping does beyond a rename
    accepts: tuple = ()  # refused: the values that match what we do (verl's default among them)

    def matches(self, key: str) -> bool:
        return fnmatch.fnmatchcase(key, self.pattern)


def _maps(pattern, target, reason=""):
    return Rule(pattern, MAPS, target=target, reason=reason)


def _ignored(pattern, reason):
    return Rule(pattern, IGNORED, reason=reason)


def _refused(pattern, reason, *accepts):
    return Rule(pattern, REFUSED, reason=reason, accepts=accepts)


def _routed(pattern, what, *accepts):
    """Refused (unless one of accepts): out of this runtime's scope, run by verl itself."""
    return Rule(pattern, REFUSED, reason=out_of_scope(what), accepts=accepts)


_AR = "actor_rollout_ref"
_ENGINE = "engine plumbing of verl's workers (sharding, compilation, kernels): our workers train the same numbers without it"
_MEMORY = "memory and speed only: the numbers do not change"
_ROLLOUT_ENGINE = "a setting of verl's rollout server (vLLM/SGLang scheduling, caching, graphs): speed only here"
_SEED = "randomness here follows trainer.seed"
_GLOBAL_MICRO = ("older scripts' global size: divided by the world size over ulysses_sequence_parallel_size, as "
                 "verl's FSDP workers did (0.7's fsdp_workers.py)")
_NO_VISION = "multi-modal data (images, video, audio)"
_OPTIM = ("betas", "lr_warmup_steps", "lr_warmup_steps_ratio", "lr_scheduler_type", "min_lr_ratio", "num_cycles",
          "zero_indexed_step")  # verl's optim.* keys that are ours under the same name (actor.*, critic.*)
_OFFLOAD = {  # verl's fsdp_config offload keys: what each does here (the same numbers, less device memory)
    "param_offload": "parameters and gradients in host memory between phases, on the device for each phase",
    "optimizer_offload": "AdamW's state in host memory between updates",
    "offload_policy": "FSDP2's CPUOffloadPolicy where the model is sharded (strategy fsdp, several workers); on "
                      "one worker, both moves above",
}
_POLICY_LOSS = ("loss_mode", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta")

RULES: tuple[Rule, ...] = (
    # --- one stored value: verl's names of our keys ----------------------------------------------------------------
    _maps(f"{_AR}.model.path", "model.path"),
    _maps(f"{_AR}.model.enable_gradient_checkpointing", "model.gradient_checkpointing"),
    *(_maps(f"{_AR}.model.{name}", f"model.{name}", "LoRA on the actor (peft); the reference is the actor with its "
            "adapters disabled, as in verl") for name in ("lora_rank", "lora_alpha", "target_modules",
                                                         "exclude_modules", "lora_adapter_path")),
    _maps(f"{_AR}.actor.optim.lr", "actor.lr"),
    _maps(f"{_AR}.actor.optim.weight_decay", "actor.weight_decay"),
    _maps(f"{_AR}.actor.optim.clip_grad", "actor.grad_clip"),
    _maps(f"{_AR}.actor.grad_clip", "actor.grad_clip"),
    _maps(f"{_AR}.actor.ppo_mini_batch_size", "actor.ppo_mini_batch_size"),
    _maps(f"{_AR}.actor.ppo_micro_batch_size_per_gpu", "actor.ppo_micro_batch_size_per_gpu"),
    # verl's memory settings, honoured with the same numbers (models.LogProbMemory, seqlen_balancing.py)
    *(_maps(f"{_AR}.{name}.use_remove_padding", "model.use_remove_padding", "padding-free micro-batches: the real "
            "tokens packed in one row") for name in ("model", "actor")),
    _maps("critic.model.use_remove_padding", "critic.use_remove_padding"),
    *(_maps(f"{_AR}.actor.{name}", f"actor.{name}", "micro-batches by real tokens, balanced as verl balances them")
      for name in ("use_dynamic_bsz", "ppo_max_token_len_per_gpu")),
    *(_maps(f"{_AR}.{role}.{name}", f"{role}.{name}", "micro-batches by real tokens")
      for role in ("rollout", "ref") for name in ("log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu")),
    *(_maps(f"critic.{name}", f"critic.{name}", "micro-batches by real tokens")
      for name in ("use_dynamic_bsz", "ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu")),
    *(_maps(f"{_AR}.{role}.{name}", f"{role}.{name}", "log-probs and entropy chunk by chunk from the hidden states")
      for role in ("actor", "ref") for name in ("entropy_from_logits_with_chunking", "entropy_from_logits_chunk_size")),
    _maps(f"{_AR}.actor.entropy_checkpointing", "actor.entropy_checkpointing"),
    _ignored(f"{_AR}.ref.entropy_checkpointing", "the reference computes neither entropy nor gradients: "
             "nothing to recompute"),
    _maps(f"{_AR}.actor.ppo_epochs", "actor.ppo_epochs"),
    _maps(f"{_AR}.actor.clip_ratio", "actor.clip_ratio"),
    _maps(f"{_AR}.actor.clip_ratio_low", "actor.clip_ratio_low"),
    _maps(f"{_AR}.actor.clip_ratio_high", "actor.clip_ratio_high"),
    _maps(f"{_AR}.actor.clip_ratio_c", "actor.clip_ratio_c"),
    _maps(f"{_AR}.actor.loss_agg_mode", "actor.loss_agg_mode"),
    _maps(f"{_AR}.actor.entropy_coeff", "actor.entropy_coeff"),
    _maps(f"{_AR}.actor.use_kl_loss", "actor.use_kl_loss"),
    _maps(f"{_AR}.actor.kl_loss_coef", "actor.kl_loss_coef"),
    _maps(f"{_AR}.actor.kl_loss_type", "actor.kl_loss_type"),
    _maps(f"{_AR}.rollout.multi_turn.enable", "rollout.multi_turn.enable"),
    _maps(f"{_AR}.rollout.multi_turn.tool_config_path", "rollout.multi_turn.tool_config_path"),
    _maps(f"{_AR}.rollout.multi_turn.max_assistant_turns", "rollout.multi_turn.max_assistant_turns"),
    _maps(f"{_AR}.rollout.multi_turn.max_user_turns", "rollout.multi_turn.max_user_turns"),
    _maps(f"{_AR}.rollout.multi_turn.max_parallel_calls", "rollout.multi_turn.max_parallel_calls"),
    _maps(f"{_AR}.rollout.multi_turn.max_tool_response_length", "rollout.multi_turn.max_tool_response_length"),
    _maps(f"{_AR}.rollout.multi_turn.tool_response_truncate_side", "rollout.multi_turn.tool_response_truncate_side"),
    _maps(f"{_AR}.rollout.name", "rollout.name", "hf, builtin or vllm here (sglang is not)"),
    _maps(f"{_AR}.rollout.n", "rollout.n"),
    _maps(f"{_AR}.rollout.temperature", "rollout.temperature"),
    _maps(f"{_AR}.rollout.top_p", "rollout.top_p"),
    _maps(f"{_AR}.rollout.top_k", "rollout.top_k"),
    _maps(f"{_AR}.rollout.do_sample", "rollout.do_sample"),
    *(_maps(f"{_AR}.rollout.val_kwargs.{name}", f"rollout.val_kwargs.{name}") for name in ("n", "temperature", "top_p", "top_k")),
    _maps(f"{_AR}.rollout.gpu_memory_utilization", "rollout.gpu_memory_utilization"),
    _maps(f"{_AR}.rollout.tensor_model_parallel_size", "rollout.tensor_model_parallel_size"),
    _maps(f"{_AR}.rollout.log_prob_micro_batch_size_per_gpu", "rollout.log_prob_micro_batch_size_per_gpu"),
    _maps(f"{_AR}.rollout.calculate_log_probs", "rollout.calculate_log_probs",
          "the rollout's log-probs go to algorithm.rollout_correction (rollout/logprob_diff is logged either way)"),
    _maps(f"{_AR}.ref.log_prob_micro_batch_size_per_gpu", "ref.log_prob_micro_batch_size_per_gpu"),
    *(_maps(f"{_AR}.{role}.{name}", f"{role}.{name}_per_gpu", _GLOBAL_MICRO)
      for role, name in (("actor", "ppo_micro_batch_size"), ("rollout", "log_prob_micro_batch_size"),
                         ("ref", "log_prob_micro_batch_size"))),
    _maps("critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size_per_gpu", _GLOBAL_MICRO),
    *(_maps(f"{_AR}.actor.optim.{name}", f"actor.{name}") for name in _OPTIM),
    _maps(f"{_AR}.actor.optim.warmup_style", "actor.lr_scheduler_type",
          "verl's older name: a value other than null sets lr_scheduler_type, whichever comes first"),
    *(_maps(f"{_AR}.actor.policy_loss.{name}", f"actor.policy_loss.{name}") for name in _POLICY_LOSS),
    _maps(f"{_AR}.actor.tau_pos", "actor.tau_pos"),
    _maps(f"{_AR}.actor.tau_neg", "actor.tau_neg"),
    # verl's SAPO examples add these with +key, but its loss reads actor.tau_pos/tau_neg (core_algos
    # compute_policy_loss_sapo takes the actor config): verl trains the same numbers without them, so do we.
    _ignored(f"{_AR}.actor.policy_loss.tau_*", "verl 0.9.1's SAPO loss reads actor_rollout_ref.actor.tau_pos/tau_neg, "
             "not these: set those to change the loss"),
    _maps("critic.optim.lr", "critic.lr"),
    *(_maps(f"critic.optim.{name}", f"critic.{name}") for name in _OPTIM),
    _maps("critic.optim.warmup_style", "critic.lr_scheduler_type", "as actor_rollout_ref.actor.optim.warmup_style"),
    _maps("critic.optim.weight_decay", "critic.weight_decay"),
    _maps("critic.optim.clip_grad", "critic.grad_clip"),
    _maps("critic.model.path", "critic.model_path"),
    # CPU offload (verl_runtime/offload.py): the same tensors in host memory while no phase needs them
    *(_maps(f"{section}.{name}", f"{role}.{name}", _OFFLOAD[name])
      for role, sections in (("actor", (f"{_AR}.actor.fsdp_config",)), ("critic", ("critic.fsdp", "critic.model.fsdp_config")))
      for section in sections for name in _OFFLOAD),
    _maps(f"{_AR}.ref.fsdp_config.param_offload", "ref.param_offload", "the reference's weights in host memory, on "
          "the device for its log-prob pass only (verl 0.9.1 offloads its reference whatever this says: ref.yaml's "
          "forward_only, verl/workers/engine/fsdp/transformer_impl.py:459-462)"),
    _ignored(f"{_AR}.ref.fsdp_config.offload_policy", "verl 0.9.1 offloads its reference whatever this says "
             "(forward_only); here ref.fsdp_config.param_offload keeps it in host memory"),
    _ignored(f"{_AR}.ref.fsdp_config.optimizer_offload", "the reference has no optimizer"),
    _maps("data.train_batch_size", "data.batch_size"),
    _maps("trainer.total_epochs", "trainer.num_epochs"),
    _maps("trainer.resume_mode", "trainer.resume", "auto or disable; resume_path is refused: a run resumes from its "
          "own run directory (trainer.run_dir; verl-deploy run --resume RUN)"),
    _maps("critic.strategy", "critic.strategy", "ours too: dp or fsdp (FSDP2 shards the critic across the workers; "
          "verl's fsdp2 is fsdp here), the same numbers either way"),
    _maps("trainer.logger", "trainer.trackers",
          "tensorboard in the list turns trainer.tensorboard on; wandb, mlflow and swanlab go to trainer.trackers "
          "(their own clients: pip install 'verl-deploy[trackers]'); console and metrics.jsonl are always written; "
          "others (clearml, trackio, file, ...) are not here: a warning"),
    _maps("custom_reward_function.path", "reward.function", "with custom_reward_function.name: reward.function=PATH:NAME"),
    _maps("custom_reward_function.name", "reward.function", "the function in custom_reward_function.path"),
    _maps("reward.custom_reward_function.path", "reward.function", "as custom_reward_function.path"),
    _maps("reward.custom_reward_function.name", "reward.function", "as custom_reward_function.name"),
    _maps("reward_model.model.path", "reward.model_path", "used when reward_model.enable is not false"),
    _maps("reward.reward_model.model_path", "reward.model_path", "used when reward.reward_model.enable is not false"),
    _maps("reward_model.enable", "reward.model_path", "false: no reward model, whatever its path"),
    _maps("reward.reward_model.enable", "reward.model_path", "false: no reward model, whatever its path"),
    _maps("reward.reward_manager.name", "reward.manager", "naive or dapo here (dapo: reward.overlong_buffer)"),
    _maps("reward_model.reward_manager", "reward.manager", "verl's older name: a value other than null sets "
          "reward.manager, and wins over reward.reward_manager.name (as verl migrates it)"),
    *(_maps(f"{section}.reward_kwargs.{name}", f"reward.{ours}")
      for section in ("reward_model", "reward")
      for name, ours in (("max_resp_len", "max_resp_len"),
                         *((f"overlong_buffer_cfg.{key}", f"overlong_buffer.{key}")
                           for key in ("enable", "len", "penalty_factor", "log")))),
    _maps("trainer.n_gpus_per_node", "trainer.n_gpus_per_node", "x trainer.nnodes = trainer.n_workers, the world size"),
    _maps("trainer.nnodes", "trainer.nnodes", "x trainer.n_gpus_per_node = trainer.n_workers, the world size"),
    _maps("ray_kwargs.ray_init.num_cpus", "ray.num_cpus"),
    # verl's v1 trainer modes and its one-step-off recipe (verl_runtime/async_rollout.py)
    _maps("trainer.v1.trainer_mode", "trainer.mode", "sync, or separate_async: the rollout on workers of its own "
          "(rollout.nnodes x rollout.n_gpus_per_node), the next batch generated while this one trains"),
    *(_maps(f"trainer.v1.separate_async.{name}", f"trainer.separate_async.{name}")
      for name in ("num_warmup_batches", "parameter_sync_step")),
    *(_maps(f"trainer.v1.sampler.{name}", f"trainer.sampler.{name}")
      for name in ("max_off_policy_threshold", "max_off_policy_strategy")),
    *(_maps(f"{_AR}.rollout.{name}", f"rollout.{name}", "the rollout's own workers with trainer.mode=separate_async "
            "(as the one-step-off recipe's rollout.{name}); unused when the rollout shares the trainer's")
      for name in ("nnodes", "n_gpus_per_node")),
    _maps(f"{_AR}.hybrid_engine", "trainer.mode", "false: the rollout on workers of its own, one batch ahead (verl's "
          "one-step-off recipe): trainer.mode=separate_async; true: as trainer.mode says"),
    # --- would change the results if ignored: refused unless the value is what we do --------------------------------
    # --- out of this runtime's scope: refused, naming verl-deploy run --runtime verl --------------------------------
    _routed("model_engine", _ENGINES, "dp"),
    _routed("*@*", "another of verl's config files for a section (Hydra's group@section=file)"),
    _routed(f"{_AR}.*.strategy", _ENGINES, "fsdp", "fsdp2"),  # fsdp, fsdp2: the sharding here is actor.strategy
    _routed("data.image_key", _NO_VISION),
    _routed("data.video_key", _NO_VISION),
    _routed("data.audio_key", _NO_VISION),
    _routed("data.image_patch_size", _NO_VISION),
    _routed("data.mm_processor_kwargs", _NO_VISION, None, {}),
    _routed(f"{_AR}.actor.freeze_vision_tower", _NO_VISION, False),
    # a generative reward model served by a rollout engine (verl's reward loop): SGLang's is out of scope, as the
    # actor's is (FAPO's recipe serves its GenRM so); null and ??? are verl's defaults
    _routed("*reward_model.rollout.name", "a reward model served by SGLang or TensorRT-LLM", None, "???", "vllm"),
    # --- would change the results if ignored: refused unless the value is what we do --------------------------------
    _refused("trainer.critic_warmup", "the actor is updated from the first step here", 0),
    _refused("trainer.val_only", "a validation-only run is not here", False),
    _refused("trainer.v1.separate_async.hybrid_rollout.enable_switch", "the trainer's GPUs are not lent to "
             "generation between steps here: the rollout runs on its own workers", False),
    _refused("algorithm.use_pf_ppo", "PF-PPO (reweighting samples) is not here", False),
    _refused("algorithm.filter_groups.enable", "dynamic sampling (DAPO's group filtering) is not here", False),
    _refused(f"{_AR}.actor.loss_scale_factor", "the loss is aggregated by actor.loss_agg_mode alone here", None),
    _refused(f"{_AR}.actor.shuffle", "mini-batches keep the batch's order here", False),
    _refused(f"{_AR}.*qat.enable", "quantization-aware training is not here", False),
    _ignored(f"{_AR}.rollout.val_kwargs.do_sample", "verl 0.9.1's rollout does not read it either: "
             "val_kwargs.temperature decides (0: greedy, above 0: sampled), here as there"),
    _refused(f"{_AR}.rollout.multi_turn.format", "tool calls are read in the hermes format here", "hermes"),
    _refused(f"{_AR}.rollout.multi_turn.function_tool_path", "tools are declared by tool_config_path here", None),
    _refused(f"{_AR}.rollout.ignore_eos", "generation stops at the end-of-sequence token here", False),
    _refused(f"{_AR}.rollout.over_sample_rate", "over-sampling and aborting rollouts is not here", 0),
    _refused(f"{_AR}.rollout.quantization", "the rollout runs the trained weights unquantized here", None),
    _refused(f"{_AR}.rollout.disaggregation.enabled", "rollouts are generated in one engine here", False),
    _refused(f"{_AR}.model.mtp.enable", "multi-token prediction is not here", False),
    _refused("critic.model.lora_rank", "LoRA on the critic is not here: every critic weight trains", 0),
    _refused("critic.model.lora_adapter_path", "LoRA on the critic is not here", None),
    _refused(f"{_AR}.model.lora.rank", f"verl's Megatron LoRA section: LoRA on FSDP is {_AR}.model.lora_rank, "
             "here too", 0),
    _refused(f"{_AR}.model.lora.adapter_path", f"verl's Megatron LoRA section: an adapter to continue from is "
             f"{_AR}.model.lora_adapter_path, here too", None),
    _refused("*model.tokenizer_path", "the tokenizer is the model's own here", None),
    _refused("*model.hf_config_path", "the model config is the model's own here", None),
    _refused("*model.custom_chat_template", "the chat template is the tokenizer's own here", None),
    _ignored("*model.override_config.max_position_embeddings", "the context length the position embeddings allow: "
             "sequences stay within data.max_prompt_length + max_response_length here, the numbers do not change"),
    _refused("*model.override_config.*", "the model config is used unchanged here (an override changes the model)"),
    _refused("*model.override_config", "the model config is used unchanged here", {}),
    _refused("*model.external_lib", "no extra library is imported to load a model here", None),
    _refused("data.tokenizer", "the tokenizer is the model's own here", None),
    _refused("data.prompt_key", "prompts are read from the prompt column here", "prompt"),
    _refused("data.reward_fn_key", "the scorer is chosen by the data_source column here", "data_source"),
    _refused("data.train_max_samples", "every row of data.train_files is used here", -1),
    _refused("data.val_max_samples", "every row of data.val_files is used here", -1),
    _refused("data.gen_batch_size", "a step generates for data.train_batch_size prompts here", None),
    _refused("data.custom_cls.path", "a custom dataset class is not here", None),
    _refused("data.apply_chat_template_kwargs.enable_thinking", "the chat template is applied with its defaults "
             "here: Qwen3's thinks unless told otherwise", True),
    _refused("data.apply_chat_template_kwargs.reasoning_effort", "the chat template is applied with its defaults "
             "here: gpt-oss's is medium", "medium"),
    _refused("data.apply_chat_template_kwargs.*", "the chat template is applied with its defaults here (another "
             "argument changes the prompts)"),
    _refused("data.apply_chat_template_kwargs", "the chat template is applied with its defaults here", {}),
    _refused("critic.ppo_mini_batch_size", f"the critic updates on {_AR}.actor.ppo_mini_batch_size here"),
    _refused("critic.ppo_epochs", f"the critic trains {_AR}.actor.ppo_epochs epochs here"),
    _refused("critic.shuffle", "mini-batches keep the batch's order here", False),
    _refused("critic.loss_scale_factor", "the loss is aggregated by critic.loss_agg_mode alone here", None),
    _refused("*optim.optimizer", "the optimizer is AdamW here", "AdamW"),
    _refused("*optim.optimizer_impl", "the optimizer is torch.optim's AdamW here", "torch.optim"),
    _refused("*optim.override_optimizer_config", "the optimizer is used with its defaults here", None),
    _ignored("*optim.total_training_steps", "verl sets it to the run's steps, as the schedule here takes them "
             "(trainer.total_training_steps, else the epochs' steps)"),
    _refused("reward.reward_manager.source", "rewards are scored by verl's registered naive manager here", "register"),
    _refused("reward.reward_manager.module.path", "a custom reward manager is not here", None),
    _refused("*sandbox_fusion.url", "code execution in a sandbox (sandbox fusion) is not here", None),
    _refused("distillation.enabled", "distillation from a teacher model is not here", False),
    _refused("transfer_queue.enable", "the transfer queue is not here: batches pass through the controller", False),
    _refused("skip.*.enable", "replaying dumped rollouts is not here", False),
    # --- no effect on the numbers: accepted with a one-line warning ---------------------------------------------------
    _ignored("hydra.*", "Hydra's own settings (where it looks for config files): verl's Hydra files are not read here"),
    _ignored("*._target_", "the Python class Hydra builds the section with: no classes are built from the config here"),
    _ignored("*fsdp_config.*", _ENGINE),
    _ignored("critic.fsdp.*", _ENGINE),
    _ignored("*ulysses_sequence_parallel_size", "sequence parallelism: " + _MEMORY),
    _ignored("*activation_offload", "offloading activations to CPU memory: " + _MEMORY),
    _ignored("*use_fused_kernels", _ENGINE),
    _ignored("*fused_kernel_options.*", _ENGINE),
    _ignored("*use_liger", _ENGINE),
    _ignored("*use_torch_compile", _ENGINE),
    _ignored("*pad_to_length*", _MEMORY),
    _ignored("*tiled_mlp.*", _MEMORY),
    _ignored("critic.forward_micro_batch_size*", "the critic's forward passes use critic.ppo_micro_batch_size_per_gpu: " + _MEMORY),
    _ignored("*use_shm", "loading the model through shared memory: speed only"),
    _ignored("*trust_remote_code", "models and tokenizers load without remote code here"),
    _ignored("*.checkpoint.*", "what a checkpoint holds: here always the model, the optimizer and the step "
             "(trainer.save_hf=true adds a Hugging Face model of the last step)"),
    _ignored("*profiler*", "verl's profilers are not here: timing_s/* metrics are written every step"),
    _ignored("*seed", _SEED),
    _ignored("*full_determinism", _SEED),
    _ignored("*rollout_n", f"verl copies {_AR}.rollout.n here: set that"),
    _ignored("critic.enable", "a critic is used exactly when algorithm.adv_estimator is gae"),
    _ignored("critic.model.*", "the critic loads like the actor's model here (critic.model.path is read)"),
    _ignored("*qat.*", "quantization-aware training is not here (its .enable is refused)"),
    _ignored(f"{_AR}.model.lora.merge", "how verl hands LoRA weights to vLLM (merged, or as adapters): the same "
             "function either way; merged here always"),
    _ignored(f"{_AR}.model.lora.*", "verl's Megatron LoRA settings (lora.rank is refused; LoRA on FSDP is "
             "model.lora_rank)"),
    _ignored(f"{_AR}.model.mtp.*", "multi-token prediction is not here (mtp.enable is refused)"),
    _ignored(f"{_AR}.model.enable_activation_offload", _MEMORY),
    _ignored(f"{_AR}.actor.use_prefix_grouper", _MEMORY),
    _ignored(f"{_AR}.actor.calculate_entropy", "actor/entropy is computed every step here"),
    _ignored(f"{_AR}.actor.calculate_sum_pi_squared", "computed here exactly when algorithm.adv_estimator uses it "
             "(the optimal token baselines)"),
    _ignored(f"{_AR}.rollout.multi_turn.*", "how verl's engines tokenize turns (the chat template is applied per "
             "turn here, as verl's default)"),
    _ignored(f"{_AR}.rollout.disaggregation.*", "rollouts are generated in one engine here (disaggregation.enabled is refused)"),
    _ignored(f"{_AR}.rollout.prompt_length", "verl copies data.max_prompt_length here: set that"),
    _ignored(f"{_AR}.rollout.response_length", "verl copies data.max_response_length here: set that"),
    _ignored(f"{_AR}.rollout.mode", "rollouts are generated in the trainer's step here, by rollout.name's engine"),
    _ignored(f"{_AR}.rollout.logprobs_mode", "the old log-probs are recomputed by the actor here"),
    _ignored(f"{_AR}.rollout.agent.*", "verl's agent-loop workers: the loop runs in the controller here (one "
             "response per sample, or rollout.multi_turn's tool loop)"),
    _ignored(f"{_AR}.rollout.trace.*", "rollout tracing is not here"),
    _ignored(f"{_AR}.rollout.prometheus.*", "the rollout server's Prometheus metrics are not here"),
    _ignored(f"{_AR}.rollout.checkpoint_engine.*", "weights reach the rollout engine in memory here"),
    _ignored(f"{_AR}.rollout.quantization_config_file", "the rollout runs unquantized here (quantization is refused)"),
    _ignored(f"{_AR}.rollout.mtp", "multi-token prediction is not here"),
    _ignored(f"{_AR}.rollout.router_config_path", _ROLLOUT_ENGINE),
    _ignored(f"{_AR}.rollout.skip_tokenizer_init", _ROLLOUT_ENGINE),
    _ignored(f"{_AR}.rollout.enable_rollout_routing_replay", "MoE routing replay: not here (dense models)"),
    _ignored(f"{_AR}.rollout.moe_load_balance_metrics_interval", "MoE metrics: not here (dense models)"),
    _ignored(f"{_AR}.rollout.*", _ROLLOUT_ENGINE),
    _ignored(f"{_AR}.nccl_timeout", "distributed timeouts are the launcher's here"),
    _ignored("data.use_shm", "data is read from its files directly"),
    _ignored("data.return_*", "what verl's dataset returns to its workers: plumbing"),
    _ignored("data.dataloader_num_workers", "speed only"),
    _ignored("data.validation_shuffle", "validation reads every prompt once; the order does not change its scores"),
    _ignored("data.filter_overlong_prompts_workers", "speed only"),
    _ignored("data.tool_config_path", "multi-turn tools are not here"),
    _ignored("data.function_tool_path", "multi-turn tools are not here"),
    _ignored("data.custom_cls.name", "a custom dataset class is not here (custom_cls.path is refused)"),
    _ignored("trainer.balance_batch", "verl reorders a batch's samples to balance sequence lengths across workers; "
             "samples stay in order here (with one worker nothing changes)"),
    _ignored("trainer.rollout_data_dir", "rollouts are not dumped here"),
    _ignored("trainer.validation_data_dir", "validation generations are not dumped here"),
    _ignored("trainer.resume_from_path", "verl reads it only with trainer.resume_mode=resume_path, which is refused "
             "here (a run resumes from its own run directory); with auto or disable it changes nothing, as in verl"),
    _ignored("trainer.default_local_dir", "checkpoints live in the run directory here (trainer.run_dir)"),
    _ignored("trainer.default_hdfs_dir", "checkpoints live in the run directory here (trainer.run_dir)"),
    _ignored("trainer.del_local_ckpt_after_load", "checkpoints live in the run directory here (trainer.keep_last)"),
    _ignored("trainer.max_*_ckpt_to_keep", "trainer.keep_last says how many checkpoints are kept here"),
    _ignored("trainer.checkpoint_callback_class", "no checkpoint callbacks here"),
    _ignored("trainer.esi_redundant_time", "checkpoints are also written on SIGTERM here"),
    _ignored("trainer.ray_wait_register_center_timeout", "verl's Ray register center is not here"),
    _ignored("trainer.use_v1", "one trainer loop here"),
    _ignored("trainer.v1.*", "a setting of verl's v1 trainer that does not change the numbers here (its modes and "
             "staleness bounds are trainer.mode, trainer.separate_async.*, trainer.sampler.*)"),
    _ignored("algorithm.filter_groups.*", "dynamic sampling is not here (filter_groups.enable is refused)"),
    _ignored("algorithm.pf_ppo.*", "PF-PPO is not here (use_pf_ppo is refused)"),
    _ignored("reward_model.*", "a setting of verl's reward-model workers; the reward model (reward.model_path) runs "
             "in the trainer's workers here"),
    _ignored("reward.reward_model.*", "a setting of verl's reward-model workers; the reward model (reward.model_path) "
             "runs in the trainer's workers here"),
    _ignored("reward.reward_manager.*", "a custom reward manager is not here (reward_manager.module.path is refused)"),
    _ignored("reward.num_workers", "rewards are scored in the controller: speed only"),
    _ignored("*sandbox_fusion.*", "sandbox fusion is not here (sandbox_fusion.url is refused)"),
    _ignored("distillation.*", "distillation is not here (distillation.enabled is refused)"),
    _ignored("transfer_queue.*", "the transfer queue is not here (transfer_queue.enable is refused)"),
    _ignored("skip.*", "replaying dumped rollouts is not here (skip.*.enable is refused)"),
    _ignored("ray_kwargs.*", "Ray starts with ray.* here (ray.address, ray.num_cpus)"),
)


@functools.cache
def verl_keys() -> frozenset[str]:
    """Every key of verl 0.9.1's composed PPO config."""
    lines = KEYS_FILE.read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def is_verl_key(key: str) -> bool:
    """A key of verl's tree, or one under a mapping-valued key of it (``engine_kwargs.vllm.x``)."""
    parts = key.split(".")
    return any(".".join(parts[:n]) in verl_keys() for n in range(len(parts), 0, -1))


def rule_for(key: str) -> Rule | None:
    """The first rule matching a verl key, None for a key that is not verl's or has no rule (ours by its name)."""
    if "@" in key:  # Hydra's GROUP@PATH=CHOICE: another of verl's config files for a section
        return next(rule for rule in RULES if rule.matches(key))
    if not is_verl_key(key) and key not in HYDRA_GROUPS and key not in ADDED_KEYS:
        if any(fnmatch.fnmatchcase(key, section) for section in OPEN_SECTIONS):
            return next(rule for rule in RULES if rule.matches(key))
        return None
    return next((rule for rule in RULES if rule.matches(key)), None)


# --- verl's releases: what a key or value was, where it went (verl_key_history.json) ---------------------------------
HISTORY_FILE = Path(__file__).with_name("verl_key_history.json")  # made by tests/fixtures/verl-key-history/make_history.py

# Our choice keys -> the value family of verl_key_history.json that holds verl's names for them.
VALUE_FAMILIES = {"algorithm.adv_estimator": "algorithm.adv_estimator", "reward.manager": "reward_manager",
                  "actor.policy_loss.loss_mode": "policy_loss"}


@functools.cache
def history() -> dict:
    """Every key and value of verl's releases on PyPI (first and last release of each), and the keys renamed."""
    import json

    return json.loads(HISTORY_FILE.read_text())


def _releases() -> str:
    releases = history()["releases"]
    return f"{releases[0]}-{releases[-1]}"


def _span(spans: dict[str, list[str]], key: str) -> list[str] | None:
    """The releases holding a key or a mapping-valued key above it (engine_kwargs.vllm.x)."""
    parts = key.split(".")
    return next((spans[".".join(parts[:n])] for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in spans), None)


def _next_release(release: str) -> str:
    releases = history()["releases"]
    return releases[releases.index(release) + 1]


def renamed(key: str) -> tuple[list[str], str] | None:
    """(the names verl gave the key since, the release that renamed it) for a key verl renamed, else None. A rename
    that was renamed again is followed to the names of the newest release."""
    renames, current = history()["renames"], history()["keys"]
    first = renames.get(key)
    if first is None:
        return None
    names, seen = list(first["to"]), {key}
    while any(name in renames and name not in seen and current.get(name, [""])[1] != history()["releases"][-1]
              for name in names):
        seen |= set(names)
        names = [new for name in names for new in (renames[name]["to"] if name in renames else [name])]
    return sorted(set(names)), first["release"]


def engine_key(key: str) -> bool:
    """A key only verl's Megatron, TorchTitan or VeOmni trainer configs have (0.9.1's or an earlier one)."""
    return _span(history()["engine_keys"], key) is not None and _span(history()["keys"], key) is None


def verl_section(key: str) -> bool:
    """The key's top-level section is one of verl's (data, actor_rollout_ref, ...)."""
    top = key.split(".")[0]
    return any(name.split(".")[0] == top for name in history()["keys"])


def key_way_out(key: str, our_sections: frozenset[str] = frozenset()) -> tuple[bool, str] | None:
    """For a key that is neither ours nor verl 0.9.1's: (renamed, what to do) from verl's releases, or None for a key
    of a section only we have (our_sections minus verl's: actor.learning_rate is a misspelling of ours, not a
    fork's). renamed: verl renamed it, and the text names the new key and the release."""
    moved = renamed(key)
    latest = history()["releases"][-1]
    if moved:
        names, release = moved
        now = [name for name in names if history()["keys"].get(name, ["", ""])[1] == latest]
        shown = " or ".join(repr(name) for name in (now or names))
        if now:
            return True, f"verl {release} renamed it {shown}: set that"
        span = _span(history()["keys"], names[0])
        return True, (f"verl {release} renamed it {shown}, which verl {_next_release(span[1])} removed: drop it, or "
                      f"run verl {span[1]} with {RUN_WITH_VERL.replace('--runtime verl', f'--runtime verl --verl-source verl=={span[1]}')}")
    span = _span(history()["keys"], key)
    if span and span[1] != latest:
        pinned = RUN_WITH_VERL.replace("--runtime verl", f"--runtime verl --verl-source verl=={span[1]}")
        return False, (f"verl's key in {span[0]}-{span[1]}, removed in {_next_release(span[1])}: drop it, or run verl "
                       f"{span[1]} with {pinned}")
    if key.split(".")[0] in our_sections and not verl_section(key):
        return None
    return False, f"it is in no verl release ({_releases()}), so it comes from a fork: run your fork with {RUN_FORK}"


def value_way_out(key: str, value) -> str | None:
    """For a value of one of our choice keys (VALUE_FAMILIES) that is not ours: what verl's releases say, or None."""
    family = VALUE_FAMILIES.get(key)
    if family is None or not isinstance(value, str):
        return None
    span = history()["values"][family].get(value)
    if span is None:
        return f"{value!r} is in no verl release ({_releases()}), so it comes from a fork: run your fork with {RUN_FORK}"
    if span[1] == history()["releases"][-1]:
        return out_of_scope(f"verl's {value!r} (verl {span[0]}-{span[1]})")
    pinned = RUN_WITH_VERL.replace("--runtime verl", f"--runtime verl --verl-source verl=={span[1]}")
    return f"verl's {value!r} in {span[0]}-{span[1]}, removed in {_next_release(span[1])}: run verl {span[1]} with {pinned}"


def extract_keys(wheel: str | Path) -> list[str]:
    """The keys of verl/trainer/config/_generated_ppo_trainer.yaml in verl's wheel, in file order."""
    import zipfile

    import yaml

    def flat(tree: dict, prefix: str = ""):
        for name, value in tree.items():
            if isinstance(value, dict) and value:
                yield from flat(value, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}"

    with zipfile.ZipFile(wheel) as archive:
        return list(flat(yaml.safe_load(archive.read("verl/trainer/config/_generated_ppo_trainer.yaml"))))


HEADER = (
    "# Every key of verl 0.9.1's composed PPO config (verl/trainer/config/_generated_ppo_trainer.yaml in its wheel).\n"
    "# Made by: pip download --no-deps verl==0.9.1 -d DIR && python -m verl_runtime.verl_keys DIR/verl-0.9.1-py3-none-any.whl\n"
    "# tests/test_verl_cli.py checks it against the wheel (in CI: CI=true).\n"
)


def table_markdown() -> str:
    """The rule table as docs/verl.md shows it (tests/test_verl_cli.py holds the two equal)."""
    rows = ["| verl key | here | what it does here |", "|---|---|---|"]
    for rule in RULES:
        accepts = ", ".join(_show(value) for value in rule.accepts)
        if rule.kind == MAPS:
            here, what = f"= `{rule.target}`", rule.reason
        elif rule.kind == REFUSED:
            here, what = "refused" + (f" unless {accepts}" if accepts else ""), rule.reason
        else:
            here, what = "ignored (warning)", rule.reason
        cells = [f"`{rule.pattern}`", here, what.replace("|", "\\|")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def defaults_markdown() -> str:
    """VERL_DEFAULTS as docs/verl.md shows it (tests/test_verl_defaults.py holds the two equal)."""
    rows = ["| our key | verl's key | verl 0.9.1's default |", "|---|---|---|"]
    rows += [f"| `{ours}` | `{key}` | {_show(value)} |" for ours, (key, value) in VERL_DEFAULTS.items()]
    rows += ["", "Where verl's default differs and ours stays:", ""]
    rows += [f"- `{ours}`: {why}" for ours, why in VERL_DEFAULTS_LEFT_OUT.items()]
    return "\n".join(rows)


def _show(value) -> str:
    import json

    return "`null`" if value is None else f"`{json.dumps(value) if not isinstance(value, str) else value}`"


if __name__ == "__main__":
    sys.stdout.write(HEADER + "\n".join(extract_keys(sys.argv[1])) + "\n")
