"""A stop (SIGTERM, Ctrl-C, SIGHUP) asks the trainer to finish the step it is in (#38). When that step is the last
one, the run is finished: it ends as succeeded, with its Hugging Face model written (trainer.save_hf), not as
stopped. A run stopped earlier says how to continue it: `verl-deploy run --resume RUN` where verl-deploy started it."""

import os
import signal

import pytest

from verl_deploy import runs
from verl_runtime import rundir
from verl_runtime.__main__ import main as train
from verl_runtime.trainer import RUN_ID_ENV, continue_command, stop_requests

STEPS = 2
SAMPLES_PER_STEP = 4  # data.batch_size x rollout.n


def config_stopping_at(tmp_path, tiny_model_dir, call: int):
    """The config file of a run of STEPS steps whose reward function sends this process SIGTERM at its call-th
    score, as a scheduler would while that step runs."""
    reward = tmp_path / "reward.py"
    reward.write_text(
        "import os, signal\n"
        "calls = 0\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    global calls\n"
        "    calls += 1\n"
        f"    if calls == {call}:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return 0.5\n"
    )
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {{path: {tiny_model_dir}}}\n"
        f"reward: {{function: '{reward}:compute_score'}}\n"
        "data: {toy_size: 16, batch_size: 4, max_response_length: 4}\n"
        "algorithm: {adv_estimator: reinforce_plus_plus}\n"
        "rollout: {n: 1}\n"
        f"trainer: {{device: cpu, total_training_steps: {STEPS}, save_hf: true, test_freq: -1, "
        f"val_before_train: false, run_dir: {tmp_path / 'run'}}}\n"
    )
    return str(config)


@pytest.fixture
def _default_sigterm():
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what stop_requests puts back afterwards
    yield
    signal.signal(signal.SIGTERM, previous)


def test_a_stop_during_the_last_step_finishes_the_run_and_writes_its_model(tmp_path, tiny_model_dir, capsys,
                                                                          _default_sigterm):
    config = config_stopping_at(tmp_path, tiny_model_dir, call=(STEPS - 1) * SAMPLES_PER_STEP + 1)
    assert train(["train", config]) == 0  # no SystemExit(143)
    out = capsys.readouterr().out
    run = tmp_path / "run"
    assert "[INFO] SIGTERM came during the last step, which completed: finishing the run" in out
    assert "stopped after step" not in out
    assert f"[INFO] Training finished at step {STEPS}; run directory {run}" in out
    assert (run / rundir.EXPORTS_DIR / rundir.step_dir_name(STEPS) / "config.json").is_file()  # trainer.save_hf
    assert runs.direct_state(run) == ("succeeded", "")  # what status and `runs` show for it


def test_a_stop_before_the_last_step_stops_after_it_and_says_how_to_continue(tmp_path, tiny_model_dir, capsys,
                                                                            _default_sigterm, monkeypatch):
    monkeypatch.delenv(RUN_ID_ENV, raising=False)
    monkeypatch.delenv("VERL_DEPLOY_PLAN", raising=False)
    config = config_stopping_at(tmp_path, tiny_model_dir, call=1)
    with pytest.raises(SystemExit) as exited:
        train(["train", config])
    assert exited.value.code == 128 + signal.SIGTERM
    out = capsys.readouterr().out
    assert ("[INFO] SIGTERM: stopped after step 1; the checkpoint is saved: run the same command again to continue "
            "(trainer.resume=auto, the default, takes the checkpoint up)") in out
    assert not (tmp_path / "run" / rundir.EXPORTS_DIR).exists()
    assert runs.direct_state(tmp_path / "run")[0] == "stopped"


def test_a_run_verl_deploy_started_is_continued_by_verl_deploy(tmp_path, monkeypatch):
    monkeypatch.delenv(RUN_ID_ENV, raising=False)
    monkeypatch.delenv("VERL_DEPLOY_PLAN", raising=False)
    run = tmp_path / "my-run"
    run.mkdir()
    assert continue_command(run).startswith("run the same command again")
    (run / rundir.LAUNCH_RECORD).write_text("{}")  # local and Slurm runs: the run directory is the host's
    assert continue_command(run) == "`verl-deploy run --resume my-run` continues it"
    monkeypatch.setenv(RUN_ID_ENV, "r7")  # in a container (docker, k8s): the launcher says which run it is
    assert continue_command("/workspace/runs/r7") == "`verl-deploy run --resume r7` continues it"


def test_the_stop_line_names_the_resume_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(RUN_ID_ENV, "r7")
    with stop_requests() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(SystemExit):
            stop.exit_after(3, tmp_path)
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        "[INFO] SIGTERM: stopped after step 3; the checkpoint is saved: `verl-deploy run --resume r7` continues it")


def test_every_container_target_tells_the_trainer_its_run_id(tmp_path):
    from verl_deploy.launchers.jobspec import RUN_ID_ENV as LAUNCHER_ENV, build_spec

    config = tmp_path / "tiny.yaml"
    config.write_text("model:\n  path: builtin:tiny\n")
    spec = build_spec(config, image="i", runs_root=tmp_path, run_id="r7", environ={})
    assert LAUNCHER_ENV == RUN_ID_ENV and spec.container_env[RUN_ID_ENV] == "r7"
