"""`verl-deploy smoke`: two training steps of the built-in tiny model in the chosen image and target, reported as
one pass/fail line, a JSON summary and a JUnit XML file, so a CI pipeline can prove an image works on its nodes."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from verl_deploy import runs
from verl_deploy.launchers import Launcher
from verl_deploy.launchers.jobspec import JobSpec

STEPS = 2
# The quickstart task, cut to seconds: tiny model, short responses, no validation.
CONFIG = f"""\
data: {{train_files: "toy:letter", toy_size: 64, batch_size: 4, max_prompt_length: 64, max_response_length: 8}}
model: {{path: builtin:tiny}}
rollout: {{name: hf, n: 2}}
algorithm: {{adv_estimator: grpo}}
trainer: {{experiment_name: smoke, total_training_steps: {STEPS}, test_freq: -1, seed: 1}}
"""
FINISHED = ("succeeded", "failed", "stopped", "exited")


@dataclass
class SmokeResult:
    passed: bool
    target: str
    image: str
    run_id: str
    seconds: float
    steps: int
    reason: str = ""
    last_metrics: dict = field(default_factory=dict)
    log_tail: str = ""

    @property
    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        what = f"{STEPS}-step training in {self.seconds:.1f} s" if self.passed else self.reason
        return f"smoke {verdict} [{self.target}] {self.image}: {what} (run {self.run_id})"


def write_config(runs_root: Path, run_id: str) -> Path:
    """The smoke config, beside the runs rather than in the run directory: the launcher creates that one, owned by
    the container's user, and a directory made here first (as root, say) would leave the trainer unable to write."""
    path = runs_root / ".smoke" / f"{run_id}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(CONFIG)
    return path


@contextmanager
def config_written(runs_root: Path, run_id: str):
    """write_config for the run plan to read; what it created is removed again when planning refuses the input, so
    that a mistyped flag leaves nothing behind."""
    made = [d for d in (runs_root, runs_root / ".smoke") if not d.exists()]
    path = write_config(runs_root, run_id)
    try:
        yield path
    except BaseException:
        path.unlink(missing_ok=True)
        for folder in reversed(made):
            folder.rmdir()
        raise


def run_smoke(launcher: Launcher, spec: JobSpec, timeout_s: float = 900) -> SmokeResult:
    """Start the run detached, wait for its end, then judge it by its exit state and its run directory."""
    start = time.monotonic()
    launcher.launch(spec, detach=True)
    status = launcher.status(spec.run_id)
    while status.state not in FINISHED and time.monotonic() - start < timeout_s:
        time.sleep(1)
        status = launcher.status(spec.run_id)
    seconds = time.monotonic() - start
    if status.state not in FINISHED:
        launcher.stop(spec.run_id)
    on_host = launcher.target != "k8s"  # a cluster keeps the run directory on its volume
    steps = len(runs.metrics_lines(spec.run_dir)) if on_host else 0
    checkpoint = on_host and f"step_{STEPS}" in runs.checkpoints(spec.run_dir)
    if status.state not in FINISHED:
        reason = f"no result within {timeout_s:.0f} s"
    elif status.state not in ("succeeded", "exited"):
        reason = f"run {status.state}" + (f" with exit code {status.exit_code}" if status.exit_code is not None else "")
    elif on_host and steps != STEPS:
        reason = f"{steps} of {STEPS} steps in metrics.jsonl"
    elif on_host and not checkpoint:
        reason = f"no checkpoint step_{STEPS}"
    else:
        reason = ""
    tail = "" if not reason else "".join(launcher.logs(spec.run_id))[-4000:]
    return SmokeResult(
        passed=not reason, target=launcher.target, image=spec.image if launcher.target != "local" else "host python", run_id=spec.run_id, seconds=round(seconds, 1),
        steps=steps, reason=reason, last_metrics=status.metrics, log_tail=tail,
    )


def write_json(result: SmokeResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**asdict(result), "line": result.line}, indent=2) + "\n")


def write_junit(result: SmokeResult, path: Path) -> None:
    suite = ET.Element("testsuite", name="verl-deploy smoke", tests="1", failures=str(int(not result.passed)),
                       time=f"{result.seconds:.1f}")
    case = ET.SubElement(suite, "testcase", classname=f"verl-deploy.smoke.{result.target}",
                         name=f"{STEPS}-step training in {result.image}", time=f"{result.seconds:.1f}")
    if not result.passed:
        failure = ET.SubElement(case, "failure", message=result.reason)
        failure.text = result.log_tail
    ET.SubElement(case, "system-out").text = result.line
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
