"""Runs that survive faults (#14), the trainer's side: each fault is made for real (a truncated checkpoint, a torn
metrics line, a second trainer, a hung-up console and a real SIGHUP, a reward function that fails), then the
trainer is run through its entrypoint as a container would run it."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from verl_runtime import rundir
from verl_runtime.__main__ import _Tee, main
from verl_runtime.config import get_default_config, diff_configs, to_yaml
from verl_runtime.errors import RewardFunctionError
from verl_runtime.metrics import read_metrics
from verl_runtime.rewards.custom import checked_score
from verl_runtime.trainer import stop_requests


def write_config(tmp_path, model_dir, **trainer):
    """A tiny run on the toy task: the built-in-size model, 4 prompts a step, 4 response tokens."""
    settings = {"device": "cpu", "run_dir": str(tmp_path / "run"), "total_training_steps": 4, **trainer}
    path = tmp_path / "run.yaml"
    path.write_text(
        f"model: {{path: '{model_dir}'}}\n"
        "data: {toy_size: 16, batch_size: 4, max_response_length: 4}\n"
        "algorithm: {adv_estimator: reinforce_plus_plus}\n"
        "rollout: {n: 1}\n"
        f"trainer: {json.dumps(settings)}\n"
    )
    return path


def train(config, capsys, *overrides):
    """`python -m verl_runtime train CONFIG --set ...` in this process: (exit code, stdout, stderr)."""
    code = main(["train", str(config), *[arg for item in overrides for arg in ("--set", item)]])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def steps_of(run):
    return [record["step"] for record in read_metrics(run)]


def assert_one_line_error(code, err, *fragments):
    err = err.strip()
    assert code == 2
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err


def files_of(run):
    """What a run directory holds, with sizes and modification times: to see that nothing wrote into it."""
    return {str(p.relative_to(run)): (p.stat().st_size, p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}


# --- 1. a truncated newest checkpoint ------------------------------------------------------------------------


def test_resume_passes_over_a_truncated_newest_checkpoint(tmp_path, tiny_model_dir, capsys):
    config = write_config(tmp_path, tiny_model_dir, save_freq=1, keep_last=2)
    run = tmp_path / "run"
    assert train(config, capsys)[0] == 0
    newest = run / "checkpoints" / "step_4"
    size = (newest / "state.pt").stat().st_size
    os.truncate(newest / "state.pt", 123)  # the disk filled up, or a copy was cut short

    code, out, err = train(config, capsys)
    assert code == 0, err
    assert "Traceback" not in out + err
    warnings = [line for line in out.splitlines() if line.startswith("[WARN]")]
    assert warnings == [f"[WARN] checkpoint {newest} is unusable (state.pt is 123 bytes, the manifest says {size} "
                        "(truncated?)): resuming from step_3"]
    assert f"Resumed from {run / 'checkpoints' / 'step_3'} (step 3)" in out
    assert steps_of(run) == [1, 2, 3, 4]  # step 4 trained again, written once
    assert [step for step, _ in rundir.valid_checkpoints(run, deep=True)] == [3, 4]


# --- 2. a torn metrics line ----------------------------------------------------------------------------------


def test_a_torn_metrics_line_does_not_block_resume(tmp_path, tiny_model_dir, capsys):
    config = write_config(tmp_path, tiny_model_dir, save_freq=1, total_training_steps=2)
    run = tmp_path / "run"
    assert train(config, capsys)[0] == 0
    with open(run / "metrics.jsonl", "a") as metrics:  # killed while writing step 3's line
        metrics.write('{"step": 3, "ac')

    code, out, err = train(config, capsys, "trainer.total_training_steps=4")
    assert code == 0, err
    assert steps_of(run) == [1, 2, 3, 4]
    assert all(json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())
    assert len([line for line in out.splitlines() if "torn line" in line]) == 1
    # 7. the resumed run says what changed since its last start, and records it
    assert "[INFO] config changed since the run's last start: trainer.total_training_steps: 2 -> 4" in out
    record = json.loads((run / "config-changes.jsonl").read_text())
    assert record["changes"] == {"trainer.total_training_steps": [2, 4]} and record["time"]


# --- 3. a second trainer on the same run directory -----------------------------------------------------------


def test_a_held_run_directory_refuses_a_second_trainer_in_one_line(tmp_path, tiny_model_dir, capsys):
    config = write_config(tmp_path, tiny_model_dir)
    run = tmp_path / "run"
    with rundir.locked(run):  # a live trainer's flock (this process's own, on another open file)
        before = files_of(run)
        code, out, err = train(config, capsys)
        assert files_of(run) == before  # no config.yaml, train.log or metrics.jsonl
    assert_one_line_error(code, err, f"run directory {run} is in use by another trainer (pid {os.getpid()}")


def wait_for_first_step(proc) -> str:
    """Read the trainer's console up to its first step line ("step   1/400 | ...")."""
    for line in proc.stdout:
        if re.match(r"step +1/", line):
            return line
    raise AssertionError(f"the trainer ended (rc {proc.wait()}) before its first step: {proc.stderr.read()}")


def wait_until_stopped(pid: int) -> None:
    deadline = time.monotonic() + 10
    while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the trainer did not stop"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_second_trainer_process_exits_2_and_writes_nothing(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir, save_freq=1, total_training_steps=6, num_epochs=2)
    run = tmp_path / "run"
    args = [sys.executable, "-m", "verl_runtime", "train", str(config)]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        wait_for_first_step(first)
        first.send_signal(signal.SIGSTOP)  # frozen mid-run, its lock held: the run directory stays still
        wait_until_stopped(first.pid)
        before = files_of(run)
        second = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert files_of(run) == before
        assert second.stdout == ""
        assert_one_line_error(second.returncode, second.stderr,
                              f"run directory {run} is in use by another trainer (pid {first.pid} on ")
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert steps_of(run) == [1, 2, 3, 4, 5, 6]
    assert rundir.holder(run) is None  # the lock ended with the process


# --- 4. SIGHUP, and a console that went away -----------------------------------------------------------------


def test_sighup_asks_for_a_stop_after_the_step(capsys):
    with stop_requests() as stop:
        os.kill(os.getpid(), signal.SIGHUP)
        assert stop.signum == signal.SIGHUP
        with pytest.raises(SystemExit) as exited:
            stop.exit_after(3)
    assert exited.value.code == 129
    assert "SIGHUP: stopped after step 3" in capsys.readouterr().out


def test_the_tee_drops_a_closed_console_and_keeps_the_log(tmp_path):
    read_end, write_end = os.pipe()
    console = os.fdopen(write_end, "w")
    os.close(read_end)  # whoever read the console is gone: writes now fail with EPIPE
    try:
        with open(tmp_path / "train.log", "w") as log:
            tee = _Tee(console, log)
            for step in (1, 2):
                print(f"step {step}/2", file=tee, flush=True)
        assert tee.console_gone
        assert (tmp_path / "train.log").read_text() == "step 1/2\nstep 2/2\n"
        console.write("what is left buffered\n")
        console.flush()  # as Python's flush at exit does: it goes to /dev/null now, no BrokenPipeError
    finally:
        console.close()


@pytest.mark.slow
def test_sighup_with_the_console_gone_saves_and_exits_129_then_resumes(tmp_path, tiny_model_dir, capsys):
    config = write_config(tmp_path, tiny_model_dir, total_training_steps=400, num_epochs=100)
    run = tmp_path / "run"
    trainer = subprocess.Popen([sys.executable, "-m", "verl_runtime", "train", str(config)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    wait_for_first_step(trainer)
    trainer.stdout.close()  # the terminal (or the ssh session) that read it went away...
    trainer.send_signal(signal.SIGHUP)  # ...and the kernel says so
    assert trainer.wait(timeout=120) == 129
    err = trainer.stderr.read()
    assert "Traceback" not in err and "Exception ignored" not in err, err

    log = (run / "train.log").read_text()
    stopped = [line for line in log.splitlines() if "SIGHUP: stopped after step" in line]
    assert len(stopped) == 1, log
    step = int(stopped[0].split("stopped after step ")[1].split(";")[0])
    assert steps_of(run) == list(range(1, step + 1))
    assert rundir.checkpoint_problem(run / "checkpoints" / f"step_{step}", deep=True) is None

    code, out, err = train(config, capsys, f"trainer.total_training_steps={step + 2}")
    assert code == 0, err
    assert f"Resumed from {run / 'checkpoints' / f'step_{step}'} (step {step})" in out
    assert steps_of(run) == list(range(1, step + 3))


# --- 6. a reward function that fails while training ----------------------------------------------------------


@pytest.mark.parametrize("body, expected", [
    ("    raise ValueError(f'no answer in\\n{solution_str!r}')\n", "raised ValueError: no answer in "),
    ("    return None\n", "returned None for a sample of data_source toy/letter: "
                          "it must return a float (or a dict with 'score')"),
    ("    return 'high'\n", "returned 'high' (str) for a sample of data_source toy/letter"),
], ids=["raises", "returns-none", "returns-a-string"])
def test_a_failing_reward_function_is_a_one_line_error(tmp_path, tiny_model_dir, capsys, body, expected):
    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    solution_str = solution_str.strip()\n" + body)
    config = write_config(tmp_path, tiny_model_dir)
    code, out, err = train(config, capsys, f"reward.function={reward}:compute_score")
    assert_one_line_error(code, err, f"reward function {reward}:compute_score ", expected)
    if "raised" in expected:
        assert err.strip().endswith(f"({reward.resolve()}, line 3) on a sample of data_source toy/letter")
    assert err.strip() in (tmp_path / "run" / "train.log").read_text()


def test_reward_results_verl_accepts_are_scores():
    spec = "my_reward.py:compute_score"
    assert checked_score(spec, 1, "x") == 1.0 and checked_score(spec, {"score": 0.5, "acc": True}, "x") == 0.5
    with pytest.raises(RewardFunctionError, match=r"returned \{'acc': True\} \(dict\) for a sample of data_source x"):
        checked_score(spec, {"acc": True}, "x")


# --- 7. what changed since the run's last start --------------------------------------------------------------


def test_diff_configs_names_the_changed_keys_dotted():
    old = get_default_config("grpo")
    old.trainer.total_training_steps, old.trainer.run_dir = 4, "runs/a"
    new = get_default_config("grpo")
    new.trainer.total_training_steps, new.trainer.run_dir, new.trainer.resume = 8, "runs/b", "disable"
    new.data.train_files = ["a.parquet", "b.parquet"]
    assert diff_configs(to_yaml(old), new) == {
        "data.train_files": [["toy:letter"], ["a.parquet", "b.parquet"]],
        "trainer.total_training_steps": [4, 8],
    }
    assert diff_configs(to_yaml(new), new) == {}
    assert diff_configs("data: [unclosed", new) == {}  # nothing readable to compare with
