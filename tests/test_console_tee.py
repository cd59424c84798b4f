"""The trainer's console is teed to <run_dir>/train.log; what still writes after the run (a logging handler made
during it, Python's flush at exit) goes to the console alone, without a warning about the closed log."""

import logging
import subprocess
import sys

import pytest

from conftest import REPO
from verl_runtime import rundir

QUICKSTART = REPO / "examples" / "quickstart.yaml"


@pytest.mark.slow
def test_a_normal_quickstart_run_warns_of_nothing_about_its_log(tmp_path):
    run_dir = tmp_path / "q"
    result = subprocess.run(
        [sys.executable, "-m", "verl_runtime", "train", str(QUICKSTART), "--set", f"trainer.run_dir={run_dir}",
         "--set", "trainer.total_training_steps=1"],
        capture_output=True, text=True, cwd=REPO, timeout=600)

    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert "Training finished at step 1" in output
    assert [line for line in output.splitlines() if "[WARN]" in line and rundir.TRAIN_LOG in line] == []
    assert "Exception ignored" not in output and "closed file" not in output
    log = (run_dir / rundir.TRAIN_LOG).read_text()
    assert "Training finished at step 1" in log and "[WARN]" not in log


def test_a_stream_kept_past_the_run_writes_to_the_console_alone(tmp_path, capsys):
    from verl_runtime.__main__ import _tee_console

    log_path = tmp_path / rundir.TRAIN_LOG
    logger = logging.getLogger("kept-past-the-run")
    with _tee_console(log_path):
        handler = logging.StreamHandler()  # holds the teed sys.stderr, as a library's handler made in a run does
        logger.addHandler(handler)
        logger.warning("during the run")
    try:
        logger.warning("after the run")
        handler.flush()
    finally:
        logger.removeHandler(handler)

    err = capsys.readouterr().err
    assert "during the run" in err and "after the run" in err
    assert "[WARN]" not in err
    assert log_path.read_text() == "during the run\n"
