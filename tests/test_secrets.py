"""Secrets reach a run as files (SECRETS_DIR, one per variable): load_secret_files hands them to the libraries
that read them, the Hugging Face token as a path only."""

import json
import os
import subprocess
import sys
import tempfile

import pytest

from conftest import FIXTURES
from verl_runtime.__main__ import main
from verl_runtime.secrets import SECRETS_DIR_ENV, load_secret_files

NOBODY = 65534


def secrets_dir(path, **files):
    path.mkdir(exist_ok=True)
    for name, content in files.items():
        (path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def test_the_hf_token_is_passed_as_a_path_the_others_as_variables(tmp_path):
    folder = secrets_dir(tmp_path / "secrets", HF_TOKEN="hf_secret\n", WANDB_API_KEY="wandb-key\n")
    environ = {SECRETS_DIR_ENV: str(folder)}
    assert load_secret_files(environ) == ["HF_TOKEN", "WANDB_API_KEY"]
    assert environ["HF_TOKEN_PATH"] == str(folder / "HF_TOKEN") and "HF_TOKEN" not in environ
    assert environ["WANDB_API_KEY"] == "wandb-key"


def test_a_variable_already_set_wins(tmp_path):
    folder = secrets_dir(tmp_path / "secrets", HF_TOKEN="from-file", WANDB_API_KEY="from-file")
    environ = {SECRETS_DIR_ENV: str(folder), "HF_TOKEN": "from-env", "WANDB_API_KEY": "from-env"}
    load_secret_files(environ)
    assert environ == {SECRETS_DIR_ENV: str(folder), "HF_TOKEN": "from-env", "WANDB_API_KEY": "from-env"}


def test_empty_and_binary_files_are_ignored(tmp_path):
    folder = secrets_dir(tmp_path / "secrets", WANDB_API_KEY=" \n", NEPTUNE_API_TOKEN=b"\xff\xfe\x00")
    (folder / "HF_TOKEN").mkdir()  # not a file
    environ = {SECRETS_DIR_ENV: str(folder)}
    assert load_secret_files(environ) == [] and environ == {SECRETS_DIR_ENV: str(folder)}


def test_unreadable_files_are_ignored():
    """A 0600 file of another uid: read as that other user (nobody), since root reads any file."""
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        os.chmod(folder, 0o755)
        for name, mode in (("WANDB_API_KEY", 0o000), ("NEPTUNE_API_TOKEN", 0o644)):
            path = os.path.join(folder, name)
            with open(path, "w") as handle:
                handle.write("value")
            os.chmod(path, mode)
        # Imports first: Python's own files may be out of nobody's reach.
        become_nobody = f"os.setgid({NOBODY}); os.setuid({NOBODY}); " if os.geteuid() == 0 else ""
        code = ("import json, os; from verl_runtime.secrets import load_secret_files; " + become_nobody +
                f"env = {{'{SECRETS_DIR_ENV}': '{folder}'}}; print(json.dumps([load_secret_files(env), env]))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    found, environ = json.loads(done.stdout)
    assert found == ["NEPTUNE_API_TOKEN"] and "WANDB_API_KEY" not in environ


def test_huggingface_hub_reads_the_token_through_its_path(tmp_path):
    pytest.importorskip("huggingface_hub")
    folder = secrets_dir(tmp_path / "secrets", HF_TOKEN="hf_from_the_secret_file\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH")}
    env.update({SECRETS_DIR_ENV: str(folder), "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1"})
    code = ("import os; from verl_runtime.secrets import load_secret_files; load_secret_files(); "
            "import huggingface_hub; print(huggingface_hub.get_token(), 'HF_TOKEN' in os.environ)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hf_from_the_secret_file", "False"]


def test_the_entrypoint_loads_the_secret_files_first(tmp_path, monkeypatch, capsys):
    folder = secrets_dir(tmp_path / "secrets", WANDB_API_KEY="wandb-key")
    monkeypatch.setenv(SECRETS_DIR_ENV, str(folder))
    monkeypatch.setenv("WANDB_API_KEY", "")
    monkeypatch.delenv("WANDB_API_KEY")  # absent now, and removed again after the test
    sample = FIXTURES / "data" / "gsm8k_sample.jsonl"
    assert main(["prepare", "gsm8k", "--input", str(sample), "--output", str(tmp_path / "out")]) == 0
    assert os.environ["WANDB_API_KEY"] == "wandb-key"
