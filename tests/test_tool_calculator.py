"""The agentic quickstart (issue #40): examples/tool-calculator.yaml trains builtin:tiny-tools to answer toy:calculator
questions by calling the code tool, whose code runs in the run's sandbox service; the tool calls per episode and the
reward rise, and nothing of the run is left running after."""

from __future__ import annotations

import contextlib
import random
import re
import threading
import time

import pytest
import torch
import yaml
from conftest import REPO
from launch_support import assert_logged, cli, containers
from transformers import AutoModelForCausalLM

from verl_runtime import tool_lesson
from verl_runtime.agent import hermes
from verl_runtime.agent.loop import _after_end_of_turn, _template
from verl_runtime.data import make_toy_rows
from verl_runtime.metrics import read_metrics
from verl_runtime.models import BUILTIN_TINY, build_tiny_model, load_tokenizer
from verl_runtime.rewards import default_compute_score

EXAMPLE = REPO / "examples" / "tool-calculator.yaml"


def test_a_calculator_question_is_scored_by_the_last_number_of_the_response():
    row = make_toy_rows("calculator", 8, seed=0)[3]
    question = row["prompt"][0]["content"]
    a, b = map(int, re.fullmatch(r"What is (\d+)\*(\d+)\?", question).groups())
    product = row["reward_model"]["ground_truth"]
    assert product == str(a * b) and row["data_source"] == "toy/calculator"

    def score(response):
        return default_compute_score("toy/calculator", response, product)

    call = tool_lesson.tool_call(f"print({a}*{b})")
    assert score(f"{call}\ntool\n{product}\n\nassistant\n{product}") == 1.0  # called, and answered with the reply
    assert score(f"{call}\ntool\n{product}\n\nassistant\n{int(product) + 1}") == 0.0  # a wrong answer counts
    assert score(f"{call}\ntool\n{product}\n\n") == 1.0  # stopped at a right reply: the call was right
    assert score(call) == 0.0  # a call with no reply ends on the question's numbers
    assert score("no idea") == 0.0


def test_the_lesson_is_the_conversation_the_tool_loop_plays():
    tokenizer = load_tokenizer(BUILTIN_TINY)
    rng = random.Random(0)
    messages = next(m for m in (tool_lesson.transcript(rng) for _ in range(100)) if len(m) == 4)  # not a guess
    ids, mask = tool_lesson.encode(tokenizer, messages)

    # what the loop sends the model, then appends after the call: its separator and the tool turn, rendered alike
    prompt = _template(tokenizer, messages[:1], [], generation=True)
    tool_turn = _after_end_of_turn(tokenizer) + _template(tokenizer, messages[:1] + messages[2:3], [], True)[
        len(_template(tokenizer, messages[:1], [], False)):]
    eos = tokenizer.eos_token
    assert tokenizer.decode(ids) == prompt + messages[1]["content"] + eos + tool_turn + messages[3]["content"] + eos + "\n"
    # the loss is on the assistant's turns, each with its end-of-turn token, as the RL step's response mask has it
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == messages[1]["content"] + eos + messages[3]["content"] + eos

    # the call is one the loop parses, of the function verl's sandbox tool config names, printing the question's sum
    call = hermes.parse(messages[1]["content"]).calls
    schema = yaml.safe_load((REPO / "examples" / "tools" / "sandbox_fusion_tool_config.yaml").read_text())
    assert [c.name for c in call] == [schema["tools"][0]["tool_schema"]["function"]["name"]]
    assert call[0].arguments == {"code": f"print({messages[0]['content'][8:-1]})"}
    assert messages[2]["content"] == f"{eval(messages[0]['content'][8:-1])}\n"  # what print writes


def test_the_lesson_calls_the_tool_in_about_half_the_transcripts():
    rng = random.Random(1)
    calls = sum(len(tool_lesson.transcript(rng)) == 4 for _ in range(1000)) / 1000
    assert abs(calls - tool_lesson.CALL_SHARE) < 0.05


def test_teaching_changes_the_weights_and_saves_a_loadable_model(tmp_path):
    before = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m")).state_dict()
    taught = AutoModelForCausalLM.from_pretrained(tool_lesson.teach(tmp_path / "m", steps=3)).state_dict()
    assert before.keys() == taught.keys()
    assert not torch.equal(before["model.embed_tokens.weight"], taught["model.embed_tokens.weight"])


def _trained(run_dir) -> tuple[list[float], list[float]]:
    rows = [row for row in read_metrics(run_dir) if "tool_calls/mean" in row]
    return [row["tool_calls/mean"] for row in rows], [row["critic/score/mean"] for row in rows]


def _assert_it_learned_to_call(run_dir):
    calls, rewards = _trained(run_dir)
    assert len(calls) == 40
    first, last = slice(0, 5), slice(-10, None)

    def mean(values, part):
        return sum(values[part]) / len(values[part])

    # the taught model calls in about half its episodes; RL makes it call in nearly all, and the reward follows
    assert mean(calls, first) < 0.7 and mean(calls, last) > 0.8, calls
    assert mean(rewards, last) > mean(rewards, first) + 0.2, rewards


@pytest.mark.slow
def test_the_agentic_quickstart_learns_to_call_the_tool_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # as a user runs it: the example names its tool config from the checkout's root
    runs = tmp_path / "runs"
    result = cli("run", EXAMPLE, "--target", "local", "--runs-dir", runs, "--run-id", "calc")
    assert result.exit_code == 0, result.output
    run_dir = runs / "calc"
    log = (run_dir / "train.log").read_text()
    assert "service sandbox: started on http://127.0.0.1:" in log and "Training finished at step 40" in log
    assert re.search(r"step 40/40 \| reward [\d.]+ \| .* \| tool calls [\d.]+ \|", log)
    _assert_it_learned_to_call(run_dir)
    assert not (run_dir / "services.json").exists()  # the sandbox stopped with the run


@pytest.mark.docker
def test_the_agentic_quickstart_learns_in_docker_with_the_sandbox_as_a_container(tmp_path, cpu_image, services_image,
                                                                                docker_client, leftovers, monkeypatch):
    monkeypatch.chdir(REPO)
    runs = tmp_path / "runs"
    leftovers.append("calc-docker")
    images, running = {}, threading.Event()  # the images its containers run, seen while they run
    running.set()

    def watch():
        while running.is_set():
            with contextlib.suppress(Exception):  # a container removed while looked at
                images.update({c.name: c.image.tags[0] for c in containers(docker_client, "calc-docker")})
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    result = cli("run", EXAMPLE, "--target", "docker", "--image", cpu_image, "--runs-dir", runs, "--run-id",
                 "calc-docker", "--shm-size", "1g")
    running.clear()
    watcher.join()
    assert result.exit_code == 0, result.output
    run_dir = runs / "calc-docker"
    assert_logged(run_dir, "service sandbox: http://calc-docker-sandbox:8080 is healthy")  # its containers are gone
    _assert_it_learned_to_call(run_dir)
    assert not containers(docker_client, "calc-docker"), "the trainer's and the sandbox's containers are gone"
    assert not docker_client.networks.list(names=["calc-docker-services"])
    assert images == {"calc-docker-sandbox": services_image, "calc-docker": cpu_image}  # the sandbox: no torch
