"""Multi-turn rollouts with tools (verl_runtime/agent/): verl's tool config files load, hermes tool calls run, tool
responses join the response without loss on them, and a verl multi-turn command line trains on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from verl_runtime.agent import hermes
from verl_runtime.agent.loop import ToolLoop, truncate
from verl_runtime.agent.tools import SandboxFusionTool, load_tools
from verl_runtime.config import MultiTurnConfig
from verl_runtime.errors import ConfigError

# verl's own examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml
GSM8K_TOOL_CONFIG = """\
tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if parsed answer is incorrect or not correctly parsed)"
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer to the GSM8K math problem, must be a digits"
          required: ["answer"]
"""

CALCULATOR = """\
tools:
  - class_name: verl_runtime.agent.tools.CalculatorTool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: calculator
        description: evaluate an arithmetic expression
        parameters:
          type: object
          properties: {expression: {type: string}}
          required: [expression]
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_hermes_calls_are_read_and_a_bad_one_is_an_error_not_a_crash():
    parsed = hermes.parse('think <tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
                          '<tool_call>{"name": "x", "arguments": "{\\"a\\": 1}"}</tool_call><tool_call>{oops</tool_call>')
    assert parsed.content == "think "
    assert parsed.calls == [hermes.ToolCall("calculator", {"expression": "6*7"}), hermes.ToolCall("x", {"a": 1})]
    assert len(parsed.errors) == 1 and "is not JSON with a name and arguments" in parsed.errors[0]
    assert hermes.parse("no calls").calls == []


def test_verls_gsm8k_tool_config_loads_and_scores_as_verls_tool(tmp_path):
    import asyncio

    tools = load_tools(write(tmp_path, "gsm8k_tool_config.yaml", GSM8K_TOOL_CONFIG))
    tool = tools["calc_gsm8k_reward"]
    instance, _ = asyncio.run(tool.create(ground_truth="72"))
    wrong, reward, _ = asyncio.run(tool.execute(instance, {"answer": "71"}))
    right, better, _ = asyncio.run(tool.execute(instance, {"answer": "72"}))
    assert (reward, better) == (-0.05, 0.0) and "reward=1.0" in right.text and "reward=0.0" in wrong.text
    assert asyncio.run(tool.calc_reward(instance)) == 1.0
    # as verl 0.9.1's loop calls it: the row's create_kwargs in one keyword
    called, _ = asyncio.run(tool.create(create_kwargs={"ground_truth": "72"}))
    assert "reward=1.0" in asyncio.run(tool.execute(called, {"answer": "72"}))[0].text


@pytest.mark.parametrize("text, says", [
    (CALCULATOR.replace("verl_runtime.agent.tools.CalculatorTool", "verl.tools.nope.Nope"), "unknown tool class"),
    (CALCULATOR.replace("required: [expression]", "required: [expr]"), "requires expr, which properties does not"),
    (CALCULATOR.replace("name: calculator", "name: 'a tool'"), "must be 1-64 letters"),
    (CALCULATOR.replace("type: function\n", "type: nope\n"), "needs type: function"),
    ("tools: []\n", "has no tools"),
    (CALCULATOR + CALCULATOR.replace("tools:\n", ""), "a second tool named 'calculator'"),
    (CALCULATOR.replace("{type: native}", "{type: mcp}"), "MCP tools are not"),
])
def test_a_bad_tool_config_is_one_line(tmp_path, text, says):
    with pytest.raises(ConfigError, match=says) as caught:
        load_tools(write(tmp_path, "tools.yaml", text))
    assert "\n" not in str(caught.value)


def test_a_users_tool_class_loads_as_verl_loads_it(tmp_path, monkeypatch):
    write(tmp_path, "my_tools.py", textwrap.dedent("""
        class Echo:
            def __init__(self, config, tool_schema):
                self.name, self.tool_schema, self.prefix = tool_schema["function"]["name"], tool_schema, config["prefix"]
            async def create(self, instance_id=None, **kwargs):
                return "one", None
            async def execute(self, instance_id, parameters, **kwargs):
                return self.prefix + parameters["text"], 0.5, {}
            async def release(self, instance_id, **kwargs):
                pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = CALCULATOR.replace("verl_runtime.agent.tools.CalculatorTool", "my_tools.Echo").replace(
        "{type: native}", "{type: native, prefix: '> '}")
    assert set(load_tools(write(tmp_path, "tools.yaml", config))) == {"calculator"}


def test_long_tool_responses_are_cut_as_verl_cuts_them():
    assert truncate("abcdefgh", 4, "left") == "(truncated)...efgh"
    assert truncate("abcdefgh", 4, "right") == "abcd...(truncated)"
    assert truncate("abcdefgh", 4, "middle") == "ab...(truncated)...gh"
    assert truncate("abc", 4, "middle") == "abc"


@pytest.fixture(scope="module")
def tool_caller(tiny_model_dir):
    """The tiny model taught (a few dozen steps on one transcript) to answer "What is 6*7?" with a calculator call."""
    from transformers import AutoModelForCausalLM

    from verl_runtime.data import prompt_token_ids
    from verl_runtime.models import load_tokenizer

    torch.manual_seed(0)
    tokenizer = load_tokenizer(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompt = prompt_token_ids([{"role": "user", "content": "What is 6*7?"}], tokenizer)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    ids = torch.tensor([prompt + tokenizer.encode(call, add_special_tokens=False) + [tokenizer.eos_token_id]])
    labels = ids.clone()
    labels[:, : len(prompt)] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(60):
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, tokenizer, prompt


def test_a_tool_call_runs_and_its_response_is_context_without_loss(tmp_path, tool_caller):
    from verl_runtime.rollout import SamplingParams
    from verl_runtime.rollout.hf import HFRolloutEngine

    model, tokenizer, prompt = tool_caller
    engine = HFRolloutEngine(model, tokenizer, "cpu")
    tools = load_tools(write(tmp_path, "tools.yaml", CALCULATOR))
    settings = MultiTurnConfig(enable=True, tool_config_path="tools.yaml", max_assistant_turns=2)
    loop = ToolLoop(lambda ids, params: vars(engine.generate(ids, params)), tokenizer, tools, settings, 160)
    batch, metrics = loop.rollout([prompt], [{}], SamplingParams(n=2, do_sample=False, max_new_tokens=160))

    response, mask = batch["responses"][0], batch["response_mask"][0]
    real = batch["attention_mask"][0, -160:].bool()
    tool_text = tokenizer.decode(response[real & (mask == 0)])
    assert tool_text == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"  # the calculator's answer
    assert tokenizer.decode(response[mask.bool()]).startswith('<tool_call>{"name": "calculator"')
    assert (mask <= real.long()).all() and batch["input_ids"].shape == (2, len(prompt) + 160)
    # two assistant turns (the limit), one tool turn, the prompt: verl's count; one call per episode
    assert metrics["num_turns/mean"] == 4 and metrics["tool_calls/mean"] == 1 and metrics["tool_calls/errors"] == 0


@pytest.fixture(scope="module")
def sandbox_url(sandbox_server):
    return f"{sandbox_server}/run_code"


def test_verls_code_tool_runs_in_our_sandbox_and_a_loop_is_cut(sandbox_url):
    schema = {"type": "function", "function": {"name": "code_interpreter", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}
    tool = SandboxFusionTool({"sandbox_fusion_url": sandbox_url, "default_timeout": 2}, schema)
    printed, _, _ = tool.execute("i", {"code": "print(6*7)"})
    assert printed.text.strip() == "42"
    looped, _, metrics = tool.execute("i", {"code": "while True: pass"})
    assert metrics["status"] == "TimeLimitExceeded"
    with pytest.raises(ConfigError, match="sandbox_fusion_url is needed"):
        SandboxFusionTool({}, schema)


def test_a_verl_multi_turn_line_trains_a_cpu_step(tmp_path):
    """verl's GSM8K tool config on a verl command line: the run composes, loads the tools and trains, with verl's
    num_turns/* in its metrics."""
    tools = write(tmp_path, "gsm8k_tool_config.yaml", GSM8K_TOOL_CONFIG)
    run_dir = tmp_path / "run"
    line = [sys.executable, "-m", "verl_runtime.main_ppo", "actor_rollout_ref.model.path=builtin:tiny",
            "data.train_files=toy:letter", "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.n=2", "data.max_response_length=16", "trainer.total_training_steps=1",
            "trainer.device=cpu", "trainer.logger=console", f"trainer.run_dir={run_dir}",
            "actor_rollout_ref.rollout.multi_turn.enable=True",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2"]
    done = subprocess.run(line, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    metrics = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics["num_turns/min"] >= 2 and "tool_calls/mean" in metrics

    bad = write(tmp_path, "bad.yaml", GSM8K_TOOL_CONFIG.replace("verl.tools.gsm8k_tool", "verl.tools.gone"))
    refused = subprocess.run([*line[:-2], f"actor_rollout_ref.rollout.multi_turn.tool_config_path={bad}"],
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "unknown tool class 'verl.tools.gone.Gsm8kTool'" in refused.stderr.strip().splitlines()[-1]


def test_the_retriever_answers_search_r1s_api_and_verls_search_tool_reads_it(tmp_path):
    """BM25 over the bundled corpus behind Search-R1's retrieve API; verl's SearchTool formats its passages."""
    from verl_runtime.agent.tools import SearchTool
    from verl_runtime.services import retriever

    server = retriever.serve("127.0.0.1", 0, retriever.load_corpus(retriever.BUNDLED_CORPUS))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/retrieve"
    try:
        schema = {"type": "function", "function": {"name": "search", "parameters": {
            "type": "object", "properties": {"query_list": {"type": "array"}}, "required": ["query_list"]}}}
        tool = SearchTool({"retrieval_service_url": url, "topk": 2}, schema)
        response, _, _ = tool.execute("i", {"query_list": ["capital of France", "highest mountain"]})
        text = json.loads(response.text)["result"]
        first, second = text.split("\n---\n")
        assert first.startswith('Doc 1 (Title: "Paris")\nParis is the capital') and "Doc 2" in first
        assert second.startswith('Doc 1 (Title: "Mount Everest")')
        import urllib.error
        import urllib.request

        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(urllib.request.Request(url, b'{"queries": "not a list"}'))
        assert bad.value.code == 400 and b"queries must be a list of strings" in bad.value.read()
    finally:
        server.shutdown()
        server.server_close()
    torn = write(tmp_path, "corpus.jsonl", '{"id": "0", "contents": "\\"A\\"\\ntext"}\n{"id": 1\n')
    done = subprocess.run([sys.executable, "-m", "verl_runtime.services.retriever", "--corpus", str(torn)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"error: corpus {torn} line 2 is not JSON with a contents field (Search-R1's format: "
        '{"id": ..., "contents": "\\"Title\\"\\ntext"})']
