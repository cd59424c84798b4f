"""Runs that `python -m verl_runtime train` starts by itself (the quickstart's) are runs like any other: listed by
`runs`, known to `status`, `logs`, `stop`, `runs rm` and `run --resume`; their name is not silently reused; `runs`
is a table, newest first; a failed run says why."""

import json
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import REPO
from launch_support import cli, metrics_steps, wait_for

from verl_deploy import runs as run_records
from verl_runtime import rundir

QUICKSTART = REPO / "examples" / "quickstart.yaml"
SHORT = ["data.max_response_length=8", "trainer.test_freq=-1"]


def train_args(*settings):
    args = [sys.executable, "-m", "verl_runtime", "train", str(QUICKSTART)]
    for setting in [*SHORT, *settings]:
        args += ["--set", setting]
    return args


def rows(runs):
    """`verl-deploy runs` (every target) as {run: its cells}; other runs the engine knows (other tests') may show too."""
    listed = cli("runs", "--runs-dir", runs)
    assert listed.exit_code == 0, listed.output
    return {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """`python -m verl_runtime train examples/quickstart.yaml` for 2 steps, as `make quickstart` runs it."""
    home = tmp_path_factory.mktemp("quickstart")
    done = subprocess.run(train_args("trainer.total_training_steps=2"), capture_output=True, text=True, cwd=home,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return home / "runs" / "quickstart"


@pytest.fixture
def runs(finished, tmp_path):
    """A runs root of this test's own holding a copy of the finished quickstart run."""
    shutil.copytree(finished, tmp_path / "runs" / "quickstart")
    return tmp_path / "runs"


@pytest.mark.slow
def test_the_quickstarts_own_run_shows_in_runs_status_and_logs(runs):
    header = cli("runs", "--runs-dir", runs).stdout.splitlines()[0]
    assert header.split() == ["RUN", "TARGET", "RUNTIME", "STATE", "STEP", "REWARD", "STARTED", "(UTC)"]
    run_id, target, runtime, state, step, reward, day, minute = rows(runs)["quickstart"]
    assert (run_id, target, runtime, state, step) == ("quickstart", "direct", "verl-deploy", "succeeded", "2/2")
    assert float(reward) == pytest.approx(run_records.last_metrics(runs / "quickstart")["critic/score/mean"], abs=1e-3)
    assert len(day) == 10 and len(minute) == 5

    status = cli("status", "quickstart", "--runs-dir", runs)
    assert status.exit_code == 0, status.output
    assert status.stdout.startswith("quickstart  direct  succeeded  step 2 · reward ")
    assert "checkpoints: step_2\n" in status.stdout
    recorded = json.loads(cli("status", "quickstart", "--runs-dir", runs, "--json").stdout)
    assert (recorded["target"], recorded["state"], recorded["total_steps"]) == ("direct", "succeeded", 2)
    assert recorded["last_metrics"]["step"] == 2

    logs = cli("logs", "quickstart", "--runs-dir", runs)
    assert logs.exit_code == 0 and "[INFO] Training finished at step 2" in logs.stdout
    assert "nothing to stop" in cli("stop", "quickstart", "--runs-dir", runs).stdout


@pytest.mark.slow
def test_a_run_name_in_use_asks_for_resume_and_resume_continues_a_direct_run(runs):
    taken = cli("run", QUICKSTART, "--target", "local", "--runs-dir", runs, "--run-id", "quickstart")
    assert taken.exit_code == 2
    assert taken.output == (f"error: run quickstart already exists under {runs} (step 2 of 2, succeeded): "
                            "`--resume quickstart` continues it; --run-id NEW starts another\n")
    assert not (runs / "quickstart" / rundir.LAUNCH_RECORD).exists()

    resumed = cli("run", "--resume", "quickstart", "--runs-dir", runs, "--set", "trainer.total_training_steps=3")
    assert resumed.exit_code == 0, resumed.output
    assert "[INFO] Resumed from " in resumed.output and "(step 2): run " in resumed.output
    assert "to start over instead: trainer.resume=disable" in resumed.output
    assert metrics_steps(runs / "quickstart") == [1, 2, 3]
    assert rows(runs)["quickstart"][:5] == ["quickstart", "local", "verl-deploy", "succeeded", "3/3"]  # launched now: local


@pytest.mark.slow
def test_a_running_direct_run_is_running_and_stop_stops_it(tmp_path):
    trainer = subprocess.Popen(train_args("trainer.total_training_steps=3000"), cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = tmp_path / "runs"
    try:
        assert wait_for(lambda: metrics_steps(runs / "quickstart"), timeout_s=120)
        assert rows(runs)["quickstart"][:4] == ["quickstart", "direct", "verl-deploy", "running"]
        removed = cli("runs", "rm", "quickstart", "--yes", "--runs-dir", runs)
        assert removed.exit_code == 2 and "still running" in removed.output

        stopped = cli("stop", "quickstart", "--runs-dir", runs)
        assert stopped.stdout.startswith(f"stopping quickstart: SIGTERM sent to its trainer (pid {trainer.pid})")
        assert trainer.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        trainer.kill()
        trainer.wait()
    status = cli("status", "quickstart", "--runs-dir", runs)
    assert status.stdout.startswith("quickstart  direct  stopped  step ")
    assert "checkpoints: step_" in status.stdout

    removed = cli("runs", "rm", "quickstart", "--yes", "--runs-dir", runs)
    assert removed.exit_code == 0 and not (runs / "quickstart").exists()


@pytest.mark.slow
def test_a_failed_run_says_why_in_status(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no prompt here"}\n')
    runs = tmp_path / "runs"
    launched = cli("run", QUICKSTART, "--target", "local", "--runs-dir", runs, "--run-id", "bad",
                   "--set", f"data.train_files={bad}", *[arg for s in SHORT for arg in ("--set", s)])
    # the host reads the data before anything starts: one line, and no run is left behind
    assert launched.exit_code == 2
    assert launched.output.strip().splitlines()[-1] == f"error: data.train_files: {bad}: missing column(s) 'data_source', 'prompt', 'reward_model' (row 0); expected columns: data_source, prompt, reward_model"
    assert not (runs / "bad").exists()

    direct = subprocess.run(train_args(f"data.train_files={bad}", "trainer.experiment_name=bad-direct"),
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert direct.returncode == 2
    assert rows(runs)["bad-direct"][1:5] == ["direct", "verl-deploy", "failed", "-"]
    status = cli("status", "bad-direct", "--runs-dir", runs)  # a run that failed in the trainer says why
    assert status.stdout.startswith("bad-direct  direct  failed  ")
    assert status.stdout.splitlines()[-1] == f"  error: {bad}: missing column(s) 'data_source', 'prompt', 'reward_model' (row 0); expected columns: data_source, prompt, reward_model"
    assert json.loads(cli("status", "bad-direct", "--runs-dir", runs, "--json").stdout)["detail"] == (
        direct.stderr.strip())


def test_runs_is_a_table_newest_first(tmp_path):
    """Recorded runs (as the launchers write launch.json) and a direct one, listed by when they started."""
    for run_id, started, runtime in (("older", "2026-01-01T10:00:00Z", "verl"), ("newer", "2026-03-01T10:00:00Z",
                                                                               "verl-deploy")):
        run_records.write_record(tmp_path / run_id, {"run_id": run_id, "target": "local", "runtime": runtime,
                                                     "started_at": started, "exit_code": 0, "finished_at": started})
        (tmp_path / run_id / rundir.METRICS_FILE).write_text('{"step": 4, "critic/score/mean": 0.5}\n')
    direct = tmp_path / "direct-one"
    direct.mkdir()
    (direct / rundir.LOCK_FILE).write_text(json.dumps({"pid": 1, "started": 1767261600.0, "host": "h"}))  # 2026-01-01 10:00
    (direct / rundir.TRAIN_LOG).write_text("[INFO] Initializing SingleControllerTrainer...\nstep 1/8 | loss 0.1\n")
    (direct / rundir.METRICS_FILE).write_text('{"step": 1}\n')

    lines = cli("runs", "--target", "local", "--runs-dir", tmp_path).stdout.splitlines()
    assert [line.split()[:7] for line in lines[1:]] == [
        ["newer", "local", "verl-deploy", "succeeded", "4", "0.500", "2026-03-01"],
        ["older", "local", "verl", "succeeded", "4", "0.500", "2026-01-01"],
    ]
    everything = list(rows(tmp_path))
    assert everything.index("newer") < everything.index("older")
    assert everything.index("direct-one") > everything.index("newer")
    status = cli("status", "direct-one", "--runs-dir", tmp_path).stdout.splitlines()
    assert status[0] == "direct-one  direct  exited  step 1"  # its trainer is gone without a word: killed
    assert status[-1] == "  its trainer is gone and its log does not say how it ended (killed?)"
