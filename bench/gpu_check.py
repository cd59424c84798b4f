"""The GPU check: what this project claims on a GPU, run on a CUDA machine with only torch and transformers (no
Docker, vLLM or Ray needed), summarised in one JSON file.

    make gpu-check                                  # = python bench/gpu_check.py --out runs/gpu-check.json
    python bench/gpu_check.py --preset cpu          # a rehearsal of every step on the CPU (tiny model)

Checks, each pass / fail / skip with its figures:
    nvml        doctor's NVIDIA checks on this driver (verl_deploy.doctor)
    greedy      the builtin engine's GPU path (its own weights, a static KV cache, the step captured as a CUDA graph)
                against transformers' generate: in fp32 the same greedy tokens on every row; in bf16 the captured step
                gives the tokens of the same step run eagerly, and how many rows equal transformers' is reported
                (two bf16 implementations round differently)
    generation  tokens/s of builtin and hf at the preset's batch (gpu: 256 sequences x 256 new tokens); target:
                builtin >= 80k tokens/s (issue #39)
    grpo        GRPO s/step through verl_runtime with builtin and hf (and against TRL's recorded 9.7 s/step on the
                same preset and GPU, issue #13); target: builtin <= 1.6 s/step (issue #39)
    plan        `verl-deploy plan`'s per-phase prediction against torch.cuda.max_memory_allocated for our runtime's
                steps (bench/plan_accuracy.py's GPU cases: the Qwen2.5-0.5B shape in bf16, GRPO with the hf and the
                builtin engine, with checkpointing, PPO with a critic), and the whole step's peak; target: within 10%
                for every phase of 1 GiB or more and the whole step; what was alive at each phase's peak is recorded
    offload     GRPO with CPU offload (actor.param_offload, optimizer_offload, ref.param_offload) against the plan
                case without it: the whole step's peak against the plan, the saving measured against the saving
                planned (target: at least 80% of it), and the actor's state on the GPU between steps (0 bytes)
    multi_gpu   2 workers, data-parallel and FSDP, where there are 2+ GPUs and Ray is installed
    trl         TRL's GRPOTrainer on the same preset, where TRL is installed (last: it needs wheels a bare machine
                lacks), and ours against it in the same run

Every line of the GPU branch also runs on the CPU in CI, torch.cuda's calls stood in (tests/test_gpu_check.py).
Without a CUDA GPU, the gpu preset says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
BENCH = Path(__file__).resolve().parent
# verl_runtime and verl_deploy from this checkout, and the pure-Python wheels `make gpu-check-wheels` put in
# .gpu-wheels/ (nvidia-ml-py for the NVML checks), importable as they are; the bench scripts it starts see them too.
PATHS = [str(BENCH.parent), str(BENCH.parent / "installer"), *map(str, sorted((BENCH.parent / ".gpu-wheels").glob("*.whl")))]
sys.path[:0] = PATHS
os.environ["PYTHONPATH"] = os.pathsep.join([*PATHS, *filter(None, [os.environ.get("PYTHONPATH")])])

from _workload import PRESETS, chat, prompt_texts  # noqa: E402

TARGETS = {"generation_tokens_per_s": 80_000, "grpo_s_per_step": 1.6, "plan_error": 0.10, "offload_saving": 0.80}
TRL_RECORDED_S_PER_STEP = 9.7  # TRL's GRPOTrainer on the gpu preset, one H200 (issue #13)
PLAN_PHASE_FLOOR = 2**30  # phases smaller than this are reported, not judged (their share of a step is noise)


@dataclass
class Rig:
    """Where the checks run: a CUDA GPU (torch.cuda), or the CPU standing in for one. A stand-in rig runs every line
    of the GPU branch with `cuda` a stand-in for torch.cuda, a tiny model and short responses (extra overrides)."""

    gpu: bool  # the GPU branch: its cases, meters and judgements
    device: str  # what the trainer runs on: cuda, or cpu for a rehearsal or a stand-in
    preset: str  # the bench scripts' preset (gpu needs CUDA)
    cuda: object = None  # torch.cuda or a stand-in
    extra: list[str] = field(default_factory=list)  # appended to every plan case (a stand-in's smaller steps)

    @classmethod
    def of(cls, preset: str) -> Rig:
        if preset == "gpu":
            import torch

            return cls(True, "cuda", "gpu", torch.cuda)
        return cls(False, "cpu", "cpu")

    def meter(self, record: bool = False):
        import plan_accuracy

        return plan_accuracy.CudaMeter(self.cuda, record) if self.gpu else plan_accuracy.CpuMeter()

    def model(self, workdir: Path) -> str:
        import plan_accuracy

        if self.gpu and self.device == "cuda":
            return plan_accuracy.gpu_model(workdir / "qwen2.5-0.5b-shape")
        return plan_accuracy.bench_model(workdir / "bench-model")

    def common(self) -> list[str]:
        import plan_accuracy

        if self.device == "cuda":
            return plan_accuracy.GPU_COMMON
        return [o.replace("trainer.device=cuda", "trainer.device=cpu") for o in plan_accuracy.GPU_COMMON]


# --- the checks ---------------------------------------------------------------------------------------------------


def nvml(rig: Rig, state: dict) -> dict:
    import torch

    from verl_deploy.doctor import diagnose

    if rig.device == "cuda" and torch.cuda.is_available() and importlib.util.find_spec("pynvml") is None:
        return {"status": "fail", "failed": ["nvidia-ml-py is not installed: `make gpu-check-wheels` carries it"]}
    findings = [f for f in diagnose().findings if f.area == "nvidia"]
    failed = [f"{f.name}: {f.message}" for f in findings if f.status == "fail"]
    return {"status": "fail" if failed else "pass", "failed": failed,
            "findings": {f.name: f"{f.status}: {f.message}" for f in findings}}


def greedy(rig: Rig, state: dict, new_tokens: int = 32) -> dict:
    """The builtin engine's GPU path against transformers' generate, greedily, from one model object."""
    import torch

    from verl_runtime.models import load_causal_lm, load_tokenizer
    from verl_runtime.rollout import SamplingParams, make_rollout_engine
    from verl_runtime.rollout.builtin import BuiltinRolloutEngine

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as d:
        path = rig.model(Path(d))
        tokenizer = load_tokenizer(path)
        prompts = [tokenizer.apply_chat_template(chat(t), add_generation_prompt=True, tokenize=True,
                                                 return_dict=False) for t in prompt_texts(8)]
        params = SamplingParams(n=1, max_new_tokens=new_tokens, do_sample=False)
        graph = {"static_cache": True} if rig.device == "cpu" else {}  # the GPU path, eagerly on the CPU
        result = {}
        for dtype in ("float32", "bfloat16"):
            model = load_causal_lm(path, getattr(torch, dtype), rig.device)
            captured = BuiltinRolloutEngine(model, tokenizer, rig.device, **graph).generate(prompts, params).responses
            theirs = make_rollout_engine("hf", model, tokenizer, rig.device).generate(prompts, params).responses
            eager = BuiltinRolloutEngine(model, tokenizer, rig.device, compile=False, **graph).generate(prompts, params)
            result[dtype] = {"rows_equal_transformers": int((captured == theirs).all(dim=1).sum()),
                             "captured_equals_eager": bool(torch.equal(captured, eager.responses))}
            del model
    ok = result["float32"]["rows_equal_transformers"] == len(prompts) and all(
        r["captured_equals_eager"] for r in result.values())
    return {"status": "pass" if ok else "fail", "rows": len(prompts), "new_tokens": new_tokens, **result}


def bench(script: str, preset: str, args: list[str], timeout_s: int) -> tuple[dict | None, str]:
    """Run one bench/ script with --json; its results and the tail of what it printed."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as d:
        out = Path(d) / "result.json"
        cmd = [sys.executable, str(BENCH / script), "--preset", preset, *args, "--json", str(out)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout_s} s"
        text = (done.stdout + done.stderr).strip()
        return (json.loads(out.read_text()) if done.returncode == 0 and out.exists() else None), text[-1500:]


def generation(rig: Rig, state: dict) -> dict:
    result, printed = bench("generation.py", rig.preset, ["--engines", "builtin,hf", "--calls", "3", "--warmup", "1"],
                            600)
    if result is None:
        return {"status": "fail", "output": printed}
    speeds = {name: round(r["tokens_per_s"]) for name, r in result["engines"].items()}
    target = TARGETS["generation_tokens_per_s"] if rig.gpu else None
    status = "pass" if not target or speeds["builtin"] >= target else "fail"
    return {"status": status, "tokens_per_s": speeds, "target_builtin": target,
            "builtin_vs_hf": round(speeds["builtin"] / speeds["hf"], 2)}


def grpo(rig: Rig, state: dict) -> dict:
    """Our GRPO steps with builtin and hf (TRL's beside them is the trl check, run last: a TRL that does not import
    on a machine costs no other figure)."""
    result, printed = bench("grpo_vs_trl.py", rig.preset, ["--only", "ours", "--engines", "builtin,hf", "--steps", "3",
                                                           "--warmup", "1"], 900)
    if result is None:
        return {"status": "fail", "output": printed}
    s_per_step = {f"ours-{r['engine']}": round(r["median_s"], 3) for r in result["rounds"][0]}
    state["grpo"] = s_per_step
    ours = s_per_step["ours-builtin"]
    check = {"s_per_step": s_per_step, "steps": result["steps"]}
    if rig.gpu:
        check["builtin_vs_trl_recorded"] = round(TRL_RECORDED_S_PER_STEP / ours, 2)
    target = TARGETS["grpo_s_per_step"] if rig.gpu else None
    return {"status": "pass" if not target or ours <= target else "fail", **check, "target_builtin_s": target}


def trl(rig: Rig, state: dict) -> dict:
    """TRL's GRPOTrainer on the same preset, where TRL is installed: its s/step, and ours (the grpo check's) against
    it, in the same run."""
    if importlib.util.find_spec("trl") is None:
        return {"status": "skip", "why": "TRL is not installed (carry its wheels: trl, datasets, dill, multiprocess)"}
    result, printed = bench("grpo_vs_trl.py", rig.preset, ["--only", "trl", "--steps", "3", "--warmup", "1"], 900)
    if result is None:
        return {"status": "fail", "output": printed}
    theirs = round(result["rounds"][0][0]["median_s"], 3)
    ours = state.get("grpo", {})
    ratios = {f"{name}_vs_trl": round(theirs / value, 2) for name, value in ours.items()}
    return {"status": "pass", "trl_s_per_step": theirs, **ratios}


def multi_gpu(rig: Rig, state: dict) -> dict:
    import torch

    if not rig.gpu or rig.device != "cuda" or torch.cuda.device_count() < 2:
        return {"status": "skip", "why": "fewer than 2 GPUs"}
    if importlib.util.find_spec("ray") is None:
        return {"status": "skip", "why": "several workers run as Ray actors and Ray is not installed"}
    result, printed = bench("grpo_vs_trl.py", rig.preset, ["--only", "ours", "--engines", "builtin", "--steps", "2",
                                                           "--warmup", "1", "--workers", "2"], 900)
    return {"status": "pass" if result else "fail", "output": printed[-600:]}


def plan(rig: Rig, state: dict) -> dict:
    """The planner against what the allocator held: each phase's peak beyond what existed before it, and the whole
    step's; the gpu cases on a GPU (the cpu preset rehearses the quickstart case, with the CPU benchmark's target)."""
    import plan_accuracy

    with tempfile.TemporaryDirectory(prefix="gpu-check-plan-") as d:
        workdir = Path(d)
        os.environ.setdefault("VERL_DEPLOY_CACHE", str(workdir / "cache"))
        if rig.gpu:
            model = rig.model(workdir)
            results = [plan_accuracy.run_case(name, _case(spec, rig), model, workdir, rig.common(), rig.meter(True))
                       for name, spec in plan_accuracy.GPU_CASES.items()]
        else:
            spec = plan_accuracy.CASES["quickstart"]
            results = [plan_accuracy.run_case("quickstart", spec, spec["model"], workdir, meter=rig.meter())]
    state["plan"] = {r["case"]: r for r in results}
    target = TARGETS["plan_error"] if rig.gpu else plan_accuracy.TARGET
    judged = [abs(row.get("error_as_run", row["error"])) for r in results for row in r["rows"]
              if not rig.gpu or max(row["measured_bytes"], row["predicted_bytes"]) >= PLAN_PHASE_FLOOR]
    judged += [abs(r["whole_step"]["error"]) for r in results]
    worst = max(judged)
    figures = {f"{r['case']} {row['phase']}": f"{row['measured_bytes'] / 2**20:.0f} MiB measured, "
               f"{row.get('planned_as_run_bytes', row['predicted_bytes']) / 2**20:.0f} planned "
               f"({row.get('error_as_run', row['error']):+.1%})" for r in results for row in r["rows"]}
    figures.update({f"{r['case']} whole step": f"{r['whole_step']['measured_bytes'] / 2**30:.2f} GiB "
                    f"({r['whole_step']['how']}), {r['whole_step']['predicted_bytes'] / 2**30:.2f} planned "
                    f"({r['whole_step']['error']:+.1%})" for r in results})
    alive = {f"{r['case']} {row['phase']}": row["alive_at_peak"] for r in results for row in r["rows"]
             if row.get("alive_at_peak")}
    left = {r["case"]: r["left_after_bytes"] for r in results if r["left_after_bytes"] > 2**20}
    return {"status": "pass" if worst <= target else "fail", "worst_error": round(worst, 4), "target": target,
            "figures": figures, **({"left_after_case_bytes": left} if left else {}), "alive_at_peak": alive}


def offload(rig: Rig, state: dict) -> dict:
    """CPU offload against the same step without it (the plan check's case, or run here): the whole step's peak
    against the plan, the saving measured against the saving planned, the actor's state on the device between steps."""
    import plan_accuracy

    with tempfile.TemporaryDirectory(prefix="gpu-check-offload-") as d:
        workdir = Path(d)
        os.environ.setdefault("VERL_DEPLOY_CACHE", str(workdir / "cache"))
        if rig.gpu:
            model = rig.model(workdir)
            cases = dict(plan_accuracy.GPU_OFFLOAD_CASES)
            plain = state.get("plan", {}).get("gpu-grpo") or plan_accuracy.run_case(
                "gpu-grpo", _case(cases["gpu-grpo"], rig), model, workdir, rig.common(), rig.meter())
            off = plan_accuracy.run_case("gpu-grpo-offload", _case(cases["gpu-grpo-offload"], rig), model, workdir,
                                         rig.common(), rig.meter())
        else:
            spec = plan_accuracy.CASES["quickstart"]
            plain, off = (plan_accuracy.run_case(name, {**spec, "set": [*spec["set"], *extra]}, spec["model"], workdir,
                                                 meter=rig.meter())
                          for name, extra in (("quickstart", []), ("quickstart-offload", plan_accuracy.OFFLOAD)))
    figures = {"actor state on the device between steps, with offload": off["actor_resident_between_steps"],
               "planned host memory for the offloaded state": f"{off['planned_host_bytes'] / 2**30:.2f} GiB"}
    if not rig.gpu:  # the CPU: the moves are no-ops; per-phase peaks must not change, as planned
        ratios = [row["measured_bytes"] / base["measured_bytes"] for row, base in zip(off["rows"], plain["rows"])
                  if base["measured_bytes"]]
        worst = max(abs(r - 1) for r in ratios)
        figures["per-phase peak, offload / plain (planned 1.00: device is host memory)"] = [round(r, 3) for r in ratios]
        return {"status": "pass" if worst <= plan_accuracy.TARGET else "fail", "worst_error": round(worst, 4),
                "figures": figures}
    measured = {r["case"]: r["whole_step"]["measured_bytes"] for r in (plain, off)}
    planned = {r["case"]: r["whole_step"]["predicted_bytes"] for r in (plain, off)}
    saving = {"measured": measured["gpu-grpo"] - measured["gpu-grpo-offload"],
              "planned": planned["gpu-grpo"] - planned["gpu-grpo-offload"]}
    worst = max(abs(r["whole_step"]["error"]) for r in (plain, off))
    for r in (plain, off):
        figures[f"{r['case']} whole step"] = (f"{r['whole_step']['measured_bytes'] / 2**30:.2f} GiB "
                                              f"max_memory_allocated, {r['whole_step']['predicted_bytes'] / 2**30:.2f} "
                                              f"planned ({r['whole_step']['error']:+.1%})")
    figures["saving"] = f"{saving['measured'] / 2**30:.2f} GiB measured, {saving['planned'] / 2**30:.2f} planned"
    left = off["actor_resident_between_steps"]
    enough = saving["measured"] >= TARGETS["offload_saving"] * saving["planned"] and saving["measured"] > 0
    ok = worst <= TARGETS["plan_error"] and enough and left["params"] == left["optimizer"] == 0
    return {"status": "pass" if ok else "fail", "worst_error": round(worst, 4), "target": TARGETS["plan_error"],
            "saving_measured_over_planned": round(saving["measured"] / saving["planned"], 3) if saving["planned"]
            else None, "figures": figures}


def _case(spec: dict, rig: Rig) -> dict:
    return {**spec, "set": [*spec["set"], *rig.extra]}


CHECKS = {"nvml": nvml, "greedy": greedy, "generation": generation, "grpo": grpo, "plan": plan, "offload": offload,
          "multi_gpu": multi_gpu, "trl": trl}


def run_checks(rig: Rig, wanted: list[str], out: Path) -> dict:
    """Each check in turn (one that breaks is a failed check; the others still run), a line per check, the summary
    written to out."""
    import torch

    summary = {"preset": rig.preset, "torch": torch.__version__, "cuda": torch.version.cuda,
               "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
               if rig.device == "cuda" else [], "commit": _commit(), "checks": {}}
    state: dict = {}  # what a check leaves for a later one (the plan check's plain GRPO case, for offload)
    with tempfile.TemporaryDirectory(prefix="gpu-check-models-") as models:
        os.environ.setdefault("VERL_BENCH_MODELS", models)  # one random Qwen2.5-0.5B shape for every check
        for name in wanted:
            started = time.monotonic()
            try:
                result = CHECKS[name](rig, state)
            except Exception as exc:  # a check that breaks is a failed check; the others still run
                result = {"status": "fail", "error": f"{type(exc).__name__}: {exc}"[:800]}
            result["seconds"] = round(time.monotonic() - started, 1)
            summary["checks"][name] = result
            shown = {k: v for k, v in result.items() if k not in ("status", "seconds", "output", "findings",
                                                                  "alive_at_peak")}
            print(f"gpu-check {name}: {result['status']} ({result['seconds']} s) {json.dumps(shown)}", flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(summary, indent=2) + "\n")  # after every check: a cut-off run keeps the rest
    return summary


def _commit() -> str | None:
    """The checkout's commit ($GPU_CHECK_COMMIT where the tree travelled without its .git)."""
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=BENCH.parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="gpu")
    p.add_argument("--out", type=Path, default=Path("runs/gpu-check.json"), help="the JSON summary")
    p.add_argument("--only", help="comma-separated checks to run (default: all of " + ", ".join(CHECKS) + ")")
    args = p.parse_args(argv)
    import torch

    if PRESETS[args.preset].device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU is visible here (torch.cuda.is_available() is False): run it on a machine "
              "with an NVIDIA GPU, or rehearse it with --preset cpu", file=sys.stderr)
        return 2
    wanted = args.only.split(",") if args.only else list(CHECKS)
    unknown = [name for name in wanted if name not in CHECKS]
    if unknown:
        p.error(f"unknown check(s) {', '.join(unknown)}: choose from {', '.join(CHECKS)}")
    summary = run_checks(Rig.of(args.preset), wanted, args.out)
    failed = [name for name, r in summary["checks"].items() if r["status"] == "fail"]
    print(f"gpu-check: {len(wanted) - len(failed)} of {len(wanted)} checks did not fail; summary: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
