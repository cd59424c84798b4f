"""One meaning of `--variant auto` (compat.variant_for) and one reading of the host (host_facts): for a recorded
host, every entry point names the same variant: `run --dry-run` on docker (this host) and k8s (the cluster's),
`images build --variant auto`, `smoke` (through the same run plan), and doctor's recommendation."""

import json
import re

import pytest
from conftest import FIXTURES, REPO
from typer.testing import CliRunner

from verl_deploy import compat, host_facts, images
from verl_deploy.cli import app
from verl_deploy.images.context import image_tag
from verl_deploy.launchers.runplan import RunRequest, plan_run
from verl_deploy.smoke import write_config

READINGS = FIXTURES / "nvml"
QUICKSTART = REPO / "examples" / "quickstart.yaml"
# A recorded host -> what auto is on it: the newest CUDA its driver runs in full; the CUDA 12 image through
# minor-version compatibility on a 535 driver; cpu where the driver is older than every CUDA image's floor.
HOSTS = {"h200": "cu130", "a100-535": "cu128", "v100-470": "cpu", "no-driver": "cpu"}


def dry_run(tmp_path, *args):
    result = CliRunner().invoke(app, ["run", str(QUICKSTART), "--dry-run", "--no-plan", "--run-id", "chosen",
                                      "--runs-dir", str(tmp_path / "runs"), *args])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(params=sorted(HOSTS))
def host(request, monkeypatch):
    """The recorded host (its NVML reading replayed, as for doctor) and the variant auto is on it."""
    monkeypatch.setenv(host_facts.NVML_READING_ENV, str(READINGS / f"{request.param}.json"))
    return request.param, HOSTS[request.param]


def test_every_entry_point_names_the_same_variant_for_one_host(host, tmp_path):
    name, expected = host
    docker = dry_run(tmp_path, "--target", "docker", "--gpus", "1")
    assert image_tag(expected) in docker.split(), docker  # the image a real docker run builds and starts
    built, notes = images.plan_build("auto", env={})  # what `images build --variant auto` would build
    assert built.tag == image_tag(expected)
    assert notes[0] == f"variant auto: {expected} (what this host's driver and GPUs run best)"
    smoke = plan_run(RunRequest(args=(str(write_config(tmp_path, "smoke")),), target="docker", gpus="1",
                                shm_size="1g", run_id="smoke-1"), tmp_path / "runs")  # the request `smoke` plans
    assert (smoke.variant, smoke.spec.image, smoke.build_image) == (expected, image_tag(expected), True)
    document = json.loads(CliRunner().invoke(app, ["doctor", "--json"]).stdout)
    assert document["recommended_variant"] == expected


def test_a_cluster_gets_the_cluster_variant_whatever_this_host_has(host, tmp_path):
    k8s = dry_run(tmp_path, "--target", "k8s", "--gpus", "1", "--image-preloaded")
    images_named = set(re.findall(r"image: (\S+)", k8s))
    assert images_named == {image_tag(compat.CLUSTER_GPU_VARIANT)}, images_named
    planned = plan_run(RunRequest(args=(str(QUICKSTART),), target="slurm", gpus="1"), tmp_path / "runs")
    assert planned.variant == compat.CLUSTER_GPU_VARIANT


def test_without_gpus_auto_is_cpu_on_every_target(host, tmp_path):
    for target in ("docker", "k8s", "slurm", "local"):
        planned = plan_run(RunRequest(args=(str(QUICKSTART),), target=target, variant="auto"), tmp_path / "runs")
        assert planned.variant == "cpu", target


def test_a_named_variant_is_kept_as_asked(host, tmp_path):
    docker = dry_run(tmp_path, "--target", "docker", "--gpus", "1", "--variant", "cu128")
    assert image_tag("cu128") in docker.split()


def test_a_runtime_with_no_image_for_this_host_refuses_a_gpu_run_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv(host_facts.NVML_READING_ENV, str(READINGS / "no-driver.json"))
    result = CliRunner().invoke(app, ["run", "--runtime", "verl", "--gpus", "1", "--target", "docker", "--dry-run",
                                      "--runs-dir", str(tmp_path / "runs"), "--", "trainer.total_epochs=1"])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.startswith("error: no verl image runs on this host: cu130: no NVIDIA GPU on this host")
    assert "\n" not in line
    assert "--variant" in line and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()


def test_a_recorded_reading_that_is_not_one_is_one_line_everywhere(monkeypatch, tmp_path):
    bad = tmp_path / "reading.json"
    bad.write_text("{}")
    monkeypatch.setenv(host_facts.NVML_READING_ENV, str(bad))
    for args in (["images", "build", "--variant", "auto"],
                 ["run", str(QUICKSTART), "--target", "docker", "--gpus", "1", "--dry-run", "--no-plan"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code != 0 and "is not an NVML reading" in result.output, result.output
        assert "Traceback" not in result.output
