"""plan(): a run's config, its GPUs and its model, to a per-phase memory plan with a verdict and suggestions; and
preflight(), the same check in one line for `verl-deploy run`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from verl_deploy import runtimes
from verl_deploy.plan import lengths as lengths_mod
from verl_deploy.plan.errors import PlanError
from verl_deploy.plan.gpu import Device, from_reading, from_size, from_type, host_memory, host_ram_bytes, host_reading
from verl_deploy.plan.memory import COMPONENTS, MemoryPlan, plan_memory
from verl_deploy.plan.shape import ModelShape, model_shape, read_config
from verl_deploy.plan.suggest import response_length_that_fits, suggest
from verl_deploy.plan.workload import OURS, Workload, from_ours, from_verl, verl_data_files
from verl_deploy.sizes import GiB, Gpus
from verl_deploy.targets import CLUSTER_TARGETS
from verl_deploy.world import check_world, derive_world, verl_world

FITS, TIGHT, NO = "fits", "tight", "does not fit"
TIGHT_ABOVE = 0.90  # of the GPU's memory: above it the allocator's fragmentation and other processes decide


@dataclass
class Plan:
    runtime: str
    model: ModelShape
    device: Device
    workload: Workload
    lengths: lengths_mod.Lengths
    memory: MemoryPlan
    verdict: str
    reason: str  # one line: why this verdict
    suggestions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    worst: Plan | None = None  # the same run with every response at the limit (None: the lengths cannot differ)
    phase_limits: dict[str, int | None] = field(default_factory=dict)  # mean response at which each phase stops fitting
    safe_response_length: int | None = None  # the mean response up to which every phase fits

    @property
    def cheapest_fix(self) -> str | None:
        """The first suggestion's settings and flags (what to change), or None."""
        if not self.suggestions or self.suggestions[0].startswith(("no change", "or plan for")):
            return None
        return _settings_of(self.suggestions[0])

    @property
    def fits(self) -> bool:
        return self.verdict != NO

    @property
    def peak_bytes(self) -> int:
        return self.memory.peak

    @property
    def gpu_memory_bytes(self) -> int:
        return self.device.memory_bytes

    @property
    def exit_code(self) -> int:
        return 0 if self.fits else 1

    def to_json(self) -> dict:
        w = self.workload
        return {
            "fits": self.fits,
            "verdict": self.verdict,
            "reason": self.reason,
            "peak_bytes": self.peak_bytes,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "peak_phase": self.memory.peak_phase.name,
            "phases": [{"name": p.name, "peak_bytes": p.peak, "components": p.components, "detail": p.detail}
                       for p in self.memory.phases],
            "suggestions": self.suggestions,
            "runtime": self.runtime,
            "device": {"kind": self.device.kind, "name": self.device.name, "memory_bytes": self.device.memory_bytes,
                       "total_bytes": self.device.total_bytes, "source": self.device.source},
            "gpus": w.world if self.device.kind == "cuda" else 0,
            "nodes": w.nodes,
            "model": {"source": self.model.source, "architecture": self.model.architecture,
                      "parameters": self.model.params, "counted_by": self.model.counted_by,
                      "layers": self.model.layers, "hidden": self.model.hidden, "vocab": self.model.vocab},
            "lengths": {"prompt": self.lengths.prompt, "response": self.lengths.response,
                        "prompt_assumed": self.lengths.prompt_how, "response_assumed": self.lengths.response_how},
            "host_memory_bytes": self.memory.host_bytes,
            "worst_case": None if self.worst is None else {
                "peak_bytes": self.worst.peak_bytes, "peak_phase": self.worst.memory.peak_phase.name,
                "verdict": self.worst.verdict, "lengths": {"prompt": self.worst.lengths.prompt,
                                                           "response": self.worst.lengths.response}},
            "safe_response_length": self.safe_response_length,
            "phase_response_limits": self.phase_limits,
            "cheapest_fix": self.cheapest_fix,
            "notes": self.notes,
        }

    def for_trainer(self) -> str:
        """The plan as the trainer reads it (VERL_DEPLOY_PLAN, compact JSON, docs/plan.md): the verdict, the safe
        mean response length, the cheapest fix and each phase's planned peak at typical lengths."""
        doc = {"verdict": self.verdict, "gpu_memory_bytes": self.gpu_memory_bytes,
               "safe_response_length": self.safe_response_length,
               "cheapest_fix": (self.cheapest_fix or "")[:300] or None,
               "phases": {p.name: {"peak_bytes": p.peak, "detail": p.detail[:120]} for p in self.memory.phases}}
        return json.dumps(doc, separators=(",", ":"))


def plan(config: Path | None = None, overrides: Sequence[str] = (), *, runtime: str = OURS, gpus: Gpus | None = None,
         nodes: int | None = None, gpu_type: str | None = None, gpu_memory: str | None = None,
         prompt_length: int | None = None, response_length: int | None = None, read_data: bool = True,
         with_suggestions: bool = True, this_host: bool = True, loaded=None) -> Plan:
    """Plan a run; PlanError (one line) for bad input. gpus: --gpus parsed (sizes.parse_gpus). `this_host`: the run is for this machine (its NVML reading
    and memory may be read); otherwise only --gpu-type/--gpu-memory name the GPU. `loaded`: our config as `run`
    already loaded it from config and overrides (not read again)."""
    for flag, value in (("--prompt-length", prompt_length), ("--response-length", response_length)):
        if value is not None and value < 1:
            raise PlanError(f"{flag} {value} must be at least 1 token")
    notes: list[str] = []
    try:
        trainer = runtimes.trainer(runtime)
        trainer.check_config(config)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    if trainer.takes_config:  # our config, read by the runtime's own loader
        work, device, data_files, apply_template = _ours(config, overrides, gpus, nodes, gpu_type, gpu_memory,
                                                         this_host, notes, loaded)
    else:  # verl's overrides on verl 0.9.1's defaults (workload.from_verl)
        work, device = _verl(overrides, gpus, nodes, gpu_type, gpu_memory, this_host)
        data_files, apply_template = verl_data_files(overrides), True
    if not work.model_path:
        raise PlanError("no model: set actor_rollout_ref.model.path (or model.path)")
    actor_key, critic_key = trainer.model_keys
    shape = model_shape(work.model_path, actor_key)
    critic = (model_shape(work.critic_path, critic_key) if work.critic_path and work.critic_path != work.model_path
              else None)
    stats, why = None, "the data file was not read"
    if read_data and prompt_length is None:
        source = read_config(work.model_path, actor_key)
        hub = work.model_path if not Path(work.model_path).expanduser().exists() else None
        stats, why = lengths_mod.prompt_stats([str(f) for f in data_files], source.folder, hub,
                                              work.max_prompt_length, apply_template)
    cases = lengths_mod.assume(work.padding_free, work.max_prompt_length, work.max_response_length, stats,
                               prompt_length, response_length, why)
    result = _judge(work, shape, critic, cases, device)
    result.notes = notes + list(work.notes) + result.notes
    result.phase_limits, result.safe_response_length = _response_limits(result, shape, critic, cases, device)
    if result.verdict == TIGHT and result.worst is not None and result.worst.verdict == NO:
        safe, prompt = result.safe_response_length, cases.typical.prompt
        if safe and safe < work.max_response_length:
            result.reason += f": it fits while the mean response stays under {safe} tokens"
        elif safe:
            result.reason += (f": it fits at every response length with prompts of {prompt} tokens; the longest "
                              "prompts do not")
    if with_suggestions and result.verdict != FITS:
        result.suggestions = _suggestions(result, shape, critic, cases, device)
        if result.verdict == TIGHT and result.worst is not None and result.worst.verdict == NO:
            if result.suggestions:
                fixes = " or ".join(_settings_of(line) for line in result.suggestions[:2])
                result.reason += f"; {fixes} removes the risk"
            else:
                result.reason += " (--response-length N plans your data's lengths)"
    return result


def size(value: float) -> str:
    """Bytes for a sentence: GiB with one decimal, MiB below 1 GiB."""
    return f"{value / GiB:.1f} GiB" if value >= GiB else f"{value / 2**20:.1f} MiB"


def _evaluate(work: Workload, shape: ModelShape, critic: ModelShape | None, lengths: lengths_mod.Lengths,
              device: Device) -> Plan:
    memory = plan_memory(work, shape, critic, lengths, device.total_bytes)
    usable = device.memory_bytes
    peak = memory.peak_phase
    where = "host memory" if device.is_cpu else "per GPU"
    share = peak.peak / usable if usable else float("inf")
    notes = list(memory.notes)
    if memory.vllm_fails:
        verdict, reason = NO, memory.vllm_fails
    elif share > 1:
        verdict, reason = NO, f"the {peak.name} phase needs {size(peak.peak)} {where}, {size(usable)} are there"
    elif share > TIGHT_ABOVE:
        verdict, reason = TIGHT, (f"the {peak.name} phase needs {size(peak.peak)} of {size(usable)} {where} "
                                  f"({100 * share:.1f}%): fragmentation or another process may tip it over")
    else:
        verdict, reason = FITS, f"the peak ({peak.name}) is {size(peak.peak)} of {size(usable)} {where} ({100 * share:.1f}%)"
    if memory.host_bytes:
        notes.append(f"host memory per node for offloaded state: {memory.host_bytes / GiB:.1f} GiB")
        if device.source.startswith("this host") and memory.host_bytes > host_ram_bytes() and verdict != NO:
            verdict, reason = NO, (f"offloaded state needs {memory.host_bytes / GiB:.1f} GiB of host memory, this "
                                   f"host has {host_ram_bytes() / GiB:.1f} GiB")
    return Plan(work.runtime, shape, device, work, lengths, memory, verdict, reason, notes=notes)


def _judge(work: Workload, shape: ModelShape, critic: ModelShape | None, cases: lengths_mod.Cases,
           device: Device) -> Plan:
    """The verdict over both length cases: fits (the worst case fits), tight (the typical case fits, the worst does
    not, or the peak is within 10% of the memory), does not fit (the typical case does not)."""
    typical = _evaluate(work, shape, critic, cases.typical, device)
    if cases.same or typical.verdict == NO:
        if typical.verdict == NO and not cases.same:
            typical.reason += (f" (typical lengths: prompt {cases.typical.prompt}, response {cases.typical.response} "
                               "tokens)")
        return typical
    worst = _evaluate(work, shape, critic, cases.worst, device)
    typical.worst = worst
    at_limit = f"every response at {cases.worst.response} tokens"
    if worst.verdict == FITS:
        typical.reason = f"{worst.reason}, with {at_limit}"
    elif worst.verdict == TIGHT:
        typical.verdict, typical.reason = TIGHT, f"with {at_limit}, {worst.reason}"
    else:
        peak = worst.memory.peak_phase
        typical.verdict = TIGHT
        share = 100 * typical.peak_bytes / device.memory_bytes
        typical.reason = (f"fits at typical lengths (prompt {cases.typical.prompt}, response {cases.typical.response} "
                          f"tokens: peak {size(typical.peak_bytes)}, {share:.1f}%), not with {at_limit} and prompts "
                          f"of {cases.worst.prompt} (the {peak.name} phase needs {size(peak.peak)} of "
                          f"{size(device.memory_bytes)})")
    return typical


def _response_limits(result: Plan, shape: ModelShape, critic: ModelShape | None, cases: lengths_mod.Cases,
                     device: Device) -> tuple[dict[str, int | None], int | None]:
    """For each phase, the longest mean response (tokens, at the typical prompt) at which it fits in the GPU's
    memory (None: not even one token; the limit: it fits all the way); and the smallest of them."""
    work, usable = result.workload, device.memory_bytes
    longest = work.max_response_length
    if result.memory.vllm_fails:
        return {p.name: None for p in result.memory.phases}, None
    if not work.padding_free:  # padded micro-batches do not depend on the responses' real lengths
        fits = {p.name: (longest if p.peak <= usable else None) for p in result.memory.phases}
        return fits, (longest if all(fits.values()) else None)
    from verl_deploy.plan.memory import plan_memory

    def peaks(response: int) -> dict[str, int]:
        lengths = lengths_mod.Lengths(cases.typical.prompt, response, "", "")
        return {p.name: p.peak for p in plan_memory(work, shape, critic, lengths, device.total_bytes).phases}

    limits = {}
    for phase in result.memory.phases:
        limits[phase.name] = response_length_that_fits(work, lambda r, n=phase.name: peaks(r)[n] <= usable, longest)
    known = list(limits.values())
    return limits, (None if None in known else min(known, default=None))


def _settings_of(line: str) -> str:
    """A suggestion's settings (what comes before its planned peak)."""
    return line.split(": peak ")[0].removeprefix("together: ")


def _suggestions(result: Plan, shape: ModelShape, critic: ModelShape | None, cases: lengths_mod.Cases,
                 device: Device) -> list[str]:
    """Does not fit: the changes that make it fit at typical lengths. Tight because the worst case does not fit:
    the settings that make the worst case fit too (no more GPUs for a run that fits)."""
    usable = device.memory_bytes
    decisive = result if result.verdict == NO or result.worst is None else result.worst
    over = {p.name for p in decisive.memory.phases if p.peak > TIGHT_ABOVE * usable}

    def evaluate(work: Workload):
        again = _judge(work, shape, critic, cases, device)
        side = again if again.verdict == NO or again.worst is None else again.worst
        over_again = {p.name for p in side.memory.phases if p.peak > TIGHT_ABOVE * usable}
        shown = side if again.verdict == FITS else again  # the peak that decides: the worst case's once it fits
        return again.verdict, shown.peak_bytes, side.memory.peak_phase.name, over_again

    if result.verdict == NO:
        found = suggest(result.workload, evaluate, over, usable)
    else:
        found = suggest(result.workload, evaluate, over, usable, goal=(FITS,), settings_only=True)
        found = [line for line in found if not line.startswith("no change")]
    if found and found[0].startswith("no change tried here"):
        found = found[:1]
    work, lengths = result.workload, result.lengths
    if result.verdict == NO and work.padding_free and result.safe_response_length:
        longest = result.safe_response_length
        found.append(f"or plan for your data's response lengths: it fits while responses average at most "
                     f"{longest} tokens (--response-length {longest})")
    return found


# --- reading the run ------------------------------------------------------------------------------------------


def _ours(config, overrides, gpus, nodes, gpu_type, gpu_memory, this_host, notes, loaded=None):
    import copy

    from verl_runtime.config import load_config
    from verl_runtime.errors import UserError

    try:  # a copy of the caller's: check_world below sets its world size
        cfg = copy.deepcopy(loaded) if loaded is not None else load_config(config, list(overrides), warn=False)
        asked, nodes = derive_world(cfg.trainer, gpus, nodes)
    except (UserError, ValueError) as exc:
        raise PlanError(str(exc)) from None
    named = gpu_type or gpu_memory
    reading = host_reading() if this_host and not named and cfg.trainer.device != "cpu" else {}
    host_gpu = from_reading(reading, _indices(asked))
    wants_cuda = cfg.trainer.device == "cuda" or asked.wanted or (cfg.trainer.device == "auto" and (named or host_gpu))
    if cfg.trainer.device == "cpu" and (asked.wanted or named):
        raise PlanError("trainer.device=cpu trains on the CPU: drop --gpus/--gpu-type, or set trainer.device=cuda")
    if not wants_cuda:
        device = host_memory()
        world = cfg.trainer.n_workers or 1
        return from_ours(cfg, world, nodes, "cpu"), device, cfg.data.train_files, cfg.data.apply_chat_template
    device = _gpu_device(gpu_type, gpu_memory, host_gpu, "trainer.device=cuda")
    per_node = asked.number if asked.wanted and asked.number else None
    if per_node is None and asked.count == -1:  # --gpus all
        per_node = (host_gpu.visible if host_gpu else None) or 1
    if per_node is None:
        if cfg.trainer.n_workers:
            world = cfg.trainer.n_workers
            per_node = max(world // nodes, 1)
        else:
            per_node = (host_gpu.visible if host_gpu and not named else None) or 1
            notes.append(f"{per_node} GPU{'s' if per_node > 1 else ''} per node "
                         + ("(all this host shows)" if host_gpu and not named else "(give --gpus N for more)"))
    world = per_node * nodes
    try:
        check_world(cfg, Gpus(count=per_node), nodes)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    return from_ours(cfg, world, nodes, "cuda"), device, cfg.data.train_files, cfg.data.apply_chat_template


def _verl(overrides, gpus, nodes, gpu_type, gpu_memory, this_host):
    try:
        asked, nodes = verl_world(list(overrides), gpus, nodes)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    host_gpu = from_reading(host_reading(), _indices(asked)) if this_host and not (gpu_type or gpu_memory) else None
    device = _gpu_device(gpu_type, gpu_memory, host_gpu, "verl trains on GPUs")
    return from_verl(list(overrides), asked.number * nodes, nodes), device


def _indices(asked) -> list[int] | None:
    ids = [int(i) for i in asked.device_ids if i.isdigit()]
    return ids or None


def _gpu_device(gpu_type, gpu_memory, host_gpu, why: str) -> Device:
    if gpu_memory:
        return from_size(gpu_memory, from_type(gpu_type).name if gpu_type else None)
    if gpu_type:
        return from_type(gpu_type)
    if host_gpu is not None:
        return host_gpu
    raise _NoGpu(f"{why} and this host shows no GPU: name the one to plan for with --gpu-type (e.g. H100) or "
                 "--gpu-memory (e.g. 80g)")


class _NoGpu(PlanError):
    """A GPU run and no GPU to plan for (preflight words it for a cluster's run)."""


# --- the pre-flight of `verl-deploy run` ----------------------------------------------------------------------


NOT_PLANNED = "note: not planned for memory"  # how `run` starts the line of a run it could not plan


@dataclass
class Preflight:
    """What `run` does with a plan: refuse (one line with the best suggestion), warn (tight), or go on quietly;
    `skipped` when the run could not be planned (the message says why; the run goes on)."""

    status: str  # fits | tight | does not fit | skipped
    message: str | None
    plan: Plan | None = None

    @property
    def refuse(self) -> bool:
        return self.status == NO


def preflight(config: Path | None, overrides: Sequence[str], *, runtime: str = OURS, target: str = "docker",
              gpus: Gpus | None = None, nodes: int | None = None, gpu_type: str | None = None,
              loaded=None) -> Preflight:
    """Plan a run before `run` starts anything. Never raises: bad input the run itself would refuse is left to it.

    local and docker runs are planned for this host's GPUs (or its memory, for a CPU run); a k8s run for --gpu-type
    (without it, a GPU run on a cluster is skipped: the cluster's GPUs are not known here). Lengths are the config's
    typical and worst lengths of lengths.py (no data file is read: this stays fast). Refuses only "does not fit" (the
    typical lengths do not fit); warns for "tight"; a run that could not be planned gets one line, "note: not planned
    for memory: <why>" (a model whose config.json cannot be had, offline or without the Hub, says so within
    seconds: shape.py), and goes on: the cluster or the container may have what this host lacks."""
    unknown_gpu = Preflight("skipped", f"{NOT_PLANNED}: the cluster's GPU is unknown here (name it with --gpu-type "
                            "to check that the run fits)")
    if target in CLUSTER_TARGETS and not gpu_type and (not runtimes.trainer(runtime).own or (gpus and gpus.wanted)):
        return unknown_gpu
    try:
        result = plan(config, overrides, runtime=runtime, gpus=gpus, nodes=nodes, gpu_type=gpu_type,
                      read_data=False, this_host=target not in CLUSTER_TARGETS, loaded=loaded)
    except _NoGpu:  # a GPU run whose GPU is not named, and none on this host
        return unknown_gpu if target in CLUSTER_TARGETS else Preflight(
            "skipped", f"{NOT_PLANNED}: the run asks for GPUs and this host shows none (`verl-deploy plan "
            "--gpu-type NAME` plans for one)")
    except PlanError as exc:
        return Preflight("skipped", f"{NOT_PLANNED}: {_one_line(exc)}")
    except Exception as exc:  # the planner must never stop a run by a bug of its own
        return Preflight("skipped", f"{NOT_PLANNED} ({type(exc).__name__}: {_one_line(exc)})")
    where = f"{result.device.name}" + ("" if result.device.is_cpu else f" x {result.workload.world}")
    if result.verdict == NO:
        best = result.suggestions[0] if result.suggestions else "a larger GPU or a smaller model"
        advice = best if best.startswith("no change") else f"cheapest fix: {best}"
        return Preflight(NO, f"the run does not fit on {where}: {result.reason}; {advice} "
                         "(`verl-deploy plan` shows every phase; --no-plan skips this check)", result)
    if result.verdict == TIGHT:
        return Preflight(TIGHT, f"warning: the run is tight on {where}: {result.reason} (`verl-deploy plan` shows "
                         "every phase)", result)
    return Preflight(FITS, None, result)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


__all__ = ["COMPONENTS", "FITS", "NO", "TIGHT", "Plan", "PlanError", "Preflight", "plan", "preflight"]
