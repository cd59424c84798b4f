"""CPU offload in our runtime (verl's param_offload, optimizer_offload, offload_policy; the reference's param_offload):
the same numbers as the plain path, and each part where it belongs at every phase boundary.

What the CPU can show: the numbers (the same tensors, moved), and the placement the offload keeps (``placement``:
which parts were released to host memory, which were brought back for a phase). What it cannot: bytes leaving the
device, since on a CPU-only machine device and host are one memory (the moves are no-ops). That is measured on a
GPU: the test marked gpu here (resident_bytes on CUDA) and bench/gpu_check.py's offload probe."""

import pytest
import torch

from verl_runtime.config import load_config
from verl_runtime.models import load_tokenizer
from verl_runtime.offload import DEVICE, HOST, resident_bytes
from verl_runtime.rollout.base import assemble_batch, left_pad
from verl_runtime.trainer import SingleControllerTrainer
from verl_runtime.workers.actor import ActorWorker
from verl_runtime.workers.critic import CriticWorker
from verl_runtime.workers.reference import ReferenceWorker

OFFLOAD = {
    "param_offload": ["actor.param_offload=true", "critic.param_offload=true"],
    "optimizer_offload": ["actor.optimizer_offload=true", "critic.optimizer_offload=true"],
    "both": ["actor.param_offload=true", "actor.optimizer_offload=true", "critic.param_offload=true",
             "critic.optimizer_offload=true"],
    "offload_policy (one worker: both)": ["actor.offload_policy=true", "critic.offload_policy=true"],
}


def _config(model_dir, *settings, device="cpu"):
    return load_config(None, [f"model.path={model_dir}", f"trainer.device={device}", "algorithm.adv_estimator=gae",
                              "rollout.n=2", "actor.ppo_micro_batch_size_per_gpu=3", "actor.entropy_coeff=0.01",
                              "critic.ppo_micro_batch_size_per_gpu=3", "actor.use_kl_loss=true", *settings], warn=False)


def _batch(tokenizer, device="cpu") -> dict:
    prompts = [tokenizer.encode(text) for text in ("Q: 2+3=?\nA:", "Hi", "Count: 1 2 3 4", "x")]
    rows = [p for p in prompts for _ in range(2)]
    prompt_ids, prompt_mask = left_pad(rows, tokenizer.pad_token_id)
    responses = torch.randint(3, 200, (len(rows), 9), generator=torch.Generator().manual_seed(0))
    responses[1, 4] = tokenizer.eos_token_id
    responses[1, 5:] = tokenizer.pad_token_id
    rollout = assemble_batch(prompt_ids, prompt_mask, responses, [tokenizer.eos_token_id])
    batch = {key: getattr(rollout, key).to(device)
             for key in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")}
    batch["advantages"] = torch.randn(responses.shape, generator=torch.Generator().manual_seed(2)).to(device)
    batch["returns"] = torch.randn(responses.shape, generator=torch.Generator().manual_seed(3)).to(device)
    return batch


def _worker(cls, model_dir, *settings, device="cpu"):
    torch.manual_seed(0)
    config = _config(model_dir, *settings, device=device)
    if cls is ActorWorker:
        return ActorWorker(config, load_tokenizer(model_dir), torch.device(device))
    return cls(config, torch.device(device))


def _two_updates(actor: ActorWorker, batch: dict) -> list[dict]:
    results = []
    for _ in range(2):  # the second update steps AdamW from the state the first left (offloaded in between)
        old = actor.compute_log_prob(batch)
        results.append(actor.update(dict(batch, old_log_prob=old, ref_log_prob=old - 0.05), mini_batch_size=8))
        results[-1]["old_log_prob"] = old
    return results


def _weights(model) -> dict:
    return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}


@pytest.mark.parametrize("setting", list(OFFLOAD))
def test_offload_trains_the_same_numbers_over_two_updates(setting, tiny_model_dir):
    plain, offloaded = _worker(ActorWorker, tiny_model_dir), _worker(ActorWorker, tiny_model_dir, *OFFLOAD[setting])
    batch = _batch(load_tokenizer(tiny_model_dir))
    for expected, got in zip(_two_updates(plain, batch), _two_updates(offloaded, batch)):
        torch.testing.assert_close(got.pop("old_log_prob"), expected.pop("old_log_prob"), rtol=0, atol=0)
        assert got == pytest.approx(expected, rel=1e-6, abs=1e-9)
    for name, tensor in _weights(plain.model).items():
        torch.testing.assert_close(_weights(offloaded.model)[name], tensor, rtol=0, atol=0)
    plain_state, offloaded_state = plain.state_dict()["optimizer"]["state"], offloaded.state_dict()["optimizer"]["state"]
    for index, moments in plain_state.items():
        for key, value in moments.items():
            torch.testing.assert_close(offloaded_state[index][key], value, rtol=0, atol=0)


def _record_placement(worker, monkeypatch) -> list[dict]:
    """The offload's placement each time the worker computes: its model's forward (the log-prob and value functions
    the workers call, which the lean CPU path runs without Module.forward) and its rollout engine's sampling."""
    from verl_runtime.workers import actor, critic

    seen = []

    def recording(module, name):
        original = getattr(module, name)

        def call(*args, **kwargs):
            seen.append(dict(worker.offload.placement))
            return original(*args, **kwargs)
        monkeypatch.setattr(module, name, call)

    recording(actor, "response_log_probs")
    recording(critic, "response_values")
    if getattr(worker, "rollout", None) is not None:
        recording(worker.rollout, "generate")
    return seen


def test_the_actor_brings_back_only_what_each_phase_uses(tiny_model_dir, monkeypatch):
    actor = _worker(ActorWorker, tiny_model_dir, *OFFLOAD["both"])
    batch = _batch(load_tokenizer(tiny_model_dir))
    assert actor.offload.placement == {"model": HOST, "optimizer": HOST}  # from start-up on
    seen = _record_placement(actor, monkeypatch)

    old = actor.compute_log_prob(batch)
    assert seen and all(p == {"model": DEVICE, "optimizer": HOST} for p in seen)  # a forward: the weights alone
    assert actor.offload.placement == {"model": HOST, "optimizer": HOST}

    seen.clear()
    actor.update(dict(batch, old_log_prob=old, ref_log_prob=old), mini_batch_size=8)
    assert seen and all(p == {"model": DEVICE, "optimizer": DEVICE} for p in seen)
    assert actor.offload.placement == {"model": HOST, "optimizer": HOST}
    resident = resident_bytes(actor.model, actor.optimizer, "cpu")
    assert resident["grads"] == 0  # freed on the way out of the update, as verl's zero_grad_on_exit
    assert resident["optimizer"] >= 2 * resident["params"]  # AdamW's two moments, kept (in host memory)

    actor.generate([[5, 6, 7]], _sampling())  # the rollout samples from the trained model: back on the device
    assert seen[-1]["model"] == DEVICE and actor.offload.placement["model"] == HOST


def _sampling():
    from verl_runtime.rollout import SamplingParams

    return SamplingParams(n=2, max_new_tokens=3, seed=0)


def test_optimizer_offload_alone_keeps_the_weights_on_the_device(tiny_model_dir, monkeypatch):
    actor = _worker(ActorWorker, tiny_model_dir, *OFFLOAD["optimizer_offload"])
    batch = _batch(load_tokenizer(tiny_model_dir))
    seen = _record_placement(actor, monkeypatch)
    old = actor.compute_log_prob(batch)
    actor.update(dict(batch, old_log_prob=old, ref_log_prob=old), mini_batch_size=8)
    assert actor.offload.placement == {"optimizer": HOST}
    assert seen[-1] == {"optimizer": DEVICE}


def test_the_critic_offloads_and_fits_the_same_values(tiny_model_dir, monkeypatch):
    plain, offloaded = (_worker(CriticWorker, tiny_model_dir), _worker(CriticWorker, tiny_model_dir, *OFFLOAD["both"]))
    batch = _batch(load_tokenizer(tiny_model_dir))
    assert offloaded.offload.placement == {"model": HOST, "optimizer": HOST}
    seen = _record_placement(offloaded, monkeypatch)
    for _ in range(2):
        values = plain.compute_values(batch)
        torch.testing.assert_close(offloaded.compute_values(batch), values, rtol=0, atol=0)
        assert seen[-1] == {"model": DEVICE, "optimizer": HOST}
        expected = plain.update(dict(batch, values=values), mini_batch_size=8)
        assert offloaded.update(dict(batch, values=values), mini_batch_size=8) == pytest.approx(expected, rel=1e-6)
        assert seen[-1] == {"model": DEVICE, "optimizer": DEVICE}
        assert offloaded.offload.placement == {"model": HOST, "optimizer": HOST}
    for name, tensor in _weights(plain.model).items():
        torch.testing.assert_close(_weights(offloaded.model)[name], tensor, rtol=0, atol=0)


def test_the_reference_keeps_its_weights_in_host_memory_outside_its_pass(tiny_model_dir, monkeypatch):
    plain = _worker(ReferenceWorker, tiny_model_dir)
    offloaded = _worker(ReferenceWorker, tiny_model_dir, "ref.param_offload=true")
    batch = _batch(load_tokenizer(tiny_model_dir))
    assert offloaded.offload.placement == {"model": HOST}
    expected = plain.compute_ref_log_prob(batch)
    seen = _record_placement(offloaded, monkeypatch)
    torch.testing.assert_close(offloaded.compute_ref_log_prob(batch), expected, rtol=0, atol=0)
    assert seen and all(p == {"model": DEVICE} for p in seen)
    assert offloaded.offload.placement == {"model": HOST}


def test_verls_offload_keys_are_honoured(tiny_model_dir):
    config = load_config(None, [f"model.path={tiny_model_dir}", "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                                "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                                "actor_rollout_ref.ref.fsdp_config.param_offload=true",
                                "critic.model.fsdp_config.param_offload=true", "critic.fsdp.offload_policy=true"],
                         warn=False)
    assert (config.actor.param_offload, config.actor.optimizer_offload, config.ref.param_offload) == (True, True, True)
    assert (config.critic.param_offload, config.critic.offload_policy) == (True, True)


def test_a_short_run_with_every_offload_gives_the_plain_runs_metrics(tmp_path):
    """The trainer's whole step (rollout, reference, values, both updates) on offloaded roles, two steps."""
    def run(name, *settings):
        config = load_config(None, ["model.path=builtin:tiny", "trainer.device=cpu", f"trainer.run_dir={tmp_path / name}",
                                    "algorithm.adv_estimator=gae", "actor.use_kl_loss=true", "data.toy_size=8",
                                    "data.batch_size=4", "data.max_response_length=6", "data.max_prompt_length=64",
                                    "trainer.total_training_steps=2", "trainer.save_freq=-1", *settings], warn=False)
        trainer = SingleControllerTrainer(config)
        trainer.fit()
        from verl_runtime.metrics import read_metrics

        return read_metrics(tmp_path / name)

    expected = run("plain")
    got = run("offloaded", *OFFLOAD["both"], "ref.param_offload=true")
    for want, have in zip(expected, got):
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/vf_loss", "critic/score/mean",
                    "response_length/mean"):
            assert have[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key


# No GPU in CI or on the development machines (shared/DESIGN.md): there `make gpu-check` runs the offload probe.
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here: make gpu-check runs it on a GPU machine")
def test_on_a_gpu_offloaded_parts_leave_device_memory(tiny_model_dir, monkeypatch):
    actor = _worker(ActorWorker, tiny_model_dir, *OFFLOAD["both"], device="cuda")
    batch = _batch(load_tokenizer(tiny_model_dir), device="cuda")
    on_gpu = lambda: resident_bytes(actor.model, actor.optimizer, "cuda")  # noqa: E731
    assert on_gpu() == {"params": 0, "grads": 0, "optimizer": 0}
    during = []
    original = actor.mixed_precision
    actor.mixed_precision = lambda: (during.append(on_gpu()), original())[1]  # entered by every forward
    _two_updates(actor, batch)
    assert during[0]["params"] > 0 and during[0]["optimizer"] == 0
    assert max(moment["optimizer"] for moment in during) > 0  # the second update's (AdamW's state starts at a step)
    assert on_gpu() == {"params": 0, "grads": 0, "optimizer": 0}
    assert next(actor.model.parameters()).is_pinned()  # host copies pinned: the moves back are asynchronous


SAMPLES = [
    {"prompt": "Hello, how are you?", "response": "I'm fine, thank you!", "reward": 0.8},
    {"prompt": "Hello, how are you?", "response": "Go away.", "reward": 0.1},
    {"prompt": "What is 2 + 2?", "response": "4", "reward": 1.0},
    {"prompt": "What is 2 + 2?", "response": "5", "reward": 0.0},
]


@pytest.mark.slow
@pytest.mark.parametrize("strategy, settings", [
    ("dp", ["actor.param_offload=true", "actor.optimizer_offload=true"]),
    ("fsdp", ["actor.param_offload=true", "actor.optimizer_offload=true"]),
    ("fsdp", ["actor.offload_policy=true"]),  # FSDP2's CPUOffloadPolicy: no moves of ours between phases
])
def test_two_offloaded_workers_take_the_one_plain_workers_steps(strategy, settings, ray_session):
    common = ["model.path=builtin:tiny", "trainer.device=cpu", "algorithm.adv_estimator=grpo", "rollout.n=2",
              "actor.lr=1e-3", "actor.ppo_micro_batch_size_per_gpu=1", "data.train_files=toy:letter"]
    one = SingleControllerTrainer(load_config(None, common, warn=False))
    two = SingleControllerTrainer(load_config(None, [*common, "trainer.n_workers=2", f"actor.strategy={strategy}",
                                                     *settings], warn=False))
    try:
        for _ in range(2):
            expected, got = one.step(SAMPLES), two.step(SAMPLES)
            for name in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy"):
                assert got[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-7), name
        trained = two.actor.state_dict()[0]["model"]
        for name, tensor in one.actor.state_dict()[0]["model"].items():
            torch.testing.assert_close(trained[name], tensor, rtol=0, atol=5e-5)
        placements = [state["placement"] for state in two.actor.offload_state()]
        moved = {} if "actor.offload_policy=true" in settings else {"model": HOST, "optimizer": HOST}
        assert all({k: v for k, v in p.items() if k != "rollout_model"} == moved for p in placements), placements
    finally:
        two.close()


# --- the planner's model of our runtime (installer/verl_deploy/plan/memory.py) ------------------------------------


def _our_plan(*overrides, gpu_type="H100", monkeypatch=None):
    from conftest import FIXTURES, REPO
    from verl_deploy.plan import plan
    from verl_deploy.sizes import parse_gpus

    model = FIXTURES / "models" / "Qwen2.5-7B-Instruct"
    return plan(REPO / "examples" / "gsm8k-grpo.yaml", [f"model.path={model}", *overrides], gpus=parse_gpus("1"),
                gpu_type=gpu_type, read_data=False, with_suggestions=False, this_host=False)


def _components(result) -> dict:
    return {phase.name: phase.components for phase in result.memory.phases}


@pytest.fixture
def planner_offline(monkeypatch, tmp_path_factory):
    from conftest import FIXTURES

    monkeypatch.setenv("VERL_DEPLOY_CACHE", str(tmp_path_factory.getbasetemp() / "plan-cache"))
    monkeypatch.setenv("VERL_DEPLOY_NVML_READING", str(FIXTURES / "nvml" / "no-driver.json"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_the_plan_takes_offloaded_state_off_the_gpu_but_for_the_phases_that_use_it(planner_offline):
    plain = _our_plan()
    offloaded = _our_plan("actor.param_offload=true", "actor.optimizer_offload=true", "ref.param_offload=true")
    P = plain.model.params
    before, after = _components(plain), _components(offloaded)
    assert after["reference log-probs"]["weights"] == 2 * P  # the reference's bf16 weights alone
    assert after["reference log-probs"]["gradients"] == after["reference log-probs"]["optimizer"] == 0
    assert after["old log-probs"]["weights"] == 4 * P  # the actor's weights, back for its forward
    assert after["rollout"]["weights"] == 4 * P  # the HF engine samples from the trained weights
    for key in ("weights", "gradients", "optimizer"):  # the update brings everything back
        assert after["actor update"][key] == before["actor update"][key] - (2 * P if key == "weights" else 0)
    assert offloaded.memory.peak < plain.memory.peak
    assert offloaded.memory.host_bytes == (4 + 8 + 2) * P  # weights, AdamW, the reference (gradients are freed)


def test_on_the_cpu_the_plan_says_offload_changes_nothing(planner_offline, monkeypatch):
    from conftest import REPO
    from verl_deploy.plan import plan

    args = dict(read_data=False, with_suggestions=False)
    plain = plan(REPO / "examples" / "quickstart.yaml", [], **args)
    offloaded = plan(REPO / "examples" / "quickstart.yaml", ["actor.param_offload=true",
                                                             "actor.optimizer_offload=true"], **args)
    assert offloaded.workload.device == "cpu"
    assert offloaded.memory.peak == plain.memory.peak and offloaded.memory.host_bytes == plain.memory.host_bytes
    # only the gradients, freed outside the update, leave the other phases
    before, after = _components(plain), _components(offloaded)
    for name in before:
        gradients = before[name]["gradients"] if name != "actor update" else 0
        assert {k: v for k, v in after[name].items() if k not in ("gradients", "overhead")} == \
            {k: v for k, v in before[name].items() if k not in ("gradients", "overhead")}
        assert after[name]["gradients"] == before[name]["gradients"] - gradients
    assert any("the device is host memory" in note for note in offloaded.memory.notes)
