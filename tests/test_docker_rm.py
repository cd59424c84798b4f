"""`verl-deploy runs rm` of a Docker run against the real engine: what a detached run leaves (its containers, with the
labels the launcher gives them, and its run directory) goes; a run whose container still runs is refused."""

import pytest
from launch_support import cli, containers

from verl_deploy import runs
from verl_deploy.launchers.docker import ROLE_LABEL
from verl_deploy.launchers.jobspec import MANAGED_LABEL, RUN_ID_LABEL

pytestmark = pytest.mark.docker


@pytest.fixture
def detached_run(tmp_path, docker_client, base_image):
    """Run `rm-1` as a detached launch leaves it: a trainer container of ours and its run directory."""
    run_dir = tmp_path / "rm-1"
    runs.write_record(run_dir, {"run_id": "rm-1", "target": "docker", "exit_code": None, "finished_at": None})
    labels = {RUN_ID_LABEL: "rm-1", MANAGED_LABEL: "true", ROLE_LABEL: "trainer"}
    trainer = docker_client.containers.run(base_image, ["sleep", "300"], name="rm-1", labels=labels, detach=True)
    yield run_dir, trainer
    for container in containers(docker_client, "rm-1"):
        container.remove(force=True)


def test_runs_rm_refuses_a_running_docker_run_then_removes_it_once_ended(tmp_path, docker_client, detached_run):
    run_dir, trainer = detached_run
    refused = cli("runs", "rm", "rm-1", "--yes", "--runs-dir", tmp_path)
    assert refused.exit_code == 2
    assert refused.output == "error: run rm-1 is still running: `verl-deploy stop rm-1` first\n"
    assert containers(docker_client, "rm-1") and run_dir.exists()
    trainer.kill()  # it ended (its end not recorded: nobody followed it)
    trainer.wait()
    removed = cli("runs", "rm", "rm-1", "--yes", "--runs-dir", tmp_path)
    assert removed.exit_code == 0, removed.output
    assert removed.stdout == f"removed run rm-1: container rm-1, run directory {run_dir}\n"
    assert not containers(docker_client, "rm-1") and not run_dir.exists()
