"""The code sandbox (verl_runtime/services/sandbox.py) speaks SandboxFusion's run_code API, so verl 0.9.1's own client
(its sandbox_fusion reward scorer) judges programs through it; the code it runs is cut off the network, runs as
nobody with nothing of the server's environment, and is stopped at its time, memory and output limits."""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from verl_runtime.services import sandbox
from verl_wheel import verl  # noqa: F401 (verl 0.9.1's modules from its wheel)


@pytest.fixture(scope="module")
def url(sandbox_server):
    return sandbox_server


def post(url: str, body, path: str = "/run_code") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def run(url: str, code: str, **fields) -> dict:
    status, reply = post(url, {"code": code, "language": "python", **fields})
    assert status == 200
    return reply


def test_verls_own_client_judges_programs_through_it(verl, url):
    client = importlib.import_module("verl.utils.reward_score.sandbox_fusion.utils")
    cases = {"inputs": ["2\n", "21\n"], "outputs": ["4\n", "42\n"]}
    judged = {
        "print(int(input()) * 2)": [True, True],
        "print(int(input()) + 2)": [True, False],
        "raise SystemExit(3)": [-2, -2],  # a runtime error
        "while True: pass": [-3, -3],  # killed at its time limit
    }
    for program, expected in judged.items():  # 4 s: the server's ceiling; the loop is stopped there
        results, metadata = client.check_correctness(f"{url}/run_code", cases, program, timeout=4)
        assert results == expected, metadata


def test_the_code_has_no_network(url):
    port = int(url.rsplit(":", 1)[1])
    reach = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('reached')"
    with socket.create_connection(("127.0.0.1", port), timeout=3):
        pass  # the server is there for this process
    reply = run(url, reach)
    assert reply["status"] == "Failed" and "reached" not in reply["run_result"]["stdout"]
    assert "Network is unreachable" in reply["run_result"]["stderr"]


def test_the_code_runs_as_nobody_with_nothing_of_the_servers_environment(url, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    reply = run(url, "import os; print(os.getuid()); print(sorted(os.environ))")
    uid, names = reply["run_result"]["stdout"].splitlines()
    assert int(uid) != 0 and "HF_TOKEN" not in names and "hf_secret" not in reply["run_result"]["stdout"]


def test_the_code_runs_below_the_servers_cpu_priority(url):
    """The server's event loop turns requests away and answers health checks at once however many runs burn CPU."""
    reply = run(url, "import os; print(os.nice(0))")
    assert reply["run_result"]["stdout"] == f"{max(sandbox.Limits.nice, os.nice(0))}\n"


def test_a_loop_forever_is_killed_at_its_time_limit_with_what_it_started(url):
    reply = run(url, "import subprocess\nsubprocess.Popen(['sleep', '97'])\nwhile True: pass", run_timeout=1)
    assert reply["status"] == "Failed" and reply["run_result"]["status"] == "TimeLimitExceeded"
    assert reply["run_result"]["execution_time"] < 30  # the loop never ends by itself: a limit stopped it
    assert _gone(b"sleep\x0097\x00", within=5), "the background process outlived its run"
    # a run_timeout above the server's ceiling (4 s here) is cut to it: the 60 s sleep does not finish
    ceiling = run(url, "import time; time.sleep(60)", run_timeout=600)["run_result"]
    assert ceiling["status"] == "TimeLimitExceeded" and ceiling["execution_time"] < 30


def _gone(cmdline: bytes, within: float) -> bool:
    """No process runs `cmdline` within a few seconds: SIGKILL is delivered when the kernel next schedules the process,
    which on a loaded machine is a moment after the sandbox answered (its 97 s would be far longer)."""
    deadline = time.monotonic() + within
    while any(pid.isdigit() and _cmdline(pid) == cmdline for pid in os.listdir("/proc")):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_memory_over_the_limit_fails_the_run_not_the_sandbox(url):
    reply = run(url, "block = bytearray(600 << 20)\nprint('allocated')", memory_limit_MB=128)
    assert reply["status"] == "Failed" and "MemoryError" in reply["run_result"]["stderr"]
    assert run(url, "print('next')")["run_result"]["stdout"] == "next\n"


def test_a_flood_of_output_is_cut_at_the_limit(url):
    reply = run(url, "while True: print('x' * 1000)")
    result = reply["run_result"]
    assert reply["status"] == "Failed" and len(result["stdout"]) <= sandbox.Limits().output_bytes
    assert "[sandbox] output limit reached" in result["stderr"]


def test_bash_runs_too(url):
    reply = run(url, "read n; echo $((n * 3))", language="bash", stdin="14\n")
    assert reply["status"] == "Success" and reply["run_result"]["stdout"] == "42\n"


def test_bad_requests_get_one_line_and_the_sandbox_goes_on(url):
    status, reply = post(url, b"{not json")
    assert status == 400 and reply["status"] == "SandboxError" and "\n" not in reply["message"]
    _, reply = post(url, {"code": "int main() {}", "language": "cpp"})
    assert reply == {**reply, "status": "SandboxError", "message": "language 'cpp' is not run here: python, bash"}
    _, reply = post(url, {"code": "print(1)", "run_timeout": -1})
    assert reply["message"] == "run_timeout must be a positive number, got -1"
    assert post(url, {"code": "print(1)"}, path="/elsewhere")[0] == 404
    with urllib.request.urlopen(url + "/health", timeout=5) as health:
        assert health.read() == b"pong"


def test_the_service_starts_answers_and_stops_on_sigterm():
    service = subprocess.Popen([sys.executable, "-m", "verl_runtime.services.sandbox", "--port", "0"],
                               stderr=subprocess.PIPE, text=True)
    try:
        banner = service.stderr.readline()
        if banner.startswith("error:") and os.environ.get("CI", "").lower() != "true":
            pytest.skip(banner.strip())
        assert banner.startswith("sandbox: serving run_code on http://127.0.0.1:"), banner
        address = banner.rsplit(" ", 1)[1].strip()
        assert run(address, "print(6 * 7)")["run_result"]["stdout"] == "42\n"
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=10) == 0
    finally:
        service.kill()
        service.wait()


def test_an_unknown_isolation_is_one_line():
    done = subprocess.run([sys.executable, "-m", "verl_runtime.services.sandbox", "--network-isolation", "none"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == "error: --network-isolation 'none': use namespace or external\n"
