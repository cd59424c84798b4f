"""How right is `verl-deploy plan`? Our trainer's own steps on the CPU, measured, against the planner's prediction.

    .venv/bin/python bench/plan_accuracy.py                 # every case; a table and the worst error
    .venv/bin/python bench/plan_accuracy.py --cases quickstart,bf16 --json runs/plan-accuracy.json

Each case builds a SingleControllerTrainer (in-process, on the CPU) for a config, runs one warm-up step (so the
gradients and AdamW's moments exist, as in every later step), then one more step in which every worker method the
trainer calls (generate, reference log-probs, critic values, old log-probs, critic update, actor update) runs under
torch.profiler with profile_memory=True. The profiler sees every tensor allocation and free of c10's CPU allocator
(the same accounting torch.cuda.max_memory_allocated keeps on a GPU), so the running sum of its memory events gives
the peak of what the call allocated beyond what existed before it: its activations, logits, weight copies and the
rollout's KV cache. The prediction is the same quantity from the planner: that phase's weight copies + activations +
logits (+ the rollout's transient), planned for the step's real prompt width.

The static terms (weights, gradients, AdamW moments) are compared byte for byte with the trainer's tensors.

Target (issue #24): every phase within 15%. The CPU runs the regimes a GPU run has: fp32 (our CPU default, with the
lean llama-family path), bf16 autocast over fp32 master weights (model.dtype=bfloat16: what `auto` is on a GPU),
each with and without gradient checkpointing, and PPO with a critic. The memory-setting cases are each compared with
their base too; for CPU offload (case offload) the CPU can show only that nothing changes (device and host are one
memory): the saving itself is measured on a GPU (bench/gpu_check.py --only offload).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "installer")]

TARGET = 0.15
MiB = 2**20

COMMON = ["data.train_files=toy:letter", "trainer.device=cpu", "trainer.val_before_train=false",
          "trainer.resume=disable", "data.max_prompt_length=64", "rollout.name=hf"]
FP32 = ["algorithm.adv_estimator=grpo", "rollout.n=4", "data.batch_size=8", "data.max_response_length=48",
        "actor.ppo_micro_batch_size_per_gpu=16", "actor.use_kl_loss=true", "actor.ppo_epochs=2"]
OFFLOAD = ["actor.param_offload=true", "actor.optimizer_offload=true", "ref.param_offload=true"]
CASES = {
    # the quickstart itself: builtin:tiny, GRPO, fp32, the lean path, the builtin decoder
    "quickstart": {"config": "examples/quickstart.yaml", "model": "builtin:tiny",
                   "set": ["actor.ppo_micro_batch_size_per_gpu=16"]},
    "fp32": {"model": "bench", "set": FP32},
    "fp32-checkpointing": {"model": "bench", "set": ["algorithm.adv_estimator=grpo", "rollout.n=4", "data.batch_size=8",
                                                    "data.max_response_length=48", "model.gradient_checkpointing=true",
                                                    "actor.ppo_micro_batch_size_per_gpu=16"]},
    "bf16": {"model": "bench", "set": ["algorithm.adv_estimator=grpo", "rollout.n=4", "data.batch_size=8",
                                      "data.max_response_length=48", "model.dtype=bfloat16",
                                      "actor.ppo_micro_batch_size_per_gpu=16", "actor.use_kl_loss=true",
                                      "actor.ppo_epochs=2"]},
    "bf16-checkpointing": {"model": "bench", "set": ["algorithm.adv_estimator=grpo", "rollout.n=4", "data.batch_size=8",
                                                    "data.max_response_length=48", "model.dtype=bfloat16",
                                                    "model.gradient_checkpointing=true",
                                                    "actor.ppo_micro_batch_size_per_gpu=16"]},
    # verl's memory settings (each against "fp32", its base: the same step with the setting off)
    "chunked": {"model": "bench", "base": "fp32", "set": [*FP32, "actor.entropy_from_logits_with_chunking=true",
                                                        "actor.entropy_from_logits_chunk_size=64",
                                                        "ref.entropy_from_logits_with_chunking=true",
                                                        "ref.entropy_from_logits_chunk_size=64"]},
    "entropy-checkpointing": {"model": "bench", "base": "fp32", "set": [*FP32, "actor.entropy_checkpointing=true"]},
    "dynamic-bsz": {"model": "bench", "base": "fp32", "set": [*FP32, "actor.use_dynamic_bsz=true",
                                                            "actor.ppo_max_token_len_per_gpu=640"]},
    "padding-free": {"model": "bench", "base": "fp32", "set": [*FP32, "model.use_remove_padding=true"]},
    # CPU offload: on the CPU the device is host memory, so the planned change of every phase's peak is none (and
    # the measured one must be none too); the gradients, freed outside the update, are the one saving here. The GPU
    # saving is measured by bench/gpu_check.py (its offload probe).
    "offload": {"model": "bench", "base": "fp32", "set": [*FP32, *OFFLOAD]},
    # LoRA (rank 8, every linear): the frozen fp32 base, adapter-only gradients and AdamW state, the reference as
    # the actor without its adapters; peft's forward (no lean path)
    "lora": {"model": "bench", "set": [*FP32, "model.lora_rank=8", "model.lora_alpha=16"]},
    "ppo-critic": {"model": "bench", "set": ["algorithm.adv_estimator=gae", "rollout.n=1", "data.batch_size=16",
                                            "data.max_response_length=48", "actor.ppo_micro_batch_size_per_gpu=8",
                                            "critic.ppo_micro_batch_size_per_gpu=8", "model.dtype=bfloat16"]},
}
# On a GPU (bench/gpu_check.py's plan check): the Qwen2.5-0.5B shape in bf16 (autocast over fp32 masters), the hf and
# the builtin engine, the phases of GRPO (reference, old log-probs), with and without checkpointing, and PPO's critic.
GPU_COMMON = ["data.train_files=toy:letter", "trainer.device=cuda", "trainer.val_before_train=false",
              "trainer.resume=disable", "data.max_prompt_length=64", "rollout.name=hf", "model.dtype=auto"]
GPU_CASES = {
    "gpu-grpo": {"model": "qwen2.5-0.5b-shape", "set": ["algorithm.adv_estimator=grpo", "rollout.n=8", "data.batch_size=16",
                                                      "data.max_response_length=256", "actor.use_kl_loss=true",
                                                      "actor.ppo_epochs=2", "actor.ppo_micro_batch_size_per_gpu=32",
                                                      "rollout.log_prob_micro_batch_size_per_gpu=32",
                                                      "ref.log_prob_micro_batch_size_per_gpu=32"]},
    # the builtin engine's GPU path: its own bf16 copy, a static KV cache, the decode step captured as a CUDA graph
    "gpu-grpo-builtin": {"model": "qwen2.5-0.5b-shape",
                         "set": ["algorithm.adv_estimator=grpo", "rollout.n=8", "data.batch_size=16",
                                 "data.max_response_length=256", "actor.ppo_micro_batch_size_per_gpu=32",
                                 "rollout.name=builtin"]},
    "gpu-grpo-checkpointing": {"model": "qwen2.5-0.5b-shape",
                               "set": ["algorithm.adv_estimator=grpo", "rollout.n=8", "data.batch_size=16",
                                       "data.max_response_length=256", "model.gradient_checkpointing=true",
                                       "actor.ppo_micro_batch_size_per_gpu=32"]},
    "gpu-ppo": {"model": "qwen2.5-0.5b-shape", "set": ["algorithm.adv_estimator=gae", "rollout.n=1", "data.batch_size=32",
                                                     "data.max_response_length=256", "actor.ppo_micro_batch_size_per_gpu=16",
                                                     "critic.ppo_micro_batch_size_per_gpu=16"]},
}
GPU_TARGET = 0.10
# bench/gpu_check.py's offload probe: gpu-grpo with and without offload (the whole step's peak and the saving)
GPU_OFFLOAD_CASES = {"gpu-grpo": GPU_CASES["gpu-grpo"],
                     "gpu-grpo-offload": {**GPU_CASES["gpu-grpo"], "set": [*GPU_CASES["gpu-grpo"]["set"], *OFFLOAD]}}

# worker method -> the plan's phase
PHASES = {"generate": "rollout", "compute_ref_log_prob": "reference log-probs", "compute_values": "critic values",
          "compute_log_prob": "old log-probs", "critic.update": "critic update", "actor.update": "actor update"}
TRANSIENT = ("weight copies", "activations", "logits")


class CpuMeter:
    """Memory on the CPU: torch.profiler's memory events of c10's CPU allocator for a call's peak beyond what existed
    before it (the same accounting torch.cuda.max_memory_allocated keeps on a GPU), and a census of the live tensors
    for what exists at a moment (every tensor Python can reach, each storage once: between and at the start of the
    workers' calls that is all of them, nothing being held by autograd there)."""

    gpu = False

    def settle(self) -> None:
        gc.collect()  # workers, engines and closures in reference cycles go now, not at the collector's next pass

    def allocated(self) -> int:
        self.settle()
        return live_tensor_bytes()

    def measure(self, fn) -> tuple[object, int]:
        """fn()'s result and the peak of the bytes it allocated beyond what existed before it."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = fn()
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            trace = Path(f.name)
        try:
            prof.export_chrome_trace(str(trace))
            events = [e for e in json.loads(trace.read_text())["traceEvents"]
                      if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0]
        finally:
            trace.unlink(missing_ok=True)
        events.sort(key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)))
        live = peak = 0
        for event in events:
            live += event["args"]["Bytes"]
            peak = max(peak, live)
        del torch
        return result, peak

    def step_peak(self, fn) -> None:
        """The whole step's peak as the allocator saw it: on the CPU there is no such counter (run_case composes it
        from the phases instead), so no third step runs."""
        return None

    def device_properties(self) -> dict:
        return {}


class CudaMeter:
    """Memory on a GPU, from the CUDA caching allocator's own counters. `cuda` is torch.cuda; the CPU tests hand in a
    stand-in with the same functions, so that every line of the GPU branch runs in CI (tests/test_gpu_check.py)."""

    gpu = True

    def __init__(self, cuda=None, record: bool = False):
        import torch

        self.cuda = cuda or torch.cuda
        self.record, self.breakdowns = record, []

    def settle(self) -> None:
        gc.collect()
        self.cuda.synchronize()
        self.cuda.empty_cache()

    def allocated(self) -> int:
        self.cuda.synchronize()
        return self.cuda.memory_allocated()

    def measure(self, fn) -> tuple[object, int]:
        """fn()'s result and its peak beyond what was allocated before it; with record set, the allocations alive at
        that peak are kept in self.breakdowns (what the GPU run says about where a phase's memory went)."""
        self.cuda.synchronize()
        self.cuda.reset_peak_memory_stats()
        before = self.cuda.memory_allocated()
        if self.record:
            try:
                self.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=500_000,
                                                        clear_history=True)
            except TypeError:  # a torch without clear_history: the window is still the last 500,000 events
                self.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=500_000)
        try:
            result = fn()
            self.cuda.synchronize()
        finally:
            if self.record:
                snapshot = self.cuda.memory._snapshot()
                self.cuda.memory._record_memory_history(enabled=None)
                self.breakdowns.append(peak_breakdown(snapshot))
        return result, self.cuda.max_memory_allocated() - before

    def step_peak(self, fn) -> int:
        """torch.cuda.max_memory_allocated over fn(): whatever was alive together at the step's highest point."""
        self.settle()
        self.cuda.reset_peak_memory_stats()
        fn()
        self.cuda.synchronize()
        return self.cuda.max_memory_allocated()

    def device_properties(self) -> dict:
        return {"gpu_memory": str(self.cuda.get_device_properties(0).total_memory)}


def peak_breakdown(snapshot: dict, top: int = 8) -> list[str]:
    """From torch.cuda.memory._snapshot() of a recorded window: the allocations made in it and alive at its peak,
    grouped by the innermost Python frame outside torch, largest first ("123.4 MiB x 24 modeling_qwen2.py:88 forward")."""
    traces = snapshot.get("device_traces") or [[]]
    events = [e for e in traces[0] if e.get("action") in ("alloc", "free_completed")]
    total = peak = peak_at = 0
    sizes: dict[int, int] = {}
    for index, event in enumerate(events):  # first pass: where the peak is
        if event["action"] == "alloc":
            sizes[event["addr"]] = event["size"]
            total += event["size"]
        else:
            total -= sizes.pop(event["addr"], 0)
        if total > peak:
            peak, peak_at = total, index
    live: dict[int, dict] = {}
    for event in events[: peak_at + 1]:  # second pass: what is alive there
        if event["action"] == "alloc":
            live[event["addr"]] = event
        else:
            live.pop(event["addr"], None)
    groups: dict[str, list[int]] = {}
    for event in live.values():
        frames = [f for f in event.get("frames", []) if "/torch/" not in f.get("filename", "")]
        where = (f"{Path(frames[0]['filename']).name}:{frames[0]['line']} {frames[0]['name']}" if frames
                 else "(no Python frame)")
        groups.setdefault(where, []).append(event["size"])
    ranked = sorted(groups.items(), key=lambda item: -sum(item[1]))[:top]
    return [f"{sum(sizes) / MiB:.1f} MiB x {len(sizes)} {where}" for where, sizes in ranked]


def live_tensor_bytes() -> int:
    """The bytes of every storage a live tensor uses, each storage once (views share theirs)."""
    import warnings

    import torch

    storages: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on some of torch's deprecated module attributes warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and not obj.is_meta:
                try:
                    storage = obj.untyped_storage()
                except (RuntimeError, NotImplementedError):  # tensor subclasses without a storage of their own
                    continue
                storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(storages.values())


def measure(fn, device: str = "cpu") -> tuple[object, int]:
    """fn()'s result and the peak of the bytes it allocated beyond what existed before (see CpuMeter, CudaMeter)."""
    return (CudaMeter() if device == "cuda" else CpuMeter()).measure(fn)


def bench_model(folder: Path) -> str:
    """bench/_models.py's BENCH_SHAPE model (random weights, the built-in tokenizer)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _models import bench_shape_model

    return bench_shape_model(folder)


def gpu_model(folder: Path) -> str:
    """The Qwen2.5-0.5B shape with random weights and the built-in tokenizer (bench/_models.py; the folder
    $VERL_BENCH_MODELS names, where set, is shared with the other GPU checks)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _models import model_dir
    from _workload import PRESETS

    return model_dir(PRESETS["gpu"], folder.parent)


def worst_error(result: dict) -> float:
    errors = [abs(row.get("error_as_run", row["error"])) for row in result["rows"]]
    if result.get("whole_step"):
        errors.append(abs(result["whole_step"]["error"]))
    return max(errors, default=0.0)


def run_case(name: str, spec: dict, model: str, workdir: Path, common: list[str] = COMMON, meter=None) -> dict:
    """One case: measured and planned, per phase and for the whole step. Memory is counted from what was allocated
    before the trainer was built, and what the case leaves behind after it is gone is reported (left_after_bytes):
    a case must not weigh on the next one's figures."""
    from verl_runtime.config import load_config

    overrides = [*common, f"model.path={model}", f"trainer.run_dir={workdir / name}", *spec["set"]]
    config_file = ROOT / spec["config"] if "config" in spec else None
    config = load_config(config_file, overrides, warn=False)
    meter = meter or (CudaMeter() if config.trainer.device == "cuda" else CpuMeter())
    meter.settle()
    baseline = meter.allocated()
    result = _run_case(name, config, config_file, overrides, meter, baseline)
    meter.settle()
    result["left_after_bytes"] = meter.allocated() - baseline
    return result


def _run_case(name: str, config, config_file, overrides: list[str], meter, baseline: int) -> dict:
    import torch

    from verl_deploy.plan import plan
    from verl_deploy.sizes import parse_gpus
    from verl_runtime.config import mini_batch_size
    from verl_runtime.rollout import SamplingParams
    from verl_runtime.trainer import SingleControllerTrainer, prompt_fields

    device = "cuda" if config.trainer.device == "cuda" else "cpu"
    torch.manual_seed(0)
    trainer = SingleControllerTrainer(config)
    prompts = trainer.load_prompts(config.data.train_files, "train")[: config.data.batch_size]
    sampling = SamplingParams(n=config.rollout.n, temperature=1.0, max_new_tokens=config.data.max_response_length)
    mini = mini_batch_size(config) * config.rollout.n
    peaks: dict[str, int] = {}
    alive: dict[str, int] = {}  # the peak of what was alive during each call: at its start, plus its own peak
    breakdowns: dict[str, list[str]] = {}  # a GPU meter's record of what was alive at each call's peak

    workers = {"actor": trainer.actor.workers[0], "ref": trainer.ref and trainer.ref.workers[0],
               "critic": trainer.critic and trainer.critic.workers[0]}
    wrapped = {"generate": ("actor", "generate"), "compute_log_prob": ("actor", "compute_log_prob"),
               "actor.update": ("actor", "update"),
               # with LoRA the reference is the actor without its adapters (no reference worker)
               "compute_ref_log_prob": ("ref" if trainer.ref else "actor", "compute_ref_log_prob"),
               "compute_values": ("critic", "compute_values"), "critic.update": ("critic", "update")}
    recording = {"on": False}
    for label, (role, method) in wrapped.items():
        worker = workers[role]
        if worker is None:
            continue
        original = getattr(worker, method)

        def traced(*args, _original=original, _label=label, _worker=worker, **kwargs):
            if not recording["on"]:
                return _original(*args, **kwargs)
            if _label.endswith(".update"):
                # The profiler sees no free of a block allocated before it started: drop the gradients here (the
                # update's own zero_grad would), so the call's peak counts them when they are made again.
                _worker.optimizer.zero_grad(set_to_none=True)
            at_start = meter.allocated() - baseline
            result, peak = meter.measure(lambda: _original(*args, **kwargs))
            peaks[_label] = max(peaks.get(_label, 0), peak)
            alive[_label] = max(alive.get(_label, 0), at_start + peak)
            if getattr(meter, "breakdowns", None):
                breakdowns[_label] = meter.breakdowns.pop()
            return result
        setattr(worker, method, traced)

    def step():
        batch = trainer.actor.generate([p.input_ids for p in prompts], sampling)
        batch.update(prompt_fields(prompts, config.rollout.n))
        scores = trainer.reward.score(batch)
        trainer._update(batch, scores, {}, mini)
        return batch

    step()  # warm-up: gradients and AdamW moments now exist
    recording["on"] = True
    batch = step()
    recording["on"] = False
    # the whole step: what the allocator held at its highest (weights, states, every phase's transients); on the
    # CPU, which keeps no such counter, the highest of what was alive during each phase (the phases hold every
    # allocation of weight; between them the controller's tensors are small)
    step_peak = meter.step_peak(step)
    composed = max(alive.values())
    for role, method in wrapped.values():  # the wrappers and the workers they name form cycles: undo them
        if workers[role] is not None:
            vars(workers[role]).pop(method, None)
    width = batch["input_ids"].shape[1] - batch["responses"].shape[1]

    actor = workers["actor"]
    static = {
        "weights": sum(p.numel() * p.element_size() for p in actor.model.parameters()),
        "gradients": sum(p.grad.numel() * p.grad.element_size() for p in actor.model.parameters() if p.grad is not None),
        "optimizer": sum(t.numel() * t.element_size() for s in actor.optimizer.state.values() for t in s.values()
                         if torch.is_tensor(t) and t.dim() > 0),
    }
    from verl_runtime.offload import resident_bytes

    between = resident_bytes(actor.model, actor.optimizer, device)  # after the step: where offload left them
    prompt_length, response_length = width, None
    if config.model.use_remove_padding:  # packed: the real tokens count; the largest micro-batch's, per sequence
        prompt_length, response_length = _packed_lengths(batch, width, config.actor.ppo_micro_batch_size_per_gpu or mini)
    # on a GPU: planned for one GPU of this one's memory, as `verl-deploy plan --gpus 1 --gpu-memory N` would
    on_gpu = ["trainer.device=cuda"] if meter.gpu else []
    predicted = plan(config_file, [*overrides, *on_gpu], runtime="verl-deploy", prompt_length=prompt_length,
                     response_length=response_length, read_data=False, with_suggestions=False,
                     gpus=parse_gpus("1") if meter.gpu else None, **meter.device_properties())
    phases = {p.name: p for p in predicted.memory.phases}
    # The lean CPU path computes each distinct prompt of a micro-batch once; the plan assumes every group's prompt
    # differs (the safe side). The quickstart's toy prompts repeat (8 templates), so the step's own count is
    # planned too, and both are reported.
    micro = config.actor.ppo_micro_batch_size_per_gpu or mini
    distinct = max(len(torch.unique(batch["input_ids"][i:i + micro, :width], dim=0))
                   for i in range(0, len(batch["input_ids"]), micro))
    as_run = None
    from verl_deploy.plan.core import _evaluate

    if config.actor.use_dynamic_bsz:
        # token budgets: the planner takes every sequence at the padded width (budget // width rows); as run, the
        # real tokens decide how many rows share a micro-batch: plan the largest micro-batch's rows too
        again = _evaluate(predicted.workload.with_(**_dynamic_rows(config, batch, mini)), predicted.model, None,
                          predicted.lengths, predicted.device)
        as_run = {p.name: p for p in again.memory.phases}
    elif distinct < -(-micro // config.rollout.n):
        again = _evaluate(predicted.workload.with_(distinct_prompts=distinct), predicted.model, None,
                          predicted.lengths, predicted.device)
        as_run = {p.name: p for p in again.memory.phases}
    rows = []
    resident_rollout = phases["actor update"].components["rollout"]
    for label, measured in peaks.items():
        phase = phases[PHASES[label]]
        guess = sum(phase.components[c] for c in TRANSIENT)
        if label.endswith(".update"):
            role = "critic" if label.startswith("critic") else "actor"
            guess += _planned_gradients(predicted, role)
        if label == "generate":
            guess += phase.components["rollout"] - resident_rollout
        row = {"case": name, "phase": phase.name, "measured_bytes": measured, "predicted_bytes": int(guess),
               "error": (guess - measured) / measured if measured else 0.0, "detail": phase.detail,
               **({"alive_at_peak": breakdowns[label]} if label in breakdowns else {})}
        exact = None
        if as_run and label != "generate" and (config.actor.use_dynamic_bsz or not label.startswith(("critic",
                                                                                                     "compute_values"))):
            exact = sum(as_run[phase.name].components[c] for c in TRANSIENT)
            if label.endswith(".update"):
                exact += _planned_gradients(predicted, "critic" if label.startswith("critic") else "actor")
        if exact is not None and exact != guess:
            why = (f" (as run: {as_run[phase.name].detail})" if config.actor.use_dynamic_bsz
                   else f" ({distinct} distinct prompts)")
            row.update({"planned_as_run_bytes": int(exact), "error_as_run": (exact - measured) / measured,
                        "distinct_prompts": distinct, "detail": phase.detail + why})
        rows.append(row)
    lora = predicted.model.lora_params(predicted.workload.lora_rank, predicted.workload.lora_targets,
                                       predicted.workload.lora_exclude)
    ref_bytes = predicted.workload.ref_bytes if predicted.workload.use_ref and not lora else 0
    # measured between steps: with param_offload that is outside the update, where its gradients are freed
    outside = phases["old log-probs"] if config.actor.param_offload and "old log-probs" in phases else None
    planned_static = {"weights": phases["actor update"].components["weights"]
                      - (ref_bytes * predicted.model.params if predicted.workload.use_ref else 0)
                      - (4 * predicted.model.critic_params if predicted.workload.use_critic else 0),
                      "gradients": (outside or phases["actor update"]).components["gradients"]
                      - (4 * predicted.model.critic_params if predicted.workload.use_critic else 0),
                      "optimizer": phases["actor update"].components["optimizer"]
                      - (8 * predicted.model.critic_params if predicted.workload.use_critic else 0)}
    exact = {key: {"measured": static[key], "predicted": int(planned_static[key])} for key in static}
    # the plan's whole step: its highest phase, less what torch does not allocate (CUDA context, allocator slack);
    # as run where the step's own prompts or token budgets were planned too
    planned = max(p.peak - p.components["overhead"] for p in (as_run or phases).values())
    measured = composed if step_peak is None else step_peak - baseline
    whole = {"measured_bytes": measured, "predicted_bytes": int(planned), "error": (planned - measured) / measured,
             "how": "composed of the phases" if step_peak is None else "max_memory_allocated",
             "composed_bytes": composed}
    return {"case": name, "device": device, "whole_step": whole, "model": config.model.path, "prompt_width": width,
            "response_width": batch["responses"].shape[1], "sequences": len(batch["responses"]), "rows": rows,
            "static": exact, "parameters": predicted.model.params, "actor_resident_between_steps": between,
            "planned_host_bytes": predicted.memory.host_bytes}


def _packed_lengths(batch: dict, width: int, micro: int) -> tuple[int, int]:
    """Per-sequence prompt and response tokens of the micro-batch with the most real tokens (what a packed
    micro-batch holds; the plan's typical lengths are per-sequence means)."""
    mask = batch["attention_mask"]
    best = max(range(0, len(mask), micro), key=lambda i: int(mask[i:i + micro].sum()))
    part = mask[best:best + micro]
    return round(float(part[:, :width].sum()) / len(part)), round(float(part[:, width:].sum()) / len(part))


def _dynamic_rows(config, batch: dict, mini: int) -> dict:
    """The largest micro-batch's rows each phase's token budget gave in this step (verl_runtime's own split)."""
    from verl_runtime.seqlen_balancing import token_budget_split
    from verl_runtime.workers.actor import token_budget

    def largest(rows: dict, budget) -> int:
        return max(len(p) for p in token_budget_split(rows, budget[0], budget[1]))

    actor, rollout, ref = config.actor, config.rollout, config.ref
    minis = [{"attention_mask": batch["attention_mask"][i:i + mini]} for i in range(0, len(batch["attention_mask"]), mini)]
    update = token_budget(config, actor.use_dynamic_bsz, actor.ppo_max_token_len_per_gpu, "actor")
    infer = token_budget(config, rollout.log_prob_use_dynamic_bsz, rollout.log_prob_max_token_len_per_gpu, "rollout")
    reference = token_budget(config, ref.log_prob_use_dynamic_bsz, ref.log_prob_max_token_len_per_gpu, "ref")
    whole = {"attention_mask": batch["attention_mask"]}
    return {"micro_update": max(largest(m, update) for m in minis), "dynamic_tokens_update": None,
            "micro_old_logprob": largest(whole, infer), "dynamic_tokens_infer": None,
            "micro_ref": largest(whole, reference), "dynamic_tokens_ref": None}


def _planned_gradients(predicted, role: str) -> int:
    """The plan's gradient bytes of one role (the phase's gradients hold the critic's too; LoRA: the adapters')."""
    w = predicted.workload
    critic = 4 * predicted.model.critic_params / (w.world if w.critic_sharded else 1) if w.use_critic else 0
    trained = predicted.model.lora_params(w.lora_rank, w.lora_targets, w.lora_exclude) or predicted.model.params
    actor = 4 * trained / (w.world if w.actor_sharded else 1)
    return int(critic if role == "critic" else actor)


def print_changes(results: list[dict]) -> float:
    """Each memory-setting case against its base (the same step without the setting): the measured and the
    planned ratio of every phase's peak; the error is the planned ratio's relative to the measured one."""
    by_name = {r["case"]: r for r in results}
    worst, lines = 0.0, []
    for result in results:
        base = by_name.get(CASES[result["case"]].get("base"))
        if base is None:
            continue
        base_rows = {row["phase"]: row for row in base["rows"]}
        for row in result["rows"]:
            before = base_rows.get(row["phase"])
            if before is None or row["phase"] == "rollout":
                continue
            measured = row["measured_bytes"] / before["measured_bytes"]
            planned = (row.get("planned_as_run_bytes", row["predicted_bytes"])
                       / before.get("planned_as_run_bytes", before["predicted_bytes"]))
            error = planned / measured - 1
            worst = max(worst, abs(error))
            lines.append(f"{result['case']:<22} {row['phase']:<20} {measured:>9.2f}x {planned:>9.2f}x {error:>+7.1%}")
    if lines:
        print(f"\n{'setting (vs its base)':<22} {'phase':<20} {'measured':>10} {'planned':>10} {'error':>7}")
        print("\n".join(lines))
    return worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", help="comma-separated cases (default: all of " + ", ".join(CASES) + ")")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(min(torch.get_num_threads(), 2))
    names = args.cases.split(",") if args.cases else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown case(s) {', '.join(unknown)}: choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    started = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="plan-accuracy-") as tmp:
        workdir = Path(tmp)
        os.environ.setdefault("VERL_DEPLOY_CACHE", str(workdir / "cache"))
        bench = None
        for name in names:
            spec = CASES[name]
            model = spec["model"]
            if model == "bench":
                bench = bench or bench_model(workdir / "bench-model")
                model = bench
            results.append(run_case(name, spec, model, workdir))
    print(f"\n{'case':<20} {'phase':<20} {'measured MiB':>13} {'predicted MiB':>14} {'error':>7}  what")
    worst = 0.0
    for result in results:
        for row in result["rows"]:
            error = row.get("error_as_run", row["error"])
            worst = max(worst, abs(error))
            predicted = row.get("planned_as_run_bytes", row["predicted_bytes"])
            first = "from the token budget" if "(as run:" in row["detail"] else "with every prompt distinct"
            extra = (f"; planned {first}: {row['predicted_bytes'] / MiB:.2f} MiB, "
                     f"{row['error']:+.1%}" if "error_as_run" in row else "")
            print(f"{row['case']:<20} {row['phase']:<20} {row['measured_bytes'] / MiB:>13.2f} "
                  f"{predicted / MiB:>14.2f} {error:>+7.1%}  {row['detail']}{extra}")
        whole = result["whole_step"]
        worst = max(worst, abs(whole["error"]))
        print(f"{result['case']:<20} {'whole step':<20} {whole['measured_bytes'] / MiB:>13.2f} "
              f"{whole['predicted_bytes'] / MiB:>14.2f} {whole['error']:>+7.1%}  {whole['how']}, weights and states "
              "included")
    worst = max(worst, print_changes(results))
    left = {r["case"]: r["left_after_bytes"] for r in results if r["left_after_bytes"] > MiB}
    if left:
        print("left allocated after a case (it weighs on the next one): "
              + ", ".join(f"{case} {size / MiB:.1f} MiB" for case, size in left.items()))
    if any(r["case"] == "offload" for r in results):
        print("offload: on the CPU the device is host memory, so the planned change of every phase's peak is none "
              "(1.00x) and the gradients leave outside the update; the GPU saving: bench/gpu_check.py --only offload")
    static_ok = all(v["measured"] == v["predicted"] for r in results for v in r["static"].values())
    print(f"\nweights, gradients, AdamW moments: {'equal to the byte' if static_ok else 'DIFFER'} "
          f"({', '.join(r['case'] for r in results)})")
    print(f"worst error {worst:.1%} (target {TARGET:.0%}); {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"target": TARGET, "worst_error": worst, "cases": results,
                                         "torch": torch.__version__}, indent=2) + "\n")
    return 0 if worst <= TARGET and static_ok else 1


if __name__ == "__main__":
    sys.exit(main())
