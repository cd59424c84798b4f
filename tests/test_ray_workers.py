"""Worker groups on Ray, on the CPU: data-parallel training over gloo gives the one-worker update, every worker
generates its share of the rollout (joined, the batch is one worker's; sampled, each rank's own and reproducible), placements that cannot fit fail in one line, and a killed worker ends the run
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


@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_each_worker_generates_its_share_and_the_joined_batch_is_one_workers(strategy, tmp_path):
    """The rollout on every worker: each generates its slice of the prompts (a prompt's samples on one worker),
    padded to the batch's longest prompt as one worker pads them, and the controller joins the slices in order.
    Greedy decoding does not depend on random draws, so the joined batch is one worker's, token for token; after an
    update (with FSDP, each rank's whole copy for the rollout refreshed in memory) too."""
    from verl_runtime.rollout import SamplingParams

    settings = ["trainer.total_training_steps=1", "actor.lr=3e-3", f"actor.strategy={strategy}"]
    one = SingleControllerTrainer(short_run(tmp_path / "one", *settings))
    two = SingleControllerTrainer(short_run(tmp_path / "two", *settings, "trainer.n_workers=2"))
    try:
        prompts = [p.input_ids for p in one.load_prompts(one.config.data.train_files, "train")[:6]]
        greedy = SamplingParams(n=2, max_new_tokens=8, do_sample=False)
        for _ in range(2):
            expected, got = one.actor.generate(prompts, greedy), two.actor.generate(prompts, greedy)
            for key in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask"):
                assert torch.equal(got[key], expected[key]), key
            assert got.keys() == expected.keys()
            if "rollout_log_probs" in expected:  # the engines that report their sampler's log-probs
                torch.testing.assert_close(got["rollout_log_probs"], expected["rollout_log_probs"], rtol=1e-4,
                                           atol=1e-5)
            one.step(SAMPLES), two.step(SAMPLES)  # the same update: the next rollout samples the updated weights
        assert two.actor.rollout_share() == [2 * 3 * 2, 2 * 3 * 2]  # two calls x 3 of the 6 prompts x 2 samples
    finally:
        two.close()


def test_sampled_rollouts_on_two_workers_are_each_ranks_own_and_reproducible(tmp_path):
    """Sampling, each rank draws from a seed of its own (no two ranks share random numbers), and the same seed on the
    same number of workers gives the same run."""
    settings = ["trainer.total_training_steps=2", "trainer.n_workers=2", "trainer.save_freq=-1"]
    runs = []
    for name in ("a", "b"):
        trainer = SingleControllerTrainer(short_run(tmp_path / name, *settings))
        trainer.fit()
        assert trainer.actor.rollout_share() == [8, 8]
        trainer.close()
        runs.append(read_metrics(tmp_path / name))
    keys = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/entropy")
    assert [[m[k] for k in keys] for m in runs[0]] == [[m[k] for k in keys] for m in runs[1]]


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
