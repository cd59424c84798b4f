"""Helpers for tests that launch runs through the CLI and follow them through their run directory."""

import json
import time

from conftest import REPO
from typer.testing import CliRunner

from verl_deploy.cli import app
from verl_deploy.launchers.jobspec import RUN_ID_LABEL

QUICKSTART = REPO / "examples" / "quickstart.yaml"


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def metrics_steps(run_dir):
    """The steps in the run's metrics.jsonl so far."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(predicate, timeout_s=180):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def assert_logged(run_dir, text, container=None):
    """The run's train.log says text; else an AssertionError in one line (all that the tail of a CI log keeps) with
    what the log does say, and what the trainer's container printed, where there is one."""
    path = run_dir / "train.log"
    log = path.read_text(errors="replace") if path.exists() else None
    if log is not None and text in log:
        return
    said = "no train.log" if log is None else f"train.log of {len(log)} chars starts {log.splitlines()[:3]!r}"
    if container is not None:
        said += f"; the container's console starts {container.logs().decode(errors='replace').splitlines()[:3]!r}"
    raise AssertionError(f"{text!r} is not in {run_dir.name}'s train.log: {said}")


def containers(docker_client, run_id, running_only=False):
    """The containers of a run (every one carrying its run-id label)."""
    return docker_client.containers.list(all=not running_only, filters={"label": f"{RUN_ID_LABEL}={run_id}"})

