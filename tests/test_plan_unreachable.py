"""A model whose config.json cannot be had (offline and not in the cache, or a Hub that does not answer) is never
planned in silence: `plan` exits 2 with one line naming HF_HUB_OFFLINE=1 and how to give a local path, and `run`
says "not planned" in one line on stderr, on every target and in dry runs, and goes on. Within seconds: the Hub is
asked once, without huggingface_hub's retries.

The closed port is real huggingface_hub code failing to connect (HF_ENDPOINT at a local port nothing listens on),
not a mock. huggingface_hub reads HF_HUB_OFFLINE when first imported; the in-process cases set its constant to what
their environment says, as a fresh process would read it, and one case runs the CLI in a fresh process.
"""

import os
import socket
import subprocess
import sys
import time

import pytest
import yaml
from conftest import FIXTURES, REPO, free_port
from typer.testing import CliRunner

from verl_deploy.cli import app

MODEL = "Qwen/Qwen2.5-72B-Instruct"  # never in the tests' empty Hugging Face cache
SECONDS = 5.0  # huggingface_hub's own retries took 23 s and more here
NOTE = "note: not planned for memory: "


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path, tmp_path_factory):
    """An empty Hugging Face cache, no host GPU, no Docker engine, counts cached apart from the user's."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("HF_HUB_CACHE", "HF_ENDPOINT", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_ETAG_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VERL_DEPLOY_CACHE", str(tmp_path_factory.getbasetemp() / "plan-cache"))  # as test_plan's
    monkeypatch.setenv("VERL_DEPLOY_NVML_READING", str(FIXTURES / "nvml" / "no-driver.json"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")


@pytest.fixture(params=["offline", "closed port"])
def no_hub(request, monkeypatch):
    """The environment of a host without the Hub: HF_HUB_OFFLINE=1, or an HF_ENDPOINT nothing answers at."""
    from huggingface_hub import constants

    if request.param == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        return {"mode": "offline", "says": "HF_HUB_OFFLINE=1: fetch it once where the Hub is reachable"}
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return {"mode": "closed port", "says": f"cannot reach {endpoint} for {MODEL}'s config.json (", "endpoint": endpoint}


def timed(*args):
    start = time.monotonic()
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result, time.monotonic() - start


def test_plan_says_in_one_line_how_to_plan_without_the_hub(no_hub):
    result, took = timed("plan", REPO / "examples" / "gsm8k-grpo.yaml", "--gpu-type", "H100",
                         "--set", f"model.path={MODEL}")
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and MODEL in line and no_hub["says"] in line
    assert "HF_HUB_OFFLINE=1" in line and "give a local path (model.path=/path/to/model, the folder with its " \
                                          "config.json)" in line
    assert result.stdout == "" and "Traceback" not in result.output and "Retry" not in result.output
    assert took < SECONDS, f"{took:.1f} s"


def test_plan_names_verls_key_for_a_verl_run(no_hub):
    result, took = timed("plan", "--runtime", "verl", "--gpu-type", "H100", "--", f"actor_rollout_ref.model.path={MODEL}",
                         "algorithm.adv_estimator=grpo", "trainer.n_gpus_per_node=8",
                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1")
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert "(actor_rollout_ref.model.path=/path/to/model, the folder with its config.json)" in line
    assert took < SECONDS, f"{took:.1f} s"


@pytest.mark.parametrize("target", ["local", "docker", "k8s", "slurm"])
def test_a_run_that_cannot_be_planned_says_so_on_stderr_and_goes_on(no_hub, target, tmp_path):
    """The user's case: a dry run printed its manifests, exit 0, with no word that nothing was planned."""
    result, took = timed("run", REPO / "examples" / "quickstart.yaml", "--target", target, "--dry-run",
                         "--image", "registry.example.com/team/verl-deploy:1", "--run-id", "far",
                         "--runs-dir", tmp_path / "runs", "--set", f"model.path={MODEL}")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if "not planned" in line]
    assert len(notes) == 1 and notes[0].startswith(NOTE) and no_hub["says"] in notes[0], result.stderr
    assert "HF_HUB_OFFLINE=1" in notes[0] and "model.path=/path/to/model" in notes[0]
    assert "not planned" not in result.stdout and result.stdout.strip()  # the dry run itself, clean
    assert "Traceback" not in result.output and "Retry" not in result.output
    assert took < SECONDS, f"{took:.1f} s"
    assert not (tmp_path / "runs").exists()


# By digest: a tag adds its own warning line on stderr (launchers/k8s.py, tag_warning).
PINNED = "registry.example.com/team/verl-deploy:1@sha256:" + "0" * 64


def test_a_kubernetes_dry_run_on_gpus_prints_its_manifests_and_the_note_apart(no_hub, tmp_path):
    """`run --dry-run | kubectl apply -f -` reads only manifests; the note is on stderr."""
    result, took = timed("run", REPO / "examples" / "gsm8k-grpo.yaml", "--target", "k8s", "--dry-run",
                         "--gpus", "8", "--gpu-type", "H100", "--image", PINNED,
                         "--run-id", "big", "--runs-dir", tmp_path / "runs", "--set", f"model.path={MODEL}")
    assert result.exit_code == 0, result.output
    [note] = result.stderr.strip().splitlines()
    assert note.startswith(NOTE) and MODEL in note and no_hub["says"] in note
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout) if doc]
    assert "Job" in kinds
    assert took < SECONDS, f"{took:.1f} s"


def test_a_hub_that_never_answers_is_given_seconds(monkeypatch):
    """A network that swallows the request (no refusal): one HEAD, cut after a few seconds, and the same line."""
    from huggingface_hub import constants

    with socket.socket() as silent:  # takes connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        result, took = timed("plan", REPO / "examples" / "gsm8k-grpo.yaml", "--gpu-type", "H100",
                             "--set", f"model.path={MODEL}")
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: cannot reach {endpoint} for {MODEL}'s config.json (") and "HF_HUB_OFFLINE=1" in line
    assert took < SECONDS, f"{took:.1f} s"


def test_a_cluster_run_whose_gpu_is_not_named_says_so(tmp_path):
    """Nothing else keeps it from being planned: the line names --gpu-type (not this host's GPUs)."""
    qwen7b = FIXTURES / "models" / "Qwen2.5-7B-Instruct"
    result, _ = timed("run", REPO / "examples" / "gsm8k-grpo.yaml", "--target", "k8s", "--dry-run",
                      "--image", PINNED, "--runs-dir", tmp_path / "runs",
                      "--set", f"model.path={qwen7b}")
    assert result.exit_code == 0, result.output
    assert result.stderr.strip().splitlines() == [
        NOTE + "the cluster's GPU is unknown here (name it with --gpu-type to check that the run fits)"]


def test_a_cached_config_is_planned_when_the_hub_does_not_answer(tmp_path, monkeypatch):
    """Online, the Hub not answering, config.json in the cache: planned from the cache, without retries."""
    from huggingface_hub import constants

    repo = tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-7B-Instruct"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text(
        (FIXTURES / "models" / "Qwen2.5-7B-Instruct" / "config.json").read_text())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    args = ("plan", REPO / "examples" / "gsm8k-grpo.yaml", "--gpu-type", "H100", "--gpus", "8",
            "--set", "model.path=Qwen/Qwen2.5-7B-Instruct", "--json")
    with monkeypatch.context() as offline:  # counted first (transformers on the meta device, untimed)
        offline.setenv("HF_HUB_OFFLINE", "1")
        offline.setattr(constants, "HF_HUB_OFFLINE", True)
        assert timed(*args)[0].exit_code in (0, 1)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    result, took = timed(*args)
    assert result.exit_code in (0, 1), result.output
    assert '"parameters": 7615616512' in result.stdout
    assert took < SECONDS, f"{took:.1f} s"


def test_in_a_fresh_process_no_retry_is_printed(tmp_path):
    """huggingface_hub logs each retry through its own handler; only a real process shows what a user sees."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=endpoint)
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "verl_deploy", "plan", "examples/gsm8k-grpo.yaml", "--gpu-type",
                             "H100", "--set", f"model.path={MODEL}"], capture_output=True, text=True, cwd=REPO,
                            env=env, timeout=120)
    took = time.monotonic() - start
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: cannot reach {endpoint} for {MODEL}'s config.json (") and "HF_HUB_OFFLINE=1" in line
    assert result.stdout == ""
    assert took < 2 * SECONDS, f"{took:.1f} s (the interpreter's start included)"
