"""One training command per run (JobSpec.command): `run --dry-run` on every target shows the same trainer
arguments, told where the files are (the container's paths, or the host's for a local run)."""

import shlex
from pathlib import Path

import yaml
from typer.testing import CliRunner

from verl_deploy.cli import app

IMAGE = "reg.example.com/team/verl-deploy:test"


def dry_run(tmp_path: Path, target: str, *flags: str) -> str:
    config = tmp_path / "tiny.yaml"
    reward = tmp_path / "my_reward.py"
    if not config.exists():
        reward.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
        config.write_text(f"model:\n  path: builtin:tiny\nreward:\n  function: {reward}:score\n")
    result = CliRunner().invoke(app, ["run", str(config), "--target", target, "--dry-run", "--image", IMAGE,
                                      "--run-id", "same", "--runs-dir", str(tmp_path / "runs"),
                                      "--set", "trainer.total_training_steps=2", *flags], env={})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_every_target_runs_the_same_trainer_arguments(tmp_path):
    docker = shlex.split(dry_run(tmp_path, "docker").strip().splitlines()[-1])
    args = docker[docker.index(IMAGE) + 1:]  # what follows the image's entrypoint (python -m verl_runtime)
    run_dir = "/workspace/runs/same"
    assert args == ["train", "/etc/verl-deploy/config.yaml", "--set", f"trainer.run_dir={run_dir}",
                    "--set", "trainer.resume=auto", "--set", "trainer.total_training_steps=2",
                    "--set", "reward.function=/etc/verl-deploy/my_reward.py:score"]  # where the mounts put the file

    job = [doc for doc in yaml.safe_load_all(dry_run(tmp_path, "k8s")) if doc and doc["kind"] == "Job"][0]
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == args

    script = dry_run(tmp_path, "slurm", "--container", "pyxis")
    assert f"--container-image={IMAGE} " in script
    assert f" {shlex.join(['python', '-m', 'verl_runtime', *args])} &" in script  # the whole command line

    # On the host: the same arguments with the host's paths; the config names its reward file itself.
    local = shlex.split(dry_run(tmp_path, "local").strip().splitlines()[-1])
    host_args = local[local.index("verl_runtime") + 1:]
    assert host_args == ["train", str((tmp_path / "tiny.yaml").resolve()),
                         "--set", f"trainer.run_dir={(tmp_path / 'runs' / 'same').resolve()}",
                         "--set", "trainer.resume=auto", "--set", "trainer.total_training_steps=2"]
    assert local[:3] == [local[0], "-m", "verl_runtime"] and Path(local[0]).name.startswith("python")
    assert f"-m verl_runtime {shlex.join(host_args)}" in dry_run(tmp_path, "slurm")  # Slurm without a container
