"""The tool services under a burst (verl_runtime/services/serving.py): a full sandbox turns a request away at once with
503 and Retry-After instead of letting it hang, stays healthy, counts what it did in Prometheus' format, and the tools'
client tries again with backoff until it gets through or its deadline passes; a tool loop of 256 episodes against
one small sandbox ends its step with every call answered."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from conftest import require
from verl_runtime.agent.loop import ToolLoop
from verl_runtime.agent.tools import load_tools
from verl_runtime.config import MultiTurnConfig
from verl_runtime.rollout import SamplingParams
from verl_runtime.services import client, sandbox

CODE_TOOL = """\
tools:
  - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool
    config: {type: native, sandbox_fusion_url: "URL", default_timeout: 5}
    tool_schema:
      type: function
      function:
        name: code_interpreter
        description: run Python
        parameters: {type: object, properties: {code: {type: string}}, required: [code]}
"""


@pytest.fixture
def run_in_thread():
    """submit(function, *args) -> a future: a request sent beside the test's own."""
    with ThreadPoolExecutor(4) as pool:
        yield pool.submit


@contextlib.contextmanager
def serving(concurrency: int, queue: int):
    """A sandbox of `concurrency` runs at once and `queue` waiting, on a free port; its base URL."""
    try:
        server = sandbox.serve("127.0.0.1", 0, sandbox.Limits(max_run_timeout_s=4), concurrency=concurrency,
                               queue=queue)
    except ValueError as exc:  # no network namespaces for this user here
        require(False, str(exc))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def post(url: str, body: dict) -> tuple[int, dict, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, dict(reply.headers), json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def metric(base: str, name: str, **labels) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))  # as the client writes them
    found = re.search(rf"^{name}\{{{re.escape(wanted)}\}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_full_sandbox_answers_503_at_once_stays_healthy_and_the_client_gets_through(run_in_thread):
    with serving(concurrency=1, queue=0) as base:
        busy = run_in_thread(post, base + "/run_code", {"code": "import time; time.sleep(2); print('slept')"})
        deadline = time.monotonic() + 10
        while metric(base, "verl_deploy_service_in_flight", service="sandbox") < 1:
            assert time.monotonic() < deadline, "the first run never started"
            time.sleep(0.02)

        asked = time.monotonic()
        code, headers, reply = post(base + "/run_code", {"code": "print(1)"})
        answered_in = time.monotonic() - asked
        assert (code, headers["retry-after"]) == (503, "1") and "sandbox is busy" in reply["message"]
        assert answered_in < 1.0  # at once, not after the 2 s run ahead of it
        with urllib.request.urlopen(base + "/health", timeout=5) as health:
            assert health.status == 200  # health answers beside the gate, full or not

        turned_away = []
        through = client.post_json(base + "/run_code", {"code": "print(6 * 7)"}, timeout=10,
                                   on_busy=turned_away.append)
        assert through["run_result"]["stdout"] == "42\n" and turned_away  # it waited its turn, then ran
        assert busy.result()[2]["run_result"]["stdout"] == "slept\n"  # the first run was never disturbed
        assert metric(base, "verl_deploy_service_rejections_total", service="sandbox") == 1 + len(turned_away)
        assert metric(base, "verl_deploy_service_requests_total", service="sandbox", path="/run_code", code="200") == 2


def test_the_client_gives_up_at_its_deadline_and_says_so(run_in_thread):
    with serving(concurrency=1, queue=0) as base:
        run_in_thread(post, base + "/run_code", {"code": "import time; time.sleep(3)"})
        while metric(base, "verl_deploy_service_in_flight", service="sandbox") < 1:
            time.sleep(0.02)
        started = time.monotonic()
        with pytest.raises(client.Busy, match="was busy until the deadline"):
            client.post_json(base + "/run_code", {"code": "print(1)"}, timeout=10, within=0.5)
        assert time.monotonic() - started < 2.5  # within its half second (and one backoff), not the run's 3 s


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def test_runs_are_started_by_worker_processes_and_a_killed_worker_costs_only_its_request(run_in_thread):
    """The server's threads never start a run (one preempted while it held the GIL would stall the event loop, and
    every 503 with it): its worker processes do. One killed under a run answers that request in one line."""
    with serving(concurrency=1, queue=0) as base:
        running = run_in_thread(post, base + "/run_code", {"code": "import time; time.sleep(3); print('slept')"})
        deadline = time.monotonic() + 20
        while not (workers := [w for w in children(os.getpid()) if children(w)]):  # a worker, its run started
            assert time.monotonic() < deadline, "no worker process started the run"
            time.sleep(0.05)
        assert b"anyio.to_process" in Path(f"/proc/{workers[0]}/cmdline").read_bytes()

        os.kill(workers[0], signal.SIGKILL)
        code, _, reply = running.result()
        assert (code, reply) == (500, {"message": "the sandbox worker answering this request died: try again"})
        assert post(base + "/run_code", {"code": "print(6 * 7)"})[2]["run_result"]["stdout"] == "42\n"


def test_runs_stopped_at_a_limit_are_counted(sandbox_server):
    client.post_json(sandbox_server + "/run_code", {"code": "while True: pass", "run_timeout": 1}, timeout=30)
    assert metric(sandbox_server, "verl_deploy_sandbox_kills_total", reason="time") >= 1
    assert metric(sandbox_server, "verl_deploy_service_request_seconds_count", service="sandbox",
                  path="/run_code") >= 1


def test_a_tool_loop_of_256_episodes_against_one_small_sandbox_answers_every_call(tmp_path, tiny_model_dir):
    """Every episode calls the code tool at once; the sandbox runs one program at a time with no room to wait, so
    most calls are turned away at first: each is tried again until it runs, and none goes missing."""
    from verl_runtime.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    call = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
    turn = tokenizer.encode(call, add_special_tokens=False) + [tokenizer.eos_token_id]

    def generate(contexts, params):  # every episode asks for the tool, turn after turn
        responses = torch.tensor([turn] * len(contexts))
        return {"responses": responses, "response_mask": torch.ones_like(responses)}

    with serving(concurrency=1, queue=0) as base:
        config = tmp_path / "tools.yaml"
        config.write_text(CODE_TOOL.replace("URL", base + "/run_code"))
        settings = MultiTurnConfig(enable=True, tool_config_path=str(config), max_assistant_turns=2, tool_timeout=120)
        loop = ToolLoop(generate, tokenizer, load_tools(config), settings, 256)
        prompt = tokenizer.encode("What is 6*7?", add_special_tokens=False)
        batch, metrics = loop.rollout([prompt] * 256, [{}] * 256, SamplingParams(n=1, max_new_tokens=256))
        rejected = metric(base, "verl_deploy_service_rejections_total", service="sandbox")

    tool_texts = [tokenizer.decode(row[(mask == 0) & (row != tokenizer.pad_token_id)])
                  for row, mask in zip(batch["responses"], batch["response_mask"])]
    assert metrics["tool_calls/mean"] == 1 and metrics["tool_calls/errors"] == 0
    assert all("42" in text for text in tool_texts), [t for t in tool_texts if "42" not in t][:3]
    assert rejected > 0  # the burst did meet a full sandbox


def test_the_retriever_is_served_the_same_way():
    from verl_runtime.services import retriever

    server = retriever.serve("127.0.0.1", 0, retriever.load_corpus(retriever.BUNDLED_CORPUS), concurrency=1, queue=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        hits = client.post_json(base + "/retrieve", {"queries": ["capital of France"], "topk": 1}, timeout=10)
        assert hits["result"][0][0]["id"] is not None
        assert metric(base, "verl_deploy_service_requests_total", service="retriever", path="/retrieve", code="200") == 1
        code, _, reply = post(base + "/elsewhere", {})
        assert code == 404 and reply["message"] == "no such path /elsewhere: POST /retrieve, GET /health, GET /metrics"
    finally:
        server.shutdown()
        server.server_close()
