"""A run that status, logs, stop or `runs rm` cannot find is said in one line that is true for it (#38): no such run
at all (not "no Docker run", whatever the target), or a run of another target than --target named. No Docker
engine is needed: one that does not answer is what most hosts without Docker have."""

import pytest
from typer.testing import CliRunner

from conftest import free_port
from verl_deploy.cli import app
from verl_deploy.runs import write_record


@pytest.fixture(autouse=True)
def _no_engine(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")  # nothing answers there


def one_line(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize("command", [["status"], ["logs"], ["stop"], ["runs", "rm", "--yes"]])
def test_a_run_that_is_nowhere_is_said_to_be_nowhere(tmp_path, command):
    root = tmp_path / "runs"
    assert one_line(*command, "nope", "--runs-dir", root) == (
        f"error: no run 'nope' under {root}: `verl-deploy runs` lists the runs")
    assert not root.exists()


@pytest.mark.parametrize("recorded, asked", [("local", "docker"), ("docker", "local"), ("k8s", "docker")])
def test_a_run_of_another_target_is_named_with_its_own(tmp_path, recorded, asked):
    root = tmp_path / "runs"
    write_record(root / "r1", {"target": recorded, "run_id": "r1"})
    for command in (["status"], ["logs"], ["stop"]):
        assert one_line(*command, "r1", "--target", asked, "--runs-dir", root) == (
            f"error: run 'r1' is a {recorded} run, not a {asked} one: leave out --target (the run's own is recorded) "
            f"or give --target {recorded}")
