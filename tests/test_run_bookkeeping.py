"""Run bookkeeping on the host, with the faults injected for real: a mistyped --resume, a reused run id, a pid
that now belongs to another process, two trainers on one run directory, a closed terminal (SIGHUP), kill -9, and
Ctrl-C while the CLI is still starting."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO
from launch_support import QUICKSTART, cli, metrics_steps, wait_for

from verl_deploy import runs as run_records

SHORT = ["--set", "data.max_response_length=8", "--set", "trainer.test_freq=-1", "--set", "trainer.val_before_train=false"]
UNTIL_STOPPED = ["--set", "trainer.total_training_steps=3000", "--set", "trainer.num_epochs=100"]


def start_detached(runs, run_id, *flags):
    """`verl-deploy run --target local --detach` of the quickstart under run_id; it must have started."""
    started = cli("run", QUICKSTART, "--target", "local", "--runs-dir", runs, "--run-id", run_id, "--detach",
                  *flags, *SHORT)
    assert started.exit_code == 0, started.output


def test_resume_of_an_unknown_run_refuses_and_creates_nothing(tmp_path):
    result = cli("run", QUICKSTART, "--target", "local", "--runs-dir", tmp_path, "--resume", "no-such-run")
    assert result.exit_code == 2
    assert "no run 'no-such-run'" in result.output and "verl-deploy runs" in result.output
    assert not (tmp_path / "no-such-run").exists()


def test_a_run_id_in_use_is_refused_without_resume(tmp_path):
    run_record = tmp_path / "taken"
    run_record.mkdir()
    (run_record / "launch.json").write_text(json.dumps({"run_id": "taken", "target": "local"}))
    result = cli("run", QUICKSTART, "--target", "local", "--runs-dir", tmp_path, "--run-id", "taken")
    assert result.exit_code == 2
    assert "run taken already exists" in result.output and "--resume taken" in result.output


def test_resume_overrides_keep_the_recorded_ones_and_say_what_changes():
    merged, changes = run_records.resume_overrides(
        ["data.max_response_length=8", "trainer.total_training_steps=2"], ["trainer.total_training_steps=3"]
    )
    assert merged == ["data.max_response_length=8", "trainer.total_training_steps=3"]
    assert changes == ["trainer.total_training_steps: 2 -> 3"]


@pytest.mark.slow
def test_resume_trains_with_the_recorded_overrides_and_records_new_ones(tmp_path):
    run_dir = tmp_path / "again"
    first = cli("run", QUICKSTART, "--target", "local", "--runs-dir", tmp_path, "--run-id", "again",
                "--set", "trainer.total_training_steps=2", *SHORT)
    assert first.exit_code == 0, first.output

    # No config, no --set: the run's own config and overrides; one new override, shown as a change.
    resumed = cli("run", "--resume", "again", "--runs-dir", tmp_path, "--set", "trainer.total_training_steps=3")
    assert resumed.exit_code == 0, resumed.output
    assert "resume again: trainer.total_training_steps: 2 -> 3" in resumed.output
    assert metrics_steps(run_dir) == [1, 2, 3]
    assert "max_response_length: 8" in (run_dir / "config.yaml").read_text(), "the recorded --set values still apply"
    record = run_records.read_record(run_dir)
    assert "trainer.total_training_steps=3" in record["overrides"]
    assert record["resumes"][-1]["changes"] == ["trainer.total_training_steps: 2 -> 3"]


def test_stop_does_not_signal_a_process_that_reuses_the_recorded_pid(tmp_path):
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run_dir = tmp_path / "old"
        run_dir.mkdir()
        # The run's supervisor had this pid once; the bystander got the number later (another start time).
        started = run_records.process_start(bystander.pid)
        (run_dir / "launch.json").write_text(json.dumps({
            "run_id": "old", "target": "local", "pid": bystander.pid, "pid_start": started - 100, "exit_code": None,
        }))
        status = cli("status", "old", "--runs-dir", tmp_path)
        assert status.output.split()[2] == "exited", status.output
        stopped = cli("stop", "old", "--runs-dir", tmp_path)
        assert stopped.exit_code == 0
        assert "not running (its recorded pid now belongs to another process)" in stopped.output
        time.sleep(0.2)
        assert bystander.poll() is None, "the bystander was not signalled"
    finally:
        bystander.kill()
        bystander.wait()


def _train(run_dir, *extra):
    return [sys.executable, "-m", "verl_runtime", "train", str(QUICKSTART), "--set", f"trainer.run_dir={run_dir}",
            *SHORT, *extra]


@pytest.mark.slow
def test_a_second_trainer_on_a_live_run_is_refused(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "busy"
    start_detached(runs, "busy", *UNTIL_STOPPED)
    try:
        assert wait_for(lambda: metrics_steps(run_dir), timeout_s=120), (run_dir / "console.log").read_text()
        again = cli("run", "--resume", "busy", "--runs-dir", runs, "--detach")
        assert again.exit_code == 2 and "still running" in again.output
        # A trainer started by hand on the same directory: one line, and the live run's files untouched.
        lines_before = len((run_dir / "metrics.jsonl").read_text().splitlines())
        second = subprocess.run(_train(run_dir), capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        assert second.stderr.strip().splitlines()[-1].startswith("error: run directory ")
        assert "in use by another trainer" in second.stderr
        assert len((run_dir / "metrics.jsonl").read_text().splitlines()) >= lines_before
        assert "in use by another trainer" not in (run_dir / "train.log").read_text()
    finally:
        cli("stop", "busy", "--runs-dir", runs)
        wait_for(lambda: cli("status", "busy", "--runs-dir", runs).output.split()[2] != "running", timeout_s=120)


@pytest.mark.slow
def test_closing_the_terminal_of_an_attached_local_run_checkpoints_and_records_the_exit(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "hangup"
    command = [sys.executable, "-m", "verl_deploy", "run", str(QUICKSTART), "--target", "local", "--runs-dir",
               str(runs), "--run-id", "hangup", *UNTIL_STOPPED, *SHORT]
    terminal = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO)
    for line in terminal.stdout:
        if line.startswith(b"step "):
            break
    terminal.stdout.close()  # the terminal is gone: nobody reads the CLI's output any more
    terminal.send_signal(signal.SIGHUP)
    terminal.wait(timeout=180)
    assert wait_for(lambda: run_records.read_record(run_dir).get("exit_code") is not None, timeout_s=180)
    record = run_records.read_record(run_dir)
    assert record["exit_code"] == 143, record  # the trainer's own exit after SIGTERM: it saved its checkpoint
    last = max(metrics_steps(run_dir))
    assert f"step_{last}" in run_records.checkpoints(run_dir), "the last completed step is in a checkpoint"
    status = cli("status", "hangup", "--runs-dir", runs)
    assert status.output.split()[2] == "stopped", status.output


@pytest.mark.slow
def test_kill_9_of_a_detached_trainer_is_recorded_as_such(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "killed"
    start_detached(runs, "killed", *UNTIL_STOPPED)
    assert wait_for(lambda: metrics_steps(run_dir), timeout_s=120)
    assert wait_for(lambda: run_records.read_record(run_dir).get("trainer_pid"), timeout_s=30)
    os.kill(run_records.read_record(run_dir)["trainer_pid"], signal.SIGKILL)
    assert wait_for(lambda: run_records.read_record(run_dir).get("exit_code") is not None, timeout_s=60)
    status = cli("status", "killed", "--runs-dir", runs)
    assert status.output.split()[2:4] == ["failed", "(exit"], status.output
    assert "killed by SIGKILL" in status.output


def test_ctrl_c_while_the_cli_is_still_importing_is_one_line():
    # SIGINT arrives for real in the middle of `import typer`, the CLI's first heavy import. The child sets the
    # disposition a terminal's Ctrl-C meets (Python's KeyboardInterrupt handler) itself: one started from a background
    # job inherits SIGINT ignored, and Python then installs no handler at all.
    script = (
        "import builtins, os, signal\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "real = builtins.__import__\n"
        "def hook(name, *args, **kwargs):\n"
        "    if name == 'typer':\n"
        "        builtins.__import__ = real\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = hook\n"
        "import sys; sys.argv = ['verl-deploy', 'runs']\n"
        "from verl_deploy.entry import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130
    assert "Traceback" not in done.stderr
    assert done.stderr.strip() == "interrupted"


@pytest.mark.slow
def test_a_truncated_newest_checkpoint_is_flagged_by_status_and_passed_over_by_resume(tmp_path):
    run_dir = tmp_path / "torn"
    first = cli("run", QUICKSTART, "--target", "local", "--runs-dir", tmp_path, "--run-id", "torn",
                "--set", "trainer.total_training_steps=2", "--set", "trainer.save_freq=1", "--set", "trainer.keep_last=2",
                *SHORT)
    assert first.exit_code == 0, first.output
    state = run_dir / "checkpoints" / "step_2" / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # a disk that filled up mid-copy

    status = cli("status", "torn", "--runs-dir", tmp_path)
    assert "checkpoints: step_1\n" in status.output
    assert "warning: checkpoint step_2 is unusable (state.pt is" in status.output

    resumed = cli("run", "--resume", "torn", "--runs-dir", tmp_path, "--set", "trainer.total_training_steps=3")
    assert resumed.exit_code == 0, resumed.output
    assert "Traceback" not in (run_dir / "console.log").read_text()
    assert "resuming from step_1" in (run_dir / "console.log").read_text()
    assert metrics_steps(run_dir) == [1, 2, 3], "step 2 is trained again from step 1's checkpoint, once"


@pytest.mark.slow
def test_three_local_runs_at_once_each_keep_their_own_books(tmp_path):
    ids = ["one", "two", "three"]
    for run_id in ids:
        start_detached(tmp_path, run_id, "--set", "trainer.total_training_steps=6")
    done = lambda: all(run_records.read_record(tmp_path / r).get("exit_code") is not None for r in ids)  # noqa: E731
    assert wait_for(done, timeout_s=300)
    listed = json.loads(cli("runs", "--target", "local", "--runs-dir", tmp_path, "--json").output)
    assert sorted((r["run_id"], r["state"], r["last_metrics"]["step"]) for r in listed) == sorted(
        (r, "succeeded", 6) for r in ids)
    for run_id in ids:
        assert metrics_steps(tmp_path / run_id) == [1, 2, 3, 4, 5, 6], "no line lost or mixed between runs"
