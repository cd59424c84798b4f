"""Temperature 0 is greedy decoding on every engine, as in vLLM and transformers: the tokens of do_sample=false, with
log-probs of the model's own distribution, which the trainer recomputes the same way. A run with
rollout.temperature=0 trains (it used to end in `index 259 is out of bounds`: logits divided by 0)."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO, require
from vllm_support import VLLM_INSTALLED, VLLM_MISSING
from verl_runtime.models import build_tiny_model, load_causal_lm, load_tokenizer, response_log_probs
from verl_runtime.rollout import SamplingParams, make_rollout_engine
from verl_runtime.rollout.base import logit_temperature


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    return load_causal_lm(path, None, "cpu"), load_tokenizer(path)


def _prompts(tokenizer):
    return [tokenizer.encode("Q: 2+3=?\nA:"), tokenizer.encode("Hi"), tokenizer.encode("Count: 1 2 3")]


ZERO = SamplingParams(n=2, max_new_tokens=16, temperature=0, top_k=5, top_p=0.5, seed=7)
GREEDY = SamplingParams(n=2, max_new_tokens=16, do_sample=False)


def test_temperature_0_asks_every_engine_for_greedy_decoding():
    assert ZERO.do_sample is False and ZERO.temperature == 1.0  # no engine divides logits by 0
    assert logit_temperature(0) == 1.0 and logit_temperature(0.7) == 0.7


@pytest.fixture(scope="module")
def transformers_greedy(tiny):
    model, tokenizer = tiny
    return make_rollout_engine("hf", model, tokenizer, "cpu").generate(_prompts(tokenizer), GREEDY)


@pytest.mark.parametrize("name", ["hf", "builtin"])
def test_temperature_0_gives_the_greedy_tokens(tiny, name, transformers_greedy):
    model, tokenizer = tiny
    engine = make_rollout_engine(name, model, tokenizer, "cpu")
    zero = engine.generate(_prompts(tokenizer), ZERO)
    assert torch.equal(zero.responses, engine.generate(_prompts(tokenizer), GREEDY).responses)
    assert torch.equal(zero.responses, transformers_greedy.responses)
    assert torch.equal(zero.responses[0::2], zero.responses[1::2])  # a prompt's samples are all the argmax
    if zero.rollout_log_probs is not None:  # the builtin engine reports them: the trainer's own, at temperature 1
        recomputed, _ = response_log_probs(model, zero.input_ids, zero.attention_mask, zero.position_ids, 16,
                                           temperature=logit_temperature(0))
        mask = zero.response_mask.bool()
        assert torch.allclose(zero.rollout_log_probs[mask], recomputed[mask], atol=1e-4)


@pytest.mark.vllm
@pytest.mark.slow
def test_temperature_0_gives_the_greedy_tokens_on_vllm(tiny, transformers_greedy):
    require(VLLM_INSTALLED, VLLM_MISSING)
    model, tokenizer = tiny
    engine = make_rollout_engine("vllm", model, tokenizer, "cpu")
    zero = engine.generate(_prompts(tokenizer), ZERO)
    assert torch.equal(zero.responses, engine.generate(_prompts(tokenizer), GREEDY).responses)
    assert torch.equal(zero.responses, transformers_greedy.responses)
    assert torch.isfinite(zero.rollout_log_probs).all()


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["builtin", "hf"])
def test_a_run_at_temperature_0_trains(engine, tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "verl_runtime", "train", str(REPO / "examples" / "quickstart.yaml"),
         "--set", "rollout.temperature=0", "--set", f"rollout.name={engine}", "--set", "trainer.total_training_steps=1",
         "--set", "data.batch_size=4", "--set", f"trainer.run_dir={run_dir}", "--set", "trainer.save_hf=false"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    [step] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert step["step"] == 1 and all(value == value for value in step.values())  # no NaN
    assert step["rollout/logprob_diff"] < 1e-3 if "rollout/logprob_diff" in step else True
