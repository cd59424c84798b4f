"""SingleControllerTrainer on the CPU with a tiny real model: step(), fit(), resume, signals, divergence."""

import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch

from verl_runtime.config import ADV_ESTIMATORS, get_default_config, load_config
from verl_runtime.errors import TrainingError
from verl_runtime.metrics import read_metrics
from verl_runtime.trainer import SingleControllerTrainer

SAMPLES = [
    {"prompt": "Hello, how are you?", "response": "I'm fine, thank you!", "reward": torch.tensor(0.8)},
    {"prompt": "Hello, how are you?", "response": "Go away.", "reward": 0.1},
    {"prompt": "What is 2 + 2?", "response": "4", "reward": 1.0},
    {"prompt": "What is 2 + 2?", "response": "5", "reward": 0.0},
]


def trainer_for(algo, model_dir, **values):
    config = get_default_config(algo)
    config.model.path = str(model_dir)
    config.trainer.device = "cpu"
    for dotted, value in values.items():
        section, key = dotted.split("__")
        setattr(getattr(config, section), key, value)
    return SingleControllerTrainer(config)


def actor_params(trainer):
    return [p.detach().clone() for p in trainer.actor.workers[0].model.parameters()]


@pytest.mark.parametrize("algo", ["ppo", "grpo", "rloo", "reinforce_plus_plus"])
def test_step_is_one_policy_update_with_a_finite_loss(algo, tiny_model_dir, capsys):
    trainer = trainer_for(algo, tiny_model_dir)
    before = actor_params(trainer)
    output = trainer.step(SAMPLES)
    assert isinstance(output["loss"], float) and math.isfinite(output["loss"])
    assert output["critic/score/mean"] == pytest.approx(0.475)
    assert any(not torch.equal(a, b) for a, b in zip(before, actor_params(trainer)))
    assert ("critic/vf_loss" in output) == (algo == "ppo")  # a critic only for GAE
    if algo == "grpo":  # groups are the samples of one prompt: advantages are +-1/sqrt(2) * (1/(std + eps))
        assert output["critic/advantages/max"] == pytest.approx(-output["critic/advantages/min"], rel=1e-4)
    out = capsys.readouterr().out
    assert "[INFO] Initializing SingleControllerTrainer..." in out
    assert f"[INFO] Loading pretrained model from {tiny_model_dir}" in out


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_accumulate_to_the_same_update(loss_agg_mode, tiny_model_dir):
    """The loss is normalised over the whole mini-batch, so micro-batching does not change the update."""
    results = []
    for micro in (None, 1):
        torch.manual_seed(0)
        trainer = trainer_for(
            "grpo", tiny_model_dir, actor__ppo_micro_batch_size_per_gpu=micro, actor__loss_agg_mode=loss_agg_mode,
            actor__lr=1e-3,
        )
        output = trainer.step(SAMPLES)
        results.append((output["actor/pg_loss"], output["actor/grad_norm"], actor_params(trainer)))
    (loss_whole, norm_whole, params_whole), (loss_micro, norm_micro, params_micro) = results
    assert loss_micro == pytest.approx(loss_whole, abs=1e-6)
    assert norm_micro == pytest.approx(norm_whole, rel=1e-4)  # the same gradient, not a rescaled one
    for a, b in zip(params_whole, params_micro):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def short_run(run_dir, *extra):
    return load_config(None, [
        "model.path=builtin:tiny", "trainer.device=cpu", f"trainer.run_dir={run_dir}",
        "data.toy_size=32", "data.batch_size=4", "data.max_response_length=8", "data.max_prompt_length=64",
        *extra,
    ])


def comparable(metrics):
    return [{k: v for k, v in m.items() if not k.startswith(("timing_s/", "timing_per_token_ms/", "perf/throughput", "perf/time"))} for m in metrics]


def test_resume_gives_the_same_metrics_as_a_straight_run(tmp_path, tiny_model_dir, monkeypatch):
    """PPO with a critic, KL in the reward (adaptive), two epochs over two mini-batches, micro-batches of one."""
    settings = [
        f"model.path={tiny_model_dir}", "actor.lr=1e-3", "critic.lr=1e-3", "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.type=adaptive", "actor.ppo_epochs=2", "actor.ppo_mini_batch_size=2",
        "actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1",
    ]
    SingleControllerTrainer(short_run(tmp_path / "straight", *settings, "trainer.total_training_steps=4")).fit()
    SingleControllerTrainer(short_run(tmp_path / "resumed", *settings, "trainer.total_training_steps=2")).fit()
    SingleControllerTrainer(short_run(tmp_path / "resumed", *settings, "trainer.total_training_steps=4")).fit()
    straight, resumed = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    assert comparable(resumed) == comparable(straight)


def test_fit_writes_verl_metrics_validation_and_checkpoints(tmp_path, tiny_model_dir):
    config = short_run(
        tmp_path, f"model.path={tiny_model_dir}", "algorithm.adv_estimator=grpo", "rollout.n=2",
        "data.val_files=toy:letter", "trainer.test_freq=2", "trainer.save_freq=1", "trainer.keep_last=2",
        "trainer.total_training_steps=3", "trainer.val_before_train=false",
    )
    SingleControllerTrainer(config).fit()
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for name in ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy",
                 "actor/grad_norm", "timing_s/gen", "timing_s/ref", "timing_s/update_actor", "timing_s/step",
                 "perf/throughput"):
        assert name in metrics[0], name
    assert "timing_s/old_log_prob" not in metrics[0]  # on-policy: the actor's own forward pass gives them
    assert "val-core/toy/letter/reward/mean@1" in metrics[1] and "val-core/toy/letter/reward/mean@1" in metrics[2]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()) == ["step_2", "step_3"]
    assert "adv_estimator: grpo" in (tmp_path / "config.yaml").read_text()


def test_a_nan_reward_stops_training_and_keeps_the_last_checkpoint(tmp_path, tiny_model_dir):
    reward = tmp_path / "reward.py"
    reward.write_text(
        "import os\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float('nan') if os.path.exists(os.environ['NAN_FLAG']) else 0.5\n"
    )
    flag = tmp_path / "nan-now"
    os.environ["NAN_FLAG"] = str(flag)
    config = short_run(tmp_path / "run", f"model.path={tiny_model_dir}", f"reward.function={reward}:compute_score",
                       "trainer.save_freq=1", "trainer.total_training_steps=1")
    SingleControllerTrainer(config).fit()
    flag.touch()
    config.trainer.total_training_steps = 3
    with pytest.raises(TrainingError, match=r"step 2: the reward is not finite for 4 of 4 samples.*checkpoints/step_1 is kept"):
        SingleControllerTrainer(config).fit()
    assert (tmp_path / "run" / "checkpoints" / "step_1").is_dir()
    assert not (tmp_path / "run" / "checkpoints" / "step_2").exists()


def test_sigterm_saves_a_checkpoint_after_the_step_and_resume_continues(tmp_path, tiny_model_dir):
    reward = tmp_path / "reward.py"
    # The reward function of step 2 asks the process to stop, as a scheduler's SIGTERM would.
    reward.write_text(
        "import os, signal\n"
        "calls = 0\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    if calls == 5 and os.environ.get('STOP_AT_STEP_2'):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return 0.5\n"
    )
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {{path: {tiny_model_dir}}}\n"
        f"reward: {{function: '{reward}:compute_score'}}\n"
        "data: {toy_size: 16, batch_size: 4, max_response_length: 4}\n"
        "algorithm: {adv_estimator: reinforce_plus_plus}\n"
        "rollout: {n: 1}\n"
        f"trainer: {{device: cpu, total_training_steps: 3, run_dir: {tmp_path / 'run'}}}\n"
    )
    args = [sys.executable, "-m", "verl_runtime", "train", str(config)]
    stopped = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "STOP_AT_STEP_2": "1"}, cwd=tmp_path)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    assert "SIGTERM: stopped after step 2" in stopped.stdout
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.is_dir()] == ["step_2"]
    resumed = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "Resumed from" in resumed.stdout and "step 3/3" in resumed.stdout
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_bf16_compute_keeps_fp32_weights(tiny_model_dir):
    """As on a GPU: forward passes autocast to bf16, the trained weights and their updates stay fp32."""
    trainer = trainer_for("ppo", tiny_model_dir, model__dtype="bfloat16")
    output = trainer.step(SAMPLES)
    assert math.isfinite(output["loss"])
    assert {p.dtype for p in trainer.actor.workers[0].model.parameters()} == {torch.float32}
    assert {p.dtype for p in trainer.critic.workers[0].model.parameters()} == {torch.float32}


def test_gradient_checkpointing_gives_the_same_update(tiny_model_dir):
    outputs = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        trainer = trainer_for("ppo", tiny_model_dir, model__gradient_checkpointing=checkpointing)
        outputs.append(trainer.step(SAMPLES))
    plain, checkpointed = outputs
    for name in ("loss", "actor/grad_norm", "critic/grad_norm"):
        assert checkpointed[name] == pytest.approx(plain[name], rel=1e-5), name


@pytest.mark.parametrize("estimator", [e for e in ADV_ESTIMATORS if e != "gae"])
def test_every_estimator_the_config_accepts_trains_a_step(tmp_path, estimator):
    config = short_run(tmp_path, f"algorithm.adv_estimator={estimator}", "trainer.total_training_steps=1",
                       "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1")
    assert config.rollout.n > 1, "a group estimator gets the group preset's samples per prompt"
    SingleControllerTrainer(config).fit()
    (record,) = read_metrics(tmp_path)
    assert record["step"] == 1 and math.isfinite(record["actor/pg_loss"])
