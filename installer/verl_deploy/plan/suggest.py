"""When a run does not fit: the changes that make it fit, in cost order, each planned again and shown only when it
fits.

The order, cheapest first:

1. Settings on the GPUs asked for, each alone, every one that fits, cheapest in throughput first: dynamic batching by
   a token budget, then smaller micro-batches (more passes, same maths; a budget never below the longest sequence);
   chunked entropy; gradient checkpointing (one more forward); sharding over the GPUs already there (our runtime's
   actor.strategy=fsdp: all-gathers over the node's links); offloading states to host memory (host transfers every
   step, over PCIe: dearer than sharding); FSDP2's offload policy; vLLM for our rollout; the rollout engine's memory
   share; verl's rollout tensor parallelism within the node (with the share that then fits). When none fits alone:
   the same settings stacked in that order, each sized as if the micro-batches were as small as they go, until the
   plan fits with the token budget or the largest micro-batches that then fit (a stack that fits with room first, a
   tight one only when none has room); the settings the stack does not need are dropped again (the dearest first).
   One "together:" line.
2. Only when nothing fits on the GPUs asked for: more GPUs on the node, the fewest that fit (2, 4, 8 per node; only
   counts the batch and the mini-batch split over evenly, never more than the mini-batch has sequences): at that
   count the GPUs alone, else each setting that fits with them (actor.strategy=fsdp where sharding is what makes it
   fit), else the stack, as in 1.
3. Only when a full node is not enough: more nodes of 8 GPUs, the fewest that fit (2, 3, 4, ... up to MAX_NODES),
   in the same way.

Each change is spelled in the run's own keys (workload.OUR_KEYS for our runtime, which honours verl's memory
settings under its own names; VERL_KEYS for upstream verl), GPUs and nodes as --gpus/--nodes. For a tight run (the
worst case does not fit) only step 1 is tried: settings remove the risk; a run that fits needs no more GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from verl_deploy.plan.workload import Workload
from verl_deploy.sizes import GiB

MAX_PER_NODE = 8  # GPUs a node offers (more are offered as nodes)
MAX_NODES = 16  # beyond 128 GPUs: a larger GPU or a smaller model
DEFAULT_TOKENS = 16384  # verl's and our actor.ppo_max_token_len_per_gpu (the critic's: twice it)


@dataclass(frozen=True)
class Change:
    settings: tuple[tuple[str, object], ...]  # (config key, value) as the runtime spells them
    workload: Workload
    why: str = ""
    flags: str = ""  # command-line flags (more GPUs)
    together: bool = False  # settings stacked because none fits alone

    def text(self) -> str:
        parts = [f"{key}={_value(value)}" for key, value in self.settings] + ([self.flags] if self.flags else [])
        return ", ".join(parts)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


Evaluate = Callable[[Workload], "tuple[str, int, str, set[str]]"]  # -> (verdict, peak, peak phase, phases over budget)
SETTINGS = ("_entropy_chunking", "_checkpointing", "_sharding", "_offload", "_offload_policy", "_vllm_rollout",
            "_memory_share", "_rollout_tp")
ANY_FIT = ("fits", "tight")


def suggest(work: Workload, evaluate: Evaluate, over_budget: set[str], gpu_bytes: int, goal: tuple = ANY_FIT,
            settings_only: bool = False) -> list[str]:
    """Lines of changes that bring `work` to a verdict in `goal`, in the module's order: the settings that fit
    alone on these GPUs (one line each), else their stack; else the fewest GPUs on the node, else the fewest nodes,
    that fit. When nothing does, one line names the phase that still does not fit with every setting applied."""
    if goal != ANY_FIT:
        judge = evaluate

        def evaluate(candidate: Workload):  # a verdict short of the goal counts as not fitting
            verdict, *rest = judge(candidate)
            return (verdict if verdict in goal else "does not fit", *rest)
    found, stack = _fit_on(Change((), work), evaluate, over_budget)
    if found or settings_only:
        return [_line(change, evaluate, gpu_bytes) for change in found]
    counts = _gpu_counts(work)
    for per_node, nodes in counts:
        found, stack = _fit_on(_on_gpus(work, per_node, nodes), evaluate, None)
        if found:
            return [_line(change, evaluate, gpu_bytes) for change in found]
    micro = _micro_batches(stack.workload, evaluate, evaluate(stack.workload)[3])
    if micro is not None:
        stack = _combine(stack, micro)
    verdict, peak, phase, _ = evaluate(stack.workload)
    applied = f" with all of them ({stack.text()})" if stack.text() else ""
    gpus = f", up to {counts[-1][0] * counts[-1][1]} GPUs" if counts else ""
    return [f"no change tried here makes it fit (micro-batches, checkpointing, offload, sharding, the rollout engine "
            f"and its share{gpus}):{applied} the {phase} phase still needs {peak / GiB:.1f} of "
            f"{gpu_bytes / GiB:.1f} GiB: a larger GPU or a smaller model"]


def _fit_on(start: Change, evaluate: Evaluate, over: set[str] | None) -> tuple[list[Change], Change]:
    """On start's GPUs: ([start] when more GPUs alone fit; else every setting that fits alone, cheapest first; else
    one stack of settings that fits, with room first (a tight one only when none has room); else []), and the stack
    with every setting applied (for the line that says nothing fits)."""
    work = start.workload
    verdict, _, _, over_now = evaluate(work)
    if start.flags and _fitting(verdict):
        return [start], start
    alone = []
    for make in (_dynamic_batches, _micro_batches, *_settings()):
        change = make(work, evaluate, over_now if over is None else over)
        if change is not None and _fitting(evaluate(change.workload)[0]):
            combined = _combine(start, change)
            alone.append(Change(combined.settings, combined.workload, change.why, combined.flags))
    if alone:
        return alone, start
    for judge in (_with_room(evaluate), evaluate):
        fitted, stack = _stack(start, _settings(), judge)
        if fitted is not None:
            return [_pruned(start, *fitted, judge)], stack
    return [], stack


def _with_room(evaluate: Evaluate) -> Evaluate:
    """evaluate, with "tight" counted as not fitting."""
    def judge(work: Workload):
        verdict, *rest = evaluate(work)
        return (verdict if verdict == "fits" else "does not fit", *rest)
    return judge


def _pruned(start: Change, stack: Change, used: list, evaluate: Evaluate) -> Change:
    """The stack without the settings it does not need (tried the dearest first; the last one it needs: without it,
    the stack did not fit)."""
    for make in reversed(used[:-1]):
        if make not in used:
            continue
        again, _ = _stack(start, [m for m in used if m is not make], evaluate)
        if again is not None:
            stack, used = again
    return Change(stack.settings, stack.workload, "", stack.flags, together=True)


def _settings():
    return [globals()[name] for name in SETTINGS]


def _stack(start: Change, makers: list, evaluate: Evaluate) -> tuple[tuple[Change, list] | None, Change]:
    """The makers' changes applied one after another, each to the workload the ones before it left, until the
    plan fits with the token budget or the largest micro-batches that then fit: ((that stack, the makers it used)
    or None, the stack with every change applied). Each maker sizes its change (a memory share, a tensor-parallel
    size) as if the micro-batches were as small as they go: the micro-batches are chosen last, to what is left."""
    def lean(work: Workload):
        return evaluate(_smallest_batches(work))

    stack, used = start, []
    for make in makers:
        change = make(stack.workload, lean, evaluate(stack.workload)[3])
        if change is None:
            continue
        stack, used = _combine(stack, change), [*used, make]
        verdict, _, _, over = evaluate(stack.workload)
        if _fitting(verdict):
            return (stack, used), stack
        for smaller in (_dynamic_batches, _micro_batches):
            batches = smaller(stack.workload, evaluate, over)
            if batches is not None and _fitting(evaluate(batches.workload)[0]):
                return (_combine(stack, batches), used), stack
    return None, stack


def _fitting(verdict: str) -> bool:
    return verdict != "does not fit"


def _gpu_counts(work: Workload) -> list[tuple[int, int]]:
    """(GPUs per node, nodes) past the run's, fewest GPUs first: 2, 4, 8 on the node, then more nodes of 8 (up to
    MAX_NODES); only counts the batch and the mini-batch split over evenly, never more GPUs than the mini-batch has
    sequences, and for verl multiples of its rollout tensor-parallel size."""
    if work.device != "cuda":
        return []
    per_node, nodes = work.gpus_per_node, work.nodes
    counts = [(p, nodes) for p in (2, 4, MAX_PER_NODE) if p > per_node]
    full = max(per_node, MAX_PER_NODE)
    counts += [(full, n) for n in range(nodes + 1, MAX_NODES + 1)]
    mini, batch = work.mini_batch_prompts * work.n * work.sp, work.batch_prompts * work.n * work.sp
    even = []
    for p, n in counts:
        world = p * n
        if world > mini:
            break  # the extra GPUs would idle
        if mini % world or batch % world or world % work.rollout_tp:
            continue
        even.append((p, n))
    return even


def _on_gpus(work: Workload, per_node: int, nodes: int) -> Change:
    """The run on per_node x nodes GPUs, as it is otherwise (our runtime's strategy stays; sharding is a setting)."""
    flags = f"--gpus {per_node}" + (f" --nodes {nodes}" if nodes > 1 else "")
    return Change((), work.with_(world=per_node * nodes, gpus_per_node=per_node, nodes=nodes), "", flags)


def _line(change: Change, evaluate: Evaluate, gpu_bytes: int) -> str:
    verdict, peak, _, _ = evaluate(change.workload)
    why = f" ({change.why})" if change.why else ""
    together = "together: " if change.together else ""
    return f"{together}{change.text()}{why}: peak {peak / GiB:.1f} of {gpu_bytes / GiB:.1f} GiB, {verdict}"


def _combine(stack: Change, change: Change) -> Change:
    settings = dict([*stack.settings, *change.settings])
    return Change(tuple(settings.items()), change.workload, "", change.flags or stack.flags)


def _fits(evaluate: Evaluate, work: Workload) -> bool:
    return _fitting(evaluate(work)[0])


def _dynamic_batches(work: Workload, evaluate: Evaluate, over: set[str]) -> Change | None:
    """verl's use_dynamic_bsz: micro-batches cut by a token budget per GPU instead of a count of sequences, so a
    step of long responses makes more, smaller micro-batches (verl/utils/seqlen_balancing.py, rearrange_micro_batches).
    The budget: verl's default (ppo_max_token_len_per_gpu 16384), halved until it fits, never below one sequence at
    the limits. Our runtime reads the same keys (the log-prob and reference budgets follow the actor's when unset, as
    in verl; its critic's budget is a key of its own, written when it moves)."""
    if work.dynamic_tokens_update is not None:
        return None
    longest = work.max_prompt_length + work.max_response_length
    budget = DEFAULT_TOKENS
    best = None
    for _ in range(6):
        budget = max(budget, longest)
        tokens = {"dynamic_tokens_update": budget, "dynamic_tokens_infer": budget, "dynamic_tokens_ref": budget}
        if work.use_critic:
            tokens["dynamic_tokens_critic"] = 2 * budget
            if work.trainer.planning.values_budget:
                tokens["dynamic_tokens_values"] = 2 * budget
        settings = [(work.keys["use_dynamic_bsz"], True)]
        if budget != DEFAULT_TOKENS:
            settings += [(work.keys["dynamic_tokens_update"], budget)]
            if work.trainer.planning.values_budget and work.use_critic:
                settings += [(work.keys["dynamic_tokens_critic"], 2 * budget)]
        best = Change(tuple(settings), work.with_(**tokens))
        if _fits(evaluate, best.workload) or budget == longest:
            return best
        budget //= 2
    return best


def _entropy_chunking(work: Workload, evaluate: Evaluate, over: set[str]) -> Change | None:
    """verl's entropy_from_logits_with_chunking: the old log-probs' entropy over 2048-row chunks (no autograd there).
    Ours (models.LogProbMemory): the head, log-softmax and entropy chunk by chunk in the old log-probs and the update
    (not under FSDP, where the head needs the whole model's forward), and the reference's log-probs likewise."""
    if not work.trainer.planning.chunks_in_update:
        if work.entropy_chunking or "old log-probs" not in over:
            return None
        return Change(((work.keys["entropy_chunking"], True),), work.with_(entropy_chunking=True))
    settings, changes = [], {}
    if not work.entropy_chunking and not work.actor_sharded and {"old log-probs", "actor update"} & over:
        settings.append((work.keys["entropy_chunking"], True))
        changes["entropy_chunking"] = True
    if work.use_ref and work.ref_entropy_chunk is None and "reference log-probs" in over:
        settings.append((work.keys["ref_entropy_chunking"], True))
        changes["ref_entropy_chunk"] = work.entropy_chunk
    return Change(tuple(settings), work.with_(**changes)) if settings else None


BATCHED = ("actor update", "old log-probs", "reference log-probs", "critic update", "critic values")


def _micro_batches(work: Workload, evaluate: Evaluate, over: set[str], smallest: bool = False) -> Change | None:
    """Halve the micro-batches (or the token budgets) of the phases over budget until it fits or they are one
    sequence (a budget never below the longest sequence: verl and our runtime refuse that); `smallest`: at once."""
    knobs = []
    if "actor update" in over:
        knobs.append(("micro_update", work.micro_update or work.mini_rows_per_gpu, "dynamic_tokens_update"))
    if "old log-probs" in over:
        knobs.append(("micro_old_logprob", work.micro_old_logprob or work.rows_per_gpu, "dynamic_tokens_infer"))
    if "reference log-probs" in over and not work.ref_in_actor:
        knobs.append(("micro_ref", work.micro_ref or work.rows_per_gpu, "dynamic_tokens_ref"))
    if {"critic update", "critic values"} & over and work.use_critic:
        knobs.append(("micro_critic", work.micro_critic or work.mini_rows_per_gpu, "dynamic_tokens_critic"))
    if not knobs:
        return None
    longest = work.max_prompt_length + work.max_response_length
    best = None
    for factor in (256,) if smallest else (2, 4, 8, 16, 32, 64, 128, 256):
        changes, settings, at_floor = {}, [], True
        for name, current, budget_name in knobs:
            budget = getattr(work, budget_name)
            if budget is not None:
                value = max(budget // factor, min(budget, longest))
                at_floor &= value == min(budget, longest)
                changes[budget_name] = value
                settings.append((work.keys.get(budget_name, budget_name), value))
                if work.trainer.planning.values_budget and budget_name == "dynamic_tokens_critic" \
                        and work.dynamic_tokens_values == budget:  # the critic's forward takes its update's budget
                    changes["dynamic_tokens_values"] = value
            else:
                value = max(current // factor, 1)
                if work.trainer.planning.micro_per_worker:
                    value = _divisor_at_most(work.mini_batch_prompts * work.n, value)
                at_floor &= value == 1
                changes[name] = value
                key = work.keys.get(name, name)
                # verl's deprecated global keys (the run's own) count sequences over all GPUs / sp
                per_gpu = key.endswith("_per_gpu") or work.trainer.planning.micro_per_worker
                shown = value if per_gpu else value * max(work.world // work.sp, 1)
                settings.append((key, shown))
                if name == "micro_critic":
                    changes["micro_values"] = value
        candidate = work.with_(**changes)
        best = Change(tuple(settings), candidate)
        if smallest or at_floor or _fits(evaluate, candidate):
            return best
    return best


def _smallest_batches(work: Workload) -> Workload:
    """work with every micro-batch at one sequence (every token budget at the longest sequence)."""
    change = _micro_batches(work, None, set(BATCHED), smallest=True)
    return change.workload if change else work


def _divisor_at_most(total: int, value: int) -> int:
    """Our runtime wants micro-batches that divide mini-batch x n: the largest such divisor <= value."""
    for d in range(max(value, 1), 0, -1):
        if total % d == 0:
            return d
    return 1


def _checkpointing(work: Workload, evaluate: Evaluate, over: set[str]) -> Change | None:
    if work.gradient_checkpointing or not ({"actor update", "critic update"} & over):
        return None
    return Change(((work.keys["gradient_checkpointing"], True),), work.with_(gradient_checkpointing=True))


def _offload(work: Workload, evaluate: Evaluate, over: set[str]) -> Change | None:
    """Parameters and optimizer state in host memory between phases; ours (verl_runtime/offload.py) also offers the
    critic's and the reference's."""
    if not work.trainer.planning.offloads_each_role:
        if work.param_offload and work.optimizer_offload:
            return None
        return Change(((work.keys["param_offload"], True), (work.keys["optimizer_offload"], True)),
                      work.with_(param_offload=True, optimizer_offload=True),
                      "parameters and optimizer in host memory outside the update")
    wanted = ["param_offload", "optimizer_offload"]
    if work.use_critic:
        wanted += ["critic_param_offload", "critic_optimizer_offload"]
    if work.use_ref:
        wanted.append("ref_param_offload")
    wanted = [name for name in wanted if not getattr(work, name)]
    if not wanted:
        return None
    return Change(tuple((work.keys[name], True) for name in wanted), work.with_(**dict.fromkeys(wanted, True)),
                  "parameters and optimizer in host memory outside the phases that use them")


def _offload_policy(work: Workload, evaluate: Evaluate, over: set[str]) -> Change | None:
    if work.offload_policy or "actor update" not in over:
        return None
    if work.trainer.planning.offload_policy_alone:  # FSDP2's where sharded, else both offloads (verl_runtime/offload.py)
        return Change(((work.keys["offload_policy"], True),), work.with_(offload_policy=True),
                      "parameters, gradients and AdamW in host memory, streamed in for each use")
    return Change((("actor_rollout_ref.actor.strategy", "fsdp2"), (work.keys["offload_policy"], True)),
                  work.with_(offload_policy=True), "FSDP2 keeps parameters, gradients and AdamW in host memory")


def _sharding(work: Workload, evaluate: Evaluate, over: set[str]) -> Change | None:
    if not work.trainer.planning.shards_by_setting or work.world < 2 or work.device != "cuda":
        return None
    settings, changes = [], {}
    if not work.actor_sharded:
        settings.append((work.keys["actor_sharded"], "fsdp"))
        changes["actor_sharded"] = True
    if work.use_critic and not work.critic_sharded:
        settings.append((work.keys["critic_sharded"], "fsdp"))
        changes["critic_sharded"] = True
    return Change(tuple(settings), work.with_(**changes)) if settings else None


def _vllm_rollout(work: Workload, evaluate: Evaluate, over: set[str]) -> Change | None:
    """Our runtime's in-process engines (hf, builtin) hold the whole batch's KV cache on GPU 0; vLLM pages it
    within its share (and sleeps between rollouts): the share that fits."""
    if not work.trainer.planning.rollout_in_process or work.rollout == "vllm" or work.device != "cuda" \
            or "rollout" not in over:
        return None
    best, lowest = None, None
    for share in [round(u / 100, 2) for u in range(90, 4, -5)]:
        candidate = work.with_(rollout="vllm", vllm_sleeps=True, gpu_memory_utilization=share, rollout_tp=1)
        change = Change((("rollout.name", "vllm"), (work.keys["gpu_memory_utilization"], share)), candidate)
        verdict, peak, _, _ = evaluate(candidate)
        if verdict != "does not fit":
            return change
        if lowest is None or peak < lowest:
            best, lowest = change, peak
    return best  # none fits: the one closest, for stacking with the changes after it


def _rollout_tp(work: Workload, evaluate: Evaluate, over: set[str]) -> Change | None:
    """verl's rollout tensor parallelism within the node, doubled until it fits, each size with the memory share
    that then fits where the share it has does not (the share a model's slice needs depends on the size)."""
    if not work.trainer.planning.rollout_tp or work.rollout != "vllm":
        return None
    tp = work.rollout_tp
    best = None
    while tp * 2 <= work.gpus_per_node and work.world % (tp * 2) == 0:
        tp *= 2
        best = Change(((work.keys["rollout_tp"], tp),), work.with_(rollout_tp=tp))
        if _fits(evaluate, best.workload):
            return best
        share = _memory_share(best.workload, evaluate, over)
        if share is not None:
            return _combine(best, share)
    return best


def _memory_share(work: Workload, evaluate: Evaluate, over: set[str]) -> Change | None:
    """The vLLM share that fits: the largest step of 0.05 below the current one where the plan fits (or, when vLLM
    cannot start in its share, the smallest above)."""
    if work.rollout != "vllm" or work.device != "cuda":
        return None
    current = round(work.gpu_memory_utilization, 2)
    steps = [round(u / 100, 2) for u in range(95, 4, -5)]
    lower = [u for u in steps if u < current]
    higher = sorted(u for u in steps if u > current)
    for share in lower + higher:
        candidate = work.with_(gpu_memory_utilization=share)
        if _fits(evaluate, candidate):
            return Change(((work.keys["gpu_memory_utilization"], share),), candidate)
    return None


def response_length_that_fits(work: Workload, fits_with: Callable[[int], bool], longest: int) -> int | None:
    """Padding-free runs: the longest mean response length (tokens) at which the plan fits, or None."""
    if not fits_with(1):
        return None
    low, high = 1, longest
    while low < high:
        mid = (low + high + 1) // 2
        if fits_with(mid):
            low = mid
        else:
            high = mid - 1
    return low
