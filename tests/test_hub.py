"""Models by Hub id, resolved by huggingface_hub's own code: a hub-layout cache built here (refs/, snapshots/ with the
built-in tiny model), read offline; a local HTTP server standing in for the Hub where the Hub would answer (a gated
model), a closed port where it cannot be reached. Each case runs in a fresh process, as huggingface_hub reads
HF_HOME, HF_ENDPOINT and HF_HUB_OFFLINE when it is imported.
"""

import http.server
import os
import shutil
import subprocess
import sys
import threading

import pytest

from conftest import REPO, free_port

COMMIT = "0123456789abcdef0123456789abcdef01234567"
RESOLVE = "import sys; from verl_runtime.models import resolve_model_path; print(resolve_model_path(sys.argv[1]))"


@pytest.fixture
def hf_home(tmp_path, tiny_model_dir, tiny_opt_dir):
    """$HF_HOME whose hub cache holds org/tiny (a Qwen2; revisions main and v1) and org/opt (an OPT: not of the
    Llama family the lean path takes), as huggingface_hub lays a download out."""
    home = tmp_path / "hf"
    for name, model in (("tiny", tiny_model_dir), ("opt", tiny_opt_dir)):
        repo = home / "hub" / f"models--org--{name}"
        shutil.copytree(model, repo / "snapshots" / COMMIT)
        (repo / "refs").mkdir()
        for ref in ("main", "v1"):
            (repo / "refs" / ref).write_text(COMMIT)
    return home


def run(code_or_args, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, *code_or_args] if isinstance(code_or_args, list) else [sys.executable, "-c", code_or_args]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=300, cwd=REPO, env={**clean, **env})


def test_a_hub_id_resolves_from_the_cache_offline(hf_home):
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    for spec in ("org/tiny", "org/tiny@v1", f"org/tiny@{COMMIT}"):
        result = run(RESOLVE, env, spec)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == str(hf_home / "hub" / "models--org--tiny" / "snapshots" / COMMIT)


@pytest.mark.parametrize("model", ["org/tiny", "org/opt"])
def test_the_trainer_trains_a_model_given_by_hub_id(hf_home, tmp_path, model):
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    result = run(["-m", "verl_runtime", "train", "examples/quickstart.yaml"], env,
                 "--set", f"model.path={model}", "--set", "trainer.total_training_steps=1", "--set", "trainer.test_freq=-1",
                 "--set", f"trainer.run_dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"[INFO] Loading pretrained model from {model}" in result.stdout
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1


def test_offline_and_not_in_the_cache_is_one_line(hf_home, tmp_path):
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    result = run(["-m", "verl_runtime", "train", "examples/quickstart.yaml"], env,
                 "--set", "model.path=Qwen/Qwen2.5-0.5B-Instruct", "--set", f"trainer.run_dir={tmp_path / 'run'}")
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert line == (f"error: Qwen/Qwen2.5-0.5B-Instruct is not in the Hugging Face cache {hf_home / 'hub'} and "
                    "HF_HUB_OFFLINE=1: download it there first (`hf download Qwen/Qwen2.5-0.5B-Instruct`), or unset "
                    "HF_HUB_OFFLINE")
    assert "Traceback" not in result.stderr


def test_a_hub_that_cannot_be_reached_is_one_line(tmp_path):
    endpoint = f"http://127.0.0.1:{free_port()}"
    result = run(RESOLVE, {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": endpoint}, "org/absent")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"verl_runtime.errors.ModelError: cannot reach {endpoint} to download org/absent")
    assert "set HF_ENDPOINT to a mirror" in last


class GatedHub(http.server.BaseHTTPRequestHandler):
    """The Hub's answer for a gated model to a caller without access (as huggingface_hub reads it)."""

    def do_GET(self):  # noqa: N802
        body = b'{"error": "Access to model org/gated is restricted."}'
        self.send_response(401)
        self.send_header("X-Error-Code", "GatedRepo")
        self.send_header("X-Error-Message", "Access to model org/gated is restricted.")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def test_a_gated_model_without_a_token_is_one_line(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), GatedHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}"}
        result = run(RESOLVE, env, "org/gated")
    finally:
        server.shutdown()
    last = result.stderr.strip().splitlines()[-1]
    assert last == ("verl_runtime.errors.ModelError: org/gated is a gated model: accept its terms on the Hub, then set "
                    "HF_TOKEN to a token of that account")


def test_a_path_that_is_neither_a_directory_nor_a_hub_id_says_what_model_path_takes(tmp_path):
    result = run(RESOLVE, {"HF_HOME": str(tmp_path / "hf")}, str(tmp_path / "nowhere"))
    last = result.stderr.strip().splitlines()[-1]
    assert "set model.path to a local Hugging Face model directory (with config.json), a Hub id (org/name or " in last


def test_a_mirror_and_offline_mode_travel_into_the_run(tmp_path):
    from verl_deploy.launchers.jobspec import build_spec

    config = tmp_path / "c.yaml"
    config.write_text("model:\n  path: org/tiny\n")
    environ = {"HF_ENDPOINT": "https://hf-mirror.example", "HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_secret"}
    spec = build_spec(config, image="img", runs_root=tmp_path, run_id="r", environ=environ)
    assert spec.container_env["HF_ENDPOINT"] == "https://hf-mirror.example"
    assert spec.container_env["HF_HUB_OFFLINE"] == "1"
    assert "HF_TOKEN" not in spec.container_env and spec.secrets == ("HF_TOKEN",)


def test_fetch_puts_the_configs_models_in_the_cache_and_says_where(hf_home, tmp_path):
    """What the Kubernetes init container runs before the trainer: here offline, from the cache built above."""
    result = run(["-m", "verl_runtime", "fetch", "examples/quickstart.yaml"], {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"},
                 "--set", "model.path=org/tiny@v1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"[INFO] org/tiny@v1: {hf_home / 'hub' / 'models--org--tiny' / 'snapshots' / COMMIT}"
    missing = run(["-m", "verl_runtime", "fetch", "examples/quickstart.yaml"], {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"},
                  "--set", "model.path=org/absent")
    assert missing.returncode == 2 and missing.stderr.strip().startswith("error: org/absent is not in the Hugging Face cache")
