"""plan(): a run's config, its GPUs and its model, to a per-phase memory plan with a verdict and suggestions; and
preflight(), the same check in one line for `verl-deploy run`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from verl_deploy.plan import lengths as lengths_mod
from verl_deploy.plan.errors import PlanError
from verl_deploy.plan.gpu import Device, from_reading, from_size, from_type, host_memory, host_ram_bytes, host_reading
from verl_deploy.plan.memory import COMPONENTS, MemoryPlan, plan_memory
from verl_deploy.plan.shape import ModelShape, model_shape, read_config
from verl_deploy.plan.suggest import response_length_that_fits, suggest
from verl_deploy.plan.workload import OURS, VERL, Workload, from_ours, from_verl, verl_data_files
from verl_deploy.sizes import GiB, Gpus

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
            "notes": self.notes,
        }


def plan(config: Path | None = None, overrides: Sequence[str] = (), *, runtime: str = OURS, gpus: Gpus | None = None,
         nodes: int | None = None, gpu_type: str | None = None, gpu_memory: str | None = None,
         prompt_length: int | None = None, response_length: int | None = None, read_data: bool = True,
         with_suggestions: bool = True, this_host: bool = True) -> Plan:
    """Plan a run; PlanError (one line) for bad input. gpus: --gpus parsed (sizes.parse_gpus). `this_host`: the run is for this machine (its NVML reading
    and memory may be read); otherwise only --gpu-type/--gpu-memory name the GPU."""
    for flag, value in (("--prompt-length", prompt_length), ("--response-length", response_length)):
        if value is not None and value < 1:
            raise PlanError(f"{flag} {value} must be at least 1 token")
    notes: list[str] = []
    if runtime == OURS:
        work, device, data_files, apply_template = _ours(config, overrides, gpus, nodes, gpu_type, gpu_memory,
                                                         this_host, notes)
    elif runtime == VERL:
        if config is not None:
            raise PlanError("--runtime verl takes verl's overrides (after --), not a config file: verl's own YAML "
                            "files are Hydra configs this planner does not compose")
        work, device = _verl(overrides, gpus, nodes, gpu_type, gpu_memory, this_host)
        data_files, apply_template = verl_data_files(overrides), True
    else:
        raise PlanError(f"--runtime {runtime!r}: use verl-deploy or verl")
    if not work.model_path:
        raise PlanError("no model: set actor_rollout_ref.model.path (or model.path)")
    shape = model_shape(work.model_path)
    critic = model_shape(work.critic_path) if work.critic_path and work.critic_path != work.model_path else None
    stats, why = None, "the data file was not read"
    if read_data and prompt_length is None:
        source = read_config(work.model_path)
        hub = work.model_path if not Path(work.model_path).expanduser().exists() else None
        stats, why = lengths_mod.prompt_stats([str(f) for f in data_files], source.folder, hub,
                                              work.max_prompt_length, apply_template)
    lengths = lengths_mod.assume(work.padding_free, work.max_prompt_length, work.max_response_length, stats,
                                 prompt_length, response_length, why)
    result = _evaluate(work, shape, critic, lengths, device)
    result.notes = notes + list(work.notes) + result.notes
    if with_suggestions and not result.fits:
        result.suggestions = _suggestions(result, shape, critic, device)
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


def _suggestions(result: Plan, shape: ModelShape, critic: ModelShape | None, device: Device) -> list[str]:
    usable = device.memory_bytes
    over = {p.name for p in result.memory.phases if p.peak > TIGHT_ABOVE * usable}

    def evaluate(work: Workload):
        again = _evaluate(work, shape, critic, result.lengths, device)
        over_again = {p.name for p in again.memory.phases if p.peak > TIGHT_ABOVE * usable}
        return again.verdict, again.peak_bytes, again.memory.peak_phase.name, over_again

    found = suggest(result.workload, evaluate, over, usable)
    if found and found[0].startswith("no change tried here"):
        found = found[:1]
    work, lengths = result.workload, result.lengths
    if work.padding_free and lengths.response >= work.max_response_length:
        def fits_with(response: int) -> bool:
            shorter = lengths_mod.Lengths(lengths.prompt, response, lengths.prompt_how, "")
            return _evaluate(work, shape, critic, shorter, device).fits

        longest = response_length_that_fits(work, fits_with, work.max_response_length)
        if longest:
            found.append(f"or plan for your data's response lengths: it fits while responses average at most "
                         f"{longest} tokens (--response-length {longest})")
    return found


# --- reading the run ------------------------------------------------------------------------------------------


def _ours(config, overrides, gpus, nodes, gpu_type, gpu_memory, this_host, notes):
    from verl_deploy.launchers import LaunchError
    from verl_deploy.launchers.jobspec import derive_world
    from verl_runtime.config import load_config
    from verl_runtime.errors import UserError

    try:
        cfg = load_config(config, list(overrides), warn=False)
        asked, nodes = derive_world(cfg.trainer, gpus, nodes)
    except (UserError, LaunchError) as exc:
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
        from verl_deploy.launchers.jobspec import check_config

        check_config(cfg, Gpus(count=per_node), nodes)
    except (UserError, LaunchError) as exc:
        raise PlanError(str(exc)) from None
    return from_ours(cfg, world, nodes, "cuda"), device, cfg.data.train_files, cfg.data.apply_chat_template


def _verl(overrides, gpus, nodes, gpu_type, gpu_memory, this_host):
    from verl_deploy.launchers import LaunchError
    from verl_deploy.launchers.jobspec import verl_world

    try:
        asked, nodes = verl_world(list(overrides), gpus, nodes)
    except LaunchError as exc:
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
    raise PlanError(f"{why} and this host shows no GPU: name the one to plan for with --gpu-type (e.g. H100) or "
                    "--gpu-memory (e.g. 80g)")


# --- the pre-flight of `verl-deploy run` ----------------------------------------------------------------------


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
              gpus: Gpus | None = None, nodes: int | None = None, gpu_type: str | None = None) -> Preflight:
    """Plan a run before `run` starts anything. Never raises: bad input the run itself would refuse is left to it.

    local and docker runs are planned for this host's GPUs (or its memory, for a CPU run); a k8s run for --gpu-type
    (without it, a GPU run on a cluster is skipped: the cluster's GPUs are not known here). Lengths are the config's
    limits (no data file is read: this stays fast)."""
    from verl_deploy.launchers import CLUSTER_TARGETS

    if target in CLUSTER_TARGETS and not gpu_type and (runtime != OURS or (gpus and gpus.wanted)):
        return Preflight("skipped", "note: not planned for memory: the cluster's GPU is unknown here (name it with "
                         "--gpu-type to check that the run fits)")
    try:
        result = plan(config, overrides, runtime=runtime, gpus=gpus, nodes=nodes, gpu_type=gpu_type,
                      read_data=False, this_host=target not in CLUSTER_TARGETS)
    except PlanError as exc:
        return Preflight("skipped", f"note: not planned for memory: {exc}")
    except Exception as exc:  # the planner must never stop a run by a bug of its own
        return Preflight("skipped", f"note: not planned for memory ({type(exc).__name__}: {exc})")
    where = f"{result.device.name}" + ("" if result.device.is_cpu else f" x {result.workload.world}")
    if result.verdict == NO:
        best = result.suggestions[0] if result.suggestions else "a larger GPU or a smaller model"
        advice = best if best.startswith("no change") else f"try {best}"
        return Preflight(NO, f"the run does not fit on {where}: {result.reason}; {advice} "
                         "(`verl-deploy plan` shows every phase; --no-plan skips this check)", result)
    if result.verdict == TIGHT:
        return Preflight(TIGHT, f"warning: the run is tight on {where}: {result.reason} (`verl-deploy plan` shows "
                         "every phase)", result)
    return Preflight(FITS, None, result)


__all__ = ["COMPONENTS", "FITS", "NO", "TIGHT", "Plan", "PlanError", "Preflight", "plan", "preflight"]
