"""`verl-deploy smoke`: a two-step training reported as one line, a JSON summary and a JUnit XML file."""

import json
import xml.etree.ElementTree as ET

import pytest
import yaml
from conftest import REPO
from typer.testing import CliRunner

from verl_deploy.cli import app


def smoke(*args):
    return CliRunner().invoke(app, ["smoke", *[str(a) for a in args]])


def assert_passed(result, tmp_path, target):
    assert result.exit_code == 0, result.output
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith(f"smoke PASS [{target}]") and "2-step training" in line
    summary = json.loads((tmp_path / "smoke.json").read_text())
    assert summary["passed"] is True and summary["steps"] == 2 and summary["line"] == line
    assert summary["last_metrics"]["step"] == 2
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert suite.tag == "testsuite" and suite.get("tests") == "1" and suite.get("failures") == "0"
    assert suite.find("testcase").get("classname") == f"verl-deploy.smoke.{target}"


@pytest.mark.slow
def test_smoke_on_this_host(tmp_path):
    result = smoke("--target", "local", "--runs-dir", tmp_path / "runs", "--json", tmp_path / "smoke.json",
                   "--junit", tmp_path / "junit.xml")
    assert_passed(result, tmp_path, "local")


@pytest.mark.slow
@pytest.mark.docker
def test_smoke_in_the_cpu_image(tmp_path, cpu_image, docker_client):
    result = smoke("--target", "docker", "--image", cpu_image, "--runs-dir", tmp_path / "runs",
                   "--json", tmp_path / "smoke.json", "--junit", tmp_path / "junit.xml")
    run_id = json.loads((tmp_path / "smoke.json").read_text())["run_id"]
    for container in docker_client.containers.list(all=True, filters={"label": f"verl-deploy.run-id={run_id}"}):
        assert container.status == "exited"
        container.remove()
    assert_passed(result, tmp_path, "docker")


def test_example_ci_workflow_uses_smoke():
    workflow = yaml.safe_load((REPO / "examples" / "ci" / "gpu-smoke.yml").read_text())
    commands = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    assert any("verl-deploy smoke --target docker --gpus 1" in c for c in commands)
    assert any("verl-deploy smoke --target k8s" in c for c in commands)
