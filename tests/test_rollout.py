"""HF rollout: grouped samples, EOS masking, padding, seeds, and log-probs that match the sampler."""

import pytest
import torch

from verl_runtime.errors import ConfigError
from verl_runtime.models import load_causal_lm, load_tokenizer, response_log_probs
from verl_runtime.rollout import SamplingParams, make_rollout_engine
from verl_runtime.rollout.base import mask_after_first_eos
from verl_runtime.rollout.hf import hf_generation_config


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_causal_lm(tiny_model_dir, None, "cpu"), load_tokenizer(tiny_model_dir)


@pytest.fixture
def engine(tiny):
    model, tokenizer = tiny
    return make_rollout_engine("hf", model, tokenizer, "cpu")


def _prompts(tokenizer):
    return [tokenizer.encode("Q: 2+3=?\nA:"), tokenizer.encode("Hi"), tokenizer.encode("Count: 1 2 3")]


def test_each_prompt_is_sampled_n_times_grouped_and_padded(engine, tiny):
    _, tokenizer = tiny
    prompts = _prompts(tokenizer)
    batch = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=12, seed=0))

    assert batch.responses.shape == (12, 12) and batch.response_mask.shape == (12, 12)
    assert batch.prompt_length == max(len(p) for p in prompts)
    assert batch.input_ids.shape == batch.attention_mask.shape == batch.position_ids.shape == (12, batch.prompt_length + 12)
    for row in range(12):
        prompt = prompts[row // 4]  # rows i*n .. i*n+n-1 belong to prompt i
        padding = batch.prompt_length - len(prompt)
        assert batch.input_ids[row, padding : batch.prompt_length].tolist() == prompt
        assert batch.input_ids[row, :padding].tolist() == [tokenizer.pad_token_id] * padding
        assert batch.attention_mask[row, : batch.prompt_length].tolist() == [0] * padding + [1] * len(prompt)
        # Positions count real tokens from 0 and continue through the response.
        assert batch.position_ids[row, padding:].tolist() == list(range(len(prompt) + 12))
    assert torch.equal(batch.attention_mask[:, batch.prompt_length :], batch.response_mask)
    # Samples of one prompt differ (random weights, temperature 1).
    assert len({tuple(r) for r in batch.responses[:4].tolist()}) > 1


def test_mask_after_first_eos():
    responses = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [2, 0, 0, 0], [5, 9, 2, 0]])
    assert mask_after_first_eos(responses, [2]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]]
    assert mask_after_first_eos(responses, [2, 9]).tolist()[3] == [1, 1, 0, 0]


def test_response_mask_ends_at_the_first_eos_and_pad_follows(tiny):
    """Force EOS as the third token of the even rows: their mask is [1, 1, 1, 0, ...] and pad fills the rest."""
    model, tokenizer = tiny
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    calls = []

    def force_eos_at_third_step(module, inputs, logits):
        calls.append(None)
        if len(calls) == 3:  # one lm_head call per generated token (KV cache on)
            logits = logits.clone()
            logits[0::2, -1, eos] = 1e4
        return logits

    handle = model.get_output_embeddings().register_forward_hook(force_eos_at_third_step)
    try:
        batch = make_rollout_engine("hf", model, tokenizer, "cpu").generate(
            _prompts(tokenizer), SamplingParams(n=2, max_new_tokens=7, seed=0)
        )
    finally:
        handle.remove()
    assert pad != eos
    for row, (response, mask) in enumerate(zip(batch.responses.tolist(), batch.response_mask.tolist())):
        if row % 2 == 0:
            assert response[2] == eos and response[3:] == [pad] * 4
            assert mask == [1, 1, 1, 0, 0, 0, 0]
        elif eos in response:  # a sampled EOS ends the odd rows just the same
            first = response.index(eos)
            assert mask == [1] * (first + 1) + [0] * (6 - first)
        else:
            assert mask == [1] * 7


def test_responses_are_right_padded_when_all_rows_stop_early(tiny):
    model, tokenizer = tiny
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    def always_eos(module, inputs, logits):
        logits = logits.clone()
        logits[..., eos] = 1e4
        return logits

    handle = model.get_output_embeddings().register_forward_hook(always_eos)
    try:
        batch = make_rollout_engine("hf", model, tokenizer, "cpu").generate(
            _prompts(tokenizer), SamplingParams(n=2, max_new_tokens=6, seed=0)
        )
    finally:
        handle.remove()
    assert batch.responses.tolist() == [[eos] + [pad] * 5] * 6
    assert batch.response_mask.tolist() == [[1] + [0] * 5] * 6


def test_greedy_is_deterministic_and_seeds_reproduce(engine, tiny):
    _, tokenizer = tiny
    prompts = _prompts(tokenizer)
    greedy = SamplingParams(n=2, max_new_tokens=10, do_sample=False)
    first, second = engine.generate(prompts, greedy), engine.generate(prompts, greedy)
    assert torch.equal(first.responses, second.responses)
    assert torch.equal(first.responses[0::2], first.responses[1::2])  # greedy samples of a prompt are identical

    seeded = SamplingParams(n=2, max_new_tokens=10, seed=7)
    state = torch.get_rng_state()
    a, b = engine.generate(prompts, seeded), engine.generate(prompts, seeded)
    assert torch.equal(a.responses, b.responses)
    assert torch.equal(torch.get_rng_state(), state)  # a seeded rollout leaves the global RNG alone
    assert not torch.equal(a.responses, engine.generate(prompts, SamplingParams(n=2, max_new_tokens=10, seed=8)).responses)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recomputed_log_probs_match_the_sampling_distribution(tiny, temperature):
    """The log-prob the trainer recomputes is log_softmax(logits / T) of the token the sampler drew."""
    _assert_log_probs_match_sampler(*tiny, temperature)


def test_other_architectures_sample_and_recompute_consistently(tiny_opt_dir):
    """OPT (learned absolute positions) catches any position-id mismatch between generate and recompute."""
    model, tokenizer = load_causal_lm(tiny_opt_dir, None, "cpu"), load_tokenizer(tiny_opt_dir)
    _assert_log_probs_match_sampler(model, tokenizer, temperature=0.8)


def _assert_log_probs_match_sampler(model, tokenizer, temperature):
    engine = make_rollout_engine("hf", model, tokenizer, "cpu")
    params = SamplingParams(n=2, max_new_tokens=8, temperature=temperature, top_k=-1, seed=3)
    batch = engine.generate(_prompts(tokenizer), params)

    # Replay the same sampling with transformers, keeping the processed scores it sampled from.
    config = hf_generation_config(params, engine.eos_ids, engine.pad_id)
    config.output_scores, config.return_dict_in_generate = True, True
    prompt_ids = batch.input_ids[:, : batch.prompt_length]
    prompt_mask = batch.attention_mask[:, : batch.prompt_length]
    with torch.random.fork_rng():
        torch.manual_seed(params.seed)
        with torch.no_grad():
            replay = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config)
    steps = len(replay.scores)
    assert torch.equal(replay.sequences[:, batch.prompt_length :], batch.responses[:, :steps])
    sampler = torch.stack([torch.log_softmax(s, dim=-1) for s in replay.scores], dim=1)
    sampler = sampler.gather(-1, batch.responses[:, :steps, None]).squeeze(-1)

    with torch.no_grad():
        recomputed, _ = response_log_probs(
            model, batch.input_ids, batch.attention_mask, batch.position_ids, 8, temperature=temperature
        )
    valid = batch.response_mask[:, :steps].bool()
    torch.testing.assert_close(recomputed[:, :steps][valid], sampler[valid], atol=1e-4, rtol=0)


def test_rollout_output_feeds_a_training_forward(engine, tiny):
    model, tokenizer = tiny
    batch = engine.generate(_prompts(tokenizer), SamplingParams(n=1, max_new_tokens=4, seed=0))
    model.train()
    log_probs, _ = response_log_probs(model, batch.input_ids, batch.attention_mask, batch.position_ids, 4)
    log_probs.sum().backward()
    model.zero_grad()
    model.eval()


def test_model_generation_defaults_do_not_leak_into_sampling(tiny):
    """A checkpoint's generation_config (say repetition_penalty) must not change what the rollout samples."""
    model, tokenizer = tiny
    engine = make_rollout_engine("hf", model, tokenizer, "cpu")
    params = SamplingParams(n=2, max_new_tokens=10, do_sample=False)
    plain = engine.generate(_prompts(tokenizer), params)
    model.generation_config.repetition_penalty = 50.0
    try:
        assert torch.equal(engine.generate(_prompts(tokenizer), params).responses, plain.responses)
    finally:
        model.generation_config.repetition_penalty = None
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id  # restored after generate


def test_sync_weights_is_a_no_op_for_the_colocated_engine(engine, tiny):
    model, _ = tiny
    engine.sync_weights(model)
    assert engine.model is model


def test_unknown_engine_is_a_config_error(tiny):
    with pytest.raises(ConfigError, match="unknown rollout engine 'sglang': choose one of hf"):
        make_rollout_engine("sglang", *tiny, "cpu")


def test_a_diverged_policy_is_named_not_a_sampler_traceback(tiny):
    """Weights an update blew up give non-finite probabilities: generate says the actor diverged, in one line."""
    import copy

    from verl_runtime.errors import TrainingError

    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    with pytest.raises(TrainingError, match="the actor diverged.*lower actor.lr"):
        make_rollout_engine("hf", model, tokenizer, "cpu").generate(_prompts(tokenizer), SamplingParams(n=2))
