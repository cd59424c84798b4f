"""`verl-deploy run --target local`: the runtime in a subprocess; status, logs, stop and resume on its run dir."""

import json

import pytest
from launch_support import QUICKSTART, cli, metrics_steps, wait_for

SHORT = ["--set", "data.max_response_length=8", "--set", "trainer.test_freq=-1", "--set", "trainer.val_before_train=false"]



@pytest.mark.slow
def test_local_run_to_completion_then_status_and_logs(tmp_path):
    runs = tmp_path / "runs"
    result = cli("run", QUICKSTART, "--target", "local", "--runs-dir", runs, "--run-id", "local-2",
                 "--set", "trainer.total_training_steps=2", *SHORT)
    assert result.exit_code == 0, result.output
    run_dir = runs / "local-2"
    assert metrics_steps(run_dir) == [1, 2]
    assert (run_dir / "checkpoints" / "step_2").is_dir()

    status = cli("status", "local-2", "--runs-dir", runs)
    assert status.exit_code == 0
    assert status.output.startswith("local-2  local  succeeded (exit 0)  step 2 · reward ")
    assert "checkpoints: step_2" in status.output
    logs = cli("logs", "local-2", "--runs-dir", runs)
    assert "step 2/2" in logs.output
    listed = json.loads(cli("runs", "--target", "local", "--runs-dir", runs, "--json").output)
    assert [(r["run_id"], r["state"]) for r in listed] == [("local-2", "succeeded")]


@pytest.mark.slow
def test_stop_checkpoints_and_resume_continues(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "local-stop"
    started = cli("run", QUICKSTART, "--target", "local", "--runs-dir", runs, "--run-id", "local-stop", "--detach",
                  "--set", "trainer.total_training_steps=200", *SHORT)
    assert started.exit_code == 0, started.output
    assert wait_for(lambda: len(metrics_steps(run_dir)) >= 1, timeout_s=120), (run_dir / "console.log").read_text()
    assert cli("status", "local-stop", "--runs-dir", runs).output.split()[2] == "running"

    assert cli("stop", "local-stop", "--runs-dir", runs).exit_code == 0
    assert wait_for(lambda: "running" not in cli("status", "local-stop", "--runs-dir", runs).output, timeout_s=120)
    done = metrics_steps(run_dir)
    last = max(done)
    assert (run_dir / "checkpoints" / f"step_{last}").is_dir(), "SIGTERM leaves a checkpoint of the last step"

    resumed = cli("run", QUICKSTART, "--target", "local", "--runs-dir", runs, "--resume", "local-stop",
                  "--set", f"trainer.total_training_steps={last + 1}", *SHORT)
    assert resumed.exit_code == 0, resumed.output
    assert metrics_steps(run_dir) == list(range(1, last + 2)), "no completed step lost or repeated"
