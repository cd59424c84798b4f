"""verl's memory settings in our runtime: padding-free micro-batches (use_remove_padding), token-budget micro-batches
(use_dynamic_bsz), chunked log-probs and entropy (entropy_from_logits_with_chunking, entropy_checkpointing). Each
gives the plain path's numbers: log-probs, losses, gradients (the updated weights) and values."""

import importlib
import sys
import types

import pytest
import torch

from verl_wheel import verl  # noqa: F401  (the fixture)

from verl_runtime import seqlen_balancing
from verl_runtime.algorithms import entropy_from_logits, entropy_from_logits_with_chunking
from verl_runtime.config import load_config
from verl_runtime.errors import ConfigError
from verl_runtime.models import load_tokenizer
from verl_runtime.rollout.base import assemble_batch, left_pad
from verl_runtime.workers.actor import ActorWorker
from verl_runtime.workers.critic import CriticWorker

SETTINGS = {
    "dynamic batches": ["actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=60"],
    "chunked entropy": ["actor.entropy_from_logits_with_chunking=true", "actor.entropy_from_logits_chunk_size=7"],
    "entropy checkpointing": ["actor.entropy_checkpointing=true"],
    "padding-free": ["model.use_remove_padding=true"],
    "padding-free, gradient checkpointing": ["model.use_remove_padding=true", "model.gradient_checkpointing=true"],
    "all of them": ["actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=60", "model.use_remove_padding=true",
                    "actor.entropy_from_logits_with_chunking=true", "actor.entropy_from_logits_chunk_size=7",
                    "actor.entropy_checkpointing=true"],
}


def _batch(tokenizer, samples: int = 2) -> dict:
    """Prompts of different lengths, `samples` responses each, some ending early at EOS (padding on both sides)."""
    prompts = [tokenizer.encode(text) for text in ("Q: 2+3=?\nA:", "Hi", "Count: 1 2 3 4", "x")]
    rows = [p for p in prompts for _ in range(samples)]
    prompt_ids, prompt_mask = left_pad(rows, tokenizer.pad_token_id)
    responses = torch.randint(3, 200, (len(rows), 9), generator=torch.Generator().manual_seed(0))
    responses[1, 4] = responses[2, 0] = responses[5, 6] = tokenizer.eos_token_id
    responses[1, 5:] = responses[2, 1:] = responses[5, 7:] = tokenizer.pad_token_id
    rollout = assemble_batch(prompt_ids, prompt_mask, responses, [tokenizer.eos_token_id])
    batch = {key: getattr(rollout, key) for key in ("input_ids", "attention_mask", "position_ids", "responses",
                                                      "response_mask")}
    batch["advantages"] = torch.randn(responses.shape, generator=torch.Generator().manual_seed(2))
    return batch


def _config(model_dir, settings, tmp_path=None, *extra):
    return load_config(None, [f"model.path={model_dir}", "trainer.device=cpu", "algorithm.adv_estimator=grpo",
                              "rollout.n=2", "actor.ppo_micro_batch_size_per_gpu=3", "actor.entropy_coeff=0.01",
                              "actor.use_kl_loss=true", *extra, *settings], warn=False)


def _actor(model_dir, settings, *extra):
    config = _config(model_dir, settings, None, *extra)
    torch.manual_seed(0)
    return ActorWorker(config, load_tokenizer(model_dir), torch.device("cpu"))


def _close(actual, expected, atol=2e-5):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=1e-4)


@pytest.mark.parametrize("model_dir", ["tiny_model_dir", "tiny_llama_dir"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_a_memory_setting_trains_the_same_numbers(setting, model_dir, request):
    path = request.getfixturevalue(model_dir)
    plain, other = _actor(path, []), _actor(path, SETTINGS[setting])
    batch = _batch(load_tokenizer(path))
    mask = batch["response_mask"].bool()

    old = plain.compute_log_prob(batch)
    _close(other.compute_log_prob(batch)[mask], old[mask])
    batch.update(old_log_prob=old, ref_log_prob=old - 0.05)
    before = {name: p.detach().clone() for name, p in plain.model.named_parameters()}
    expected, got = plain.update(dict(batch), mini_batch_size=8), other.update(dict(batch), mini_batch_size=8)

    for key in ("actor/loss", "actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
        assert got[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key
    for (name, p), q in zip(plain.model.named_parameters(), other.model.parameters()):
        moved = (p.detach() - before[name]).abs().max()
        torch.testing.assert_close(q.detach(), p.detach(), atol=float(moved) * 1e-2 + 1e-7, rtol=0, msg=name)


def test_dynamic_batches_keep_each_samples_log_prob_in_its_row(tiny_model_dir):
    """Balanced micro-batches reorder the samples; the result comes back in the batch's order (as fixed sizes)."""
    plain = _actor(tiny_model_dir, [])
    dynamic = _actor(tiny_model_dir, ["actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=40"])
    batch = _batch(load_tokenizer(tiny_model_dir))
    split = seqlen_balancing.token_budget_split(batch, 40, "actor.ppo_max_token_len_per_gpu")
    assert len(split) > 2 and sorted(i for p in split for i in p) == list(range(8))
    assert [i for p in split for i in p] != list(range(8))  # reordered, so the order must be restored
    mask = batch["response_mask"].bool()
    _close(dynamic.compute_log_prob(batch)[mask], plain.compute_log_prob(batch)[mask])


def test_the_critic_gives_the_same_values_and_update_padding_free_and_by_tokens(tiny_model_dir):
    batch = _batch(load_tokenizer(tiny_model_dir))
    batch.update(returns=torch.randn(batch["responses"].shape), values=torch.zeros(batch["responses"].shape))
    workers = []
    for settings in ([], ["model.use_remove_padding=true", "critic.use_dynamic_bsz=true",
                          "critic.ppo_max_token_len_per_gpu=50", "critic.forward_max_token_len_per_gpu=30"]):
        config = _config(tiny_model_dir, settings, None, "algorithm.adv_estimator=gae", "rollout.n=1",
                         "critic.ppo_micro_batch_size_per_gpu=3")
        torch.manual_seed(0)
        workers.append(CriticWorker(config, torch.device("cpu")))
    plain, other = workers
    mask = batch["response_mask"].bool()
    _close(other.compute_values(batch)[mask], plain.compute_values(batch)[mask])
    expected, got = plain.update(dict(batch), mini_batch_size=8), other.update(dict(batch), mini_batch_size=8)
    assert got["critic/vf_loss"] == pytest.approx(expected["critic/vf_loss"], rel=1e-4)
    assert got["critic/grad_norm"] == pytest.approx(expected["critic/grad_norm"], rel=1e-4)


def test_a_token_budget_below_the_sequence_width_says_which_key_to_raise(tiny_model_dir):
    batch = _batch(load_tokenizer(tiny_model_dir))
    width = batch["input_ids"].shape[1]
    with pytest.raises(ConfigError, match=rf"actor.ppo_max_token_len_per_gpu=10 .* at least {width}"):
        seqlen_balancing.token_budget_split(batch, 10, "actor.ppo_max_token_len_per_gpu")


def test_verls_memory_keys_are_honoured_not_ignored(capsys):
    config = load_config(None, [
        "actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=8192",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
        "actor_rollout_ref.actor.entropy_checkpointing=true", "critic.forward_max_token_len_per_gpu=1024",
    ])
    assert config.model.use_remove_padding and config.actor.use_dynamic_bsz
    assert config.actor.ppo_max_token_len_per_gpu == 4096 and config.rollout.log_prob_max_token_len_per_gpu == 8192
    assert config.ref.log_prob_use_dynamic_bsz is False and config.critic.forward_max_token_len_per_gpu == 1024
    assert config.actor.entropy_from_logits_with_chunking and config.actor.entropy_checkpointing
    assert "memory and speed only" not in capsys.readouterr().err


def test_entropy_from_logits_with_chunking_matches_verls(verl):
    logits = torch.randn(37, 50, generator=torch.Generator().manual_seed(0)) * 3
    for chunk in (1, 8, 2048):
        expected = verl.F.entropy_from_logits_with_chunking(logits, chunk_size=chunk)
        torch.testing.assert_close(entropy_from_logits_with_chunking(logits, chunk_size=chunk), expected)
    torch.testing.assert_close(entropy_from_logits_with_chunking(logits, 8), entropy_from_logits(logits), atol=1e-5,
                               rtol=0)


def test_micro_batches_are_balanced_as_verl_balances_them(verl):
    stubs = {"verl.protocol": types.ModuleType("verl.protocol"),
             "verl.utils.tensordict_utils": types.ModuleType("verl.utils.tensordict_utils")}
    stubs["verl.protocol"].DataProto = object
    stubs["verl.utils.tensordict_utils"].index_select_tensor_dict = lambda batch, indices: indices
    sys.modules.update(stubs)
    theirs = importlib.import_module("verl.utils.seqlen_balancing")
    generator = torch.Generator().manual_seed(3)
    for rows, budget in ((16, 300), (24, 500), (7, 130)):
        lengths = torch.randint(10, 120, (rows,), generator=generator)
        mask = (torch.arange(128)[None] < lengths[:, None]).long()
        _, expected = theirs.rearrange_micro_batches({"input_ids": mask, "attention_mask": mask}, budget)
        assert seqlen_balancing.rearrange_micro_batches(lengths.tolist(), budget) == expected
        workloads = lengths.tolist()
        assert seqlen_balancing.get_seqlen_balanced_partitions(workloads, 3, False) == \
            theirs.get_seqlen_balanced_partitions(workloads, 3, False)


def test_the_planner_sees_each_setting_of_our_runtime():
    """Each setting moves the planned peak of the phases it touches, the way bench/plan_accuracy.py measures it on
    the CPU (Qwen2.5-0.5B's shape on one H100, GRPO: packed rows at their typical length, not the limits)."""
    from conftest import FIXTURES
    from verl_deploy.plan import plan
    from verl_deploy.sizes import parse_gpus

    base = [f"model.path={FIXTURES / 'models' / 'Qwen2.5-0.5B-Instruct'}", "algorithm.adv_estimator=grpo",
            "rollout.n=8", "data.batch_size=16", "data.max_prompt_length=512", "data.max_response_length=2048",
            "actor.ppo_micro_batch_size_per_gpu=16", "rollout.log_prob_micro_batch_size_per_gpu=16", "actor.ppo_epochs=2"]

    def peaks(*settings):
        planned = plan(None, [*base, *settings], read_data=False, with_suggestions=False, gpus=parse_gpus("1"),
                       gpu_type="H100", this_host=False)
        return {p.name: p.peak for p in planned.memory.phases}

    plain = peaks()
    chunked = peaks("actor.entropy_from_logits_with_chunking=true")
    assert chunked["actor update"] < plain["actor update"] and chunked["old log-probs"] < plain["old log-probs"]
    dynamic = peaks("actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=10240")  # 4 sequences
    assert dynamic["actor update"] < plain["actor update"] and dynamic["old log-probs"] < plain["old log-probs"]
    packed = peaks("model.use_remove_padding=true")
    assert packed["actor update"] < plain["actor update"]
    assert peaks("actor.entropy_checkpointing=true") == plain  # our fused log-prob and entropy: nothing to save


@pytest.mark.slow
def test_token_budgets_on_two_fsdp_workers_train_as_one_worker(tmp_path, ray_session):
    """Each rank cuts its share by the budget; the ranks agree on one micro-batch count (FSDP's forwards are
    collectives), and the update equals one worker's on the same samples (given, not sampled: each worker samples
    its own share from a seed of its own)."""
    from verl_runtime.trainer import SingleControllerTrainer

    settings = ["algorithm.adv_estimator=grpo", "rollout.n=2", "trainer.device=cpu", "data.batch_size=4",
                "data.max_response_length=8", "data.max_prompt_length=64", "actor.lr=3e-3",
                "actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=80",
                "actor.entropy_from_logits_with_chunking=true"]
    samples = [{"prompt": prompt, "response": response, "reward": reward} for prompt, response, reward in (
        ("Hello, how are you?", "I'm fine, thank you, and you?", 0.8), ("Hello, how are you?", "Go away.", 0.1),
        ("What is 2 + 2?", "4", 1.0), ("What is 2 + 2?", "It is five, or maybe six.", 0.0),
        ("Name a colour.", "Blue.", 0.7), ("Name a colour.", "A very long answer about colours.", 0.2),
        ("Count to three.", "1 2 3", 1.0), ("Count to three.", "one two", 0.3))]
    one = SingleControllerTrainer(load_config(None, [*settings, f"trainer.run_dir={tmp_path / 'one'}"]))
    two = SingleControllerTrainer(load_config(None, [*settings, f"trainer.run_dir={tmp_path / 'two'}",
                                                     "trainer.n_workers=2", "actor.strategy=fsdp"]))
    try:
        expected, got = one.step(samples), two.step(samples)
    finally:
        two.close()
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy"):
        assert got[name] == pytest.approx(expected[name], rel=1e-4, abs=1e-6), name


def test_a_packed_model_keeps_its_padded_forward(tiny_model_dir):
    """packed_attention stays installed after a packed pass (a checkpointed layer meets it again in the backward);
    every padded forward through it is transformers' sdpa, to the bit."""
    from verl_runtime.models import LogProbMemory, load_causal_lm, response_log_probs

    model = load_causal_lm(tiny_model_dir, None, "cpu")
    batch = _batch(load_tokenizer(tiny_model_dir))
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "position_ids")}
    before = model(**inputs).logits
    response_log_probs(model, *inputs.values(), 9, memory=LogProbMemory(packed=True))
    assert model.config._attn_implementation != "sdpa"
    torch.testing.assert_close(model(**inputs).logits, before, rtol=0, atol=0)
