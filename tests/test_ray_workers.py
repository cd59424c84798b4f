"""Worker groups on Ray, on the CPU: data-parallel training over gloo gives the one-worker update, a GRPO run on
two workers matches one worker, placements that cannot fit fail in one line, and a killed worker ends the run
naming it while its last checkpoint resumes (into one worker: checkpoints load into any worker count)."""

import threading
import time

import pytest
import torch

from verl_runtime.checkpoint import latest_checkpoint, load_checkpoint
from verl_runtime.config import get_default_config, load_config
from verl_runtime.errors import ConfigError, TrainingError
from verl_runtime.metrics import read_metrics
from verl_runtime.trainer import SingleControllerTrainer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

SAMPLES = [
    {"prompt": "Hello, how are you?", "response": "I'm fine, thank you!", "reward": 0.8},
    {"prompt": "Hello, how are you?", "response": "Go away.", "reward": 0.1},
    {"prompt": "What is 2 + 2?", "response": "4", "reward": 1.0},
    {"prompt": "What is 2 + 2?", "response": "5", "reward": 0.0},
]


def grpo(**values):
    config = get_default_config("grpo")
    config.trainer.device = "cpu"
    for dotted, value in values.items():
        section, key = dotted.split("__")
        setattr(getattr(config, section), key, value)
    return config


def short_run(run_dir, *extra):
    return load_config(None, [
        "algorithm.adv_estimator=grpo", "rollout.n=2", "trainer.device=cpu", f"trainer.run_dir={run_dir}",
        "data.toy_size=32", "data.batch_size=4", "data.max_response_length=8", "data.max_prompt_length=64", *extra,
    ])


def model_state(trainer):
    return trainer.actor.state_dict()[0]["model"]


@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_two_workers_take_the_same_update_as_one(strategy):
    """Loss aggregation stays global: 2 workers x B/2 samples (micro-batches of one) give 1 worker x B's gradient."""
    settings = dict(actor__lr=1e-3, actor__ppo_micro_batch_size_per_gpu=1, actor__strategy=strategy)
    one = SingleControllerTrainer(grpo(**settings))
    two = SingleControllerTrainer(grpo(**settings, trainer__n_workers=2))
    try:
        assert two.actor.world_size == 2
        expected, got = one.step(SAMPLES), two.step(SAMPLES)
        for name in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy"):
            assert got[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-7), name
        for name, tensor in model_state(one).items():
            # Adam's first step is lr x g / (|g| + eps): ~lr x sign(g), but for gradients near eps (1e-8) it follows
            # their rounding noise, and one worker computes them on the lean forward while FSDP runs the model's.
            torch.testing.assert_close(model_state(two)[name], tensor, rtol=0, atol=5e-5)
        with pytest.raises(TrainingError, match="step\\(\\) on 2 workers needs a multiple of 2 samples"):
            two.step(SAMPLES[:3])
    finally:
        two.close()


def test_grpo_on_two_workers_matches_one_worker(tmp_path):
    """Rank 0 samples the whole batch from the same random stream, so the runs see the same samples; step 2's samples
    come from the updated weights (with FSDP, rank 0's whole copy for the rollout, refreshed in memory)."""
    settings = ["trainer.total_training_steps=2", "actor.lr=3e-3"]
    SingleControllerTrainer(short_run(tmp_path / "one", *settings)).fit()
    expected_metrics = read_metrics(tmp_path / "one")
    for strategy in ("dp", "fsdp"):
        two = SingleControllerTrainer(short_run(tmp_path / strategy, *settings, "trainer.n_workers=2",
                                                f"actor.strategy={strategy}"))
        two.fit()
        two.close()
        metrics = read_metrics(tmp_path / strategy)
        assert [m["step"] for m in metrics] == [1, 2]
        for expected, got in zip(expected_metrics, metrics):
            for name in ("critic/score/mean", "response_length/mean", "critic/advantages/max"):
                assert got[name] == expected[name], (strategy, name)
            for name in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy"):
                assert got[name] == pytest.approx(expected[name], rel=1e-4, abs=1e-6), (strategy, name)
            assert 0 <= got["timing_s/controller"] < got["timing_s/step"]


@pytest.mark.parametrize("settings, message", [
    ({"trainer__n_workers": 8}, r"^the placement needs 8 CPUs \(trainer.n_workers=8 x 1\) but the Ray cluster has 4: "
                                r"lower trainer.n_workers or trainer.cpus_per_worker, or add nodes$"),
    ({"trainer__n_workers": 2, "trainer__device": "cuda"}, r"^the placement needs 2 GPUs .* the Ray cluster has 0"),
    ({"trainer__n_workers": 2, "trainer__cpus_per_worker": 3}, r"^the placement needs 6 CPUs"),
])
def test_a_placement_that_does_not_fit_is_one_line(settings, message):
    with pytest.raises(ConfigError, match=message):
        SingleControllerTrainer(grpo(**settings))


def test_split_placement_gives_the_critic_its_own_workers():
    config = get_default_config("ppo")
    config.trainer.device, config.trainer.n_workers, config.trainer.placement = "cpu", 2, "split"
    trainer = SingleControllerTrainer(config)
    try:
        assert trainer.critic.pool is not trainer.actor.pool and trainer.critic.world_size == 2
        assert trainer.ref is None or trainer.ref.pool is trainer.actor.pool
        output = trainer.step(SAMPLES)
        assert "critic/vf_loss" in output and "actor/pg_loss" in output
    finally:
        trainer.close()
    config.trainer.n_workers = 4
    with pytest.raises(ConfigError, match=r"needs 8 CPUs \(trainer.n_workers=4 x 2 pools \(trainer.placement=split\)"):
        SingleControllerTrainer(config)


def test_a_killed_worker_ends_the_run_naming_it_and_the_checkpoint_resumes(tmp_path):
    config = short_run(tmp_path, "trainer.n_workers=2", "trainer.save_freq=1", "trainer.total_training_steps=50")
    trainer = SingleControllerTrainer(config)
    errors = []

    def train():
        try:
            trainer.fit()
        except TrainingError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=train)
    thread.start()
    deadline = time.monotonic() + 120
    while latest_checkpoint(tmp_path) is None or latest_checkpoint(tmp_path).name < "step_2":
        assert time.monotonic() < deadline and thread.is_alive(), errors
        time.sleep(0.2)
    import ray

    ray.kill(trainer.actor.pool.actors[1])
    thread.join(timeout=120)
    assert not thread.is_alive()
    [error] = errors
    assert "the actor/ref worker of rank 1 died during" in error, error
    assert "training stopped, the last checkpoint" in error, error

    done = int(latest_checkpoint(tmp_path).name.removeprefix("step_"))
    assert load_checkpoint(latest_checkpoint(tmp_path))["step"] == done
    config.trainer.n_workers, config.trainer.total_training_steps = 1, done + 1  # in-process, one worker
    SingleControllerTrainer(config).fit()
    assert [m["step"] for m in read_metrics(tmp_path)] == list(range(1, done + 2))
