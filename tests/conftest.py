"""Shared test helpers.

A component the project needs (Docker engine, Ray, vLLM, ...) must be tested in CI: with CI=true a missing
component fails the test; elsewhere the test is skipped with the reason.
"""

import os
import shutil
import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
IN_CI = os.environ.get("CI", "").lower() == "true"


def require(available: bool, reason: str) -> None:
    """Skip (outside CI) or fail (in CI) when a needed component is missing."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: this component must be present)")
    pytest.skip(reason)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The two image builds that take ~20 GB of disk each (a CUDA image and the stage it was made from) run first, while
# the disk holds least: a CI run on a machine with less free disk than ours ran out at their COPY steps once the
# earlier Docker tests' CPU images were there. Each removes what it made before the next starts.
DISK_HEAVY = ("test_images_cuda.py", "test_images_verl.py")
SESSION_START = time.time()


# `make test` runs two pytest sessions side by side (tests/run_lanes.sh): the "engines" lane holds every test of the
# one Docker engine and the one Slurm controller, one at a time as before; the "host" lane holds the rest (CPU
# training, Ray, vLLM, the CLI). The image builds wait on the network and the disk while the host lane computes.
ENGINE_MODULES = ("test_slurm.py",)  # its jobs share the controller's 2 CPUs with the docker-marked one


def in_engines_lane(item) -> bool:
    return item.get_closest_marker("docker") is not None or item.path.name in ENGINE_MODULES


def pytest_addoption(parser):
    parser.addoption("--lane", choices=("engines", "host"), default=None,
                     help="run only the tests of one lane (tests/run_lanes.sh runs both side by side)")


def pytest_collection_modifyitems(config, items):
    if lane := config.getoption("--lane"):
        keep = [item for item in items if in_engines_lane(item) == (lane == "engines")]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
    items.sort(key=lambda item: item.path.name not in DISK_HEAVY)  # stable: the rest keep their order


def make_room(client, need_gb: float, what: str) -> None:
    """Before a big build: remove the untagged images this test session left (stages of earlier builds, tags moved
    on) that no container uses, then fail (CI) or skip with one line if the engine's disk still has too little."""
    for image in client.images.list(filters={"dangling": True}):
        created = datetime.fromisoformat(image.attrs["Created"].split(".")[0].rstrip("Z")).replace(tzinfo=timezone.utc)
        if created.timestamp() >= SESSION_START - 1:
            try:
                client.images.remove(image.id)
            except Exception:  # in use by a container, or gone with its child
                pass
    root = client.info()["DockerRootDir"]
    if not os.path.isdir(root):  # a remote engine: its disk is not ours to read
        return
    free = shutil.disk_usage(root).free / 1e9
    require(free >= need_gb, f"{what} needs about {need_gb:.0f} GB free under {root}, and {free:.1f} GB is: "
                             "free some (docker image prune; docker builder prune) and run again")


def remove_images_made_since(client, before: set[str], tag: str) -> None:
    """An image build's teardown: the containers of `tag` (the runs of the tests: its layers go only after them),
    then every image made since `before` (ids), newest first, so that a big build leaves no disk behind."""
    for container in client.containers.list(all=True, filters={"ancestor": tag}):
        container.remove(force=True)
    made = [image for image in client.images.list(all=True) if image.id not in before]
    for image in sorted(made, key=lambda i: i.attrs["Created"], reverse=True):
        try:
            client.images.remove(image.id, force=True, noprune=False)
        except Exception:  # already gone with a child it parented
            pass


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for a module's multi-worker tests (start-up takes seconds), with an explicit CPU count, shut down
    after them: the trainer joins a Ray this process is connected to and never shuts it down, so a test that let it
    start one would leave it to the next module's ray.init ("called ray.init twice")."""
    try:
        import ray
    except ImportError:
        ray = None
    require(ray is not None, "ray is not installed (pip install verl-deploy[runtime])")
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """cluster(answers) starts the recorded API server (tests/k8s_api.py) with these answers as the user's
    KUBECONFIG, HOME being tmp_path; every server it started stops after the test."""
    from contextlib import ExitStack

    from k8s_api import ApiServer

    monkeypatch.setenv("HOME", str(tmp_path))
    with ExitStack() as servers:
        def start(answers: dict) -> ApiServer:
            api = servers.enter_context(ApiServer(answers))
            monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
            return api

        yield start


@pytest.fixture(scope="session")
def docker_client():
    """A client of a running Docker engine. Its calls may wait: right after a module removes a CUDA image's ~10 GB of
    layers, the engine took more than 10 s to untag an image."""
    import docker

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:  # any failure means: no usable engine
        require(False, f"no Docker engine reachable: {exc}")
    return client


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A fresh builtin:tiny model directory (Qwen2, random seeded weights, offline tokenizer)."""
    from verl_runtime.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tiny_model_dir):
    """A tiny Llama with what Qwen2 lacks: an untied lm_head, biases on o_proj and the MLP, llama3 rope scaling."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    out = tmp_path_factory.mktemp("tiny-llama")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name.endswith("bias"):
                    parameter.normal_(std=0.1)  # transformers initialises biases to zero: make them count
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_opt_dir(tmp_path_factory, tiny_model_dir):
    """A tiny random OPT model (the tutorial's architecture) with the built-in tokenizer, built offline."""
    import torch
    from transformers import AutoTokenizer, OPTConfig, OPTForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = OPTConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        word_embed_proj_dim=16,  # != hidden_size: exercises OPT's project_in/project_out
        num_hidden_layers=2,
        ffn_dim=64,
        num_attention_heads=4,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    out = tmp_path_factory.mktemp("tiny-opt")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        OPTForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# --- images: a base image made here (no registry is reachable) and the cpu variant built on it ------------------

BASE_IMAGE = "verl-deploy-test/bookworm-python:3.11"


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    """A minimal Debian bookworm with Python 3.11 (the cp311 of the torch wheel), made once per machine:
    debootstrap, then `docker import`. Later sessions find it by its tag."""
    import shutil
    import subprocess
    import tempfile

    if docker_client.images.list(name=BASE_IMAGE):
        return BASE_IMAGE
    require(shutil.which("debootstrap") is not None, "debootstrap is missing (.ci/services.sh installs it)")
    with tempfile.TemporaryDirectory() as root:
        packages = "--include=python3,python3-venv,ca-certificates"
        subprocess.run(["debootstrap", "--variant=minbase", packages, "bookworm", root], check=True, capture_output=True)
        subprocess.run(f"rm -rf {root}/var/cache/apt/archives/*.deb {root}/var/lib/apt/lists/*", shell=True, check=True)
        subprocess.run(f"tar -C {root} -c . | docker import - {BASE_IMAGE}", shell=True, check=True, capture_output=True)
    return BASE_IMAGE


@pytest.fixture(scope="session")
def torch_wheelhouse() -> Path:
    """A folder holding the torch wheel the cpu variant pins (kept in .cache/ between sessions)."""
    import subprocess
    import sys

    from verl_deploy import compat

    cpu = compat.load_catalog()["cpu"]
    wheelhouse = REPO / ".cache" / "wheelhouse"
    if not list(wheelhouse.glob(f"torch-{cpu.torch}+cpu-*.whl")):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"torch=={cpu.torch}", "--no-deps", "-d", str(wheelhouse),
             "--extra-index-url", cpu.torch_index_url],
            check=True, capture_output=True,
        )
    return wheelhouse


@pytest.fixture(scope="session")
def cpu_image(docker_client, base_image, torch_wheelhouse) -> str:
    """The tag of the cpu variant (verl-deploy:<version>-cpu) built on base_image through verl_deploy.images.
    Docker's layer cache turns a build of an unchanged source into seconds; a source change rebuilds only
    the last layers."""
    from rich.console import Console

    from verl_deploy.images import plan_build
    from verl_deploy.images.build import build

    opts, _ = plan_build("cpu", base_image=base_image, wheelhouse=torch_wheelhouse)
    return build(opts, Console(stderr=True)).tag


@pytest.fixture(scope="session")
def services_image(docker_client, base_image) -> str:
    """The tag of the services image (verl-deploy:<version>-services: the tool services without torch) built on
    base_image through verl_deploy.images; the docker launcher runs a run's services from it."""
    from rich.console import Console

    from verl_deploy.images import plan_build
    from verl_deploy.images.build import build

    opts, _ = plan_build("services", base_image=base_image)
    return build(opts, Console(stderr=True)).tag


@pytest.fixture
def leftovers(docker_client):
    """Run ids whose containers and secret files a test may leave behind when it fails: removed after it."""
    from launch_support import containers

    from verl_deploy.launchers.docker import secrets_dir

    run_ids = []
    yield run_ids
    for run_id in run_ids:
        for container in containers(docker_client, run_id):
            container.remove(force=True)
        shutil.rmtree(secrets_dir(run_id), ignore_errors=True)


@pytest.fixture(scope="session")
def sandbox_server():
    """Our code sandbox (verl_runtime/services/sandbox.py) serving on a free port, with a 4 s ceiling; its base URL."""
    from verl_runtime.services import sandbox

    try:
        server = sandbox.serve("127.0.0.1", 0, sandbox.Limits(max_run_timeout_s=4), concurrency=2)
    except ValueError as exc:  # no network namespaces for this user here
        require(False, str(exc))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
