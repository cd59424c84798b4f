"""The actor: the policy model, its optimizer, the rollout engine that samples from it, and the PPO update."""

from __future__ import annotations

import contextlib
import copy
from collections import defaultdict
from dataclasses import replace

import torch
from torch import nn

from verl_runtime.algorithms import (
    agg_loss,
    calculate_sum_pi_squared_from_logits,
    compute_policy_loss,
    get_policy_loss_fn,
    kl_penalty,
    logprobs_from_logits,
)
from verl_runtime import lora, offload, oom
from verl_runtime.config import Config
from verl_runtime.controller import ALL, DP_SPLIT, PROMPT_SPLIT, chunks, register
from verl_runtime.errors import UserError
from verl_runtime.models import LogProbMemory, load_causal_lm, resolve_dtype, response_log_probs, response_logits
from verl_runtime.rollout import SamplingParams, make_rollout_engine
from verl_runtime.rollout.base import logit_temperature
from verl_runtime.rollout_correction import compute_policy_loss_bypass_mode
from verl_runtime.seqlen_balancing import restore_order, select, token_budget_split
from verl_runtime.workers import optim, parallel

ROLLOUT_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


class ActorWorker:
    def __init__(self, config: Config, tokenizer, device: torch.device):
        self.config = config
        self.mixed_precision = mixed_precision(config.model.dtype, device)
        self.model = load_causal_lm(
            config.model.path, torch.float32, device, gradient_checkpointing=config.model.gradient_checkpointing
        )
        if config.model.uses_lora:  # only the adapters train; the optimizer gets only them (requires_grad)
            self.model = lora.wrap(self.model, config.model)
        disable_dropout(self.model)
        self.model.eval()  # train() only inside update(), which gradient checkpointing needs
        parallel.broadcast_weights(self.model)
        # Every rank generates its share of the rollout (see generate). Under FSDP an engine that holds its own
        # weights (vLLM, builtin's graph path) is made from the whole model before it is sharded and refreshed from
        # the gathered state after each update; the others sample from a whole copy each rank keeps (4 bytes a
        # parameter); unsharded, the engine samples from the trained model object itself.
        sharded = config.actor.strategy == "fsdp" and parallel.world_size() > 1
        self.rollout_model = copy.deepcopy(self.model) if sharded else None
        # trainer.mode=separate_async: the rollout's own workers generate (workers/rollout.py); this one only trains
        separate = config.trainer.mode == "separate_async"
        self.rollout = None if separate else make_engine(config, self._rollout_weights(), tokenizer, device)
        if sharded and getattr(self.rollout, "owns_weights", False) and not lora.is_lora(self.model):
            self.rollout_model = None  # the engine has its copy (a LoRA state is merged from the whole model)
        if sharded:
            parallel.shard(self.model, offload_policy=config.actor.offload_policy)
        self.optimizer = optim.build_optimizer(self.model, config.actor, sharded=parallel.is_sharded(self.model))
        self.rollout_rows = 0  # sequences this rank has generated (the tests count the ranks' shares)
        self.offload = offload.Offload.for_role(config.actor, device, sharded)
        self.offload.release({"model": self.model, "rollout_model": self.rollout_model, **self._engine_parts()},
                             self.optimizer)

    def offload_parts(self, phase: str) -> tuple[dict, torch.optim.Optimizer | None]:
        """What each phase needs on the device (offload.phase): a rollout the weights it samples from (none for
        vLLM, which holds its own copy), a forward the model, an update the model and optimizer, a checkpoint
        nothing (unsharded, the offloaded state is whole in host memory) or its shards (FSDP gathers them)."""
        if phase == offload.ROLLOUT:
            if self.config.rollout.name == "vllm":
                return {}, None
            return (self._engine_parts() or {self._rollout_part(): self._rollout_weights()}), None
        if phase == offload.FORWARD:
            return {"model": self.model}, None
        if phase == offload.STATE and not parallel.is_sharded(self.model):
            return {}, None  # the state in host memory is whole: a checkpoint reads it there
        return {"model": self.model}, self.optimizer

    def _engine_parts(self) -> dict:
        """The rollout engine's own copy of the weights (the builtin engine's graph path), if it has one: then a
        rollout needs only it on the device, not the trained model."""
        parts = getattr(self.rollout, "offload_parts", None)
        return parts() if parts else {}

    def _rollout_part(self) -> str:
        return "model" if self.rollout_model is None else "rollout_model"

    @register(ALL)
    def offload_state(self) -> dict:
        """Where this rank's parts are between phases, and their bytes on the training device (this rank's shards)."""
        resident = offload.resident_bytes(self.model, self.optimizer, self.offload.device)
        return {"placement": dict(self.offload.placement), "resident": resident}

    @register(ALL)
    def rollout_share(self) -> int:
        """Sequences this rank has generated so far."""
        return self.rollout_rows

    @register(PROMPT_SPLIT)
    @offload.phase(offload.ROLLOUT)
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> dict[str, torch.Tensor]:
        """Sample responses to this rank's share of the prompts: each prompt params.n times, samples of one prompt
        adjacent (the controller joins the ranks' shares in order).

        With several ranks each draws from a seed of its own (rank_seed), so that their samples do not share random
        numbers; a run is reproducible for a given seed and number of workers (docs/verl-runtime.md).
        """
        if not prompt_ids:  # fewer prompts than ranks: nothing to sample here
            return {}
        batch = sample(self.rollout, prompt_ids, params, self.mixed_precision, parallel.rank(), parallel.world_size())
        self.rollout_rows += len(prompt_ids) * params.n
        if self.offload.params and hasattr(self.rollout, "release_caches"):
            self.rollout.release_caches()  # its KV cache and graphs leave the device with the weights
        return batch

    @register(ALL)
    @offload.phase(offload.STATE)
    def policy_state(self) -> dict | None:
        """The policy's weights, a copy in host memory (rank 0's; every rank takes part under FSDP): what the rollout's
        own workers load after an update (trainer.mode=separate_async)."""
        if parallel.is_sharded(self.model):
            state = parallel.full_model_state(self.model)  # a collective: every rank takes part
        else:
            state = self.model.state_dict()
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}
        return state if parallel.rank() == 0 else None

    @register(DP_SPLIT)
    @offload.phase(offload.FORWARD)
    def compute_log_prob(self, batch: dict) -> torch.Tensor:
        """Log-probs [B, R] of the responses under the current policy (PPO's "old" log-probs)."""
        rollout = self.config.rollout
        split = MicroBatching(rollout.log_prob_micro_batch_size_per_gpu, *token_budget(
            self.config, rollout.log_prob_use_dynamic_bsz, rollout.log_prob_max_token_len_per_gpu, "rollout"))
        with self.mixed_precision():
            return log_probs(self.model, batch, split, logit_temperature(rollout.temperature), actor_memory(self.config))

    @register(DP_SPLIT)
    @offload.phase(offload.FORWARD)
    def compute_ref_log_prob(self, batch: dict) -> torch.Tensor:
        """With LoRA, the reference policy's log-probs: the actor with its adapters disabled, the base model (verl's
        ref_in_actor; no reference worker is built then)."""
        with self.model.disable_adapter(), self.mixed_precision():
            return log_probs(self.model, batch, ref_micro_batching(self.config),
                             logit_temperature(self.config.rollout.temperature), ref_memory(self.config))

    @register(DP_SPLIT)
    @offload.phase(offload.FORWARD)
    def compute_log_prob_and_sum_pi_squared(self, batch: dict) -> dict[str, torch.Tensor]:
        """compute_log_prob's log-probs and, from the same logits, the sum over the vocabulary of p^2 at each token
        (verl's calculate_sum_pi_squared: the optimal token baselines' input)."""
        response_length = batch["responses"].shape[1]
        temperature = logit_temperature(self.config.rollout.temperature)
        log_prob, sum_pi_squared = [], []
        with self.mixed_precision(), torch.inference_mode():
            for micro in chunks(batch, self.config.rollout.log_prob_micro_batch_size_per_gpu):
                logits = response_logits(self.model, micro["input_ids"], micro["attention_mask"], micro["position_ids"],
                                         response_length, temperature)
                log_prob.append(logprobs_from_logits(logits, micro["input_ids"][:, -response_length:]))
                sum_pi_squared.append(calculate_sum_pi_squared_from_logits(logits))
        return {"old_log_prob": torch.cat(log_prob).clone(), "sum_pi_squared": torch.cat(sum_pi_squared).clone()}

    @register(DP_SPLIT)
    @offload.phase(offload.TRAIN)
    def update(self, batch: dict, mini_batch_size: int, lr: float | None = None) -> dict[str, float]:
        """PPO epochs over mini-batches; micro-batches accumulate gradients of one mini-batch-wide loss.

        Without ``old_log_prob`` in the batch the update is on-policy (one epoch, one mini-batch): the old
        log-probs are the current ones, detached, so no separate forward pass is needed. ``lr``: this step's
        learning rate (the controller's schedule, workers/optim.py); None keeps the optimizer's.
        """
        cfg = self.config.actor
        if lr is not None:
            optim.set_learning_rate(self.optimizer, lr)
        loss_mode = cfg.policy_loss.loss_mode
        on_policy = "old_log_prob" not in batch
        correction = self.config.algorithm.rollout_correction
        # verl's bypass mode: the old log-probs are the rollout's, and its loss replaces loss_mode (as in verl)
        bypass = correction.bypass_mode and self.config.rollout.calculate_log_probs and "rollout_log_probs" in batch
        response_length = batch["responses"].shape[1]
        stats = defaultdict(list)
        sampler_gap = []  # |sampler - trainer| log-prob per token, before any update: rollout/logprob_diff
        split = MicroBatching(cfg.ppo_micro_batch_size_per_gpu or mini_batch_size,
                              *token_budget(self.config, cfg.use_dynamic_bsz, cfg.ppo_max_token_len_per_gpu, "actor",
                                            "ppo_max_token_len_per_gpu"))
        memory = actor_memory(self.config)
        self.model.train()
        for epoch in range(cfg.ppo_epochs):
            for mini in chunks(batch, mini_batch_size // parallel.world_size()):  # this rank's share of it
                # The loss is normalised by the whole mini-batch's tokens/sequences (all ranks), so the micro-batch
                # losses add up to it and accumulation gives exactly the mini-batch gradient.
                info = parallel.global_batch_info(mini["response_mask"])
                totals = defaultdict(float)
                self.optimizer.zero_grad(set_to_none=True)
                # the loss of each micro-batch is its share of the mini-batch's (info): any split sums to the same
                for micro in split.micro_batches(mini)[0]:
                    mask = micro["response_mask"]
                    with self.mixed_precision():
                        log_prob, entropy = response_log_probs(
                            self.model, micro["input_ids"], micro["attention_mask"], micro["position_ids"],
                            response_length, temperature=logit_temperature(self.config.rollout.temperature),
                            with_entropy=True, memory=memory,
                        )
                    old_log_prob = log_prob.detach() if on_policy else micro["old_log_prob"]
                    if epoch == 0 and "rollout_log_probs" in micro and not bypass:
                        sampler_gap.append((micro["rollout_log_probs"] - old_log_prob).abs()[mask.bool()])
                    share = mask.sum() / info["batch_num_tokens"]  # weights the per-token fractions
                    weights = micro.get("rollout_is_weights")  # decoupled rollout correction's, if any
                    if bypass:
                        pg_loss, pg_metrics = compute_policy_loss_bypass_mode(
                            old_log_prob, log_prob, micro["advantages"], mask, cfg.loss_agg_mode, cfg, correction, info
                        )
                        for key, value in pg_metrics.items():
                            totals[key] += value * share
                    elif loss_mode == "vanilla":
                        pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(
                            old_log_prob, log_prob, micro["advantages"], mask,
                            cliprange=cfg.clip_ratio, cliprange_low=cfg.clip_ratio_low,
                            cliprange_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c,
                            loss_agg_mode=cfg.loss_agg_mode, global_batch_info=info, token_weights=weights,
                        )
                        totals["actor/pg_clipfrac"] += clipfrac.detach() * share
                        totals["actor/ppo_kl"] += ppo_kl.detach() * share
                        totals["actor/pg_clipfrac_lower"] += clipfrac_lower.detach() * share
                    else:  # verl's registered form: the actor config (with the batch totals) in, a metric dict out
                        pg_loss, pg_metrics = get_policy_loss_fn(loss_mode)(
                            old_log_prob, log_prob, micro["advantages"], mask, cfg.loss_agg_mode, LossConfig(cfg, info),
                            rollout_is_weights=weights,
                        )
                        for key, value in pg_metrics.items():
                            totals[key] += value * share
                    entropy_loss = agg_loss(
                        entropy if cfg.entropy_coeff else entropy.detach(), mask, cfg.loss_agg_mode, **info
                    )
                    loss = pg_loss - cfg.entropy_coeff * entropy_loss
                    if cfg.use_kl_loss:
                        kl = kl_penalty(log_prob, micro["ref_log_prob"], cfg.kl_loss_type)
                        kl_loss = agg_loss(kl, mask, cfg.loss_agg_mode, **info)
                        loss = loss + cfg.kl_loss_coef * kl_loss
                        totals["actor/kl_loss"] += kl_loss.detach()
                    loss.backward()
                    totals["actor/loss"] += loss.detach()
                    totals["actor/pg_loss"] += pg_loss.detach()
                    totals["actor/entropy"] += entropy_loss.detach()
                values, grad_norm = parallel.finish_mini_batch(
                    self.model, self.optimizer, totals, cfg.grad_clip, "actor/loss", "actor.lr", cfg.lr
                )
                for key, value in values.items():
                    stats[key].append(value)
                stats["actor/grad_norm"].append(grad_norm)
        self.model.eval()
        self._sync_rollout()
        metrics = {key: sum(v) / len(v) for key, v in stats.items()}
        if sampler_gap:
            gaps = torch.cat(sampler_gap)
            total = parallel.sum_across_ranks({"sum": float(gaps.sum()), "tokens": gaps.numel()})
            metrics["rollout/logprob_diff"] = total["sum"] / max(total["tokens"], 1)
        if cfg.use_kl_loss:
            metrics["actor/kl_coef"] = cfg.kl_loss_coef
        return metrics

    def _rollout_weights(self) -> nn.Module:
        return self.model if self.rollout_model is None else self.rollout_model

    def _sync_rollout(self) -> None:
        """Hand the updated weights to the rollout engine in memory (engines with their own copy: vLLM, builtin's
        graph path, FSDP's whole copy); sharded, an engine with its own copy takes the gathered state itself."""
        oom.note_weight_sync()
        source = self._rollout_weights()
        if parallel.is_sharded(self.model):
            state = parallel.full_model_state(self.model)  # a collective: every rank takes part
            if self.rollout_model is not None:
                self.rollout_model.load_state_dict(state)
            else:
                source = state
        if self.rollout is not None:
            self.rollout.sync_weights(source)

    @register(ALL)
    @offload.phase(offload.STATE)
    def state_dict(self) -> dict | None:
        """The whole model and optimizer state (rank 0 returns it; every rank takes part under FSDP)."""
        state = parallel.full_state(self.model, self.optimizer)
        if lora.is_lora(self.model):
            state["lora"] = lora.lora_state(self.model)  # how to merge or export the adapters without peft
        if self.offload.active:  # no device copy of it outlives the phase
            state = offload.to_host(state)
        return state if parallel.rank() == 0 else None

    @register(ALL)
    @offload.phase(offload.STATE)
    def load_state_dict(self, state: dict) -> None:
        if ("lora" in state) != lora.is_lora(self.model):
            trained, now = ("with", "without") if "lora" in state else ("without", "with")
            raise UserError(f"the checkpoint was trained {trained} LoRA and this run is {now} it: set model.lora_rank "
                            "as the run had it, or train under another trainer.experiment_name")
        parallel.load_full_state(self.model, self.optimizer, state)
        self._sync_rollout()


def make_engine(config: Config, model: nn.Module, tokenizer, device: torch.device):
    """rollout.name's engine, sampling from model, with the options the config gives it."""
    options = {}
    if config.rollout.name == "builtin":
        options = {"compile": config.rollout.compile, "dtype": resolve_dtype(config.model.dtype, device)}
    if config.rollout.name == "vllm":
        options = {
            "gpu_memory_utilization": config.rollout.gpu_memory_utilization,
            "tensor_parallel_size": rollout_tensor_parallel(config, model, device),
            "enable_sleep_mode": config.rollout.enable_sleep_mode,
            "dtype": resolve_dtype(config.model.dtype, device),  # vLLM's own copy computes in it, not in fp32
        }
    return make_rollout_engine(config.rollout.name, model, tokenizer, device, **options)


# Of a GPU's rollout share (gpu_memory_utilization), what the weights may take: the rest is the KV cache's.
WEIGHTS_SHARE = 0.8


def rollout_tensor_parallel(config: Config, model: nn.Module, device: torch.device) -> int:
    """The vLLM tensor-parallel size this worker's engine runs with: 1. verl's lines ask for more
    (rollout.tensor_model_parallel_size); where one GPU's rollout share holds the whole model, this runtime runs the
    rollout data-parallel instead, one engine per worker on its share of the prompts (the same samples' distribution,
    no collective in the decode loop), and says so once; where it does not, the line is verl's to run."""
    tp = config.rollout.tensor_model_parallel_size
    if tp == 1:
        return 1
    weights = sum(p.numel() for p in model.parameters()) * torch.finfo(resolve_dtype(config.model.dtype, device)).bits // 8
    memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    line = data_parallel_rollout(tp, weights, memory, config.rollout.gpu_memory_utilization)
    if parallel.rank() == 0:
        print(line, flush=True)
    return 1


def data_parallel_rollout(tp: int, weights: int, gpu_memory: int | None, utilization: float) -> str:
    """The line that says the rollout runs data-parallel instead of tensor-parallel tp, where the weights (bytes) fit
    one GPU's rollout share (gpu_memory x utilization, WEIGHTS_SHARE of it; None: the CPU, host memory); UserError
    naming verl's own trainer where they do not."""
    if gpu_memory is None:
        where = f"{weights / 2**20:.0f} MiB"
    else:
        share = gpu_memory * utilization
        if weights > WEIGHTS_SHARE * share:
            raise UserError(
                f"rollout.tensor_model_parallel_size={tp}: the model's weights ({weights / 2**30:.1f} GiB) do not fit "
                f"one GPU's rollout share (rollout.gpu_memory_utilization={utilization} of {gpu_memory / 2**30:.0f} "
                "GiB) and this runtime has no tensor-parallel rollout; verl runs it: verl-deploy run --runtime verl "
                "-- <the same overrides>")
        where = f"{weights / 2**30:.2f} GiB of its {share / 2**30:.0f} GiB rollout share"
    return (f"[INFO] rollout.tensor_model_parallel_size={tp}: the rollout runs data-parallel instead, one vLLM engine "
            f"per worker holding the whole model ({where}), each on its share of the prompts")


def sample(engine, prompt_ids: list[list[int]], params: SamplingParams, precision, rank: int, world: int) -> dict:
    """One worker's share of a rollout: the engine's samples as a batch (ROLLOUT_KEYS, and the sampler's own
    log-probs where the engine gives them), drawn from the rank's seed (rank_seed)."""
    oom.note_rollout(len(prompt_ids) * params.n, max(map(len, prompt_ids), default=0) + params.max_new_tokens)
    with precision():
        rollout = engine.generate(prompt_ids, rank_seed(params, rank, world))
    batch = {key: getattr(rollout, key) for key in ROLLOUT_KEYS}
    if rollout.rollout_log_probs is not None:  # the sampler's own log-probs, for rollout/logprob_diff
        batch["rollout_log_probs"] = rollout.rollout_log_probs
    return batch


SEED_STRIDE = 1_000_003  # a prime above any batch's rows: rank seeds never meet (vLLM adds each row's index)


def rank_seed(params: SamplingParams, rank: int, world: int) -> SamplingParams:
    """With several ranks, this rank's own seed for a call: one draw from the rank's random stream (every rank's is
    seeded alike, so the draw is the same) plus the rank's offset; a call with a seed keeps it, offset likewise. One
    rank samples from its stream as before."""
    if world == 1:
        return params
    base = params.seed if params.seed is not None else int(torch.randint(0, 2**31 - 1, (1,)))
    return replace(params, seed=base + rank * SEED_STRIDE)


class LossConfig:
    """The actor config as verl's policy losses read it: its fields, plus the mini-batch totals (global_batch_info)."""

    def __init__(self, actor_config, global_batch_info: dict):
        self._config, self.global_batch_info = actor_config, global_batch_info

    def __getattr__(self, name: str):
        return getattr(self._config, name)

    def get(self, name: str, default=None):
        return getattr(self._config, name, default)


class MicroBatching:
    """How a role cuts a batch into micro-batches: ``size`` samples each, or (use_dynamic_bsz) by ``budget`` real
    tokens, balanced as verl balances them (seqlen_balancing.py); ``key`` names the budget's setting in errors."""

    def __init__(self, size: int, budget: int | None = None, key: str = ""):
        self.size, self.budget, self.key = size, budget, key

    def micro_batches(self, batch: dict) -> tuple[list[dict], list[list[int]] | None]:
        """The micro-batches, and the samples each holds (None: consecutive slices, in order)."""
        if self.budget is None:
            return chunks(batch, self.size), None
        partitions = token_budget_split(batch, self.budget, self.key)
        return [select(batch, indices) for indices in partitions], partitions

    def per_sample(self, batch: dict, fn) -> torch.Tensor:
        """fn(micro-batch) -> [rows, ...] for each micro-batch, joined in the batch's order."""
        micros, partitions = self.micro_batches(batch)
        parts = [fn(micro) for micro in micros]
        return torch.cat(parts) if partitions is None else restore_order(parts, partitions)


def token_budget(config: Config, use: bool | None, tokens: int | None, role: str,
                 name: str = "log_prob_max_token_len_per_gpu") -> tuple[int | None, str]:
    """A role's token budget per micro-batch, or None (fixed sizes). As verl's config interpolates them, an unset
    (None) use or budget takes the actor's (use_dynamic_bsz, ppo_max_token_len_per_gpu)."""
    actor = config.actor
    use = actor.use_dynamic_bsz if use is None else use
    return ((tokens or actor.ppo_max_token_len_per_gpu) if use else None), f"{role}.{name}"


def ref_micro_batching(config: Config) -> MicroBatching:
    ref = config.ref
    return MicroBatching(ref.log_prob_micro_batch_size_per_gpu,
                         *token_budget(config, ref.log_prob_use_dynamic_bsz, ref.log_prob_max_token_len_per_gpu, "ref"))


def actor_memory(config: Config) -> LogProbMemory:
    actor = config.actor
    chunk = actor.entropy_from_logits_chunk_size if actor.entropy_from_logits_with_chunking else None
    return LogProbMemory(config.model.use_remove_padding, chunk, actor.entropy_checkpointing)


def ref_memory(config: Config) -> LogProbMemory:
    ref = config.ref
    chunk = ref.entropy_from_logits_chunk_size if ref.entropy_from_logits_with_chunking else None
    return LogProbMemory(config.model.use_remove_padding, chunk)


def log_probs(model: nn.Module, batch: dict, split: MicroBatching | int, temperature: float,
              memory: LogProbMemory = LogProbMemory()) -> torch.Tensor:
    """Response log-probs [B, R] in micro-batches (split, or a fixed size), without autograd."""
    split = MicroBatching(split) if isinstance(split, int) else split
    response_length = batch["responses"].shape[1]

    def one(micro: dict) -> torch.Tensor:
        return response_log_probs(model, micro["input_ids"], micro["attention_mask"], micro["position_ids"],
                                  response_length, temperature=temperature, memory=memory)[0]

    # Not inference mode under FSDP: its unsharded parameter buffers are reused by the next training forward, and an
    # inference tensor cannot be updated in place outside inference mode (the LoRA actor as its own reference).
    with torch.inference_mode(not parallel.is_sharded(model)), torch.no_grad():
        result = split.per_sample(batch, one)
    return result.clone()  # an ordinary tensor, usable in the loss


def mixed_precision(dtype: str, device: torch.device):
    """A context for forward passes of trained models, whose weights stay fp32 (an update of lr 1e-6 would vanish in
    bf16 weights): autocast to model.dtype where that is lower (auto: bf16 on CUDA), else nothing."""
    compute = resolve_dtype(dtype, device)
    if compute == torch.float32:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=compute)


def disable_dropout(model: nn.Module) -> None:
    """No dropout anywhere: the policy that sampled and the policy being trained must be the same function.

    Besides nn.Dropout modules, attention and residual dropout are often plain float attributes
    (e.g. OPT's ``self.dropout``, Qwen2's ``self.attention_dropout``) applied functionally.
    """
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)
