"""Every GPU the user gives reaches the trainer: --gpus x --nodes is trainer.n_workers on every target, sizes are
checked against it before anything starts, and --target local runs only on GPUs this host has.

The host's GPUs are read through NVML: this machine's own (none), or a reading recorded on an H200 (replayed, as
doctor's tests do).
"""

import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from verl_deploy.cli import app
from verl_deploy.launchers.jobspec import Gpus, LaunchError, parse_gpus
from verl_deploy.launchers.local import visible_devices

from conftest import FIXTURES, REPO

QUICKSTART = REPO / "examples" / "quickstart.yaml"  # 8 prompts x 4 samples = 32 samples a step
H200 = str(FIXTURES / "nvml" / "h200.json")
NO_GPU_HERE = not Path("/dev/nvidiactl").exists()


def invoke(*args, env=None):
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def dry_run(target, *args, env=None):
    result = invoke("run", QUICKSTART, "--target", target, "--dry-run", "--image", "reg.io/verl-deploy:test",
                    "--run-id", "ws", *args, env=env)
    return result


def test_docker_gives_the_trainer_one_worker_per_gpu():
    result = dry_run("docker", "--gpus", "0,1")
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.stdout)
    assert argv[argv.index("--gpus") + 1] == '"device=0,1"'
    assert "trainer.n_workers=2" in argv


def test_kubernetes_job_and_rayjob_carry_the_world_size():
    job = [d for d in yaml.safe_load_all(dry_run("k8s", "--gpus", "8").stdout) if d and d["kind"] == "Job"][0]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "trainer.n_workers=8" in args
    rayjob = [d for d in yaml.safe_load_all(dry_run("k8s", "--gpus", "8", "--nodes", "2").stdout)
              if d and d["kind"] == "RayJob"][0]
    assert "trainer.n_workers=16" in shlex.split(rayjob["spec"]["entrypoint"])


def test_sizes_that_do_not_divide_by_the_world_size_are_refused_before_anything_starts():
    result = dry_run("docker", "--gpus", "3")
    assert result.exit_code == 2
    assert result.output.strip() == ("error: data.batch_size * rollout.n (8 * 4 = 32 samples) must be divisible by "
                                     "trainer.n_workers (3), as in verl: each worker trains on an equal share")


def test_a_worker_count_that_contradicts_the_gpus_is_refused():
    result = dry_run("docker", "--gpus", "4", "--set", "trainer.n_workers=2")
    assert result.exit_code == 2
    assert result.output.strip() == ("error: trainer.n_workers=2 but --gpus 4 x --nodes 1 gives 4 GPUs, one worker "
                                     "each: drop trainer.n_workers or change --gpus/--nodes")
    assert dry_run("docker", "--gpus", "4", "--set", "trainer.n_workers=4").exit_code == 0


def test_without_gpus_the_runtime_decides():
    argv = shlex.split(dry_run("docker").stdout)
    assert not [a for a in argv if a.startswith("trainer.n_workers")]


@pytest.mark.skipif(not NO_GPU_HERE, reason="this host has an NVIDIA GPU")
def test_local_gpus_on_a_host_without_any_is_one_line(tmp_path):
    for target_args in (["run", QUICKSTART, "--target", "local", "--dry-run"], ["smoke", "--target", "local"]):
        result = invoke(*target_args, "--gpus", "2", "--runs-dir", tmp_path)
        assert result.exit_code == 2, result.output
        assert result.output.strip() == "error: --gpus 2: this host has no NVIDIA GPU: drop --gpus to train on the CPU"


def test_local_gpus_beyond_what_the_host_has_are_refused():
    result = dry_run("local", "--gpus", "2", env={"VERL_DEPLOY_NVML_READING": H200})
    assert result.exit_code == 2
    assert result.output.strip() == "error: --gpus 2: this host has 1 NVIDIA GPU: ask for at most 1"


def test_local_gpus_with_a_cpu_torch_would_train_on_the_cpu_and_are_refused():
    from verl_deploy.doctor.torch_check import installed_torch

    build = installed_torch()
    if build and build[1]:
        pytest.skip("this Python's torch is a CUDA build")
    result = dry_run("local", "--gpus", "1", env={"VERL_DEPLOY_NVML_READING": H200})
    assert result.exit_code == 2
    assert "a CPU build, so the run would train on the CPU" in result.output


@pytest.mark.parametrize(
    "gpus, found, visible",
    [("2", 8, "0,1"), ("all", 4, "0,1,2,3"), ("3,5", 8, "3,5"), ("GPU-aa,GPU-bb", 2, "GPU-aa,GPU-bb")],
)
def test_the_gpus_asked_for_become_cuda_visible_devices(gpus, found, visible):
    assert visible_devices(parse_gpus(gpus), found) == {"CUDA_VISIBLE_DEVICES": visible}


@pytest.mark.parametrize("gpus, found", [("3", 2), ("all", 0), ("0,7", 4)])
def test_gpus_the_host_lacks_are_refused(gpus, found):
    with pytest.raises(LaunchError, match=f"^--gpus {parse_gpus(gpus)}: this host has "):
        visible_devices(parse_gpus(gpus), found)


def test_gpus_numbers():
    assert Gpus(count=-1).number is None and parse_gpus("0,1").number == 2
