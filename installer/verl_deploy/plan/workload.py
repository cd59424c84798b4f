"""What a run asks of memory, read the way its trainer reads it: our runtime's config (verl_runtime.config.load_config:
the same defaults, YAML, --set overrides and verl aliases), or upstream verl 0.9.1's main_ppo overrides (its defaults
below, from verl/trainer/config/_generated_ppo_trainer.yaml of the verl 0.9.1 wheel; the deprecated global micro-batch
keys divided as verl's FSDP workers divide them: verl/workers/fsdp_workers.py, lines 241-273 at commit
b178a3cd56f58b2d502255daba591e92833930a7 of volcengine/verl)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from verl_deploy import runtimes
from verl_deploy.plan.errors import PlanError

OURS, VERL = runtimes.OURS.name, runtimes.VERL.name  # the runtime a Workload is read for


@dataclass(frozen=True)
class Workload:
    runtime: str
    model_path: str
    critic_path: str | None
    device: str  # cuda | cpu
    world: int  # workers (GPUs) of the actor's group
    gpus_per_node: int
    nodes: int
    use_critic: bool
    use_ref: bool
    batch_prompts: int  # prompts per step
    n: int  # samples per prompt
    mini_batch_prompts: int
    ppo_epochs: int
    micro_update: int | None  # sequences per GPU per forward/backward (None: the GPU's whole mini-batch share)
    micro_old_logprob: int | None
    micro_ref: int | None
    micro_critic: int | None
    micro_values: int | None
    old_log_prob_pass: bool  # a separate forward for the old policy's log-probs
    max_prompt_length: int
    max_response_length: int
    padding_free: bool  # micro-batches hold the real tokens (verl's use_remove_padding)
    compute_bytes: int  # 2: bf16/fp16 compute, 4: fp32
    ref_bytes: int  # the reference model's weights
    actor_sharded: bool
    critic_sharded: bool
    gradient_checkpointing: bool
    rollout: str  # hf | builtin | vllm
    gpu_memory_utilization: float
    rollout_tp: int
    vllm_sleeps: bool  # vLLM frees its KV cache and weights between rollouts
    sp: int = 1  # Ulysses sequence parallel size (verl)
    ref_in_actor: bool = False  # verl with LoRA: the reference is the actor without its adapters
    dynamic_tokens_update: int | None = None  # verl use_dynamic_bsz: tokens per GPU per micro-batch
    dynamic_tokens_infer: int | None = None
    dynamic_tokens_ref: int | None = None
    dynamic_tokens_critic: int | None = None
    dynamic_tokens_values: int | None = None  # ours: the critic's forward (critic.forward_max_token_len_per_gpu)
    param_offload: bool = False  # verl: parameters (and gradients) on the CPU between phases
    optimizer_offload: bool = False
    offload_policy: bool = False  # verl FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer on the CPU always
    critic_param_offload: bool = False
    critic_optimizer_offload: bool = False
    critic_offload_policy: bool = False  # ours (verl's critic offload_policy is not read by the planner)
    ref_param_offload: bool = False  # ours: the reference's weights in host memory outside its pass
    entropy_in_update: bool = True
    entropy_chunking: bool = False  # verl entropy_from_logits_with_chunking: entropy over row chunks, in fp32
    entropy_chunk: int = 2048  # verl entropy_from_logits_chunk_size
    entropy_checkpointing: bool = False  # verl: the entropy recomputed in the backward
    ref_entropy_chunk: int | None = None  # ours: the reference's chunked log-probs (ref.entropy_from_logits_*)
    lora_rank: int = 0
    lora_targets: Any = "all-linear"
    lora_exclude: tuple = ()
    placement_split: bool = False  # ours: the critic on GPUs of its own
    max_num_seqs: int = 256
    # distinct prompts in a micro-batch (the lean CPU path computes each once); None: every group's prompt differs
    distinct_prompts: int | None = None
    rollout_graphs: bool = False  # ours, builtin on the CPU: its GPU path (static_cache; bench/plan_accuracy.py)
    separate_rollout: bool = False  # ours, trainer.mode=separate_async: the rollout on GPUs of its own
    keys: dict = field(default_factory=dict)  # what each knob is called in this runtime's config
    notes: tuple = ()

    @property
    def trainer(self) -> runtimes.Trainer:
        """The runtime this workload is read for, with what it offers the planner (runtimes.Planning)."""
        return runtimes.trainer(self.runtime)

    @property
    def rows_per_gpu(self) -> int:
        """Sequences a GPU handles per step (its share of the batch)."""
        return max(self.batch_prompts * self.n * self.sp // max(self.world, 1), 1)

    @property
    def mini_rows_per_gpu(self) -> int:
        return max(self.mini_batch_prompts * self.n * self.sp // max(self.world, 1), 1)

    def with_(self, **changes) -> Workload:
        return replace(self, **changes)


# --- our runtime ------------------------------------------------------------------------------------------------

OUR_KEYS = {
    "micro_update": "actor.ppo_micro_batch_size_per_gpu",
    "micro_old_logprob": "rollout.log_prob_micro_batch_size_per_gpu",
    "micro_ref": "ref.log_prob_micro_batch_size_per_gpu",
    "micro_critic": "critic.ppo_micro_batch_size_per_gpu",
    "gradient_checkpointing": "model.gradient_checkpointing",
    "actor_sharded": "actor.strategy",
    "critic_sharded": "critic.strategy",
    "gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "max_response_length": "data.max_response_length",
    "param_offload": "actor.param_offload",
    "optimizer_offload": "actor.optimizer_offload",
    "offload_policy": "actor.offload_policy",
    "use_dynamic_bsz": "actor.use_dynamic_bsz",
    "dynamic_tokens_update": "actor.ppo_max_token_len_per_gpu",
    "dynamic_tokens_infer": "rollout.log_prob_max_token_len_per_gpu",
    "dynamic_tokens_ref": "ref.log_prob_max_token_len_per_gpu",
    "dynamic_tokens_critic": "critic.ppo_max_token_len_per_gpu",
    "entropy_chunking": "actor.entropy_from_logits_with_chunking",
    "ref_entropy_chunking": "ref.entropy_from_logits_with_chunking",
    "ref_param_offload": "ref.param_offload",
    "critic_param_offload": "critic.param_offload",
    "critic_optimizer_offload": "critic.optimizer_offload",
}


def from_ours(config, world: int, nodes: int, device: str) -> Workload:
    """A loaded verl_runtime Config (load_config) on `world` workers over `nodes` nodes, on `device`."""
    from verl_runtime.config import mini_batch_size

    compute = _our_compute_bytes(config.model.dtype, device)
    mini = mini_batch_size(config)
    on_policy = config.actor.ppo_epochs == 1 and mini >= config.data.batch_size and not config.algorithm.use_kl_in_reward
    use_critic = config.algorithm.adv_estimator == "gae"
    vllm = config.rollout.name == "vllm"
    notes = []
    if device == "cuda" and world > 1 and config.actor.strategy == "dp":
        notes.append("actor.strategy=dp: every GPU holds the whole model, its gradients and its optimizer")
    if vllm and config.rollout.tensor_model_parallel_size > 1:
        notes.append(f"rollout.tensor_model_parallel_size={config.rollout.tensor_model_parallel_size}: this runtime "
                     "runs the rollout data-parallel, one vLLM engine per GPU holding the whole model (planned so)")
    lora = _our_lora(config.model, notes)
    return Workload(
        runtime=OURS, model_path=config.model.path, critic_path=config.critic.model_path if use_critic else None,
        device=device, world=world, gpus_per_node=max(world // max(nodes, 1), 1), nodes=nodes,
        use_critic=use_critic, use_ref=bool(config.actor.use_kl_loss or config.algorithm.use_kl_in_reward),
        batch_prompts=config.data.batch_size, n=config.rollout.n, mini_batch_prompts=mini,
        ppo_epochs=config.actor.ppo_epochs, micro_update=config.actor.ppo_micro_batch_size_per_gpu,
        micro_old_logprob=config.rollout.log_prob_micro_batch_size_per_gpu,
        micro_ref=config.ref.log_prob_micro_batch_size_per_gpu, micro_critic=config.critic.ppo_micro_batch_size_per_gpu,
        micro_values=config.critic.ppo_micro_batch_size_per_gpu, old_log_prob_pass=not on_policy,
        max_prompt_length=config.data.max_prompt_length, max_response_length=config.data.max_response_length,
        compute_bytes=compute, ref_bytes=compute,
        actor_sharded=config.actor.strategy == "fsdp" and world > 1,
        critic_sharded=config.critic.strategy == "fsdp" and world > 1,
        gradient_checkpointing=config.model.gradient_checkpointing, rollout=config.rollout.name,
        gpu_memory_utilization=config.rollout.gpu_memory_utilization, rollout_tp=1,  # data-parallel (actor.py)
        vllm_sleeps=vllm and config.rollout.enable_sleep_mode and device == "cuda",
        placement_split=config.trainer.placement == "split" and use_critic, keys=dict(OUR_KEYS), notes=tuple(notes),
        separate_rollout=config.trainer.mode == "separate_async",
        **_our_memory_settings(config), **_our_offload(config), **lora,
    )


def _our_lora(model, notes: list[str]) -> dict[str, Any]:
    """LoRA as verl_runtime/lora.py wraps the actor: model.lora_rank, or the rank an adapter directory records."""
    rank = model.lora_rank
    if not rank and model.lora_adapter_path:
        adapter = Path(model.lora_adapter_path).expanduser() / "adapter_config.json"
        try:
            rank = int(json.loads(adapter.read_text())["r"])
        except (OSError, ValueError, KeyError, TypeError):
            rank = 64
            notes.append(f"model.lora_adapter_path: its rank is not readable here ({adapter}): planned as rank 64")
    exclude = model.exclude_modules or ()
    return {"lora_rank": rank, "lora_targets": model.target_modules,
            "lora_exclude": tuple([exclude] if isinstance(exclude, str) else exclude)}


def _our_offload(config) -> dict[str, bool]:
    """The offload settings (verl_runtime/offload.py) as the Workload names them."""
    actor, critic = config.actor, config.critic
    return {"param_offload": actor.param_offload, "optimizer_offload": actor.optimizer_offload,
            "offload_policy": actor.offload_policy, "critic_param_offload": critic.param_offload,
            "critic_optimizer_offload": critic.optimizer_offload, "critic_offload_policy": critic.offload_policy,
            "ref_param_offload": config.ref.param_offload}


def _our_memory_settings(config) -> dict[str, Any]:
    """verl's memory settings as our runtime applies them (verl_runtime/workers/actor.py token_budget, actor_memory,
    ref_memory): an unset (None) budget or switch takes the actor's, as verl's config interpolates them."""
    actor, ref, rollout, critic = config.actor, config.ref, config.rollout, config.critic

    def budget(use, tokens):
        use = actor.use_dynamic_bsz if use is None else use
        return (tokens or actor.ppo_max_token_len_per_gpu) if use else None

    return {
        "padding_free": config.model.use_remove_padding,
        "dynamic_tokens_update": budget(actor.use_dynamic_bsz, actor.ppo_max_token_len_per_gpu),
        "dynamic_tokens_infer": budget(rollout.log_prob_use_dynamic_bsz, rollout.log_prob_max_token_len_per_gpu),
        "dynamic_tokens_ref": budget(ref.log_prob_use_dynamic_bsz, ref.log_prob_max_token_len_per_gpu),
        "dynamic_tokens_critic": budget(critic.use_dynamic_bsz, critic.ppo_max_token_len_per_gpu),
        "dynamic_tokens_values": budget(critic.use_dynamic_bsz,
                                        critic.forward_max_token_len_per_gpu or critic.ppo_max_token_len_per_gpu),
        "entropy_chunking": actor.entropy_from_logits_with_chunking,
        "entropy_chunk": actor.entropy_from_logits_chunk_size,
        "entropy_checkpointing": actor.entropy_checkpointing,
        "ref_entropy_chunk": ref.entropy_from_logits_chunk_size if ref.entropy_from_logits_with_chunking else None,
    }


def _our_compute_bytes(dtype: str, device: str) -> int:
    """verl_runtime.models.resolve_dtype: auto is bf16 on CUDA, fp32 on the CPU."""
    if dtype == "auto":
        return 2 if device == "cuda" else 4
    return 4 if dtype == "float32" else 2


# --- upstream verl 0.9.1 ----------------------------------------------------------------------------------------

_AR = "actor_rollout_ref"
# verl 0.9.1's defaults for the keys that size memory (_generated_ppo_trainer.yaml; oc.select interpolations are
# resolved in from_verl).
VERL_DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "algorithm.adv_estimator": "gae",
    "algorithm.use_kl_in_reward": False,
    f"{_AR}.model.use_remove_padding": True,
    f"{_AR}.model.enable_gradient_checkpointing": True,
    f"{_AR}.model.lora_rank": 0,
    f"{_AR}.model.lora.rank": 0,
    f"{_AR}.model.target_modules": "all-linear",
    f"{_AR}.model.exclude_modules": None,
    f"{_AR}.actor.strategy": "fsdp",
    f"{_AR}.actor.ppo_mini_batch_size": 256,
    f"{_AR}.actor.ppo_micro_batch_size": None,
    f"{_AR}.actor.ppo_micro_batch_size_per_gpu": None,
    f"{_AR}.actor.use_dynamic_bsz": False,
    f"{_AR}.actor.ppo_max_token_len_per_gpu": 16384,
    f"{_AR}.actor.entropy_from_logits_with_chunking": False,
    f"{_AR}.actor.entropy_from_logits_chunk_size": 2048,
    f"{_AR}.actor.entropy_checkpointing": False,
    f"{_AR}.actor.ppo_epochs": 1,
    f"{_AR}.actor.use_kl_loss": False,
    f"{_AR}.actor.entropy_coeff": 0,
    f"{_AR}.actor.calculate_entropy": False,
    f"{_AR}.actor.ulysses_sequence_parallel_size": 1,
    f"{_AR}.actor.fsdp_config.param_offload": False,
    f"{_AR}.actor.fsdp_config.optimizer_offload": False,
    f"{_AR}.actor.fsdp_config.offload_policy": False,
    f"{_AR}.actor.fsdp_config.model_dtype": "fp32",
    f"{_AR}.ref.log_prob_micro_batch_size": None,
    f"{_AR}.ref.log_prob_micro_batch_size_per_gpu": None,
    f"{_AR}.rollout.name": None,  # ??? in verl: required
    f"{_AR}.rollout.n": 1,
    f"{_AR}.rollout.gpu_memory_utilization": 0.5,
    f"{_AR}.rollout.tensor_model_parallel_size": 2,
    f"{_AR}.rollout.free_cache_engine": True,
    f"{_AR}.rollout.max_num_seqs": 256,
    f"{_AR}.rollout.log_prob_micro_batch_size": None,
    f"{_AR}.rollout.log_prob_micro_batch_size_per_gpu": None,
    "critic.strategy": "fsdp",
    "critic.ppo_micro_batch_size": None,
    "critic.ppo_micro_batch_size_per_gpu": None,
    "critic.forward_micro_batch_size_per_gpu": None,
    "critic.ppo_max_token_len_per_gpu": 32768,
    "critic.model.path": None,
    "critic.model.enable_gradient_checkpointing": True,
    "critic.ulysses_sequence_parallel_size": 1,
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
}

VERL_KEYS = {
    "micro_update": f"{_AR}.actor.ppo_micro_batch_size_per_gpu",
    "micro_old_logprob": f"{_AR}.rollout.log_prob_micro_batch_size_per_gpu",
    "micro_ref": f"{_AR}.ref.log_prob_micro_batch_size_per_gpu",
    "micro_critic": "critic.ppo_micro_batch_size_per_gpu",
    "dynamic_tokens_update": f"{_AR}.actor.ppo_max_token_len_per_gpu",
    "dynamic_tokens_infer": f"{_AR}.rollout.log_prob_max_token_len_per_gpu",
    "dynamic_tokens_ref": f"{_AR}.ref.log_prob_max_token_len_per_gpu",
    "dynamic_tokens_critic": "critic.ppo_max_token_len_per_gpu",
    "use_dynamic_bsz": f"{_AR}.actor.use_dynamic_bsz",
    "entropy_chunking": f"{_AR}.actor.entropy_from_logits_with_chunking",
    "gradient_checkpointing": f"{_AR}.model.enable_gradient_checkpointing",
    "param_offload": f"{_AR}.actor.fsdp_config.param_offload",
    "optimizer_offload": f"{_AR}.actor.fsdp_config.optimizer_offload",
    "offload_policy": f"{_AR}.actor.fsdp_config.offload_policy",
    "rollout_tp": f"{_AR}.rollout.tensor_model_parallel_size",
    "gpu_memory_utilization": f"{_AR}.rollout.gpu_memory_utilization",
    "max_response_length": "data.max_response_length",
}


def parse_verl_overrides(overrides) -> dict[str, Any]:
    """Hydra's overrides as verl takes them (our config's parser: key=value with YAML values, +key and ++key the
    same, ~key drops); the last one given wins. An interpolation (${...}) is kept as its text: verl resolves it."""
    from verl_runtime.config import DELETE, parse_override
    from verl_runtime.errors import ConfigError

    values: dict[str, Any] = {}
    for item in overrides:
        try:
            key, value = parse_override(item)
        except ConfigError as exc:
            if "${" not in item:
                raise PlanError(str(exc)) from None
            key, value = item.partition("=")[0].strip().lstrip("+"), item.partition("=")[2]
        if value is DELETE:
            values.pop(key, None)
        else:
            values[key] = value
    return values


def from_verl(overrides, world: int, nodes: int) -> Workload:
    """verl 0.9.1's main_ppo on these overrides, on `world` GPUs over `nodes` nodes."""
    given = parse_verl_overrides(overrides)

    def get(key: str, default: Any = ...) -> Any:
        if key in given:
            return given[key]
        return VERL_DEFAULTS.get(key) if default is ... else default

    def number(key: str, default: Any = ...) -> Any:
        value = get(key, default)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, (int, float)):
            return value
        if isinstance(value, str) and "${" in value:
            raise PlanError(f"{key}={value}: an interpolation the planner does not resolve: give the value itself")
        try:
            return float(value) if "." in str(value) else int(value)
        except ValueError:
            raise PlanError(f"{key}={value!r} is not a number") from None

    def flag(key: str, default: Any = ...) -> bool:
        value = get(key, default)
        if isinstance(value, str):
            return value.strip().lower() == "true"
        return bool(value)

    notes = []
    global_keys: dict[str, str] = {}  # a per-GPU key -> the deprecated global one the run gave instead
    sp = int(number(f"{_AR}.actor.ulysses_sequence_parallel_size") or 1)
    dp = max(world // sp, 1)
    n = int(number(f"{_AR}.rollout.n"))
    rollout = get(f"{_AR}.rollout.name")
    if rollout is None:
        notes.append(f"{_AR}.rollout.name is not given (verl requires it): planned as vllm")
        rollout = "vllm"
    if rollout not in ("vllm", "sglang", "hf"):
        raise PlanError(f"{_AR}.rollout.name={rollout}: the planner models vllm (sglang as vllm, hf)")
    if rollout == "sglang":
        notes.append("rollout.name=sglang planned as vLLM (the same mem_fraction share of the GPU)")
    tp = int(number(f"{_AR}.rollout.tensor_model_parallel_size"))
    if world % tp:
        raise PlanError(f"rollout world_size {world} is not divisible by {_AR}.rollout.tensor_model_parallel_size "
                        f"{tp} (verl stops here too): choose a tensor-parallel size that divides the GPUs")
    dynamic = flag(f"{_AR}.actor.use_dynamic_bsz")
    actor_tokens = int(number(f"{_AR}.actor.ppo_max_token_len_per_gpu"))

    def micro(section: str, per_gpu_key: str, global_key: str) -> int | None:
        """verl's per-GPU micro-batch: the *_per_gpu key, else the deprecated global one // (world / sp)."""
        per_gpu, total = number(f"{section}.{per_gpu_key}"), number(f"{section}.{global_key}")
        if per_gpu is not None and total is not None:
            raise PlanError(f"[{section}] You have set both '{section}.{global_key}' AND '{section}.{per_gpu_key}': "
                            f"remove '{section}.{global_key}' (verl stops here too)")
        if per_gpu is not None:
            return int(per_gpu)
        if total is not None:
            global_keys[f"{section}.{per_gpu_key}"] = f"{section}.{global_key}"
            notes.append(f"{section}.{global_key}={total} (deprecated, global) read as verl's FSDP workers read it: "
                         f"{total} // ({world} GPUs / sp {sp}) = {max(int(total) // dp, 1)} per GPU; verl 0.9.1's "
                         f"engine workers want {section}.{per_gpu_key}")
            return max(int(total) // dp, 1)
        if not dynamic:
            raise PlanError(f"[{section}] Please set at least one of '{section}.{global_key}' or "
                            f"'{section}.{per_gpu_key}' (verl stops here too)")
        return None

    micro_update = micro(f"{_AR}.actor", "ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size")
    micro_logprob = micro(f"{_AR}.rollout", "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size")
    lora_rank = int(number(f"{_AR}.model.lora_rank") or number(f"{_AR}.model.lora.rank") or 0)
    use_kl_loss = flag(f"{_AR}.actor.use_kl_loss")
    use_kl_in_reward = flag("algorithm.use_kl_in_reward")
    use_ref = use_kl_loss or use_kl_in_reward
    ref_in_actor = lora_rank > 0
    micro_ref = micro(f"{_AR}.ref", "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size") \
        if use_ref and not ref_in_actor else micro_logprob
    estimator = str(get("algorithm.adv_estimator"))
    use_critic = estimator == "gae" if get("critic.enable", None) is None else flag("critic.enable")
    micro_critic = micro_values = None
    if use_critic:
        micro_critic = micro("critic", "ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size")
        forward = number("critic.forward_micro_batch_size_per_gpu")
        micro_values = int(forward) if forward is not None else micro_critic
    strategy = str(get(f"{_AR}.actor.strategy"))
    if strategy not in ("fsdp", "fsdp2"):
        raise PlanError(f"{_AR}.actor.strategy={strategy}: the planner models verl's FSDP workers (fsdp, fsdp2), "
                        "not Megatron")
    offload_policy = flag(f"{_AR}.actor.fsdp_config.offload_policy")
    if offload_policy and strategy != "fsdp2":
        notes.append("fsdp_config.offload_policy applies to strategy=fsdp2 only: ignored with fsdp")
        offload_policy = False
    targets = get(f"{_AR}.model.target_modules")
    exclude = get(f"{_AR}.model.exclude_modules") or ()
    mini = int(number(f"{_AR}.actor.ppo_mini_batch_size"))
    batch = int(number("data.train_batch_size"))
    critic_key = "critic.model.fsdp_config" if any(k.startswith("critic.model.fsdp_config.") for k in given) else "critic.fsdp"
    return Workload(
        runtime=VERL, model_path=str(get(f"{_AR}.model.path", None) or ""),
        critic_path=(get("critic.model.path") or None) if use_critic else None, device="cuda", world=world,
        gpus_per_node=max(world // max(nodes, 1), 1), nodes=nodes, use_critic=use_critic, use_ref=use_ref,
        batch_prompts=batch, n=n, mini_batch_prompts=mini, ppo_epochs=int(number(f"{_AR}.actor.ppo_epochs")),
        micro_update=micro_update, micro_old_logprob=micro_logprob, micro_ref=micro_ref, micro_critic=micro_critic,
        micro_values=micro_values, old_log_prob_pass=True,
        max_prompt_length=int(number("data.max_prompt_length")), max_response_length=int(number("data.max_response_length")),
        padding_free=flag(f"{_AR}.model.use_remove_padding"), compute_bytes=2, ref_bytes=2,
        actor_sharded=True, critic_sharded=True, gradient_checkpointing=flag(f"{_AR}.model.enable_gradient_checkpointing"),
        rollout="hf" if rollout == "hf" else "vllm",
        gpu_memory_utilization=float(number(f"{_AR}.rollout.gpu_memory_utilization")), rollout_tp=tp,
        vllm_sleeps=flag(f"{_AR}.rollout.free_cache_engine"), sp=sp, ref_in_actor=ref_in_actor and use_ref,
        dynamic_tokens_update=actor_tokens if dynamic else None,
        dynamic_tokens_infer=int(number(f"{_AR}.rollout.log_prob_max_token_len_per_gpu", actor_tokens)) if dynamic else None,
        dynamic_tokens_ref=int(number(f"{_AR}.ref.log_prob_max_token_len_per_gpu", actor_tokens)) if dynamic else None,
        dynamic_tokens_critic=int(number("critic.ppo_max_token_len_per_gpu")) if dynamic else None,
        param_offload=flag(f"{_AR}.actor.fsdp_config.param_offload"),
        optimizer_offload=flag(f"{_AR}.actor.fsdp_config.optimizer_offload"), offload_policy=offload_policy,
        critic_param_offload=flag(f"{critic_key}.param_offload", False),
        critic_optimizer_offload=flag(f"{critic_key}.optimizer_offload", False),
        entropy_in_update=bool(number(f"{_AR}.actor.entropy_coeff") or 0) or flag(f"{_AR}.actor.calculate_entropy"),
        entropy_chunking=flag(f"{_AR}.actor.entropy_from_logits_with_chunking"),
        entropy_chunk=int(number(f"{_AR}.actor.entropy_from_logits_chunk_size")),
        entropy_checkpointing=flag(f"{_AR}.actor.entropy_checkpointing"),
        lora_rank=lora_rank, lora_targets=targets, lora_exclude=tuple(exclude) if isinstance(exclude, list) else (),
        max_num_seqs=int(number(f"{_AR}.rollout.max_num_seqs")),
        keys={name: global_keys.get(key, key) for name, key in VERL_KEYS.items()}, notes=tuple(notes),
    )


def verl_data_files(overrides) -> list[str]:
    value = parse_verl_overrides(overrides).get("data.train_files")
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def exists(path: str) -> bool:
    return Path(path).expanduser().exists()
