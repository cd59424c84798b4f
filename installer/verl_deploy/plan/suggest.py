"""When a run does not fit: the changes that make it fit, cheapest in throughput first, each checked by planning again
and shown only when it changes the verdict.

The order: settings first (dynamic batching by a token budget, smaller micro-batches: more passes, same maths;
chunked entropy; gradient checkpointing: one more forward; offloading states to host memory: transfers each step;
sharding the model over the GPUs, our runtime's actor.strategy; vLLM for our rollout; the rollout engine's memory
share), then tensor parallelism for verl's rollout, then more GPUs on the same node (up to 8), then more nodes, never
more GPUs than the mini-batch has sequences. Each is spelled in the run's own keys (our runtime honours verl's memory
settings under its own names). Where no single change is enough, the same changes are stacked in that order until
the plan fits. For a tight run (the worst case does not fit) only the settings are tried: they remove the risk; more
GPUs are not needed for a run that fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from verl_deploy.plan.workload import OURS, Workload
from verl_deploy.sizes import GiB

MAX_DOUBLINGS = 5
DEFAULT_TOKENS = 16384  # verl's and our actor.ppo_max_token_len_per_gpu (the critic's: twice it)


@dataclass(frozen=True)
class Change:
    settings: tuple[tuple[str, object], ...]  # (config key, value) as the runtime spells them
    workload: Workload
    why: str = ""
    flags: str = ""  # command-line flags (more GPUs)

    def text(self) -> str:
        parts = [f"{key}={_value(value)}" for key, value in self.settings] + ([self.flags] if self.flags else [])
        return ", ".join(parts)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


Evaluate = Callable[[Workload], "tuple[str, int, str, set[str]]"]  # -> (verdict, peak, peak phase, phases over budget)
SETTINGS = ("_entropy_chunking", "_checkpointing", "_offload", "_offload_policy", "_sharding", "_vllm_rollout",
            "_memory_share")
ORDER = (*SETTINGS, "_rollout_tp", "_more_gpus")
ANY_FIT = ("fits", "tight")


def suggest(work: Workload, evaluate: Evaluate, over_budget: set[str], gpu_bytes: int, goal: tuple = ANY_FIT,
            settings_only: bool = False) -> list[str]:
    """One line per change that brings `work` to a verdict in `goal`, cheapest first. When none does alone, the
    changes are stacked in that order, each stack with the largest micro-batches that then fit, and the first stack
    that fits is one line; when nothing does, one line names the phase that still does not fit with every change
    applied."""
    if goal != ANY_FIT:
        judge = evaluate

        def evaluate(candidate: Workload):  # a verdict short of the goal counts as not fitting
            verdict, *rest = judge(candidate)
            return (verdict if verdict in goal else "does not fit", *rest)
    found: list[str] = []
    names = SETTINGS if settings_only else ORDER
    makers = [_dynamic_batches, _micro_batches, *(globals()[name] for name in names)]
    for make in makers:
        if make is _more_gpus and found:
            break  # a setting is enough: more GPUs are not offered for a run that fits on these
        alone = make(work, evaluate, over_budget)
        if alone is not None:
            verdict, peak, _, _ = evaluate(alone.workload)
            if verdict in goal:
                found.append(_line(alone, verdict, peak, gpu_bytes))
    if found or settings_only:
        return found
    stack: Change | None = None
    for make in makers[2:]:
        current = stack.workload if stack else work
        change = make(current, evaluate, evaluate(current)[3])
        if change is None:
            continue
        stack = _combine(stack, change)
        verdict, peak, _, over = evaluate(stack.workload)
        if verdict == "does not fit":
            micro = _micro_batches(stack.workload, evaluate, over)
            if micro is not None and evaluate(micro.workload)[0] in goal:
                combined = _combine(stack, micro)
                verdict, peak, _, _ = evaluate(combined.workload)
                return ["together: " + _line(combined, verdict, peak, gpu_bytes)]
        else:
            return ["together: " + _line(stack, verdict, peak, gpu_bytes)]
    last = stack.workload if stack else work
    micro = _micro_batches(last, evaluate, evaluate(last)[3])
    if micro is not None:
        stack, last = _combine(stack, micro), micro.workload
    verdict, peak, phase, _ = evaluate(last)
    applied = f" with all of them ({stack.text()})" if stack and stack.text() else ""
    return [f"no change tried here makes it fit (micro-batches, checkpointing, offload, sharding, the rollout engine "
            f"and its share, more GPUs):{applied} the {phase} phase still needs {peak / GiB:.1f} of "
            f"{gpu_bytes / GiB:.1f} GiB: a larger GPU or a smaller model"]


def _combine(stack: Change | None, change: Change) -> Change:
    if stack is None:
        return Change(change.settings, change.workload, "", change.flags)
    settings = dict([*stack.settings, *change.settings])
    return Change(tuple(settings.items()), change.workload, "", change.flags or stack.flags)


def _line(change: Change, verdict: str, peak: int, gpu_bytes: int) -> str:
    what = change.text()
    why = f" ({change.why})" if change.why else ""
    return f"{what}{why}: peak {peak / GiB:.1f} of {gpu_bytes / GiB:.1f} GiB, {verdict}"


def _fits(evaluate: Evaluate, work: Workload) -> bool:
    return evaluate(work)[0] != "does not fit"


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
            if work.runtime == OURS:
                tokens["dynamic_tokens_values"] = 2 * budget
        settings = [(work.keys["use_dynamic_bsz"], True)]
        if budget != DEFAULT_TOKENS:
            settings += [(work.keys["dynamic_tokens_update"], budget)]
            if work.runtime == OURS and work.use_critic:
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
    if work.runtime != OURS:
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


def _micro_batches(work: Workload, evaluate: Evaluate, over: set[str]) -> Change | None:
    """Halve the micro-batches (or verl's token budgets) of the phases over budget until it fits or they are 1."""
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
    best = None
    for factor in (2, 4, 8, 16, 32, 64, 128, 256):
        changes, settings = {}, []
        for name, current, budget_name in knobs:
            budget = getattr(work, budget_name)
            if budget is not None:
                value = max(budget // factor, 256)
                changes[budget_name] = value
                settings.append((work.keys.get(budget_name, budget_name), value))
                if work.runtime == OURS and budget_name == "dynamic_tokens_critic" \
                        and work.dynamic_tokens_values == budget:  # the critic's forward takes its update's budget
                    changes["dynamic_tokens_values"] = value
            else:
                value = max(current // factor, 1)
                if work.runtime == OURS:
                    value = _divisor_at_most(work.mini_batch_prompts * work.n, value)
                changes[name] = value
                key = work.keys.get(name, name)
                # verl's deprecated global keys (the run's own) count sequences over all GPUs / sp
                shown = value if key.endswith("_per_gpu") or work.runtime == OURS else value * max(work.world // work.sp, 1)
                settings.append((key, shown))
                if name == "micro_critic":
                    changes["micro_values"] = value
        candidate = work.with_(**changes)
        best = Change(tuple(settings), candidate)
        if _fits(evaluate, candidate) or all(v in (1, 256) for v in changes.values()):
            return best
    return best


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
    if work.runtime != OURS:
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
    if work.runtime == OURS:  # FSDP2's policy where the model is sharded, else both offloads (verl_runtime/offload.py)
        return Change(((work.keys["offload_policy"], True),), work.with_(offload_policy=True),
                      "parameters, gradients and AdamW in host memory, streamed in for each use")
    return Change((("actor_rollout_ref.actor.strategy", "fsdp2"), (work.keys["offload_policy"], True)),
                  work.with_(offload_policy=True), "FSDP2 keeps parameters, gradients and AdamW in host memory")


def _sharding(work: Workload, evaluate: Evaluate, over: set[str]) -> Change | None:
    if work.runtime != OURS or work.world < 2 or work.device != "cuda":
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
    if work.runtime != OURS or work.rollout == "vllm" or work.device != "cuda" or "rollout" not in over:
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
    if work.runtime == OURS or work.rollout != "vllm":
        return None
    tp = work.rollout_tp
    best = None
    while tp * 2 <= work.gpus_per_node and work.world % (tp * 2) == 0:
        tp *= 2
        best = Change(((work.keys["rollout_tp"], tp),), work.with_(rollout_tp=tp))
        if _fits(evaluate, best.workload):
            return best
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


def _more_gpus(work: Workload, evaluate: Evaluate, over: set[str]) -> Change | None:
    if work.device != "cuda" or (work.runtime == OURS and not (work.actor_sharded or work.world == 1)):
        return None
    per_node, nodes = work.gpus_per_node, work.nodes
    for _ in range(MAX_DOUBLINGS):
        if per_node < 8:
            per_node *= 2
        else:
            nodes *= 2
        world = per_node * nodes
        changes = {"world": world, "gpus_per_node": per_node, "nodes": nodes}
        if work.runtime == OURS and world > 1:
            changes["actor_sharded"] = True
            changes["critic_sharded"] = work.use_critic
        candidate = work.with_(**changes)
        if world > work.mini_batch_prompts * work.n * work.sp:
            return None  # more GPUs than the mini-batch has sequences: the extra ones would idle
        if (work.mini_batch_prompts * work.n * work.sp) % world:
            continue  # the mini-batch must split evenly over the GPUs
        flags = f"--gpus {per_node}" + (f" --nodes {nodes}" if nodes > 1 else "")
        settings = ((work.keys["actor_sharded"], "fsdp"),) if work.runtime == OURS and not work.actor_sharded else ()
        if _fits(evaluate, candidate):
            return Change(settings, candidate, "", flags)
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
