"""Input that contradicts itself, names a thing twice or names nothing is refused in one line, exit 2, before
anything is created (#38): `--gpus 0,0`, `--resume R --run-id OTHER`, `--ipc-host --shm-size`, a --memory no GPU
trainer starts in, an empty CONFIG, a --hf-cache folder that is not there. `plan --gpu-type T --gpu-memory M` says
which memory it plans for. No Docker engine, cluster or GPU is needed: dry runs and the planner."""

import json
import shlex

import pytest
import yaml
from typer.testing import CliRunner

from verl_deploy.cli import app
from verl_deploy.launchers.runplan import RunRequest, resumed_request
from verl_deploy.runs import Launch
from verl_deploy.sizes import GiB, SizeError, parse_gpus
from verl_runtime.__main__ import main as runtime_main

IMAGE = "reg.example.com/team/verl-deploy:test"


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("model:\n  path: builtin:tiny\n")
    return path


def invoke(*args, env=None):
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def refused(tmp_path, *args) -> str:
    """The one line a refused command prints; it exits 2, shows no traceback and creates nothing."""
    before = sorted(tmp_path.rglob("*"))
    result = invoke(*args, "--runs-dir", tmp_path / "runs") if args[0] == "run" else invoke(*args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert sorted(tmp_path.rglob("*")) == before, "a refused command creates nothing"
    return lines[0]


def dry_run(tmp_path, config, target, *flags):
    result = invoke("run", config, "--target", target, "--dry-run", "--image", IMAGE, "--run-id", "r1", "--no-plan",
                    "--runs-dir", tmp_path / "runs", *flags, env={})
    assert result.exit_code == 0, result.output
    return result.stdout


# --- --gpus 0,0 -------------------------------------------------------------------------------------------------


def test_a_gpu_named_twice_is_refused_not_counted_twice(config, tmp_path):
    line = refused(tmp_path, "run", config, "--target", "docker", "--dry-run", "--image", IMAGE, "--gpus", "0,0")
    assert line == ("error: --gpus '0,0' names a GPU more than once (0): name each GPU once, e.g. --gpus 0, or say "
                    "how many: --gpus 2")
    assert "more than once (0)" in refused(tmp_path, "plan", config, "--gpus", "device=0,1,0")
    with pytest.raises(SizeError, match=r"more than once \(GPU-a\).*--gpus GPU-a,GPU-b"):
        parse_gpus("GPU-a,GPU-b,GPU-a")
    assert str(parse_gpus("0,1")) == "device=0,1" and parse_gpus("0,1").number == 2


# --- --resume RUN --run-id OTHER ----------------------------------------------------------------------------------


def test_resume_with_another_run_id_is_refused(tmp_path):
    line = refused(tmp_path, "run", "--resume", "r1", "--run-id", "other", "--dry-run")
    assert line == ("error: --resume r1 continues run r1 under its own id: drop --run-id other (a new run named "
                    "other: leave out --resume)")
    # The run's own id beside --resume says nothing new: the resume goes on (and here finds no run r1).
    assert "no run 'r1'" in refused(tmp_path, "run", "--resume", "r1", "--run-id", "r1", "--dry-run")


# --- --ipc-host --shm-size ------------------------------------------------------------------------------------------


def test_ipc_host_and_shm_size_contradict_and_the_line_says_which_to_keep(config, tmp_path):
    line = refused(tmp_path, "run", config, "--target", "docker", "--dry-run", "--image", IMAGE, "--ipc-host",
                   "--shm-size", "64g")
    assert line == ("error: --ipc-host and --shm-size 64g contradict: --ipc-host shares the host's /dev/shm (the "
                    "host's size), --shm-size gives the run one of its own: keep --shm-size 64g (a /dev/shm of that "
                    "size, the run's alone), or --ipc-host alone where its containers must share the host's memory")
    alone = shlex.split(dry_run(tmp_path, config, "docker", "--ipc-host").strip().splitlines()[-1])
    assert alone[alone.index("--ipc") + 1] == "host" and "--shm-size" not in alone
    sized = shlex.split(dry_run(tmp_path, config, "docker", "--shm-size", "64g").strip().splitlines()[-1])
    assert sized[sized.index("--shm-size") + 1] == "64g" and "--ipc" not in sized


def test_a_resume_given_one_of_them_drops_the_other_one_recorded():
    recorded = Launch(flags={"ipc_host": True, "cpus": 4})
    request, changes = resumed_request(RunRequest(resume="r1", shm_size="64g"), recorded)
    assert (request.ipc_host, request.shm_size, request.cpus) == (False, "64g", 4)
    assert "--ipc-host: True -> dropped (--shm-size given)" in changes
    request, changes = resumed_request(RunRequest(resume="r1", ipc_host=True), Launch(flags={"shm_size": "8g"}))
    assert (request.ipc_host, request.shm_size) == (True, None)
    assert "--shm-size: 8g -> dropped (--ipc-host given)" in changes


# --- plan --gpu-type T --gpu-memory M -------------------------------------------------------------------------------


def test_plan_with_a_gpu_type_and_less_memory_plans_that_memory_and_says_so(tmp_path):
    config = tmp_path / "gpu.yaml"
    config.write_text("model:\n  path: builtin:tiny\ntrainer:\n  device: cuda\n")
    result = invoke("plan", config, "--gpus", "1", "--gpu-type", "H100", "--gpu-memory", "40g", "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr.strip().splitlines() == [
        "note: planning for --gpu-memory 40g (40.0 GiB) of the H100's 79 GiB (a MIG slice, or a GPU shared with other "
        "work); --gpu-type alone plans for all of it"]
    assert json.loads(result.stdout)["gpu_memory_bytes"] == 40 * GiB  # --json's stdout stays JSON
    # The board's own size (gpu_types.yaml rounds down to a GiB: 80g is an H100's 79 GiB) is no news.
    same = invoke("plan", config, "--gpus", "1", "--gpu-type", "H100", "--gpu-memory", "80g", "--json")
    assert same.exit_code == 0 and same.stderr == ""
    line = refused(tmp_path, "plan", config, "--gpus", "1", "--gpu-type", "H100", "--gpu-memory", "141g")
    assert line == ("error: --gpu-memory 141g is more than the H100's 79 GiB: drop --gpu-memory to plan for the "
                    "whole H100, or --gpu-type for a GPU of 141g")


# --- --memory below what a GPU trainer starts in ------------------------------------------------------------------


@pytest.mark.parametrize("target", ["k8s", "docker", "slurm"])
def test_a_memory_no_gpu_trainer_starts_in_is_refused_with_the_least_that_can(config, tmp_path, target):
    line = refused(tmp_path, "run", config, "--target", target, "--dry-run", "--image", IMAGE, "--no-plan",
                   "--gpus", "1", "--memory", "1g")
    assert line == ("error: --memory '1g' is below the 4g a run on 1 GPU needs at least: torch's CUDA libraries and "
                    "context, and the weights on their way to the GPU: give --memory 4g or more (on k8s and Slurm the "
                    "limit is --memory plus /dev/shm, --shm-size)")
    line = refused(tmp_path, "run", config, "--target", target, "--dry-run", "--image", IMAGE, "--no-plan",
                   "--gpus", "2", "--memory", "6g")
    assert "below the 8g a run on 2 GPUs needs at least (4g per GPU)" in line and "--memory 8g or more" in line


def test_a_memory_a_gpu_trainer_starts_in_is_honoured_with_shared_memory_added_on_k8s(config, tmp_path):
    objects = [o for o in yaml.safe_load_all(dry_run(tmp_path, config, "k8s", "--gpus", "1", "--memory", "4g")) if o]
    [job] = [o for o in objects if o["kind"] == "Job"]
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["memory"] == "6Gi"  # 4Gi for the trainer, 2Gi of /dev/shm (memory-backed: it counts)
    # A CPU run's --memory has no GPU floor.
    cpu = [o for o in yaml.safe_load_all(dry_run(tmp_path, config, "k8s", "--memory", "1g")) if o]
    [job] = [o for o in cpu if o["kind"] == "Job"]
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "2Gi"


# --- an empty CONFIG ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n", "null\n"])
def test_an_empty_config_is_refused_not_taken_for_the_defaults(tmp_path, text, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text(text)
    line = refused(tmp_path, "run", empty, "--target", "local", "--dry-run")
    assert line == (f"error: CONFIG {empty} is empty: give it the run's settings (examples/quickstart.yaml is one), "
                    "or leave CONFIG out for the defaults with overrides after -- (`-- KEY=VALUE ...`)")
    assert refused(tmp_path, "plan", empty) == line
    # The trainer's own entrypoint, as `python -m verl_runtime train` (the container's) runs it.
    assert runtime_main(["train", str(empty), "--set", f"trainer.run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: CONFIG {empty} is empty: give it the run's settings (examples/quickstart.yaml is one)\n"
    assert not (tmp_path / "run").exists()


# --- --hf-cache ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["local", "docker"])
def test_a_hf_cache_folder_that_is_not_there_is_refused_on_this_host(config, tmp_path, target):
    missing = tmp_path / "no-such-cache"
    line = refused(tmp_path, "run", config, "--target", target, "--dry-run", "--image", IMAGE, "--hf-cache", missing)
    assert line == (f"error: --hf-cache '{missing}' is not a directory on this host: point it at your Hugging Face "
                    f"cache (without it: ~/.cache/huggingface), or create it first (mkdir -p {missing})")


def test_a_hf_cache_folder_is_the_local_trainer_s_hf_home_and_the_docker_run_s_mount(config, tmp_path):
    cache = tmp_path / "hf"
    cache.mkdir()
    local = shlex.split(dry_run(tmp_path, config, "local", "--hf-cache", cache).strip().splitlines()[-1])
    assert local[0] == f"HF_HOME={cache.resolve()}"  # it was ignored on this host before
    docker = shlex.split(dry_run(tmp_path, config, "docker", "--hf-cache", cache).strip().splitlines()[-1])
    assert f"{cache.resolve()}:/cache/huggingface" in docker


def test_on_k8s_the_hf_cache_is_a_claim_s_name_and_a_path_is_refused_as_one(config, tmp_path):
    line = refused(tmp_path, "run", config, "--target", "k8s", "--dry-run", "--image", IMAGE, "--hf-cache",
                   "/nonexistent")
    assert line == ("error: --hf-cache '/nonexistent': on Kubernetes it names a PersistentVolumeClaim, not a folder: "
                    "pass a claim's name (`kubectl get pvc`; ReadWriteMany shares it between runs), or leave it out "
                    "for the launcher's cache claim")
    objects = [o for o in yaml.safe_load_all(dry_run(tmp_path, config, "k8s", "--hf-cache", "team-models")) if o]
    [job] = [o for o in objects if o["kind"] == "Job"]
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "team-models"}} in \
        job["spec"]["template"]["spec"]["volumes"]
