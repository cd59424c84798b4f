"""The builtin engine's GPU path (rollout/graph_decoder.py) on the CPU: the same code, with the CUDA graph an eager
call of the captured step, or a stand-in for torch.cuda's capture calls. What a GPU adds (the speed of replay, real
capture) is measured by bench/gpu_check.py."""

import copy
import types
from contextlib import contextmanager

import pytest
import torch

from verl_runtime.models import build_tiny_model, load_causal_lm, load_tokenizer
from verl_runtime.rollout import SamplingParams, make_rollout_engine
from verl_runtime.rollout.builtin import BuiltinRolloutEngine
from verl_runtime.rollout.graph_decoder import Graphs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    return load_causal_lm(path, None, "cpu"), load_tokenizer(path)


def _prompts(tokenizer, count=3):
    texts = ["Q: 2+3=?\nA:", "Hi", "Count: 1 2 3", "Name a colour.", "x"]
    return [tokenizer.encode(t) for t in texts[:count]]


def _graph_engine(model, tokenizer, **options):
    return BuiltinRolloutEngine(model, tokenizer, "cpu", static_cache=True, **options)


def test_greedy_tokens_equal_transformers_over_several_calls_and_batch_sizes(tiny):
    model, tokenizer = tiny
    engine = _graph_engine(model, tokenizer)
    hf = make_rollout_engine("hf", model, tokenizer, "cpu")
    for count, n in ((3, 1), (5, 2), (3, 1)):  # 3 rows, 10 rows (two buckets of 8), then the first bucket again
        params = SamplingParams(n=n, max_new_tokens=20, do_sample=False)
        got, expected = (e.generate(_prompts(tokenizer, count), params) for e in (engine, hf))
        assert torch.equal(got.responses, expected.responses)
        assert torch.equal(got.attention_mask, expected.attention_mask)
    assert sorted(b.rows for b in engine._decoders) == [8, 16]  # kept per bucket: the KV cache and the graph


def test_seeded_samples_equal_the_eager_lean_paths_and_reproduce(tiny):
    """The graph path draws every step's numbers as the eager path does: the same seed, the same samples."""
    model, tokenizer = tiny
    params = SamplingParams(n=4, max_new_tokens=16, temperature=0.8, top_k=50, top_p=0.95, seed=7)
    graph = _graph_engine(model, tokenizer).generate(_prompts(tokenizer), params)
    eager = BuiltinRolloutEngine(model, tokenizer, "cpu").generate(_prompts(tokenizer), params)
    again = _graph_engine(model, tokenizer).generate(_prompts(tokenizer), params)
    assert torch.equal(graph.responses, eager.responses) and torch.equal(graph.responses, again.responses)
    torch.testing.assert_close(graph.rollout_log_probs, eager.rollout_log_probs, rtol=1e-4, atol=1e-5)


def test_the_graph_path_reads_its_copy_refreshed_in_place(tiny):
    """sync_weights copies the updated weights into the same tensors (a captured graph holds their addresses)."""
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    engine = _graph_engine(model, tokenizer)
    params = SamplingParams(n=1, max_new_tokens=12, do_sample=False)
    before = engine.generate(_prompts(tokenizer), params)
    addresses = {name: buffer.data_ptr() for name, buffer in engine.weights.named_buffers()}
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)))
    engine.sync_weights(model)
    after = engine.generate(_prompts(tokenizer), params)
    assert {name: buffer.data_ptr() for name, buffer in engine.weights.named_buffers()} == addresses
    assert not torch.equal(after.responses, before.responses)
    assert torch.equal(after.responses, make_rollout_engine("hf", model, tokenizer, "cpu").generate(
        _prompts(tokenizer), params).responses)


def test_rows_stop_at_eos_and_the_loop_ends_soon_after_all_have(tiny, monkeypatch):
    """EOS forced as the third token of the even rows, then everywhere: the even rows end there (padding after),
    and once every row has ended the loop stops at its next look (every CHECK_EVERY steps), not at the limit."""
    from verl_runtime.rollout import graph_decoder

    model, tokenizer = tiny
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    calls = []

    def forcing(logits, params, draws):
        calls.append(None)
        logits = logits.clone()
        if len(calls) == 3:
            logits[0::2, eos] = 1e4
        if len(calls) >= 5:
            logits[:, eos] = 1e4
        return sample(logits, params, draws)

    sample = graph_decoder.sample
    monkeypatch.setattr(graph_decoder, "sample", forcing)
    batch = _graph_engine(model, tokenizer).generate(_prompts(tokenizer), SamplingParams(n=2, max_new_tokens=60,
                                                                                          seed=0))
    for row, (response, mask) in enumerate(zip(batch.responses.tolist(), batch.response_mask.tolist())):
        if row % 2 == 0:
            assert response[2] == eos and response[3:] == [pad] * 57 and sum(mask) == 3
        else:
            assert eos in response[:5] and sum(mask) <= 5
    assert len(calls) == graph_decoder.CHECK_EVERY  # stopped at the first look after every row had ended


class StandInCuda:
    """torch.cuda's capture calls as the graph path makes them, recorded; the "graph" replays the step eagerly."""

    def __init__(self):
        self.calls = []

    def Stream(self, device):  # noqa: N802 - torch.cuda's name
        stream = types.SimpleNamespace(wait_stream=lambda other: self.calls.append("wait"))
        return stream

    def current_stream(self, device):
        return types.SimpleNamespace(wait_stream=lambda other: self.calls.append("wait"))

    @contextmanager
    def stream(self, stream):
        self.calls.append("side stream")
        yield

    def CUDAGraph(self):  # noqa: N802
        outer = self

        class Graph:
            def replay(self):
                outer.calls.append("replay")
                self.step()

        return Graph()

    @contextmanager
    def graph(self, graph):
        self.calls.append("capture")
        frame = __import__("inspect").currentframe().f_back.f_back
        graph.step = frame.f_locals["step"]  # what the capture records: the step, replayed later
        yield


def test_capture_warms_up_on_a_side_stream_restores_the_counters_and_replays_per_token(tiny):
    """The CUDA branch of Graphs.capture, with torch.cuda's calls stood in: one warm-up on a side stream, the counters
    it moved put back, one capture per bucket, one replay per new token; the tokens are still transformers'."""
    model, tokenizer = tiny
    cuda = StandInCuda()
    engine = BuiltinRolloutEngine(model, tokenizer, "cpu", static_cache=True, graphs=Graphs(torch.device("cpu"), cuda))
    params = SamplingParams(n=1, max_new_tokens=10, do_sample=False)
    expected = make_rollout_engine("hf", model, tokenizer, "cpu").generate(_prompts(tokenizer), params)
    for _ in range(2):
        assert torch.equal(engine.generate(_prompts(tokenizer), params).responses, expected.responses)
    assert cuda.calls[:4] == ["wait", "side stream", "wait", "capture"]
    assert cuda.calls.count("capture") == 1  # the second call reuses the bucket's graph
    assert cuda.calls.count("replay") == 2 * 9  # the first token comes from the prefill


def test_offload_moves_the_copy_and_drops_caches_between_rollouts(tiny):
    model, tokenizer = tiny
    engine = _graph_engine(model, tokenizer)
    engine.generate(_prompts(tokenizer), SamplingParams(n=1, max_new_tokens=4, do_sample=False))
    assert engine._decoders and set(engine.offload_parts()) == {"rollout weights"}
    engine.release_caches()
    assert not engine._decoders
    assert not BuiltinRolloutEngine(model, tokenizer, "cpu").offload_parts()  # the CPU's lean path has no copy


@pytest.mark.parametrize("name", ["tiny", "tiny_llama"])
def test_the_copy_refreshes_from_a_whole_state_dict_as_from_the_model(request, name):
    """Under FSDP the engine takes the gathered state dict (transformers' names), not a model: the same tensors."""
    from verl_runtime.rollout.graph_decoder import DecodeWeights

    if name == "tiny_llama":
        model = load_causal_lm(request.getfixturevalue("tiny_llama_dir"), None, "cpu")
    else:
        model = request.getfixturevalue("tiny")[0]
    from_model, from_state = (DecodeWeights(model, torch.float32, torch.device("cpu")) for _ in range(2))
    with torch.no_grad():
        for buffer in from_state.buffers():
            buffer.zero_()
    from_state.refresh({key: value.clone() for key, value in model.state_dict().items()})
    for (key, expected), (_, got) in zip(from_model.named_buffers(), from_state.named_buffers()):
        assert torch.equal(got, expected), key
