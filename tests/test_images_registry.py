"""Push to and pull from a real registry (Debian's docker-registry on 127.0.0.1, which the engine treats as
insecure-allowed), with the per-layer progress and the one-line failures checked."""

import io
import os
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.request

import pytest
from typer.testing import CliRunner

from conftest import require
from verl_deploy import __version__
from verl_deploy.cli import app

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A real registry on 127.0.0.1:<free port>, for this module."""
    exe = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    require(os.access(exe, os.X_OK), "docker-registry is missing (.ci/services.sh installs it)")
    root, port = tmp_path_factory.mktemp("registry"), free_port()
    config = root / "config.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    with open(root / "registry.log", "wb") as log:
        server = subprocess.Popen([exe, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(50):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


def verl_deploy(*args: str):
    return CliRunner().invoke(app, list(args))


def test_build_push_then_pull_back(docker_client, cpu_image, base_image, torch_wheelhouse, registry):
    built = verl_deploy("images", "build", "--variant", "cpu", "--base-image", base_image,
                        "--wheelhouse", str(torch_wheelhouse), "--registry", registry, "--push")
    assert built.exit_code == 0, built.output
    ref = f"{registry}/verl-deploy:{__version__}-cpu"
    assert f"built {ref}" in built.output and "digest: sha256:" in built.output

    docker_client.images.remove(ref)  # an untag: verl-deploy:<version>-cpu keeps the shared layers
    pulled = verl_deploy("images", "pull", "--variant", "cpu", "--registry", registry)
    assert pulled.exit_code == 0, pulled.output
    *layer_lines, last = pulled.output.strip().splitlines()
    assert last == f"Status: Downloaded newer image for {ref}"
    # Layers this host still holds read "Already exists"; any other (a source layer built since) is fetched.
    assert all(" Already exists " in line or " Pull complete " in line for line in layer_lines), layer_lines
    assert docker_client.api.inspect_image(ref)["Config"]["Labels"]["verl-deploy.variant"] == "cpu"
    assert docker_client.api.inspect_image(ref)["Id"] == docker_client.api.inspect_image(cpu_image)["Id"]


def test_pull_shows_a_bar_per_downloaded_layer(docker_client, registry):
    ref = f"{registry}/verl-deploy-test/layers:1"
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as tar:
        data = os.urandom(3 << 20)  # incompressible: the pull has something to count
        info = tarfile.TarInfo("payload.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    docker_client.api.import_image_from_data(payload.getvalue(), repository=ref.rsplit(":", 1)[0], tag="1")
    assert '"error"' not in docker_client.images.push(ref)
    docker_client.images.remove(ref)

    result = verl_deploy("images", "pull", "--tag", ref)
    assert result.exit_code == 0, result.output
    assert "Pull complete" in result.output and "MB" in result.output
    assert f"Downloaded newer image for {ref}" in result.output
    docker_client.images.remove(ref)


def test_unknown_tag_is_one_line(registry):
    result = verl_deploy("images", "pull", "--tag", f"{registry}/verl-deploy:no-such-tag")
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"error: {registry}/verl-deploy:no-such-tag is not in registry {registry}: check the tag "
        f"(`verl-deploy images list`), or build and push it "
        f"(`verl-deploy images build --variant V --tag {registry}/verl-deploy:no-such-tag --push`)"
    )


def test_unreachable_registry_is_one_line():
    result = verl_deploy("images", "pull", "--variant", "cpu", "--registry", f"127.0.0.1:{free_port()}")
    assert result.exit_code == 1
    assert result.output.startswith("error: cannot reach registry 127.0.0.1:")
    assert len(result.output.strip().splitlines()) == 1
