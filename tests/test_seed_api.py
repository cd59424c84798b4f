"""The tutorial's example (examples/seed_api.py) runs as written, with the built-in model and with an OPT model."""

import os
import re
import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "examples" / "seed_api.py"


def run_example(args, env):
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


def assert_tutorial_output(out, model_dir):
    assert "[INFO] Initializing SingleControllerTrainer..." in out
    assert f"[INFO] Loading pretrained model from {model_dir}" in out
    assert "Training step completed." in out
    assert re.search(r"^Loss: -?\d+\.\d{4}$", out, re.MULTILINE), out


def test_with_the_builtin_tiny_model(tmp_path):
    out = run_example([], {"VERL_RUNTIME_CACHE": str(tmp_path)})  # built here, offline, on first use
    assert_tutorial_output(out, tmp_path)


def test_with_a_local_opt_model_directory(tiny_opt_dir):
    """The tutorial's architecture (OPT, with its dropout and BOS), as a local directory."""
    assert_tutorial_output(run_example([str(tiny_opt_dir)], {}), tiny_opt_dir)
