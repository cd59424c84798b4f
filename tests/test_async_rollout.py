"""trainer.mode=separate_async (verl_runtime/async_rollout.py): the rollout on workers of its own, overlapped with
training; verl's v1 and one-step-off keys onto it; what verl's users reported about async (a push that cut a
generation short, an "on-policy" mode that ran one step off, staleness nobody could see) held by tests."""

from __future__ import annotations

import json
import time

import pytest
import torch

from conftest import REPO
from launch_support import QUICKSTART, cli
from verl_runtime.config import load_config
from verl_runtime.errors import ConfigError
from verl_runtime.main_ppo import main as main_ppo
from verl_runtime.metrics import read_metrics
from verl_runtime.trainer import SingleControllerTrainer

ASYNC = ["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1",
         "actor_rollout_ref.rollout.n_gpus_per_node=1"]
STALENESS = "training/off_policy/trajectory_staleness"


# --- verl's keys ---------------------------------------------------------------------------------------------------

def test_verls_v1_keys_and_the_one_step_off_recipe_keys_select_separate_async():
    config = load_config(QUICKSTART, [*ASYNC, "trainer.v1.sampler.max_off_policy_threshold=2",
                                      "trainer.v1.sampler.max_off_policy_strategy=wait",
                                      "trainer.v1.separate_async.num_warmup_batches=2"])
    assert config.trainer.mode == "separate_async" and config.rollout.nnodes == 1
    assert config.trainer.sampler.max_off_policy_threshold == 2 and config.trainer.sampler.max_off_policy_strategy == "wait"
    assert config.trainer.separate_async.num_warmup_batches == 2
    # verl's one-step-off recipe on main_ppo: hybrid_engine=False, the rollout's pool under rollout.*
    recipe = load_config(None, ["actor_rollout_ref.hybrid_engine=False", "rollout.nnodes=1", "rollout.n_gpus_per_node=2",
                                "data.train_files=toy:letter", "data.train_batch_size=8",
                                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                "algorithm.rollout_correction.bypass_mode=True", "actor_rollout_ref.rollout.name=builtin"])
    assert recipe.trainer.mode == "separate_async" and recipe.rollout.n_gpus_per_node == 2
    assert recipe.trainer.separate_async.parameter_sync_step == 4  # verl's default, and 8 == 4 x 2 as verl requires


def compose(argv):
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main_ppo(["--cfg", "job", *argv])
    return code, err.getvalue().strip().splitlines()


@pytest.mark.parametrize("argv, words", [
    (["trainer.v1.trainer_mode=colocate_async"], "verl-deploy run --runtime verl"),
    (["trainer.v1.trainer_mode=separate_async", "data.train_batch_size=8",
      "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.nnodes=1"],
     "parameter_sync_step=2"),
    (["trainer.v1.trainer_mode=separate_async", "data.train_batch_size=8",
      "actor_rollout_ref.actor.ppo_mini_batch_size=2"], "needs rollout.nnodes > 0"),
    (["trainer.v1.separate_async.hybrid_rollout.enable_switch=True"], "not lent to generation"),
    (["trainer.v1.sampler.max_off_policy_strategy=sometimes"], "choose one of drop, wait"),
])
def test_what_is_not_here_is_refused_in_one_line(argv, words):
    code, lines = compose(argv)
    assert code == 2 and len(lines) == 1 and words in lines[0], lines


# --- the rollout workers: a push never cuts a generation short ------------------------------------------------------

def test_a_push_made_during_a_generation_waits_for_it_and_every_sample_names_its_version():
    from verl_runtime.async_rollout import AsyncRollout, start_rollout_workers
    from verl_runtime.models import load_causal_lm, load_tokenizer
    from verl_runtime.rollout import SamplingParams

    config = load_config(QUICKSTART, ["trainer.mode=separate_async", "rollout.name=hf"])
    tokenizer = load_tokenizer(config.model.path)
    weights_a = load_causal_lm(config.model.path, torch.float32, torch.device("cpu")).state_dict()
    torch.manual_seed(7)
    weights_b = {name: tensor + 0.5 * torch.randn_like(tensor) for name, tensor in weights_a.items()}
    prompts = [tokenizer.encode("Write the letter b.")] * 4
    greedy = SamplingParams(n=1, do_sample=False, max_new_tokens=128)  # long enough to push while it runs
    pipeline = AsyncRollout(start_rollout_workers(config, torch.device("cpu")), lookahead=2, threshold=None,
                            strategy="drop", version=0)
    try:
        pipeline.start(weights_a, torch.get_rng_state())
        generate = lambda step: (pipeline.workers.generate(prompts, greedy), {})  # noqa: E731
        pipeline.fill(1, 1, generate)
        deadline = time.monotonic() + 120
        while not pipeline.generating and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pipeline.generating
        pipeline.push(weights_b, 1)  # while step 1's generation runs
        first, _, first_metrics = pipeline.take(1, generate)
        assert pipeline.version == 1 and first_metrics[f"{STALENESS}/max"] == 0  # version 0: nothing cut, nothing new
        second, _, second_metrics = pipeline.take(2, generate)  # generated after the push
        assert second_metrics[f"{STALENESS}/max"] == 0
        pipeline.push(weights_a, 2)
        third, _, _ = pipeline.take(3, generate)
    finally:
        pipeline.close()
    assert torch.equal(first["responses"], third["responses"])  # version 0's and 2's weights are the same: A
    assert not torch.equal(first["responses"], second["responses"])  # B generated the second


# --- training ------------------------------------------------------------------------------------------------------

COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "response_length/mean",
            "critic/advantages/mean")


def train(tmp_path, name, overrides, steps=5):
    config = load_config(QUICKSTART, [f"trainer.run_dir={tmp_path / name}", f"trainer.total_training_steps={steps}",
                                      "trainer.save_hf=false", "trainer.tensorboard=false", "trainer.test_freq=-1",
                                      *overrides])
    trainer = SingleControllerTrainer(config)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return [row for row in read_metrics(tmp_path / name) if "critic/score/mean" in row]


@pytest.mark.slow
def test_with_threshold_zero_separate_async_is_on_policy_and_trains_the_numbers_of_sync(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the trainer's share of the cores in the async run, where it matters for the numbers
    try:
        sync = train(tmp_path, "sync", [])
        on_policy = train(tmp_path, "async", ["trainer.mode=separate_async",
                                              "trainer.sampler.max_off_policy_threshold=0"])
    finally:
        torch.set_num_threads(threads)
    assert [row[f"{STALENESS}/max"] for row in on_policy] == [0] * 5
    for ours, theirs in zip(on_policy, sync):
        for key in COMPARED:
            assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), (ours["step"], key)


@pytest.mark.parametrize("strategy, dropped", [("drop", True), ("wait", False)])
def test_the_threshold_bounds_staleness_by_dropping_or_waiting(tmp_path, strategy, dropped):
    rows = train(tmp_path, strategy, ["trainer.mode=separate_async", "trainer.separate_async.num_warmup_batches=2",
                                      "trainer.sampler.max_off_policy_threshold=1",
                                      f"trainer.sampler.max_off_policy_strategy={strategy}"], steps=4)
    assert all(row[f"{STALENESS}/max"] <= 1 for row in rows)
    assert (sum(row["training/off_policy/dropped_batches"] for row in rows) > 0) == dropped
    if strategy == "wait":
        assert rows[-1][f"{STALENESS}/max"] == 1  # it generates one step ahead, not two: the overlap is kept


@pytest.mark.slow
def test_the_quickstart_trains_separate_async_to_the_reward_of_sync_from_the_cli(tmp_path):
    runs = tmp_path / "runs"
    result = cli("run", QUICKSTART, "--target", "local", "--runs-dir", runs, "--run-id", "qa", "--", *ASYNC,
                 "trainer.save_hf=false")
    assert result.exit_code == 0, result.output
    rows = [row for row in read_metrics(runs / "qa") if "critic/score/mean" in row]
    assert len(rows) == 40
    staleness = [row[f"{STALENESS}/max"] for row in rows]
    assert staleness == [0] + [1] * 39  # one step off after the first, never above the threshold (8)
    assert sum(row["critic/score/mean"] for row in rows[-10:]) / 10 >= 0.85
    assert all(0 <= row["separate_async/rollout/idle_ratio"] <= 1 for row in rows)
    assert all("timing_s/sync_rollout_weights" in row and "timing_s/wait_prev_gen" in row for row in rows)
    log = (runs / "qa" / "train.log").read_text()
    assert "| stale 1.0 |" in log
    status = cli("status", "qa", "--runs-dir", runs)
    assert "stale" in status.output, status.output


# --- every target: the dry runs show both pools ---------------------------------------------------------------------

POOLS = "# pools (trainer.mode=separate_async): trainer"


def dry_run(target, *flags, rollout_gpus=1):
    result = cli("run", QUICKSTART, "--target", target, "--dry-run", "--run-id", "qa", *flags, "--",
                 "trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1",
                 f"actor_rollout_ref.rollout.n_gpus_per_node={rollout_gpus}", "trainer.device=auto")
    assert result.exit_code == 0, result.output
    return result.output


def test_docker_and_slurm_give_the_rollouts_gpus_beside_the_trainers():
    docker = dry_run("docker", "--gpus", "2")
    assert f"{POOLS} 2 GPU(s) x 1 node(s); rollout 1 GPU(s) x 1 node(s) beside the trainer's" in docker
    assert " --gpus 3 " in docker and "--set trainer.n_workers=2 " in docker  # the trainer's workers stay 2
    slurm = dry_run("slurm", "--gpus", "2")
    assert f"{POOLS} 2 GPU(s)" in slurm and "#SBATCH --gres=gpu:3" in slurm


def test_kubernetes_gives_the_rollout_a_worker_group_of_its_own_on_a_ray_cluster():
    import yaml

    image = ("--image", "registry.example/verl-deploy:0.1.0-cu128")
    one_pod = dry_run("k8s", "--gpus", "1", *image)
    job = next(o for o in yaml.safe_load_all(one_pod.split("\n", 3)[-1]) if o and o["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    ray = dry_run("k8s", "--gpus", "2", "--nodes", "2", *image, rollout_gpus=4)
    assert f"{POOLS} 2 GPU(s) x 2 node(s); rollout 4 GPU(s) x 1 node(s) of its own" in ray
    ray_job = next(o for o in yaml.safe_load_all(ray.split("\n", 3)[-1]) if o and o["kind"] == "RayJob")
    groups = {g["groupName"]: g for g in ray_job["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    assert groups["rollout"]["replicas"] == 1
    limits = lambda group: group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]  # noqa
    assert limits(groups["rollout"]) == "4" and limits(groups["workers"]) == "2"
    assert "verl_runtime.preflight_ray --nodes 3 &&" in ray_job["spec"]["entrypoint"]  # the rollout's node too
    from test_k8s import validate

    validate(ray_job)  # KubeRay's RayJob CRD schema, and the official pod schema for each group's template


@pytest.mark.slow
@pytest.mark.ray
def test_with_ray_workers_the_rollout_is_a_ray_pool_of_its_own(tmp_path, capsys, ray_session):
    # ray_session: this module's Ray (4 CPUs), shut down after it; the trainer joins it and leaves it running
    rows = train(tmp_path, "ray", ["trainer.mode=separate_async", "trainer.n_workers=2"], steps=3)
    assert "1 Ray worker(s) for rollout" in capsys.readouterr().out
    assert [row[f"{STALENESS}/max"] for row in rows] == [0, 1, 1]


# --- the GPU branches, on the CPU ----------------------------------------------------------------------------------

def test_on_gpus_each_rollout_worker_takes_the_next_gpu_after_the_trainers():
    from verl_runtime.async_rollout import rollout_placement

    config = load_config(QUICKSTART, ["trainer.mode=separate_async", "rollout.n_gpus_per_node=2", "trainer.n_workers=1"])
    envs, threads = rollout_placement(config, "cuda", ["3", "5", "6"], cores=16, threads=8)
    assert envs == [{"CUDA_VISIBLE_DEVICES": "5"}, {"CUDA_VISIBLE_DEVICES": "6"}] and threads == 8
    with pytest.raises(ConfigError, match="needs 3 GPUs .* this node sees 2"):
        rollout_placement(config, "cuda", ["0", "1"], cores=16, threads=8)
    envs, threads = rollout_placement(config, "cpu", [], cores=6, threads=6)  # the cores shared out, 2 each
    assert envs == [{}, {}] and threads == 2


def test_a_tp_line_runs_data_parallel_where_one_gpu_holds_the_model_else_names_verl():
    from verl_runtime.errors import UserError
    from verl_runtime.workers.actor import data_parallel_rollout

    from conftest import FIXTURES

    h200 = json.loads((FIXTURES / "nvml" / "h200.json").read_text())["devices"][0]["memory_total"]  # NVML's reading
    line = data_parallel_rollout(2, 16 * 2**30, h200, 0.6)  # an 8B model in bf16
    assert "runs data-parallel instead" in line and "16.00 GiB of its 84 GiB rollout share" in line
    with pytest.raises(UserError, match="do not fit one GPU's rollout share .* --runtime verl"):
        data_parallel_rollout(8, 140 * 2**30, h200, 0.6)  # a 70B model in bf16: verl runs it TP 8


# --- a fault: the rollout's worker killed mid-run --------------------------------------------------------------------

@pytest.mark.slow
def test_a_killed_rollout_worker_stops_the_run_in_one_line_and_the_completed_steps_resume(tmp_path):
    import signal
    import subprocess
    import sys

    import psutil

    from verl_runtime.checkpoint import latest_checkpoint

    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "verl_runtime", "train", str(QUICKSTART), "--set", f"trainer.run_dir={run_dir}",
               "--set", "trainer.mode=separate_async", "--set", "trainer.save_freq=2", "--set", "trainer.save_hf=false",
               "--set", "trainer.test_freq=-1", "--set", "data.max_response_length=48"]
    trainer = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and trainer.poll() is None:
            done = [row["step"] for row in read_metrics(run_dir)] if (run_dir / "metrics.jsonl").exists() else []
            if done and done[-1] >= 3:
                break
            time.sleep(0.05)
        workers = psutil.Process(trainer.pid).children()
        assert workers, "the rollout's worker process"
        for worker in workers:
            worker.send_signal(signal.SIGKILL)
        out, err = trainer.communicate(timeout=120)
    finally:
        trainer.kill()
    assert trainer.returncode not in (0, None)
    assert "Traceback" not in out + err
    last = (out + err).strip().splitlines()[-1]
    assert "the rollout worker of rank 0 died" in last and "checkpoint" in last, last
    kept = latest_checkpoint(run_dir)
    assert kept is not None  # steps 2, 4, ...: what completed is kept
    resumed = subprocess.run([*command, "--set", "trainer.total_training_steps=8"], cwd=REPO, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"Resumed from {kept}" in resumed.stdout
    assert [row["step"] for row in read_metrics(run_dir)][-1] == 8


# --- plan: each pool on its own GPUs ---------------------------------------------------------------------------------

def test_plan_plans_each_pool_on_its_own_gpus_and_says_when_the_split_fits_where_colocated_does_not():
    from conftest import FIXTURES
    from verl_deploy.plan.core import plan

    def planned(mode, utilization):
        return plan(REPO / "examples" / "gsm8k-grpo.yaml", [
            f"model.path={FIXTURES / 'models' / 'Qwen2.5-1.5B-Instruct'}", "rollout.name=vllm",
            f"trainer.mode={mode}", f"rollout.gpu_memory_utilization={utilization}"],
            gpu_type="A100-80GB", read_data=False, with_suggestions=False, this_host=False)

    colocated, split = planned("sync", 0.7), planned("separate_async", 0.7)
    names = [phase.name for phase in split.memory.phases]
    assert "rollout" not in names and "weight sync" not in names and "rollout (own GPUs)" in names
    assert all(phase.components["rollout"] == 0 for phase in split.memory.phases if phase.name != "rollout (own GPUs)")
    assert not colocated.fits and split.fits
    assert any("the split fits where colocated would not" in note for note in split.notes)
    assert any("both fit" in note for note in planned("separate_async", 0.5).notes)


@pytest.mark.slow
def test_verls_one_step_off_recipe_line_trains_on_main_ppo_with_bypass_mode(tmp_path):
    """The recipe's keys (verl/experimental/one_step_off_policy: hybrid_engine=False, rollout.nnodes /
    rollout.n_gpus_per_node, calculate_log_probs and bypass_mode as its config sets them) through main_ppo."""
    argv = ["actor_rollout_ref.hybrid_engine=False", "rollout.nnodes=1", "rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.calculate_log_probs=True", "algorithm.rollout_correction.bypass_mode=True",
            "actor_rollout_ref.rollout.name=builtin", "actor_rollout_ref.model.path=builtin:tiny",
            "data.train_files=toy:letter", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.n=2", "algorithm.adv_estimator=grpo", "data.max_response_length=8",
            "trainer.device=cpu", "trainer.total_training_steps=3", "trainer.val_before_train=False",
            "trainer.test_freq=-1", "trainer.save_freq=-1", f"trainer.run_dir={tmp_path / 'run'}"]
    assert main_ppo(argv) == 0
    rows = [row for row in read_metrics(tmp_path / "run") if f"{STALENESS}/max" in row]
    assert [row[f"{STALENESS}/max"] for row in rows] == [0, 1, 1]
    assert all("actor/pg_loss" in row for row in rows)
