"""`make quickstart` a second time (#38): a finished runs/quickstart is said in one line, with how to train it again,
instead of a doctor table and a trainer that loads the model to find nothing to do; an unfinished one continues;
AGAIN=1 trains it again from step 1. The Makefile runs here as is, with a stand-in trainer that only says how it
was called (the training itself is tests/test_quickstart.py's)."""

import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, require


@pytest.fixture
def project(tmp_path):
    """A folder laid out as the checkout is for the quickstart (its config, a runs/ folder), and a venv whose python
    is this one except that `-m verl_runtime` (the training) and `verl-deploy` (the doctor) only print their calls."""
    require(shutil.which("make") is not None, "no make on PATH")
    (tmp_path / "examples").mkdir()
    shutil.copy(REPO / "examples" / "quickstart.yaml", tmp_path / "examples")
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "verl_runtime" ]; then shift 2; echo "TRAIN $*"; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n')
    (bin_dir / "verl-deploy").write_text('#!/bin/sh\necho "DOCTOR $*"\n')
    for stub in ("python", "verl-deploy"):
        (bin_dir / stub).chmod(0o755)
    (bin_dir / ".installed-runtime").touch()
    return tmp_path


def make_quickstart(project, *variables) -> subprocess.CompletedProcess:
    bin_dir = project / "venv" / "bin"
    return subprocess.run(["make", "--no-print-directory", "-f", str(REPO / "Makefile"), f"VENV={project / 'venv'}",
                           "-o", str(bin_dir / ".installed-runtime"), "quickstart", *variables],
                          cwd=project, capture_output=True, text=True, timeout=120)


def trained(project, steps: int, last_line: str) -> None:
    run = project / "runs" / "quickstart"
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, steps + 1)))
    (run / "train.log").write_text(f"[INFO] Initializing SingleControllerTrainer...\nstep {steps}/40 | reward 0.9\n"
                                   f"{last_line}\n")


def test_a_finished_quickstart_is_said_in_one_line_with_how_to_train_again(project):
    trained(project, 40, "[INFO] Training finished at step 40; run directory runs/quickstart")
    done = make_quickstart(project)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"runs/quickstart already finished (step 40 of 40): `{project / 'venv' / 'bin'}/verl-deploy report "
        "runs/quickstart` charts it; `make quickstart AGAIN=1` trains it again from step 1"]
    assert done.stderr == ""  # neither the doctor nor the trainer ran

    again = make_quickstart(project, "AGAIN=1")
    assert again.returncode == 0, again.stderr
    assert "DOCTOR doctor" in again.stdout
    assert again.stdout.splitlines()[-1] == "TRAIN train examples/quickstart.yaml --set trainer.resume=disable"


@pytest.mark.parametrize("steps, last_line", [
    (None, None),  # the first time
    (20, "[INFO] SIGTERM: stopped after step 20; the checkpoint is saved"),  # stopped: it continues
    (40, "[INFO] Training finished at step 40; run directory runs/quickstart"),  # finished, then more steps asked
])
def test_an_unfinished_quickstart_trains(project, steps, last_line):
    if steps:
        trained(project, steps, last_line)
    if steps == 40:
        config = project / "examples" / "quickstart.yaml"
        config.write_text(config.read_text().replace("total_training_steps: 40", "total_training_steps: 80"))
    done = make_quickstart(project)
    assert done.returncode == 0, done.stderr
    assert "DOCTOR doctor" in done.stdout
    assert done.stdout.splitlines()[-1] == "TRAIN train examples/quickstart.yaml"
