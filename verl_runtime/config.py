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
import math
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

from verl_runtime import rollout_thresholds, verl_keys
from verl_runtime.errors import ConfigError

ALGORITHMS = ("ppo", "grpo", "rloo", "reinforce_plus_plus")
# The names of verl_runtime.algorithms' registries the trainer can run (torch-free here, so the host can check a
# config; tests/test_algorithms.py holds them equal). remax takes a greedy baseline generation per prompt in fit()
# (not in step(), which generates nothing); the optimal token baselines the actor's sum of p^2. Not here: gdpo
# (several reward components per sample), which the reward functions here do not return.
ADV_ESTIMATORS = ("gae", "grpo", "grpo_vectorized", "grpo_passk", "rloo", "rloo_vectorized", "opo", "gpg",
                  "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "optimal_token_baseline",
                  "tir_optimal_token_baseline")
# algorithms.POLICY_LOSS_REGISTRY's names (tests/test_algorithms.py holds them equal) and the LR schedules
# (workers/optim.py): actor.policy_loss.loss_mode, *.lr_scheduler_type
REWARD_MANAGERS = ("naive", "dapo")  # reward.manager: verl's managers this runtime has (rewards/managers.py)
POLICY_LOSSES = ("vanilla", "gspo", "sapo", "cispo", "gpg", "geo_mean", "dppo_tv", "dppo_kl", "clip_cov", "kl_cov", "dro")
LR_SCHEDULER_TYPES = ("constant", "cosine")
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
    truncation: str = "error"  # error | left | right (| filter: as filter_overlong_prompts, an earlier spelling)
    # drop the prompts longer than max_prompt_length when the data is loaded (verl's filter_overlong_prompts); what
    # remains is within the limit, so truncation never acts on it
    filter_overlong_prompts: bool = False
    shuffle: bool = True
    apply_chat_template: bool = True
    toy_size: int = 512  # rows of a "toy:" train set (its validation set gets a quarter)


@dataclass
class ModelConfig:
    pretrained_model_name_or_path: str = "builtin:tiny"  # a local HF directory, or builtin:tiny
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16
    gradient_checkpointing: bool = False
    # verl's model.use_remove_padding: each micro-batch's real tokens packed in one row (models.LogProbMemory); off,
    # the CPU's llama-family models take the lean path (lean_model.py), which computes each distinct prompt once
    use_remove_padding: bool = False
    # LoRA on the actor (verl_runtime/lora.py; verl's actor_rollout_ref.model.*): on when lora_rank > 0 or an adapter
    # to continue from is given (its own rank and targets then apply)
    lora_rank: int = 0  # 0: off, every weight trains
    lora_alpha: int = 16  # scaling = lora_alpha / lora_rank
    target_modules: str | list[str] = "all-linear"  # peft's: all-linear, a list of module names, or a regex
    exclude_modules: str | list[str] | None = None
    lora_adapter_path: str | None = None  # a peft adapter directory (or Hub id) to continue training

    @property
    def uses_lora(self) -> bool:
        return self.lora_rank > 0 or self.lora_adapter_path is not None

    @property
    def path(self) -> str:
        return self.pretrained_model_name_or_path

    @path.setter
    def path(self, value: str) -> None:
        self.pretrained_model_name_or_path = value


@dataclass
class PolicyLossConfig:
    # verl's actor.policy_loss: the loss (algorithms.POLICY_LOSS_REGISTRY) and the settings of some modes
    loss_mode: str = "vanilla"  # vanilla (PPO's clip) | gspo | sapo | cispo | gpg | geo_mean | dppo_tv | dppo_kl | clip_cov | kl_cov | dro
    clip_cov_ratio: float = 0.0002  # clip_cov: share of tokens whose gradient is cut
    clip_cov_lb: float = 1.0  # clip_cov: covariance bounds of the candidates
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002  # kl_cov: share of tokens given the KL term
    ppo_kl_coef: float = 0.1  # kl_cov: its coefficient
    dro_beta: float | None = None  # dro: the log-ratio penalty (required there)


@dataclass
class ActorConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    # The optimizer (AdamW) and learning-rate schedule, verl's optim.* (workers/optim.py); the same keys in critic.
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    lr_warmup_steps: int = -1  # linear warm-up from 0 over this many steps; <= 0: lr_warmup_steps_ratio x total steps
    lr_warmup_steps_ratio: float = 0.0
    lr_scheduler_type: str = "constant"  # constant | cosine (to min_lr_ratio x lr at the last step)
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5  # cosine waves over the run (0.5: one half-wave down)
    zero_indexed_step: bool = True  # cosine: false counts steps from 1 (torchtitan's)
    ppo_epochs: int = 1
    ppo_mini_batch_size: int | None = None  # prompts per optimizer step; None: data.batch_size (one update per step)
    ppo_micro_batch_size_per_gpu: int | None = None  # samples per forward/backward; None: the whole mini-batch
    # verl's actor_rollout_ref.actor.use_dynamic_bsz: micro-batches by real tokens (ppo_max_token_len_per_gpu); as in
    # verl, it lifts the batch-size checks (validate)
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384  # use_dynamic_bsz: real tokens per update micro-batch (verl's default)
    # verl's: lm_head, log-softmax and entropy chunk by chunk from the hidden states (models.LogProbMemory), and the
    # entropy's softmax recomputed in the backward
    entropy_from_logits_with_chunking: bool = False
    entropy_from_logits_chunk_size: int = 2048
    entropy_checkpointing: bool = False
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    tau_pos: float = 1.0  # sapo: gate temperature for positive advantages
    tau_neg: float = 1.05  # sapo: and for the others
    strategy: str = "dp"  # with several workers: dp (each holds the whole model) | fsdp (FSDP2 shards it across them)
    # verl's fsdp_config.*: parameters (with their gradients) / AdamW's state in host memory between phases;
    # offload_policy: FSDP2's CPUOffloadPolicy where the model is sharded, else both (verl_runtime/offload.py)
    param_offload: bool = False
    optimizer_offload: bool = False
    offload_policy: bool = False


@dataclass
class CriticConfig:
    model_path: str | None = None  # None: the actor's model
    lr: float = 1e-5
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # these six: as in actor
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    lr_scheduler_type: str = "constant"
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5
    zero_indexed_step: bool = True
    cliprange_value: float = 0.5
    ppo_micro_batch_size_per_gpu: int | None = None
    # verl's: None takes actor.use_dynamic_bsz / model.use_remove_padding; the forward's budget the update's
    use_dynamic_bsz: bool | None = None
    ppo_max_token_len_per_gpu: int = 32768
    forward_max_token_len_per_gpu: int | None = None
    use_remove_padding: bool | None = None
    loss_agg_mode: str = "token-mean"
    strategy: str = "dp"  # dp | fsdp, as actor.strategy
    param_offload: bool = False  # these three: as in actor
    optimizer_offload: bool = False
    offload_policy: bool = False


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = 16
    param_offload: bool = False  # verl's ref.fsdp_config.param_offload: the weights in host memory between passes
    # verl's: None takes actor.use_dynamic_bsz / actor.ppo_max_token_len_per_gpu (as verl's ref.yaml does)
    log_prob_use_dynamic_bsz: bool | None = None
    log_prob_max_token_len_per_gpu: int | None = None
    entropy_from_logits_with_chunking: bool = False  # the reference computes no entropy: the chunked log-probs
    entropy_from_logits_chunk_size: int = 2048


@dataclass
class ValKwargsConfig:
    # verl's rollout.val_kwargs: how validation samples. As in verl 0.9.1's rollout, the temperature decides: 0 is
    # greedy, one response per prompt repeated n times; above 0, n samples per prompt (val-core .../best@N, maj@N).
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1


@dataclass
class MultiTurnConfig:
    # verl's actor_rollout_ref.rollout.multi_turn (its ToolAgentLoop): generate, run the hermes tool calls, append
    # the tool responses (no loss on them), until an answer or a limit (verl_runtime/agent/)
    enable: bool = False
    tool_config_path: str | None = None  # verl's tool config file: tools: [{class_name, config, tool_schema}]
    max_assistant_turns: int | None = None  # None: until the response length
    max_user_turns: int | None = None  # tool-response turns
    max_parallel_calls: int = 1  # tool calls run per turn (the first ones)
    max_tool_response_length: int = 256  # characters of a tool's response kept
    tool_response_truncate_side: str = "middle"  # left | right | middle, as verl
    format: str = "hermes"  # the tool-call format: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    tool_timeout: float = 30.0  # seconds one tool call may take; past it the call is an error in the episode


@dataclass
class RolloutConfig:
    name: str = "hf"  # hf (transformers generate) | builtin (our decode loop, CUDA graphs on GPU) | vllm
    n: int = 1  # samples per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    log_prob_micro_batch_size_per_gpu: int = 16
    log_prob_use_dynamic_bsz: bool | None = None  # the old log-probs by a token budget; None: as the actor
    log_prob_max_token_len_per_gpu: int | None = None
    # builtin only: compile the decode step. null: on CUDA (CUDA graphs), not on the CPU; true on the CPU: faster
    # steps for some seconds of compiling at the start of the run (needs a C++ compiler); false: never
    compile: bool | None = None
    # vllm only (verl's names): GPU memory share for weights + KV cache, tensor-parallel GPUs, KV cache freed while training
    gpu_memory_utilization: float = 0.5
    tensor_model_parallel_size: int = 1
    enable_sleep_mode: bool = True
    # verl's name: the engine's own log-probs of its samples go to the trainer, where algorithm.rollout_correction
    # uses them (off, as in verl: the correction then does nothing). rollout/logprob_diff is logged either way.
    calculate_log_probs: bool = False
    # trainer.mode=separate_async: the rollout's own workers (verl's rollout.nnodes x rollout.n_gpus_per_node, as
    # its one-step-off recipe and v1 trainer size them), each a process with a copy of the policy and an engine, on
    # devices of their own. null: one worker on one node.
    n_gpus_per_node: int | None = None
    nnodes: int | None = None
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)


@dataclass
class OverlongBufferConfig:
    # verl's reward_kwargs.overlong_buffer_cfg (reward.manager=dapo): responses longer than max_resp_len - len tokens
    # lose up to penalty_factor, linearly over the last len tokens; log adds overlong_reward and overlong to the
    # reward's extra information (validation reports them under val-aux/)
    enable: bool = False
    len: int = 0
    penalty_factor: float = 1.0
    log: bool = False


@dataclass
class RewardConfig:
    function: str | None = None  # "path/to/file.py:fn" with verl's signature; None: the built-in scorers
    model_path: str | None = None  # a sequence-classification reward model directory, used instead of a function
    # verl's reward manager (REWARD_MANAGERS): naive scores each response; dapo adds the overlong penalty below
    manager: str = "naive"
    max_resp_len: int | None = None  # dapo: the response length the overlong buffer ends at (required with it)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)


@dataclass
class KLControlConfig:
    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class RolloutCorrectionConfig:
    # verl's algorithm.rollout_correction (verl_runtime/rollout_correction.py), with rollout.calculate_log_probs=true:
    # importance weights pi_train / pi_rollout per token or sequence (null: none), truncated at rollout_is_threshold
    # ("lower_upper": zeroed outside); rejection of tokens/sequences by rollout_rs ("token_k1,seq_max_k2": each must
    # pass) at rollout_rs_threshold ("0.6_1.6,2.5"); bypass_mode: the rollout's log-probs are the old ones (no
    # recomputation) and the loss is loss_type (ppo_clip | reinforce)
    rollout_is: str | None = None
    rollout_is_threshold: str | None = "2.0"
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: str | None = None
    bypass_mode: bool = False
    loss_type: str = "ppo_clip"

    @property
    def enabled(self) -> bool:
        """Whether it changes the update (verl's default section changes nothing)."""
        return self.rollout_is is not None or self.rollout_rs is not None or self.bypass_mode


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "gae"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass
class SeparateAsyncConfig:
    # verl's trainer.v1.separate_async: batches generated ahead of training (1: one step off, as verl's recipe)
    num_warmup_batches: int = 1
    # optimizer updates between two weight pushes to the rollout workers; verl requires data.batch_size ==
    # parameter_sync_step x actor.ppo_mini_batch_size (one push per step). null: the step's mini-batches.
    parameter_sync_step: int | None = None


@dataclass
class SamplerConfig:
    # verl's trainer.v1.sampler: the most weight versions a trained sample may lag behind the policy it trains
    # (0: on-policy, nothing generated ahead; null: no bound), and what happens to a staler batch: drop (generated
    # again with the newest weights) or wait (generation waits for newer weights, so none is ever staler)
    max_off_policy_threshold: int | None = 8
    max_off_policy_strategy: str = "drop"


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
    # Also write the final step as a Hugging Face model directory, <run_dir>/hf/step_<N> (verl: "hf_model" in
    # actor_rollout_ref.actor.checkpoint.save_contents); `verl-deploy export` writes one from any checkpoint.
    save_hf: bool = False
    resume: str = "auto"  # auto: continue from the run directory's latest checkpoint | disable
    tensorboard: bool = True  # events in <run_dir>/tensorboard; verl's trainer.logger without tensorboard turns it off
    # Trackers every step's metrics also go to (verl_runtime/trackers.py: wandb, mlflow, swanlab); verl's
    # trainer.logger sets it. project_name names the project (W&B, SwanLab) or experiment (MLflow), experiment_name the run.
    trackers: list[str] = field(default_factory=list)
    project_name: str = "verl-deploy"
    # Validation samples (prompt, response, score) each validation sends the trackers (W&B's table val/generations,
    # an MLflow artifact val_step<N>.json), as verl's; 0: none.
    log_val_generations: int = 0
    # Workers: 1 runs every role in this process. More (or a Ray cluster to join) runs them as Ray actors, one per
    # slot of cpus_per_worker CPUs (or one GPU), training data-parallel (actor.strategy / critic.strategy).
    # null (the default): one per visible GPU on CUDA, else 1. `verl-deploy run` sets it to --gpus x --nodes.
    n_workers: int | None = None
    # verl's names for the world size: n_workers = n_gpus_per_node x nnodes (null: not given)
    n_gpus_per_node: int | None = None
    nnodes: int | None = None
    cpus_per_worker: int = 1
    placement: str = "colocated"  # colocated: all roles share the workers | split: the critic gets its own n_workers
    # verl's trainer.v1.trainer_mode: sync (generate, then update, on the same workers) | separate_async (the rollout
    # on workers of its own, rollout.n_gpus_per_node x rollout.nnodes, generating the next batch while this one
    # trains; verl_runtime/async_rollout.py). colocate_async is verl's (--runtime verl).
    mode: str = "sync"
    separate_async: SeparateAsyncConfig = field(default_factory=SeparateAsyncConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)


@dataclass
class RayConfig:
    address: str | None = None  # a running cluster to join ("host:6379", "auto"); RAY_ADDRESS too. None: start one here
    num_cpus: int | None = None  # CPUs of a Ray started here (None: all of this host's)


@dataclass
class SandboxServiceConfig:
    # A code sandbox that speaks SandboxFusion's run_code API (verl_runtime/services/sandbox.py), started with the
    # run and stopped with it; SandboxFusionTool's sandbox_fusion_url points at it.
    enable: bool = False
    url: str | None = None  # a sandbox that already runs there (http://host:port): checked, not started
    memory_mb: int = 1024  # the most memory one program may take
    run_timeout: float = 10.0  # the longest one program may run, in seconds (a request may ask for less)
    concurrency: int | None = None  # programs run at once per sandbox (None: one per CPU); more wait or get 503
    # sandboxes behind its one address (docker: containers sharing a network alias; k8s: the Deployment's replicas);
    # a sandbox beside the trainer (local, Slurm) is one process
    replicas: int = 1


@dataclass
class RetrieverServiceConfig:
    # A retriever that speaks Search-R1's retrieve API (verl_runtime/services/retriever.py); SearchTool's
    # retrieval_service_url points at it.
    enable: bool = False
    url: str | None = None  # a retriever that already runs there (http://host:port): checked, not started
    corpus: str | None = None  # Search-R1's JSON lines ({"id", "contents"}); None: the small bundled corpus


@dataclass
class ServicesConfig:
    # What the run's tools call (rollout.multi_turn), started before the trainer, health-checked and stopped with
    # the run: processes beside the trainer, or containers and sidecars the launcher runs (docs/agentic.md).
    sandbox: SandboxServiceConfig = field(default_factory=SandboxServiceConfig)
    retriever: RetrieverServiceConfig = field(default_factory=RetrieverServiceConfig)
    health_timeout: float = 60.0  # seconds a service may take to answer /health
    # The services' container image (--target docker, k8s; processes elsewhere). None: the run's image. A service
    # needs only the image's Python and verl_runtime, so a GPU run can name the catalog's cpu variant of its image
    # (verl-deploy:<version>-cpu, about a sixth of the CUDA image's size) for nodes that must pull it.
    image: str | None = None


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
    services: ServicesConfig = field(default_factory=ServicesConfig)

    @property
    def train(self) -> TrainerConfig:
        """The tutorial's name for the trainer section (``config.train.num_epochs``)."""
        return self.trainer

    @property
    def run_dir(self) -> Path:
        return Path(self.trainer.run_dir or Path("runs") / self.trainer.experiment_name)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Range:
    """The values a numeric key takes: low and high bounds (each inclusive unless open; None: unbounded) and a note
    on what a value means. A key whose value is None (unset: see its field's comment) is not checked."""

    key: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""

    def allows(self, value: float) -> bool:
        if not math.isfinite(value):  # nan passes every comparison; inf is no learning rate or length
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def wording(self) -> str:
        if self.high is None:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
        else:
            text = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        return f"{text} ({self.note})" if self.note else text


def _at_least(key: str, low: float, note: str = "") -> Range:
    return Range(key, low=low, note=note)


def _above(key: str, low: float, note: str = "") -> Range:
    return Range(key, low=low, low_open=True, note=note)


def _fraction(key: str, note: str = "", zero: bool = True) -> Range:
    return Range(key, low=0, high=1, low_open=not zero, note=note)


# Every numeric key's range, checked at load (tests/test_config_ranges.py holds that each int/float field has one).
RANGES = (
    _at_least("data.batch_size", 1, "prompts per step"),
    _at_least("data.val_batch_size", 1, "null: all validation prompts at once"),
    _at_least("data.max_prompt_length", 1, "tokens"),
    _at_least("data.max_response_length", 1, "tokens"),
    _at_least("data.toy_size", 1, "rows"),
    _at_least("model.lora_rank", 0, "0: no LoRA"),
    _above("model.lora_alpha", 0, "LoRA's scaling is lora_alpha / lora_rank"),
    _above("actor.lr", 0),
    _at_least("actor.weight_decay", 0),
    _above("actor.grad_clip", 0, "the largest gradient norm"),
    _at_least("actor.ppo_epochs", 1),
    _at_least("actor.ppo_mini_batch_size", 1, "null: data.batch_size"),
    _at_least("actor.ppo_micro_batch_size_per_gpu", 1, "null: the whole mini-batch"),
    _above("actor.clip_ratio", 0, "e.g. 0.2"),
    _above("actor.clip_ratio_low", 0, "null: actor.clip_ratio"),
    _above("actor.clip_ratio_high", 0, "null: actor.clip_ratio"),
    _above("actor.clip_ratio_c", 1, "the dual-clip bound, e.g. 3"),
    _at_least("actor.entropy_coeff", 0),
    _at_least("actor.kl_loss_coef", 0),
    *(rule for section in ("actor", "critic") for rule in (
        _at_least(f"{section}.lr_warmup_steps", -1, "-1 or 0: lr_warmup_steps_ratio decides"),
        _fraction(f"{section}.lr_warmup_steps_ratio", "a share of the run's steps"),
        _fraction(f"{section}.min_lr_ratio", "the cosine schedule's last learning rate, a share of lr"),
        _at_least(f"{section}.num_cycles", 0, "cosine waves over the run"),
    )),
    _above("actor.tau_pos", 0, "sapo's gate temperature"),
    _above("actor.tau_neg", 0, "sapo's gate temperature"),
    _fraction("actor.policy_loss.clip_cov_ratio", "a share of the tokens", zero=False),
    Range("actor.policy_loss.clip_cov_lb", low=-math.inf, note="a covariance bound: any number"),
    Range("actor.policy_loss.clip_cov_ub", low=-math.inf, note="a covariance bound: any number"),
    _fraction("actor.policy_loss.kl_cov_ratio", "a share of the tokens", zero=False),
    _at_least("actor.policy_loss.ppo_kl_coef", 0),
    _above("actor.policy_loss.dro_beta", 0, "required by loss_mode=dro"),
    _above("critic.lr", 0),
    _at_least("critic.weight_decay", 0),
    _above("critic.grad_clip", 0, "the largest gradient norm"),
    _above("critic.cliprange_value", 0, "e.g. 0.5"),
    _at_least("critic.ppo_micro_batch_size_per_gpu", 1, "null: the whole mini-batch"),
    _at_least("actor.ppo_max_token_len_per_gpu", 1, "real tokens per micro-batch with use_dynamic_bsz"),
    _at_least("actor.entropy_from_logits_chunk_size", 1, "tokens per chunk"),
    _at_least("critic.ppo_max_token_len_per_gpu", 1, "real tokens per micro-batch with use_dynamic_bsz"),
    _at_least("critic.forward_max_token_len_per_gpu", 1, "null: critic.ppo_max_token_len_per_gpu"),
    _at_least("ref.log_prob_max_token_len_per_gpu", 1, "null: actor.ppo_max_token_len_per_gpu"),
    _at_least("ref.entropy_from_logits_chunk_size", 1, "tokens per chunk"),
    _at_least("rollout.log_prob_max_token_len_per_gpu", 1, "null: actor.ppo_max_token_len_per_gpu"),
    _at_least("ref.log_prob_micro_batch_size_per_gpu", 1),
    _at_least("rollout.n", 1, "samples per prompt"),
    _at_least("rollout.multi_turn.max_assistant_turns", 1, "null: until the response length"),
    _at_least("rollout.multi_turn.max_user_turns", 1, "null: no limit on tool turns"),
    _at_least("rollout.multi_turn.max_parallel_calls", 1, "tool calls run per turn"),
    _at_least("rollout.multi_turn.max_tool_response_length", 1, "characters of a tool response kept"),
    _above("rollout.multi_turn.tool_timeout", 0, "seconds one tool call may take"),
    _at_least("services.sandbox.memory_mb", 16, "MB one program may take"),
    _above("services.sandbox.run_timeout", 0, "seconds one program may run"),
    _at_least("services.sandbox.concurrency", 1, "programs run at once; null: one per CPU"),
    _at_least("services.sandbox.replicas", 1, "sandboxes behind its address"),
    _above("services.health_timeout", 0, "seconds a service may take to become healthy"),
    _at_least("rollout.temperature", 0, "0 means greedy sampling"),
    _fraction("rollout.top_p", "1 keeps every token", zero=False),
    _at_least("rollout.top_k", -1, "-1 or 0: no top-k filtering"),
    _at_least("rollout.val_kwargs.n", 1, "validation samples per prompt"),
    _at_least("rollout.val_kwargs.temperature", 0, "0 means greedy validation"),
    _fraction("rollout.val_kwargs.top_p", "1 keeps every token", zero=False),
    _at_least("rollout.val_kwargs.top_k", -1, "-1 or 0: no top-k filtering"),
    _at_least("reward.max_resp_len", 1, "tokens; null: unset (dapo's overlong buffer needs it)"),
    _at_least("reward.overlong_buffer.len", 0, "tokens before max_resp_len where the penalty grows"),
    _at_least("reward.overlong_buffer.penalty_factor", 0, "the penalty at max_resp_len"),
    _at_least("rollout.log_prob_micro_batch_size_per_gpu", 1),
    _fraction("rollout.gpu_memory_utilization", "a share of each GPU's memory", zero=False),
    _at_least("rollout.tensor_model_parallel_size", 1),
    _fraction("algorithm.gamma", "the discount factor"),
    _fraction("algorithm.lam", "GAE's lambda"),
    _at_least("algorithm.kl_ctrl.kl_coef", 0),
    _at_least("algorithm.kl_ctrl.horizon", 1, "steps"),
    _above("algorithm.kl_ctrl.target_kl", 0),
    _at_least("trainer.seed", 0),
    _at_least("trainer.log_val_generations", 0, "validation samples sent to the trackers; 0: none"),
    _at_least("trainer.num_epochs", 1),
    _at_least("trainer.total_training_steps", 1, "null: trainer.num_epochs decides"),
    _at_least("trainer.test_freq", -1, "-1 or 0: never"),
    _at_least("trainer.save_freq", -1, "-1 or 0: only at the end and when stopped"),
    _at_least("trainer.keep_last", 1, "checkpoints kept"),
    _at_least("trainer.n_workers", 1, "null: one per visible GPU"),
    _at_least("trainer.n_gpus_per_node", 1),
    _at_least("trainer.nnodes", 1),
    _at_least("trainer.cpus_per_worker", 1),
    _at_least("ray.num_cpus", 1, "null: all of this host's"),
    _at_least("rollout.n_gpus_per_node", 1, "trainer.mode=separate_async: the rollout's workers per node"),
    _at_least("rollout.nnodes", 0, "trainer.mode=separate_async: the rollout's nodes"),
    _at_least("trainer.separate_async.num_warmup_batches", 0, "batches generated ahead of training"),
    _at_least("trainer.separate_async.parameter_sync_step", 1, "null: the step's mini-batches"),
    _at_least("trainer.sampler.max_off_policy_threshold", 0, "0: on-policy; null: no bound"),
)


# Where an override was given, as every message says it: verl's KEY=VALUE (main_ppo, run's `-- KEY=VALUE`) and
# --set alike reach load_config as overrides; a file's keys are "in FILE".
COMMAND_LINE = "on the command line"


def stated(setting: str, origin: str) -> str:
    """A setting as a message names it, with where it was given: ``trainer.critic_warmup=5 on the command line``,
    ``data.batch_size=0 in run.yaml`` (origin: COMMAND_LINE or ``in FILE``; empty: the setting alone)."""
    return f"{setting} {origin}" if origin else setting


def check_ranges(config: Config, spelled: dict[str, str] | None = None) -> None:
    """ConfigError (one line) for the first numeric key out of its range (RANGES). spelled: how the user wrote a
    key and where ({"rollout.temperature": "actor_rollout_ref.rollout.temperature on the command line"})."""
    for rule in RANGES:
        value = get_value(config, rule.key)
        if value is not None and not rule.allows(value):
            shown = f"{value:g}" if isinstance(value, float) else value
            name, _, where = (spelled or {}).get(rule.key, rule.key).partition(" ")
            raise ConfigError(f"{stated(f'{name}={shown}', where)} is out of range: it must be {rule.wording()}")


def get_value(config: Config, key: str) -> Any:
    """The value of a dotted key (``rollout.temperature``)."""
    target: Any = config
    for part in key.split("."):
        target = getattr(target, part)
    return target


# Older scripts' global micro-batch sizes, divided into the *_per_gpu keys (_per_gpu_sizes): key -> the key of the
# ulysses_sequence_parallel_size that divides the world with it (verl 0.7's fsdp_workers.py: the actor's for its
# rollout and reference, the critic's for the critic).
_GLOBAL_MICRO = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "critic.ppo_micro_batch_size": "critic.ulysses_sequence_parallel_size",
}

# verl keys whose value is translated, not only renamed (see _from_verl).
_TRANSLATED = (
    "trainer.logger", "custom_reward_function.path", "custom_reward_function.name",
    "reward.custom_reward_function.path", "reward.custom_reward_function.name", "reward_model.enable",
    "reward.reward_model.enable", "actor_rollout_ref.actor.optim.warmup_style", "critic.optim.warmup_style",
    "reward_model.reward_manager", "actor_rollout_ref.hybrid_engine",
    *_GLOBAL_MICRO,
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
    "remax": "grpo",  # verl's ReMax scripts sample several responses per prompt too
    "optimal_token_baseline": "grpo",
    "tir_optimal_token_baseline": "grpo",
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
    spelled: dict[str, str] = {}  # dotted key -> the key as written and where, for a range error (check_ranges)
    file_keys: list[str] = []  # as written: a verl config is known by its own spellings
    written_keys: list[str] = []
    if path is not None:
        for key, value in _flatten(_read_yaml(Path(path))).items():
            values[_canonical(key)] = (value, f"in {path}")
            spelled[_canonical(key)] = stated(key, f"in {path}")
            file_keys.append(key)
    for item in overrides:
        written, value = parse_override(item)
        written_keys.append(written)
        key = _canonical(written)
        values.pop(key, None)  # the last one given counts, in its place (~key: none does)
        spelled.pop(key, None)
        if value is not DELETE:
            values[key] = (value, COMMAND_LINE)
            spelled[key] = stated(written, COMMAND_LINE)
    # The base decides: a file of ours keeps our defaults under verl-spelled overrides (they translate onto it); a
    # verl file, or a command line of verl's keys with no file (or main_ppo.yaml's empty one), gets verl's.
    verl_line = _gives_verls_keys(file_keys if file_keys else written_keys)
    values = _from_verl(values, warn)
    if verl_line:  # what verl would train with where the line does not say (verl_keys.VERL_DEFAULTS)
        for key, (verl_key, value) in verl_keys.VERL_DEFAULTS.items():
            values.setdefault(key, (value, f"(verl {verl_keys.VERL_VERSION}'s default of {verl_key})"))
    estimator = values.get("algorithm.adv_estimator", ("gae", ""))[0]
    config = get_default_config(_PRESET_OF_ESTIMATOR.get(str(estimator), "ppo"))
    for key, (value, origin) in values.items():
        set_value(config, key, value, origin)
    check_ranges(config, spelled)
    _set_world_size(config)
    if warn and config.algorithm.adv_estimator in ("grpo", "rloo") and config.rollout.n < 2:
        # verl runs it: a group of one has mean 0 and std 1 (core_algos.compute_grpo/rloo_outcome_advantage)
        where = " (verl's default unless actor_rollout_ref.rollout.n is given)" if verl_line else ""
        _warn(f"algorithm.adv_estimator={config.algorithm.adv_estimator} compares samples of one prompt and "
              f"rollout.n is {config.rollout.n}{where}: each advantage is the sample's own score, with no "
              "baseline, as in verl; set rollout.n to 2 or more to compare samples")
    validate(config)
    config.spelled = spelled  # not a field (not in config.yaml): oom.py names a fix as the user wrote its key
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
        raise ConfigError(f"override {item!r} needs the form key=value")
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


def _check_multi_turn(multi_turn: MultiTurnConfig) -> None:
    if not multi_turn.enable:
        return
    _check_choice("rollout.multi_turn.format", multi_turn.format, ("hermes",))
    if not multi_turn.tool_config_path:
        raise ConfigError("rollout.multi_turn.enable needs rollout.multi_turn.tool_config_path: a tool config file "
                          "in verl's format (tools: [{class_name, config, tool_schema}]; docs/agentic.md)")


def _check_services(services: ServicesConfig) -> None:
    for name in ("sandbox", "retriever"):
        url = getattr(services, name).url
        if url and not str(url).startswith(("http://", "https://")):
            raise ConfigError(f"services.{name}.url {url!r}: give where it serves, http://host:port")


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
    _check_multi_turn(config.rollout.multi_turn)
    _check_services(config.services)
    _check_choice("trainer.placement", config.trainer.placement, ("colocated", "split"))
    _check_choice("actor.strategy", config.actor.strategy, ("dp", "fsdp"))
    _check_choice("critic.strategy", config.critic.strategy, ("dp", "fsdp"))
    _check_choice("actor.policy_loss.loss_mode", config.actor.policy_loss.loss_mode, POLICY_LOSSES)
    _check_choice("reward.manager", config.reward.manager, REWARD_MANAGERS)
    _check_overlong_buffer(config.reward)
    _check_rollout_correction(config)
    _check_trainer_mode(config)
    for section in ("actor", "critic"):
        optim = getattr(config, section)
        _check_choice(f"{section}.lr_scheduler_type", optim.lr_scheduler_type, LR_SCHEDULER_TYPES)
        if len(optim.betas) != 2 or not all(0 <= beta < 1 for beta in optim.betas):
            raise ConfigError(f"{section}.betas={optim.betas} is out of range: AdamW's two betas, each in [0, 1)")
    if config.actor.policy_loss.loss_mode == "dro" and config.actor.policy_loss.dro_beta is None:
        raise ConfigError("actor.policy_loss.loss_mode=dro needs actor.policy_loss.dro_beta (a positive number)")

    check_ranges(config)
    if not config.data.train_files:
        raise ConfigError("data.train_files is empty: name a .parquet or .jsonl file in verl's layout (or toy:letter)")

    _check_batch_sizes(config)


TRAINER_MODES = ("sync", "separate_async")
OFF_POLICY_STRATEGIES = ("drop", "wait")


def _check_trainer_mode(config: Config) -> None:
    """trainer.mode and its settings: verl's own checks of its separate_async trainer
    (verl/trainer/ppo/v1/trainer_separate_async.py, PPOTrainerSeparateAsync.__init__), in one line each."""
    _check_choice("trainer.mode", config.trainer.mode, TRAINER_MODES)
    _check_choice("trainer.sampler.max_off_policy_strategy", config.trainer.sampler.max_off_policy_strategy,
                  OFF_POLICY_STRATEGIES)
    if config.trainer.mode != "separate_async":
        return
    if config.rollout.nnodes == 0:
        raise ConfigError("trainer.mode=separate_async needs rollout.nnodes > 0 (verl: actor_rollout_ref.rollout.nnodes"
                          "; 0 is colocated): the rollout runs on workers of its own")
    sync_step = config.trainer.separate_async.parameter_sync_step
    mini = mini_batch_size(config)
    if sync_step is not None and not config.actor.use_dynamic_bsz and config.data.batch_size != sync_step * mini:
        raise ConfigError(f"trainer.separate_async.parameter_sync_step={sync_step} needs data.batch_size == "
                          f"parameter_sync_step x actor.ppo_mini_batch_size, as in verl ({config.data.batch_size} != "
                          f"{sync_step} x {mini}): set parameter_sync_step={max(config.data.batch_size // mini, 1)} "
                          "or leave it unset (one weight push per step)")
    if config.model.uses_lora:
        raise ConfigError("trainer.mode=separate_async with LoRA (model.lora_rank > 0) is not here: the rollout "
                          "workers take whole weights; " + verl_keys.not_here("LoRA with a separate rollout"))


def rollout_world_size(config: Config) -> int:
    """The rollout's own workers with trainer.mode=separate_async: rollout.n_gpus_per_node x rollout.nnodes."""
    return (config.rollout.n_gpus_per_node or 1) * (config.rollout.nnodes or 1)


def _check_batch_sizes(config: Config) -> None:
    """verl 0.9.1's batch-size checks, none with use_dynamic_bsz: the batch holds at least one mini-batch
    (verl/workers/config/actor.py:224-229, ActorConfig.validate; a last, smaller mini-batch is trained as verl's
    split does) and its samples split evenly over the workers (verl/utils/config.py:103-127, validate_config:
    real_train_batch_size % n_gpus). Always: each worker gets a share of a mini-batch (it trains on
    mini-batch // workers samples a step, as verl's workers divide it)."""
    batch, mini, n = config.data.batch_size, mini_batch_size(config), config.rollout.n
    workers = config.trainer.n_workers  # None: known once the trainer sees its GPUs (resolve_world_size)
    if not config.actor.use_dynamic_bsz:
        if batch < mini:
            raise ConfigError(f"data.batch_size ({batch}) must be >= actor.ppo_mini_batch_size ({mini}), as in verl")
        if workers and (batch * n) % workers:
            raise ConfigError(f"data.batch_size * rollout.n ({batch} * {n} = {batch * n} samples) must be divisible "
                              f"by trainer.n_workers ({workers}), as in verl: each worker trains on an equal share")
    if workers and mini * n < workers:
        raise ConfigError(f"actor.ppo_mini_batch_size * rollout.n ({mini} * {n} = {mini * n} samples) must be at "
                          f"least trainer.n_workers ({workers}): each worker trains on a share of every mini-batch")


def _check_overlong_buffer(reward: RewardConfig) -> None:
    """DAPO's overlong buffer: what verl's DAPORewardManager asserts, and that it would act at all."""
    buffer = reward.overlong_buffer
    if not buffer.enable:
        return
    if reward.manager != "dapo":  # verl's naive manager would not read it: the penalty asked for would not apply
        raise ConfigError(f"reward.overlong_buffer.enable=true needs reward.manager=dapo (now {reward.manager}): "
                          "only DAPO's reward manager applies the overlong penalty")
    if reward.model_path:
        raise ConfigError("reward.overlong_buffer.enable=true with reward.model_path: the reward model's score is used "
                          "as is here (verl, too, applies the penalty to a reward function's scores only), so the "
                          "overlong penalty would not apply; unset one of them")
    if reward.max_resp_len is None:
        raise ConfigError("reward.overlong_buffer.enable=true needs reward.max_resp_len (verl: "
                          "reward_kwargs.max_resp_len), the response length the buffer ends at")
    if buffer.len < 1 or reward.max_resp_len < buffer.len:
        raise ConfigError(f"reward.overlong_buffer.len={buffer.len} must be at least 1 and at most reward.max_resp_len "
                          f"({reward.max_resp_len}); to turn the penalty off, set reward.overlong_buffer.enable=false")


def _check_rollout_correction(config: Config) -> None:
    """What verl rejects at its first step, at load; and a correction asked for that would not act."""
    rc = config.algorithm.rollout_correction
    _check_choice("algorithm.rollout_correction.loss_type", rc.loss_type, rollout_thresholds.LOSS_TYPES)
    try:
        rollout_thresholds.check_rollout_correction(rc.rollout_is, rc.rollout_is_threshold, rc.rollout_rs,
                                                    rc.rollout_rs_threshold)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"algorithm.rollout_correction: {error}") from None
    if not rc.enabled:
        return
    if config.rollout.name == "hf":
        raise ConfigError("algorithm.rollout_correction needs the rollout engine's log-probs, which rollout.name=hf "
                          "(transformers generate) does not give: set rollout.name=builtin or vllm")
    if not config.rollout.calculate_log_probs:
        if rc.bypass_mode:  # verl stops at the first step
            raise ConfigError("algorithm.rollout_correction.bypass_mode=true needs the rollout's log-probs: set "
                              "rollout.calculate_log_probs=true (verl: actor_rollout_ref.rollout.calculate_log_probs)")
        _warn("algorithm.rollout_correction has no effect without rollout.calculate_log_probs=true (as in verl, "
              "where the rollout then gives no log-probs to correct with)")


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
    warmup_styles: dict[str, tuple[Any, str]] = {}  # our lr_scheduler_type key -> verl's warmup_style (value, origin)
    legacy_manager = None  # (value, origin) of verl's older reward_model.reward_manager
    one_step_off = None  # (value, origin): actor_rollout_ref.hybrid_engine=false
    _refuse_out_of_scope(values, ours)
    _refuse_unknown(values, ours)
    for key, (value, origin) in values.items():
        rule = None if key in ours else verl_keys.rule_for(key)
        if key in ours and isinstance(value, str):  # verl's values of keys that are ours too (rollout.name=sglang)
            value = verl_keys.VALUE_SPELLINGS.get(key, {}).get(value, value)
            refusal = verl_keys.VALUE_REFUSALS.get(key, {}).get(value)
            if refusal:
                raise ConfigError(f"{stated(f'{key}={value!r}', origin)} is refused: {refusal}")
        if rule is None:
            out[key] = (value, origin)
        elif rule.kind == verl_keys.IGNORED:
            if warn:
                _warn(f"{key} has no effect here: {rule.reason}")
        elif rule.kind == verl_keys.REFUSED:
            if not any(_same_value(value, ok) for ok in rule.accepts):
                accepted = " or ".join("null" if ok is None else repr(ok) for ok in rule.accepts)
                unless = f" (accepted: {accepted})" if accepted else ""
                raise ConfigError(f"{stated(f'{key}={value!r}', origin)} is refused: "
                                  f"{verl_keys.not_here(rule.reason + unless)}")
        elif key == "trainer.logger":
            from verl_runtime.trackers import TRACKERS  # torch-free, imports no tracker's client

            loggers = [value] if isinstance(value, str) else list(value or [])
            out["trainer.tensorboard"] = ("tensorboard" in loggers, origin)
            out["trainer.trackers"] = ([name for name in loggers if name in TRACKERS], origin)
            others = [name for name in loggers if name not in ("console", "tensorboard", *TRACKERS)]
            if others and warn:
                _warn(f"trainer.logger: {', '.join(map(str, others))} not here (console, tensorboard, "
                      f"{', '.join(TRACKERS)} are): metrics go to the console and metrics.jsonl")
        elif key.endswith("custom_reward_function.path"):
            reward_path = (value, origin)
        elif key.endswith("custom_reward_function.name"):
            reward_name = (value, origin)
        elif key.endswith("reward_model.enable"):
            reward_model_enabled = None if value is None else _coerce(key, value, bool)
        elif key.endswith("optim.warmup_style"):
            if value is not None:  # verl: warmup_style, when given, overrides lr_scheduler_type
                warmup_styles[rule.target] = (value, origin)
        elif key == "reward_model.reward_manager":
            if value is not None:  # null: verl's default; given, it wins over reward.reward_manager.name (as in verl)
                legacy_manager = (value, origin)
        elif key == "actor_rollout_ref.hybrid_engine":
            if _coerce(key, value, bool) is False:  # verl's one-step-off recipe: the rollout on its own workers
                one_step_off = ("separate_async", origin)
        elif key in _GLOBAL_MICRO:
            if value is not None:
                out[rule.target] = (_per_gpu_size(key, value, values), origin)
        else:
            raise AssertionError(f"no translation for {key}")  # a maps rule missing from ALIASES and _TRANSLATED
    if reward_path and reward_path[0]:
        name = reward_name[0] if reward_name and reward_name[0] else ""
        out["reward.function"] = (f"{reward_path[0]}:{name}" if name else str(reward_path[0]), reward_path[1])
    if reward_model_enabled is False:
        out.pop("reward.model_path", None)
    out.update(warmup_styles)
    if legacy_manager:
        refusal = verl_keys.VALUE_REFUSALS["reward.manager"].get(legacy_manager[0])
        if refusal:
            raise ConfigError(f"{stated(f'reward_model.reward_manager={legacy_manager[0]!r}', legacy_manager[1])} is "
                              f"refused: {refusal}")
        out["reward.manager"] = legacy_manager
    if one_step_off and out.get("trainer.mode", ("sync",))[0] == "sync":
        out["trainer.mode"] = one_step_off
    return out


def _gives_verls_keys(written: list[str]) -> bool:
    """Whether a command line (or file) speaks verl: it gives a key of verl's own that is not one of ours and says
    something about training (not trainer.logger, not a key ignored here)."""
    ours = set(all_keys())

    def speaks_verl(key: str) -> bool:
        if key in ours or key in verl_keys.BOOKKEEPING_KEYS or not verl_keys.is_verl_key(key):
            return False
        rule = verl_keys.rule_for(key)
        return rule is None or rule.kind != verl_keys.IGNORED

    return any(speaks_verl(key) for key in written)


def _refuse_out_of_scope(values: dict[str, tuple[Any, str]], ours: set[str]) -> None:
    """The first key naming something out of this runtime's scope (Megatron, SGLang, NPUs, images), before any
    other refusal: such a command line is verl's to run (verl_keys.RUN_WITH_VERL), whatever else it holds."""
    for key, (value, origin) in values.items():
        reason = verl_keys.VALUE_REFUSALS.get(key, {}).get(value) if key in ours and isinstance(value, str) else None
        if not reason and key in _CHOICES and isinstance(value, str) and value not in _CHOICES[key]:
            reason = verl_keys.value_way_out(key, value)  # verl 0.9.1's and not ours: out of scope
        if key not in ours and not verl_keys.is_verl_key(key) and verl_keys.engine_key(key):
            reason = verl_keys.ENGINE_ONLY
        rule = None if key in ours else verl_keys.rule_for(key)
        if rule is not None and rule.kind == verl_keys.REFUSED and not any(_same_value(value, ok) for ok in rule.accepts):
            reason = rule.reason
        if reason and verl_keys.RUN_WITH_VERL in reason:
            raise ConfigError(f"{stated(f'{key}={value!r}', origin)} is refused: {reason}")


# Our choice keys whose values verl names too (verl_keys.VALUE_FAMILIES): a value of verl's that is not ours is out
# of scope, refused before anything else.
_CHOICES = {"algorithm.adv_estimator": ADV_ESTIMATORS, "reward.manager": REWARD_MANAGERS,
            "actor.policy_loss.loss_mode": POLICY_LOSSES}


def _refuse_unknown(values: dict[str, tuple[Any, str]], ours: set[str]) -> None:
    """Keys and choice values no verl release has (a fork's), and keys verl renamed, after the out-of-scope ones and
    before any other refusal: the way out of such a line is the fork (--verl-source) or the new name, whatever else
    it holds (upstream verl would refuse it too)."""
    for key, (value, origin) in values.items():
        if key not in ours and verl_keys.rule_for(key) is None:
            _unknown_key(key, origin)
        choice = "reward.manager" if key == "reward_model.reward_manager" else key  # verl's older name of it
        if (choice in _CHOICES and isinstance(value, str) and value not in _CHOICES[choice]
                and not verl_keys.VALUE_REFUSALS.get(choice, {}).get(value)):
            way_out = verl_keys.value_way_out(choice, value)
            if way_out and verl_keys.RUN_WITH_VERL not in way_out:  # verl 0.9.1's own: out of scope, refused above
                _check_choice(choice, value, _CHOICES[choice])


def _per_gpu_size(key: str, value: Any, values: dict[str, tuple[Any, str]]) -> int:
    """A global micro-batch size per worker, as verl's FSDP workers divided it: size // (world // ulysses_sp). The
    world size is trainer.n_workers, else trainer.n_gpus_per_node x trainer.nnodes, else 1."""
    def given(name: str, default: int) -> int:
        return _coerce(name, values[name][0], int) if values.get(name, (None,))[0] is not None else default

    world = given("trainer.n_workers", given("trainer.n_gpus_per_node", 1) * given("trainer.nnodes", 1))
    share = world // given(_GLOBAL_MICRO[key], 1)
    size = _coerce(key, value, int)
    if share < 1 or size < share:
        raise ConfigError(f"{key}={size} is a global size: it must be at least the world size ({world}) over "
                          f"{_GLOBAL_MICRO[key]} ({given(_GLOBAL_MICRO[key], 1)}), or set its *_per_gpu key instead")
    return size // share


def _same_value(value: Any, accepted: Any) -> bool:
    """value == accepted, where true is not 1 and 0 is not false."""
    return value == accepted and isinstance(value, bool) == isinstance(accepted, bool)


def world_size(trainer, visible_gpus: int | None = None) -> int | None:
    """The runtime's one rule for how many workers train (one per GPU): trainer.n_workers, else verl's
    trainer.n_gpus_per_node x trainer.nnodes, else, once the trainer has counted the GPUs it sees (visible_gpus;
    0 for a CPU run), one per visible GPU and at least one; None while that count is not known. ConfigError
    (one line) where the keys disagree."""
    if trainer.n_gpus_per_node is None and trainer.nnodes is not None:
        raise ConfigError("trainer.nnodes needs trainer.n_gpus_per_node: the world size is their product")
    if trainer.n_gpus_per_node is not None:
        world = trainer.n_gpus_per_node * (trainer.nnodes or 1)
        if trainer.n_workers is not None and trainer.n_workers != world:
            raise ConfigError(
                f"trainer.n_workers={trainer.n_workers} but trainer.n_gpus_per_node x trainer.nnodes = "
                f"{trainer.n_gpus_per_node} x {trainer.nnodes or 1} = {world}: give one of them, or equal ones"
            )
        return world
    if trainer.n_workers is not None:
        return trainer.n_workers
    return None if visible_gpus is None else max(visible_gpus, 1)


def _set_world_size(config: Config) -> None:
    """trainer.n_workers from the config's keys (world_size), where they give it."""
    config.trainer.n_workers = world_size(config.trainer)


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


def _closest(word: str, choices: typing.Iterable[str], cutoff: float = 0.5) -> str | None:
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return matches[0] if matches else None


def _suggest(word: str, choices: typing.Iterable[str]) -> str:
    match = _closest(word, choices)
    return f"; did you mean {match!r}?" if match else ""


def _unknown_key(key: str, origin: str) -> typing.NoReturn:
    """One line for a key that is neither ours nor verl 0.9.1's: the key verl renamed it to (and in which release),
    or the key meant (a misspelling) and, for a key of verl's sections, how to run the verl that has it (an older
    release, or the user's fork: verl_keys.key_way_out)."""
    unknown = f"unknown config key {stated(repr(key), origin)}"
    way_out = verl_keys.key_way_out(key, frozenset(_field_types(Config)))
    if way_out and way_out[0]:  # renamed: the new name, not the nearest spelling
        raise ConfigError(f"{unknown}: {way_out[1]}")
    keys = all_keys() + list(ALIASES) + sorted(verl_keys.verl_keys() - set(ALIASES))
    if way_out:  # a verl-style key: a misspelling is a close name in the same section (else a fork's key)
        section, _, name = key.rpartition(".")
        names = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == section and not k.endswith("_target_")}
        close = _closest(name, names, 0.75)
        match = (_same_words(key, keys) or _nested_words(key, keys)
                 or (names[close] if close else None if names else _closest(key, keys, 0.85)))
    else:
        match = _same_words(key, keys) or _closest(key, keys)
    if match is None and not way_out:  # a misspelt name in a known section, e.g. actor.learning_rate
        section, _, name = key.rpartition(".")
        names = {k.rpartition(".")[2]: k for k in keys if k.startswith(section + ".")}
        close = _closest(name, names)
        match = names[close] if close else None
    hint = f"; did you mean {match!r}?" if match else ""
    tail = f" If not a misspelling: {way_out[1]}" if way_out and match else f": {way_out[1]}" if way_out else ""
    raise ConfigError(f"{unknown}{hint}{tail}")


def _same_words(key: str, keys: list[str]) -> str | None:
    """The shortest key of the same section whose name holds every word of the given name: trainer.total_steps ->
    trainer.total_training_steps (difflib alone would say trainer.total_epochs, which counts something else)."""
    section, _, name = key.rpartition(".")
    words = set(name.split("_"))
    found = [k for k in keys if k.rpartition(".")[0] == section and words <= set(k.rpartition(".")[2].split("_"))]
    return min(found, key=len) if found and len(words) > 1 else None


def _nested_words(key: str, keys: list[str]) -> str | None:
    """The shortest key under the same section, a level or more deeper, whose names hold every word of the given
    name: actor_rollout_ref.rollout.val_temperature -> actor_rollout_ref.rollout.val_kwargs.temperature (the nearest
    spelling would be rollout.temperature, which samples the training responses)."""
    section, _, name = key.rpartition(".")
    words = set(name.split("_"))
    found = [k for k in keys if k.startswith(f"{section}.") and k.count(".") > key.count(".")
             and words <= set(k[len(section) + 1:].replace(".", "_").split("_"))]
    return min(found, key=len) if found and len(words) > 1 else None


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        way_out = verl_keys.value_way_out(key, value)  # a choice verl names: which release has it, or a fork's
        tail = f"; {way_out}" if way_out else ""
        raise ConfigError(f"{key}: unknown value {value!r}{_suggest(str(value), choices)} (choose one of "
                          f"{', '.join(choices)}){tail}")


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
