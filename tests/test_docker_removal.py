"""Removing what a Docker run made while something else removes it too (a `docker rm -f`, a `runs rm`, the engine,
another command that records the run's end): a container already gone (404) or whose removal is already in progress
(409) is what was asked, on every path that removes (the finish of a run, `runs rm`), against the real engine."""

import contextlib
import subprocess
import sys
import threading
import time

import docker.errors
import pytest
from docker.models.containers import Container
from launch_support import QUICKSTART, cli, containers, metrics_steps
from test_docker_rm import detached_run  # noqa: F401 (a fixture)

from verl_deploy.launchers.docker import DockerLauncher, discard

pytestmark = pytest.mark.docker


def _removing_or_gone(client, container_id) -> bool:
    try:
        return client.api.inspect_container(container_id)["State"]["Status"] == "removing"
    except docker.errors.NotFound:
        return True


def _remove_from_outside(client, container_id) -> threading.Thread:
    """Start a forced removal from outside the launcher; return once the engine reports it under way (or done)."""
    def remove():
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            client.api.remove_container(container_id, force=True)

    outside = threading.Thread(target=remove)
    outside.start()
    deadline = time.monotonic() + 30
    while not _removing_or_gone(client, container_id) and time.monotonic() < deadline:
        time.sleep(0.001)
    return outside


@pytest.fixture
def removed_from_outside(monkeypatch, docker_client):
    """Every container the launcher removes is being removed from outside at that very moment: the names it raced."""
    real_remove = Container.remove
    raced = []

    def racing_remove(self, **kwargs):
        outside = _remove_from_outside(docker_client, self.id)
        raced.append(self.name)
        try:
            return real_remove(self, **kwargs)
        finally:
            outside.join()

    monkeypatch.setattr(Container, "remove", racing_remove)
    return raced


def test_a_container_whose_removal_is_in_progress_is_removed_without_error(docker_client, base_image):
    container = docker_client.containers.run(base_image, ["sleep", "300"], detach=True)
    outside = _remove_from_outside(docker_client, container.id)
    with pytest.raises(docker.errors.APIError, match="already in progress|No such container"):
        docker_client.api.remove_container(container.id, force=True)  # what the launcher used to fail on
    discard(container)  # the same race: no error, and it is gone once discard returns
    outside.join()
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(container.id)
    discard(container)  # already gone: nothing to do


def test_runs_rm_of_a_container_removed_from_outside_meanwhile(tmp_path, docker_client, detached_run,  # noqa: F811
                                                               removed_from_outside):
    run_dir, trainer = detached_run
    trainer.kill()
    trainer.wait()
    removed = cli("runs", "rm", "rm-1", "--yes", "--runs-dir", tmp_path)
    assert removed.exit_code == 0, removed.output
    assert removed_from_outside == ["rm-1"]
    assert not containers(docker_client, "rm-1") and not run_dir.exists()


def test_a_finished_run_whose_container_is_removed_from_outside_exits_0(tmp_path, cpu_image, docker_client, leftovers,
                                                                        removed_from_outside):
    runs = tmp_path / "runs"
    leftovers.append("dock-race")
    result = cli("run", QUICKSTART, "--target", "docker", "--image", cpu_image, "--runs-dir", runs,
                 "--run-id", "dock-race", "--set", "trainer.total_training_steps=2", "--set", "trainer.test_freq=-1",
                 "--set", "data.max_response_length=8", "--shm-size", "1g")
    assert result.exit_code == 0, result.output
    assert set(removed_from_outside) == {"dock-race"}  # the launcher removed it (maybe also after an ulimit retry)
    assert metrics_steps(runs / "dock-race") == [1, 2]
    assert not containers(docker_client, "dock-race")
    status = cli("status", "dock-race", "--runs-dir", runs)
    assert status.output.startswith("dock-race  docker  succeeded (exit 0)"), status.output


def test_an_attached_run_whose_end_another_command_records_first_exits_with_its_code(tmp_path, cpu_image,
                                                                                    docker_client, leftovers,
                                                                                    monkeypatch):
    """`verl-deploy runs` in another terminal, under any runs root, records the end of a run whose trainer has
    exited and removes its containers: here it does so just as the trainer ends, before the launcher that follows
    the run (attached) records it itself."""
    runs = tmp_path / "runs"
    leftovers.append("dock-first")
    follow, other = DockerLauncher._follow, []

    def follow_then_another_command(self, *args):
        code = follow(self, *args)
        other.append(subprocess.run([sys.executable, "-m", "verl_deploy", "runs", "--target", "docker", "--runs-dir",
                                     str(tmp_path / "elsewhere")], capture_output=True, text=True, timeout=120))
        return code

    monkeypatch.setattr(DockerLauncher, "_follow", follow_then_another_command)
    result = cli("run", QUICKSTART, "--target", "docker", "--image", cpu_image, "--runs-dir", runs,
                 "--run-id", "dock-first", "--set", "trainer.total_training_steps=1", "--set", "trainer.test_freq=-1",
                 "--set", "data.max_response_length=8", "--shm-size", "1g")
    assert other[0].returncode == 0 and "dock-first" in other[0].stdout, other[0].stdout + other[0].stderr
    assert result.exit_code == 0, result.output
    assert metrics_steps(runs / "dock-first") == [1]
    assert not containers(docker_client, "dock-first")
    status = cli("status", "dock-first", "--runs-dir", runs)
    assert status.output.startswith("dock-first  docker  succeeded (exit 0)"), status.output
