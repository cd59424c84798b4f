"""`verl-deploy run --dry-run`: the docker line and the JobSpec behind it; bad input fails in one line."""

import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verl_deploy.cli import app
from verl_deploy.launchers.docker import container_options, docker_run_args, secrets_dir
from verl_deploy.launchers.jobspec import LaunchError, build_spec, parse_gpus

SECRET = "hf_very_secret_value_123"


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text("model:\n  path: builtin:tiny\n")
    return path


def invoke(*args, env=None):
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def test_docker_dry_run_is_a_docker_run_line_with_secrets_by_name_only(config, tmp_path):
    (tmp_path / "hf").mkdir()  # --hf-cache names an existing cache
    result = invoke("run", config, "--target", "docker", "--dry-run", "--image", "verl-deploy:test",
                    "--gpus", "0,1", "--set", "trainer.total_training_steps=2", "--run-id", "demo",
                    "--runs-dir", tmp_path / "runs", "--hf-cache", tmp_path / "hf",
                    env={"HF_TOKEN": SECRET, "WANDB_API_KEY": SECRET})
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.stdout)
    assert argv[:2] == ["docker", "run"]
    assert SECRET not in result.output and "HF_TOKEN" not in result.output  # secrets are files, mounted
    assert f"{secrets_dir('demo')}:/run/secrets:ro" in argv
    assert "--label" in argv and "verl-deploy.run-id=demo" in argv
    assert argv[argv.index("--gpus") + 1] == '"device=0,1"'
    assert argv[argv.index("--shm-size") + 1] == "16g"
    assert "memlock=-1" in argv and "stack=67108864" in argv
    assert f"{config.resolve()}:/etc/verl-deploy/config.yaml:ro" in argv
    assert f"{(tmp_path / 'runs' / 'demo').resolve()}:/workspace/runs/demo" in argv
    assert argv[argv.index("--user") + 1] != "0:0"
    image_at = argv.index("verl-deploy:test")
    assert argv[image_at + 1:] == [
        "train", "/etc/verl-deploy/config.yaml", "--set", "trainer.run_dir=/workspace/runs/demo",
        "--set", "trainer.resume=auto", "--set", "trainer.n_workers=2", "--set", "trainer.total_training_steps=2",
    ]
    assert not (tmp_path / "runs").exists(), "a dry run has no side effects"


def test_sdk_options_match_the_dry_run_line(config, tmp_path):
    spec = build_spec(config, image="img:1", runs_root=tmp_path, run_id="r1", gpus=parse_gpus("all"), ipc_host=True,
                      cpus=2, memory="8g", environ={"HF_TOKEN": SECRET})
    options = container_options(spec)
    argv = docker_run_args(options)
    assert options["device_requests"][0]["Count"] == -1 and ["--gpus", "all"] == argv[argv.index("--gpus"):][:2]
    assert options["ipc_mode"] == "host" and "shm_size" not in options and "--shm-size" not in argv
    assert options["labels"] == {"verl-deploy.run-id": "r1", "verl-deploy.managed": "true", "verl-deploy.role": "trainer"}
    assert options["command"] == argv[argv.index("img:1") + 1:]
    assert SECRET not in str(options) and SECRET not in shlex.join(argv)  # secrets are files (test_docker_faults)
    assert {m["Target"]: m["ReadOnly"] for m in options["mounts"]}["/etc/verl-deploy/config.yaml"] is True
    assert options["nano_cpus"] == 2_000_000_000 and options["mem_limit"] == "8g"


@pytest.mark.parametrize(
    "text, count, ids",
    [("all", -1, ()), ("2", 2, ()), ("0,1", 0, ("0", "1")), ("GPU-3f9a,GPU-77b1", 0, ("GPU-3f9a", "GPU-77b1")),
     (None, 0, ()), ("0", 0, ())],
)
def test_gpu_requests(text, count, ids):
    gpus = parse_gpus(text)
    assert (gpus.count, gpus.device_ids) == (count, ids)


def test_uuid_gpus_become_device_requests(config, tmp_path):
    spec = build_spec(config, image="i", runs_root=tmp_path, gpus=parse_gpus("GPU-3f9a"), environ={})
    request = container_options(spec, environ={})["device_requests"][0]
    assert request["DeviceIDs"] == ["GPU-3f9a"] and request["Capabilities"] == [["gpu"]]


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "missing.yaml", "--dry-run", "--image", "i"], "config file 'missing.yaml' does not exist"),
        (["run", "{config}", "--dry-run", "--image", "i", "--gpus", "lots"], "--gpus 'lots' is not understood"),
        (["run", "{config}", "--dry-run", "--image", "i", "--set", "nokey"], "needs the form key=value"),
        (["run", "{config}", "--dry-run", "--image", "reg.io/i", "--target", "k8s", "-n", "Bad_NS"],
         "not a valid Kubernetes namespace"),
        (["run", "{config}", "--dry-run", "--image", "reg.io/i", "--target", "k8s", "--gpus", "all"],
         "give a count"),
        (["run", "{config}", "--dry-run", "--image", "i", "-e", "HF_TOKEN=x"], "must come from the environment"),
        (["run", "{config}", "--dry-run", "--image", "i", "-e", "HF_TOKEN"], "secrets pass from your environment"),
        (["run", "{config}", "--dry-run", "--image", "i", "--target", "moon"], "unknown target 'moon'"),
        (["run", "{config}", "--dry-run", "--image", "verl-deploy:1", "--target", "k8s"],
         "image verl-deploy:1 names no registry, so no node can pull it: `verl-deploy images push --registry"),
        (["run", "{config}", "--dry-run", "--image", "reg.io/i", "--target", "k8s", "--gpu-type", "H1000"],
         "--gpu-type 'H1000' is not a GPU type this tool knows: use one of H100,"),
        (["run", "{config}", "--dry-run", "--image", "reg.io/i", "--target", "k8s", "--node-selector", "gpu"],
         "--node-selector 'gpu' needs the form KEY=VALUE"),
        (["run", "{config}", "--dry-run", "--image", "reg.io/i", "--target", "k8s", "--grace-period", "0"],
         "--grace-period 0 must be at least 1 second"),
        (["run", "{config}", "--dry-run", "--image", "reg.io/i", "--target", "k8s", "--priority-class", "High!"],
         "--priority-class 'High!' is not a Kubernetes object name"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(args, message, config):
    result = invoke(*[a.replace("{config}", str(config)) for a in args])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("target", ["local", "docker", "k8s"])
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--cpus", "-2"], "--cpus '-2' must be a number of cores above zero: use e.g. 8 or 0.5"),
        (["--cpus", "lots"], "--cpus 'lots' is not a number of cores: use e.g. 8 or 0.5"),
        (["--shm-size", "-5g"], "--shm-size '-5g' is not a size: use e.g. 16g (or 16Gi)"),
        (["--shm-size", "0"], "--shm-size '0' must be more than zero: use e.g. 16g"),
        (["--memory", "lots"], "--memory 'lots' is not a size: use e.g. 64g (or 64Gi)"),
        (["--memory", "1k"], "--memory '1k' is below the 6m a container needs to start: use e.g. 64g"),
        (["--nodes", "0"], "--nodes 0 must be at least 1"),
        (["--gpus", "-1"], "--gpus '-1' is not understood: use all, a count (2)"),
    ],
)
def test_bad_sizes_are_the_same_one_line_on_every_target(flags, message, target, config, tmp_path):
    """One parser (verl_deploy.sizes) for every target: the same input, the same line, exit 2, nothing left."""
    result = invoke("run", config, "--target", target, "--dry-run", "--image", "reg.io/verl:1", *flags,
                    "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 2, result.output
    assert result.output.strip().startswith(f"error: {message}") and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_smoke_reads_gpus_with_the_same_parser(tmp_path):
    result = invoke("smoke", "--target", "local", "--gpus", "-1", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 2, result.output
    assert result.output.strip() == ("error: --gpus '-1' is not understood: use all, a count (2), indices (0,1) or "
                                     "UUIDs (GPU-...)")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("target", ["docker", "k8s"])
def test_sizes_in_either_spelling_mean_the_same_bytes(target, config, tmp_path):
    outputs = {invoke("run", config, "--target", target, "--dry-run", "--image", "reg.io/verl:1", "--run-id", "same",
                      "--memory", memory, "--shm-size", shm, "--runs-dir", tmp_path).stdout
               for memory, shm in (("64g", "2g"), ("64Gi", "2Gi"), ("64G", "2048m"), ("64gb", "2GiB"))}
    assert len(outputs) == 1, outputs


def test_run_ids_are_dns_labels(config, tmp_path):
    spec = build_spec(config, image="i", runs_root=tmp_path, environ={})
    assert spec.run_id.startswith("tiny-") and len(spec.run_id) <= 52
    with pytest.raises(LaunchError):
        build_spec(config, image="i", runs_root=tmp_path, run_id="Not_OK", environ={})


def test_several_nodes_are_a_ray_head_and_workers_on_one_network(config, tmp_path):
    result = invoke("run", config, "--target", "docker", "--dry-run", "--image", "img:1", "--nodes", "3",
                    "--run-id", "mn", "--runs-dir", tmp_path)
    assert result.exit_code == 0, result.output
    network, *workers, head = [shlex.split(line) for line in result.stdout.strip().splitlines()]
    assert network == ["docker", "network", "create", "mn-net"]
    assert [w[w.index("--name") + 1] for w in workers] == ["mn-worker-1", "mn-worker-2"]
    assert all("--detach" in w and "verl-deploy.role=ray-worker" in w and "ray start --address=mn:6379" in w[-1]
               for w in workers)
    assert head[head.index("--name") + 1] == "mn" and "--detach" not in head
    assert all(argv[argv.index("--network") + 1] == "mn-net" for argv in [*workers, head])
    assert head[-1].startswith("ray start --head --port=6379")
    assert "RAY_ADDRESS=127.0.0.1:6379 python -m verl_runtime train /etc/verl-deploy/config.yaml" in head[-1]


@pytest.mark.parametrize("target", ["docker", "k8s", "local"])
@pytest.mark.parametrize(
    "overrides, yaml_text, message",
    [
        (["--set", "trainer.total_steps=2"], "model:\n  path: builtin:tiny\n", "trainer.total_steps"),
        (["--set", "data.batch_size=-1"], "model:\n  path: builtin:tiny\n", "data.batch_size=-1 on the command line is out of range: it must be >= 1"),
        ([], "model: [unclosed\n", "tiny.yaml"),
    ],
)
def test_a_dry_run_validates_the_config_as_the_trainer_will(tmp_path, target, overrides, yaml_text, message):
    """The trainer's own one-line message and a non-zero exit, before anything is printed or scheduled."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml_text)
    result = invoke("run", config, "--target", target, "--dry-run", "--image", "verl-deploy:test",
                    "--runs-dir", tmp_path / "runs", *overrides)
    assert result.exit_code == 2
    assert result.stdout == "" or result.stdout.startswith("error:")
    line = result.output.strip()
    assert "\n" not in line and line.startswith("error: ") and message in line and "Traceback" not in line
