"""Built-in decoder: the same tokens as transformers' generate under greedy decoding (on the lean Llama-family path,
the model-forward path and the static-cache path), the sampler's log-probs, EOS stopping, seeds, and the compiled
(static cache, bucketed) path."""

import copy

import pytest
import torch

from verl_runtime.models import build_tiny_model, load_causal_lm, load_tokenizer, response_log_probs
from verl_runtime.rollout import SamplingParams, make_rollout_engine
from verl_runtime.rollout.builtin import BuiltinRolloutEngine, sample
from verl_runtime.lean_model import lean_path_applies


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    return load_causal_lm(path, None, "cpu"), load_tokenizer(path)


@pytest.fixture(scope="module")
def tiny_opt(tmp_path_factory, tiny):
    """A tiny OPT (learned absolute positions, another attention code path) with the tiny model's tokenizer."""
    from transformers import OPTConfig, OPTForCausalLM

    _, tokenizer = tiny
    config = OPTConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
        word_embed_proj_dim=32, max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("opt")
    OPTForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return load_causal_lm(path, None, "cpu"), load_tokenizer(path)


def _save_with_tokenizer(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return load_causal_lm(path, None, "cpu"), load_tokenizer(path)


@pytest.fixture(scope="module")
def tiny_llama(tiny_llama_dir):
    return load_causal_lm(tiny_llama_dir, None, "cpu"), load_tokenizer(tiny_llama_dir)


@pytest.fixture(scope="module")
def tiny_mistral(tmp_path_factory, tiny):
    """A tiny Mistral whose sliding window (8) is shorter than the sequences: the lean path must step aside."""
    from transformers import MistralConfig, MistralForCausalLM

    _, tokenizer = tiny
    config = MistralConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=8, max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    return _save_with_tokenizer(MistralForCausalLM(config), tokenizer, tmp_path_factory.mktemp("mistral"))


def _prompts(tokenizer):
    return [tokenizer.encode("Q: 2+3=?\nA:"), tokenizer.encode("Hi"), tokenizer.encode("Count: 1 2 3")]


PATHS = {"lean": {}, "forward": {"lean": False}, "static": {"static_cache": True}}
MISTRAL_STATIC = ("tiny_mistral", "static")


@pytest.mark.parametrize(
    "model_name,path",
    # Not the static cache with a sliding window: transformers' StaticCache then keeps only the window.
    [(m, p) for m in ("tiny", "tiny_llama", "tiny_mistral", "tiny_opt") for p in PATHS if (m, p) != MISTRAL_STATIC],
)
def test_greedy_tokens_equal_transformers_generate(request, model_name, path):
    model, tokenizer = request.getfixturevalue(model_name)
    params = SamplingParams(n=2, max_new_tokens=24, do_sample=False)
    expected = make_rollout_engine("hf", model, tokenizer, "cpu").generate(_prompts(tokenizer), params)
    batch = BuiltinRolloutEngine(model, tokenizer, "cpu", **PATHS[path]).generate(_prompts(tokenizer), params)

    assert torch.equal(batch.responses, expected.responses)
    for name in ("input_ids", "attention_mask", "position_ids", "response_mask"):
        assert torch.equal(getattr(batch, name), getattr(expected, name)), name
    assert batch.prompt_length == expected.prompt_length


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, 5, 0.9)])
def test_samples_follow_the_distribution_transformers_samples_from(temperature, top_k, top_p):
    """Same filters in the same order as transformers' warpers: the empirical frequencies of many draws match."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.linspace(0.0, 3.0, 8)[None]
    scores = TemperatureLogitsWarper(temperature)(None, logits)
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(None, scores)
    expected = TopPLogitsWarper(top_p)(None, scores).softmax(-1)[0]

    draws = 40_000
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    tokens, _ = sample(logits.repeat(draws, 1), params, _uniform(draws))
    frequencies = torch.bincount(tokens, minlength=8) / draws
    assert (frequencies[expected == 0] == 0).all()
    torch.testing.assert_close(frequencies, expected, atol=0.01, rtol=0)


def test_builtin_is_a_registered_engine(tiny):
    model, tokenizer = tiny
    engine = make_rollout_engine("builtin", model, tokenizer, "cpu")
    assert isinstance(engine, BuiltinRolloutEngine) and not engine.compile  # eager on the CPU
    engine.sync_weights(model)  # shares the actor's model object: nothing to copy
    assert engine.model is model


def test_the_lean_path_takes_llama_family_models_on_the_cpu_only(tiny, tiny_llama, tiny_mistral, tiny_opt):
    cpu = torch.device("cpu")
    assert lean_path_applies(tiny[0], cpu, 200) and lean_path_applies(tiny_llama[0], cpu, 200)
    assert not lean_path_applies(tiny_opt[0], cpu, 200)  # another architecture
    assert lean_path_applies(tiny_mistral[0], cpu, 8) and not lean_path_applies(tiny_mistral[0], cpu, 9)
    assert not lean_path_applies(tiny[0], torch.device("cuda"), 200)  # CUDA takes the graph path
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not lean_path_applies(tiny[0], cpu, 200)


@pytest.mark.parametrize("model_name", ["tiny", "tiny_llama"])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, 20, 0.9)])
def test_returned_log_probs_equal_the_trainers_recomputation(request, model_name, temperature, top_k, top_p):
    model, tokenizer = request.getfixturevalue(model_name)
    params = SamplingParams(n=3, max_new_tokens=16, temperature=temperature, top_k=top_k, top_p=top_p, seed=5)
    batch = make_rollout_engine("builtin", model, tokenizer, "cpu").generate(_prompts(tokenizer), params)
    with torch.no_grad():
        recomputed, _ = response_log_probs(
            model, batch.input_ids, batch.attention_mask, batch.position_ids, 16, temperature=temperature
        )
    torch.testing.assert_close(batch.rollout_log_probs, recomputed * batch.response_mask, atol=1e-5, rtol=0)
    assert (batch.rollout_log_probs[batch.response_mask == 0] == 0).all()


def test_the_lean_path_sees_weights_updated_in_place_at_the_next_call(tiny):
    """The optimizer updates the actor's parameters in place; the next generate decodes with them."""
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    params = SamplingParams(n=1, max_new_tokens=12, do_sample=False)
    engine = make_rollout_engine("builtin", model, tokenizer, "cpu")
    hf = make_rollout_engine("hf", model, tokenizer, "cpu")
    before = engine.generate(_prompts(tokenizer), params)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)))
    after = engine.generate(_prompts(tokenizer), params)
    assert not torch.equal(after.responses, before.responses)
    assert torch.equal(after.responses, hf.generate(_prompts(tokenizer), params).responses)


def test_rows_stop_at_eos_and_the_loop_ends_when_all_have(tiny):
    """Force EOS as the third token of the even rows; then force it everywhere: one forward, then no more."""
    model, tokenizer = tiny
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    forwards = []

    def force_eos(rows):
        def hook(module, inputs, logits):
            forwards.append(None)
            if len(forwards) == 3 or rows == "all":  # the prefill's logits pick the first token
                logits = logits.clone()
                logits[(slice(0, None, 2) if rows == "even" else slice(None)), -1, eos] = 1e4
            return logits

        return model.get_output_embeddings().register_forward_hook(hook)

    engine = make_rollout_engine("builtin", model, tokenizer, "cpu")
    handle = force_eos("even")
    try:
        batch = engine.generate(_prompts(tokenizer), SamplingParams(n=2, max_new_tokens=7, seed=0))
    finally:
        handle.remove()
    for row, (response, mask) in enumerate(zip(batch.responses.tolist(), batch.response_mask.tolist())):
        if row % 2 == 0:
            assert response[2] == eos and response[3:] == [pad] * 4
            assert mask == [1, 1, 1, 0, 0, 0, 0]
        elif eos in response:
            first = response.index(eos)
            assert response[first + 1 :] == [pad] * (6 - first)

    forwards.clear()
    handle = force_eos("all")
    try:
        batch = engine.generate(_prompts(tokenizer), SamplingParams(n=2, max_new_tokens=6, seed=0))
    finally:
        handle.remove()
    assert len(forwards) == 1  # every row ended on the first token: no decode step ran
    assert batch.responses.tolist() == [[eos] + [pad] * 5] * 6
    assert batch.response_mask.tolist() == [[1] + [0] * 5] * 6


def test_seeds_reproduce_and_leave_the_global_rng_alone(tiny):
    model, tokenizer = tiny
    engine = make_rollout_engine("builtin", model, tokenizer, "cpu")
    prompts = _prompts(tokenizer)
    seeded = SamplingParams(n=4, max_new_tokens=10, seed=7)
    state = torch.get_rng_state()
    a, b = engine.generate(prompts, seeded), engine.generate(prompts, seeded)
    assert torch.equal(a.responses, b.responses)
    assert torch.equal(torch.get_rng_state(), state)
    assert len({tuple(r) for r in a.responses[:4].tolist()}) > 1  # samples of one prompt differ
    other = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=10, seed=8))
    assert not torch.equal(a.responses, other.responses)


def _uniform(rows: int) -> torch.Tensor:
    return torch.rand(rows, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def test_sampling_filters():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).repeat(2000, 1)
    top1, _ = sample(logits, SamplingParams(top_k=1), _uniform(2000))
    assert (top1 == 3).all()
    # Probabilities are .64, .24, .09, .03: the two likeliest are the fewest that reach p=0.7.
    kept, _ = sample(logits, SamplingParams(top_p=0.7), _uniform(2000))
    assert set(kept.tolist()) == {2, 3}
    # The extreme draws still land on tokens of positive probability.
    edges, _ = sample(logits[:2], SamplingParams(top_k=2), torch.tensor([[0.0], [1 - 2**-53]], dtype=torch.float64))
    assert edges.tolist() == [3, 2]
    greedy, log_probs = sample(logits[:1], SamplingParams(do_sample=False, temperature=0.5), _uniform(1))
    assert greedy.tolist() == [3]
    torch.testing.assert_close(log_probs, torch.log_softmax(logits[:1] / 0.5, -1)[:, 3])


def test_the_graph_path_decodes_its_own_bf16_copy_that_sync_weights_refreshes(tiny):
    """The actor on a GPU: fp32 weights, bf16 compute. The graph path decodes its own bf16 copy, stale until
    sync_weights, then equal to a fresh engine's decoding of the updated model; the actor's weights stay fp32."""
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    params = SamplingParams(n=2, max_new_tokens=12, do_sample=False)
    engine = BuiltinRolloutEngine(model, tokenizer, "cpu", static_cache=True, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = engine.generate(_prompts(tokenizer), params)
        assert engine.weights.embedding.dtype == torch.bfloat16
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)))
        assert torch.equal(engine.generate(_prompts(tokenizer), params).responses, before.responses)
        engine.sync_weights(model)
        after = engine.generate(_prompts(tokenizer), params)
        fresh = BuiltinRolloutEngine(model, tokenizer, "cpu", static_cache=True, dtype=torch.bfloat16)
        expected = fresh.generate(_prompts(tokenizer), params)
    assert torch.equal(after.responses, expected.responses)
    assert not torch.equal(after.responses, before.responses)
    assert next(model.parameters()).dtype == torch.float32  # the actor's weights stay as they are


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


@pytest.mark.slow
def test_compiled_lean_step_gives_the_eager_tokens_and_compiles_once_per_run(tiny):
    """compile=True on the CPU (rollout.compile): the lean step and its sampling as one graph over slabs padded to a
    length bucket. Greedy tokens are transformers', seeded samples the eager path's; later calls with other prompts
    and with weights updated in place (as the optimizer does) reuse the graph."""
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    engine = BuiltinRolloutEngine(model, tokenizer, "cpu", compile=True)
    eager = BuiltinRolloutEngine(model, tokenizer, "cpu")
    greedy = SamplingParams(n=2, max_new_tokens=12, do_sample=False)
    expected = make_rollout_engine("hf", model, tokenizer, "cpu").generate(_prompts(tokenizer), greedy)
    assert torch.equal(engine.generate(_prompts(tokenizer), greedy).responses, expected.responses)

    seeded = SamplingParams(n=3, max_new_tokens=12, seed=3)
    compiled = engine.generate(_prompts(tokenizer), seeded)
    graphs = _graphs()
    assert torch.equal(compiled.responses, eager.generate(_prompts(tokenizer), seeded).responses)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)))
    updated = engine.generate(_prompts(tokenizer)[::-1], seeded)
    assert not torch.equal(updated.responses, compiled.responses)
    assert torch.equal(updated.responses, eager.generate(_prompts(tokenizer)[::-1], seeded).responses)
    torch.testing.assert_close(
        updated.rollout_log_probs, eager.generate(_prompts(tokenizer)[::-1], seeded).rollout_log_probs,
        atol=1e-5, rtol=0,
    )
    assert _graphs() == graphs  # no recompilation


def test_compiling_on_the_cpu_without_a_cpp_compiler_says_what_to_do(tiny, monkeypatch):
    from verl_runtime.errors import ConfigError

    monkeypatch.setenv("PATH", "")
    with pytest.raises(ConfigError, match="C\\+\\+ compiler.*rollout.compile=false"):
        BuiltinRolloutEngine(*tiny, "cpu", compile=True)
