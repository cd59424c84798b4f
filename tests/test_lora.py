"""LoRA on the actor (model.lora_rank, verl's actor_rollout_ref.model.lora_rank): only the adapters train, the reference
is the base model, the rollout samples the merged weights, checkpoints resume, exports are merged or peft adapters,
and verl's own LoRA scripts compose and train."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

from conftest import REPO, require
from verl_runtime.__main__ import main
from vllm_support import VLLM_INSTALLED, VLLM_MISSING

PEFT_MISSING = "peft is not installed (the runtime extra: pip install 'verl-deploy[runtime]')"
QUICKSTART = str(REPO / "examples" / "quickstart.yaml")
LORA = ["model.lora_rank=8", "model.lora_alpha=16", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.01"]
SMALL = ["trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=1", "trainer.save_hf=false",
         "trainer.tensorboard=false", "rollout.name=hf", "data.batch_size=4", "rollout.n=2"]


@pytest.fixture(autouse=True)
def _peft_and_cache(tmp_path_factory, monkeypatch):
    require(importlib.util.find_spec("peft") is not None, PEFT_MISSING)
    monkeypatch.setenv("VERL_RUNTIME_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))  # builtin:tiny, offline


def train(run_dir, *overrides: str) -> int:
    args = ["train", QUICKSTART, "--set", f"trainer.run_dir={run_dir}"]
    for item in (*SMALL, *overrides):
        args += ["--set", item]
    return main(args)


def checkpoint(run_dir, step: int) -> dict:
    return torch.load(run_dir / "checkpoints" / f"step_{step}" / "state.pt", weights_only=True)


def base_state() -> dict:
    from verl_runtime.models import load_causal_lm

    return load_causal_lm("builtin:tiny", torch.float32, "cpu").state_dict()


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A 2-step LoRA run of the quickstart (GRPO with a KL loss), a checkpoint after each step."""
    require(importlib.util.find_spec("peft") is not None, PEFT_MISSING)
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VERL_RUNTIME_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        assert train(run_dir, *LORA) == 0
    return run_dir


def test_merged_weights_are_peft_merge():
    """lora.merged_weights (what vLLM and a merged export get) equals peft's own merge_and_unload."""
    import copy

    from peft import LoraConfig, get_peft_model

    from verl_runtime import lora
    from verl_runtime.models import load_causal_lm

    model = get_peft_model(load_causal_lm("builtin:tiny", torch.float32, "cpu"),
                           LoraConfig(r=4, lora_alpha=12, target_modules="all-linear", exclude_modules=["o_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_()  # B starts at zero: make the adapters matter
    merged = lora.merged_weights(model.state_dict(), lora.lora_state(model))
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert merged.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(merged[key], expected[key], rtol=1e-5, atol=1e-6)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], base_state()["model.layers.0.self_attn.q_proj.weight"])


@pytest.mark.slow
def test_a_lora_run_trains_only_the_adapters(lora_run):
    base = base_state()
    metrics = [json.loads(line) for line in (lora_run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all("actor/kl_loss" in m for m in metrics)
    first, second = checkpoint(lora_run, 1)["actor"], checkpoint(lora_run, 2)["actor"]
    weights = second["model"]
    for name, tensor in base.items():  # every base weight is what it was before training
        wrapped = "base_model.model." + name
        stored = weights.get(wrapped, weights.get(wrapped.replace(".weight", ".base_layer.weight").replace(
            ".bias", ".base_layer.bias")))
        assert torch.equal(stored, tensor), name
    adapters = [key for key in weights if ".lora_B." in key]
    assert len(adapters) == 14  # all-linear: q, k, v, o, gate, up, down in 2 layers (not lm_head)
    assert all(weights[key].abs().sum() > 0 for key in adapters)  # B starts at 0: the update moved them
    assert any(not torch.equal(first["model"][key], weights[key]) for key in adapters)
    # the optimizer holds the adapters' state only: 2 x 14 tensors (A and B)
    assert len(second["optimizer"]["state"]) == 28


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["hf", "builtin"])
def test_the_reference_is_the_base_model_and_greedy_rollout_the_merged_model(engine, tmp_path):
    from verl_runtime.config import load_config
    from verl_runtime.export import export_checkpoint
    from verl_runtime.models import load_causal_lm, load_tokenizer
    from verl_runtime.rollout import SamplingParams
    from verl_runtime.rollout.hf import HFRolloutEngine
    from verl_runtime.trainer import SingleControllerTrainer
    from verl_runtime.workers.actor import log_probs

    run_dir = tmp_path / "run"
    config = load_config(QUICKSTART, [*SMALL, *LORA, f"trainer.run_dir={run_dir}", "actor.lr=0.05",
                                      f"rollout.name={engine}"])
    trainer = SingleControllerTrainer(config)
    assert trainer.ref is None and trainer.ref_policy is trainer.actor  # no second model: the actor without adapters
    trainer.fit()
    prompts = [p.input_ids for p in trainer.load_prompts(["toy:letter"], "val")[:6]]
    greedy = SamplingParams(n=1, do_sample=False, max_new_tokens=16)
    batch = trainer.actor.generate(prompts, greedy)

    base = load_causal_lm("builtin:tiny", torch.float32, "cpu")
    torch.testing.assert_close(trainer.ref_policy.compute_ref_log_prob(batch), log_probs(base, batch, 8, 1.0),
                               rtol=1e-5, atol=1e-5)
    trained = trainer.actor.compute_log_prob(batch)
    assert (trained - log_probs(base, batch, 8, 1.0)).abs().max() > 1e-3  # the adapters did change the policy

    _, merged_dir = export_checkpoint(run_dir, tmp_path / "merged")
    merged = load_causal_lm(str(merged_dir), torch.float32, "cpu")
    engine = HFRolloutEngine(merged, load_tokenizer(str(merged_dir)), "cpu")
    assert torch.equal(engine.generate(prompts, greedy).responses, batch["responses"])


@pytest.mark.slow
def test_a_lora_run_resumes_from_its_checkpoint(lora_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(lora_run, run_dir)
    assert train(run_dir, *LORA, "trainer.total_training_steps=3") == 0
    assert "Resumed from" in capsys.readouterr().out
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    before, after = checkpoint(run_dir, 2)["actor"], checkpoint(run_dir, 3)["actor"]
    assert after["lora"]["scaling"] == before["lora"]["scaling"]
    assert any(not torch.equal(before["model"][k], after["model"][k]) for k in after["model"] if ".lora_" in k)

    # the same run without LoRA: one line, exit 2, nothing trained
    assert train(run_dir, "actor.use_kl_loss=true", "trainer.total_training_steps=4") == 2
    assert "trained with LoRA and this run is without it" in capsys.readouterr().err
    assert not (run_dir / "checkpoints" / "step_4").exists()


@pytest.mark.slow
def test_export_adapter_is_a_peft_adapter_equal_to_the_merged_export(lora_run, tmp_path):
    from peft import PeftModel

    from verl_runtime.models import load_causal_lm

    assert main(["export", str(lora_run), "--out", str(tmp_path / "merged")]) == 0
    assert main(["export", str(lora_run), "--out", str(tmp_path / "adapter"), "--form", "adapter"]) == 0
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    adapted = PeftModel.from_pretrained(load_causal_lm("builtin:tiny", torch.float32, "cpu"), tmp_path / "adapter")
    merged = load_causal_lm(str(tmp_path / "merged"), torch.float32, "cpu")
    ids = torch.tensor([[5, 60, 61, 62, 63, 64, 7]])
    with torch.no_grad():
        torch.testing.assert_close(adapted(input_ids=ids).logits, merged(input_ids=ids).logits, rtol=1e-4, atol=1e-4)

    # continuing from that adapter: verl's lora_adapter_path
    run_dir = tmp_path / "continued"
    assert train(run_dir, f"model.lora_adapter_path={tmp_path / 'adapter'}", "trainer.total_training_steps=1") == 0
    start = checkpoint(run_dir, 1)["actor"]["model"]
    assert start.keys() == checkpoint(lora_run, 2)["actor"]["model"].keys()


def test_export_adapter_of_a_full_run_says_what_to_do(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train(run_dir, "trainer.total_training_steps=1") == 0
    assert main(["export", str(run_dir), "--out", str(tmp_path / "a"), "--form", "adapter"]) == 2
    assert "trained without LoRA" in capsys.readouterr().err


# --- verl's own LoRA scripts ------------------------------------------------------------------------------------------
LORA_SCRIPTS = ("examples/tuning/lora/run_qwen3_8b_fsdp.sh", "examples/tuning/lora/run_qwen3_8b_merge_fsdp.sh",
                "examples/tuning/lora/run_qwen3_8b_from_adapter_fsdp.sh", "dapo/test_dapo_7b_math_lora.sh")


@pytest.mark.parametrize("path", LORA_SCRIPTS)
def test_verl_lora_scripts_compose(path):
    import yaml

    from test_verl_scripts import compose, corpus

    row = next(row for row in corpus() if row["path"] == path)
    code, _, error = compose(row["argv"])
    if code:  # vLLM's tensor parallelism (these scripts ask for it) is upstream verl's: refused, naming it
        assert "rollout.tensor_model_parallel_size" in error and "--runtime verl" in error, error
    code, out, error = compose([*row["argv"], "actor_rollout_ref.rollout.tensor_model_parallel_size=1"])
    assert code == 0, error
    model = yaml.safe_load(out)["model"]
    assert model["lora_rank"] > 0 or model["lora_adapter_path"]


def test_critic_lora_is_refused():
    from test_verl_scripts import compose

    code, _, error = compose(["critic.model.lora_rank=8"])
    assert code == 2 and "LoRA on the critic is not here" in error


@pytest.mark.slow
def test_verl_lora_script_trains_two_cpu_steps(tmp_path):
    from test_verl_scripts import GSM8K, corpus, stand_ins
    from verl_runtime.main_ppo import main as main_ppo
    from verl_runtime.prepare import prepare_gsm8k

    row = next(row for row in corpus() if row["path"] == LORA_SCRIPTS[0])
    data = prepare_gsm8k(str(GSM8K), str(tmp_path / "gsm8k"))["train"]
    assert main_ppo(stand_ins(row["argv"], data, tmp_path / "run")) == 0
    actor = checkpoint(tmp_path / "run", 2)["actor"]
    assert actor["lora"]["scaling"]["model.layers.0.self_attn.q_proj"][0] == 32 / 64  # the script's alpha / rank


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_samples_the_merged_weights(tmp_path):
    require(VLLM_INSTALLED, VLLM_MISSING)
    run_dir = tmp_path / "run"
    assert train(run_dir, *LORA, "rollout.name=vllm", "actor.lr=0.05", "trainer.total_training_steps=4",
                 "data.batch_size=8", "rollout.n=4") == 0
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(m["actor/grad_norm"] > 0 for m in metrics[:-1])  # the adapters moved before the last rollout
    # vLLM's log-probs of its samples match the trainer's after each update: it samples the merged, trained weights
    # (the base weights alone, without the adapters, gave 0.15 here)
    assert max(m["rollout/logprob_diff"] for m in metrics) < 1e-2


SAMPLES = [
    {"prompt": "Hello, how are you?", "response": "I'm fine, thank you!", "reward": 0.8},
    {"prompt": "Hello, how are you?", "response": "Go away.", "reward": 0.1},
    {"prompt": "What is 2 + 2?", "response": "4", "reward": 1.0},
    {"prompt": "What is 2 + 2?", "response": "5", "reward": 0.0},
]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_lora_on_two_workers_takes_the_same_update_as_one(strategy):
    """Data-parallel LoRA (replicated or FSDP2-sharded, frozen base and trainable adapters in one model) gives the
    one-worker update, the reference (adapters disabled) included; its checkpoint state has the one-worker layout."""
    require(importlib.util.find_spec("ray") is not None, "ray is not installed (pip install verl-deploy[runtime])")
    import ray

    from verl_runtime.config import load_config
    from verl_runtime.trainer import SingleControllerTrainer

    def config(*extra):
        return load_config(None, ["algorithm.adv_estimator=grpo", "trainer.device=cpu", "actor.lr=1e-2",
                                  "actor.ppo_micro_batch_size_per_gpu=1", f"actor.strategy={strategy}", *LORA, *extra])

    ray.init(address="local", num_cpus=4, include_dashboard=False)
    try:
        one, two = SingleControllerTrainer(config()), SingleControllerTrainer(config("trainer.n_workers=2"))
        expected, got = one.step(SAMPLES), two.step(SAMPLES)
        for name in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
            assert got[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-7), name
        state_one, state_two = one.actor.state_dict()[0], two.actor.state_dict()[0]
        assert state_two["lora"] == state_one["lora"]
        assert len(state_two["optimizer"]["state"]) == len(state_one["optimizer"]["state"]) == 28
        for name, tensor in state_one["model"].items():
            torch.testing.assert_close(state_two["model"][name], tensor, rtol=0, atol=5e-5)
        two.close()
    finally:
        ray.shutdown()
