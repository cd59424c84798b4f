"""Image builds without an engine: every variant's build args, build context and pip configuration.

CUDA variants are checked here rather than built (their torch downloads are GBs); test_images_build.py builds
the cpu variant for real, and a CUDA one on request (VERL_DEPLOY_BUILD_CUDA=1).
"""

import io
import re
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verl_deploy import __version__, compat
from verl_deploy.cli import app
from verl_deploy.images import ImageError, image_tag, plan_build
from verl_deploy.images.build import BuildLog
from verl_deploy.images.context import DOCKERFILE, build_args, context_members, pip_config, target, write_context
from verl_deploy.images.registry import explain

NO_ENV: dict[str, str] = {}
CUDA_VARIANTS = [name for name, v in compat.load_catalog().items() if not v.is_cpu]


def plan(variant="cpu", env=NO_ENV, **kwargs):
    opts, _ = plan_build(variant, env=env, **kwargs)
    return opts


def test_cpu_build_args_pin_the_catalog_and_label_the_image():
    args = build_args(plan("cpu"))
    assert args["VARIANT"] == "cpu"
    assert args["TORCH_VERSION"] == compat.load_catalog()["cpu"].torch
    assert args["RUNTIME_VERSION"] == __version__
    assert args["CUDA"] == "none"
    # No GPU for the cpu variant: the NVIDIA runtime then behaves like runc.
    assert args["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert args["NVIDIA_REQUIRE_CUDA"] == ""
    assert args["BASE_IMAGE"] == "python:3.11-slim-bookworm"


@pytest.mark.parametrize("name", CUDA_VARIANTS)
def test_cuda_variant_asks_the_toolkit_for_a_driver_that_runs_it(name):
    v = compat.load_catalog()[name]
    args = build_args(plan(name))
    assert args["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert args["CUDA"] == v.cuda
    assert args["TORCH_VERSION"] == v.torch
    # The toolkit's check and the catalog's min_driver agree: the CUDA that driver runs in full.
    required = args["NVIDIA_REQUIRE_CUDA"].removeprefix("cuda>=")
    assert compat.driver_runs_cuda(v.min_driver, v.cuda)
    assert compat.max_cuda(v.min_driver) == required
    assert compat.version_tuple(required)[0] == compat.version_tuple(v.cuda)[0]


@pytest.mark.parametrize("name", CUDA_VARIANTS)
def test_cuda_variant_takes_torch_and_vllm_from_pypi_alone(name):
    """PyPI's Linux torch is the CUDA build the catalog names: no torch index to reach, none to fall back from."""
    v = compat.load_catalog()[name]
    opts = plan(name)
    assert v.torch_index_url is None and v.vllm
    assert pip_config(opts, for_torch=True) == pip_config(opts)
    assert "index-url" not in pip_config(opts)
    args = build_args(opts)
    assert args["VLLM_VERSION"] == v.vllm and args["COMPILER"] == "true"
    assert args["COMPUTE_CAPABILITIES"] == ",".join(v.compute_capabilities)
    assert opts.tag == f"verl-deploy:{__version__}-{name}"


def test_a_torch_index_is_a_mirror_for_the_torch_step_only():
    opts = plan("cu130", torch_index_url="https://mirror.example/torch/cu130")
    assert "extra-index-url = https://mirror.example/torch/cu130" in pip_config(opts, for_torch=True)
    assert "mirror.example" not in pip_config(opts)


def test_pip_in_the_build_retries_little_and_the_catalog_lists_what_it_removes():
    conf = pip_config(plan("cpu"))
    assert "retries = 2" in conf and "timeout = 60" in conf
    cpu, cu130 = build_args(plan("cpu")), build_args(plan("cu130"))
    assert "torch/include" in cpu["UNUSED_PATHS"].split()  # no compiler in the cpu image: no headers either
    assert "torch/include" not in cu130["UNUSED_PATHS"].split() and "torch/test" in cu130["UNUSED_PATHS"].split()
    assert "flashinfer-python" in cu130["UNUSED"].split() and "flashinfer-python" not in cpu["UNUSED"].split()
    # every image: the host CLI's Kubernetes client and charts, which nothing in a container imports
    assert {"virtualenv", "kubernetes", "matplotlib"} <= set(cpu["UNUSED"].split()) & set(cu130["UNUSED"].split())


def test_context_holds_the_dockerfile_source_and_build_extras_only():
    members = context_members(plan("cu128"))
    assert members["Dockerfile"] == DOCKERFILE
    assert "pyproject.toml" in members and "installer/constraints.txt" in members
    assert "verl_runtime/__init__.py" in members and "installer/verl_deploy/images/context.py" in members
    assert not [n for n in members if "__pycache__" in n or n.endswith(".pyc")]
    assert not [n for n in members if n.startswith((".venv", "tests/", ".git", "runs/"))]
    assert {n for n in members if n.startswith("extras/")} == {"extras/pip.conf", "extras/pip-torch.conf"}
    assert {n for n in members if n.startswith("build/")} == {
        "build/base.sh", "build/toolchain.sh", "build/preflight.py", "build/verify.py", "build/prune.py"}


def test_context_is_a_tar_the_engine_can_read():
    buffer = io.BytesIO()
    write_context(plan("cpu"), buffer)
    buffer.seek(0)
    with tarfile.open(fileobj=buffer) as tar:
        names = tar.getnames()
        assert tar.extractfile("Dockerfile").read() == DOCKERFILE.read_bytes()
    assert "verl_runtime/__init__.py" in names


def test_wheelhouse_with_the_pinned_torch_replaces_the_torch_index(tmp_path):
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"wheel")
    opts = plan("cpu", wheelhouse=tmp_path)
    torch_conf = pip_config(opts, for_torch=True)
    assert "find-links = /extras/wheelhouse" in torch_conf
    assert "extra-index-url" not in torch_conf
    assert "extras/wheelhouse/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl" in context_members(opts)


def test_wheelhouse_without_the_pinned_torch_keeps_the_torch_index(tmp_path):
    (tmp_path / "torch-2.10.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"wheel")
    torch_conf = pip_config(plan("cpu", wheelhouse=tmp_path), for_torch=True)
    assert "extra-index-url = https://download.pytorch.org/whl/cpu" in torch_conf


def test_mirrors_go_to_pip_conf_never_into_build_args():
    token_url = "https://user:s3cret@mirror.example/simple"
    opts = plan("cu130", pip_index_url=token_url, pip_extra_index_urls=("https://extra.example/simple",),
                torch_index_url="https://mirror.example/torch/cu130")
    assert "index-url = https://user:s3cret@mirror.example/simple" in pip_config(opts)
    assert "https://extra.example/simple" in pip_config(opts)
    torch_conf = pip_config(opts, for_torch=True)
    assert re.search(r"extra-index-url = https://mirror.example/torch/cu130\n\s+https://extra.example/simple", torch_conf)
    assert not [v for v in build_args(opts).values() if "s3cret" in v or "mirror.example" in v]


def test_host_ca_bundle_is_used_for_pip_and_said_so(tmp_path):
    bundle = tmp_path / "proxy-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    opts, notes = plan_build("cpu", env={"PIP_CERT": str(bundle)})
    assert opts.ca_bundle == bundle
    assert any(str(bundle) in n and "PIP_CERT" in n and "stays out of the image" in n for n in notes)
    assert "cert = /extras/ca-bundle.pem" in pip_config(opts)
    assert context_members(opts)["extras/ca-bundle.pem"] == bundle
    assert target(opts) == "runtime"


def test_requests_ca_bundle_is_the_fallback_and_none_means_none(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("x")
    assert plan("cpu", env={"REQUESTS_CA_BUNDLE": str(bundle)}).ca_bundle == bundle
    opts = plan("cpu", env={})
    assert opts.ca_bundle is None and "cert" not in pip_config(opts)


def test_keep_ca_bundle_builds_the_stage_that_trusts_it(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("x")
    assert target(plan("cpu", ca_bundle=bundle, keep_ca_bundle=True)) == "runtime-with-ca"


def test_runtime_stage_copies_nothing_from_the_build_extras():
    """The CA bundle, pip.conf and wheelhouse live in /extras of the deps stage; only runtime-with-ca takes the
    bundle from there."""
    stages = re.split(r"^FROM ", DOCKERFILE.read_text(), flags=re.M)
    runtime = next(s for s in stages if s.startswith("toolchain AS runtime"))
    assert "extras" not in runtime and "PIP_CERT" not in runtime
    assert "USER 1000:1000" in runtime and "WORKDIR /workspace" in runtime
    assert 'ENTRYPOINT ["python", "-m", "verl_runtime"]' in runtime
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in runtime and "HF_HOME=/cache/huggingface" in runtime


def test_tags_name_the_version_variant_and_registry():
    assert image_tag("cpu") == f"verl-deploy:{__version__}-cpu"
    assert image_tag("cu128", "127.0.0.1:5000/") == f"127.0.0.1:5000/verl-deploy:{__version__}-cu128"
    assert plan("cpu", registry="reg.example:5000").tag == f"reg.example:5000/verl-deploy:{__version__}-cpu"


def test_build_log_folds_the_engine_stream_into_steps():
    clock = iter(range(100))
    log = BuildLog(clock=lambda: next(clock))
    events = [
        {"stream": "Step 1/3 : ARG BASE_IMAGE=python:3.11-slim-bookworm"},
        {"stream": "\n"},
        {"stream": "Step 2/3 : FROM python:3.11-slim-bookworm AS builder\n"},
        {"stream": " ---> 5a424bdd0148\n"},
        {"stream": "Step 3/3 : RUN pip install nothing\n"},
        {"stream": " ---> Running in 0123456789ab\n"},
        {"stream": "ERROR: No matching distribution found for nothing\n"},
        {"error": "The command '/bin/sh -c pip install nothing' returned a non-zero code: 1",
         "errorDetail": {"code": 1}},
    ]
    finished = [step.number for event in events for step in log.feed(event)]
    assert finished == [1, 2]
    assert log.current.number == 3 and log.current.log == ["ERROR: No matching distribution found for nothing"]
    assert "non-zero code: 1" in log.error


@pytest.mark.parametrize(
    "ref, message, expected",
    [
        # As Docker 20.10 words them.
        ("127.0.0.1:1/verl-deploy:x", 'Get "https://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: connection refused',
         "cannot reach registry 127.0.0.1:1"),
        ("127.0.0.1:5000/verl-deploy:nope",
         "manifest for 127.0.0.1:5000/verl-deploy:nope not found: manifest unknown: manifest unknown",
         "is not in registry 127.0.0.1:5000"),
        ("127.0.0.1:5000/verl-deploy:x", "unauthorized: authentication required",
         "refused access: run `docker login 127.0.0.1:5000`"),
        ("reg.example:5000/verl-deploy:x",
         'Get "https://reg.example:5000/v2/": http: server gave HTTP response to HTTPS client', "insecure-registries"),
        ("verl-deploy:x", "pull access denied for verl-deploy, repository does not exist or may require 'docker login'",
         "registry docker.io refused access"),
    ],
)
def test_registry_failures_read_as_one_line_with_what_to_do(ref, message, expected):
    line = explain(message, ref, "pull")
    assert expected in line and "\n" not in line


def test_bad_build_input_is_one_line_and_exit_2_as_every_command_s(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["images", "build", "--variant", "cu999"])
    assert result.exit_code == 2
    assert "unknown variant 'cu999': choose one of cpu, cu128" in result.output
    result = runner.invoke(app, ["images", "build", "--variant", "cpu", "--wheelhouse", str(tmp_path / "none")])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        f"error: --wheelhouse {tmp_path / 'none'} is not a directory"]
    result = runner.invoke(app, ["images", "build", "--variant", "cpu", "--ca-bundle", str(tmp_path / "none.pem")])
    assert result.exit_code == 2 and "--ca-bundle" in result.output and len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_auto_is_cpu_on_a_host_without_nvidia_gpu():
    opts, notes = plan_build("auto", env={})
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this host has an NVIDIA driver")
    assert opts.variant.name == "cpu" and notes == ["variant auto: cpu (what this host's driver and GPUs run best)"]


def test_unknown_variant_is_an_image_error():
    with pytest.raises(ImageError, match="unknown variant"):
        plan_build("tpu", env={})


def test_pull_without_a_registry_says_where_images_come_from():
    result = CliRunner().invoke(app, ["images", "pull", "--variant", "cpu"])
    assert result.exit_code == 2  # bad input, as on every command
    assert result.output.startswith("error: no registry publishes verl-deploy images: pass --registry")


def test_host_mirrors_carry_over_unless_given():
    env = {"PIP_INDEX_URL": "https://mirror.example/simple", "PIP_EXTRA_INDEX_URL": "https://a.example https://b.example"}
    opts, notes = plan_build("cpu", env=env)
    assert opts.pip_index_url == "https://mirror.example/simple"
    assert opts.pip_extra_index_urls == ("https://a.example", "https://b.example")
    assert any("PIP_INDEX_URL" in n for n in notes) and not any("mirror.example" in n for n in notes)
    assert plan("cpu", env=env, pip_index_url="https://other.example/simple").pip_index_url == "https://other.example/simple"


def test_list_shows_the_tag_run_uses_and_other_local_tags_after_it():
    from rich.console import Console

    from verl_deploy.images.listing import LocalImage, rows, table

    local = {"cpu": [LocalImage((image_tag("cpu"), "reg.example:5000/verl-deploy:mine"), 1_500_000_000, "2026-12-01 12:00")],
             "cu130": [LocalImage(("verl-deploy-test:cu130",), 9_000_000_000, "2026-12-01 12:30")],
             "services": [LocalImage((image_tag("services"),), 241_000_000, "2026-12-01 12:40")]}
    console = Console(record=True, width=250)
    console.print(table(rows(None, [], local)))
    text = console.export_text()
    cpu = next(line for line in text.splitlines() if line.startswith("│ cpu "))
    assert image_tag("cpu") in cpu and "1.50 GB" in cpu and "yes" in cpu
    assert "also: reg.example:5000/verl-deploy:mine" in text
    cu130 = next(line for line in text.splitlines() if line.startswith("│ cu130 "))
    # Only another tag of cu130 is here: `run` would not find its image.
    assert f"{image_tag('cu130')} (not built or pulled)" in cu130 and "no NVIDIA GPU" in cu130
    assert "also: verl-deploy-test:cu130" in text
    services = next(line for line in text.splitlines() if line.startswith("│ services "))
    assert image_tag("services") in services and "0.24 GB" in services and "no torch" in services and "yes" in services
