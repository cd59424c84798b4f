"""Push to and pull from a real registry (Debian's docker-registry on 127.0.0.1, which the engine treats as
insecure-allowed), with the per-layer progress and the one-line failures checked."""

import base64
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
import warnings

import pytest
from typer.testing import CliRunner

from conftest import free_port, require
from verl_deploy import __version__
from verl_deploy.cli import app

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def serve_registry(root, auth: str = ""):
    """Start Debian's docker-registry on 127.0.0.1:<free port> storing under root; (address, process)."""
    exe = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    require(os.access(exe, os.X_OK), "docker-registry is missing (.ci/services.sh installs it)")
    port = free_port()
    config = root / "config.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n"
        f"http:\n  addr: 127.0.0.1:{port}\n{auth}"
    )
    with open(root / "registry.log", "wb") as log:
        server = subprocess.Popen([exe, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(50):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
            break
        except urllib.error.HTTPError:  # 401 from a registry that wants credentials: it is up
            break
        except OSError:
            time.sleep(0.2)
    return f"127.0.0.1:{port}", server


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A real registry, open to all, for this module."""
    address, server = serve_registry(tmp_path_factory.mktemp("registry"))
    yield address
    server.terminate()
    server.wait(10)


USER, PASSWORD = "verl", "s3cret-for-tests"


def docker_login(config_dir, registry: str) -> None:
    """What `docker login` writes into DOCKER_CONFIG's config.json: the registry's credentials, base64 user:password."""
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    (config_dir / "config.json").write_text(json.dumps({"auths": {registry: {"auth": token}}}))


@pytest.fixture(scope="module")
def private_registry(tmp_path_factory):
    """A real registry that wants a user and password (htpasswd, bcrypt)."""
    with warnings.catch_warnings():  # crypt (libxcrypt's bcrypt, as htpasswd -B writes it) is deprecated in 3.11
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    root = tmp_path_factory.mktemp("private-registry")
    (root / "htpasswd").write_text(f"{USER}:{crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n")
    auth = f"auth:\n  htpasswd:\n    realm: verl-deploy-test\n    path: {root}/htpasswd\n"
    address, server = serve_registry(root, auth)
    yield address
    server.terminate()
    server.wait(10)


def small_image(client, ref: str) -> None:
    """A one-layer image of 3 MB of random bytes (incompressible: a pull has something to count), tagged ref."""
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as tar:
        data = os.urandom(3 << 20)
        info = tarfile.TarInfo("payload.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    repository, tag = ref.rsplit(":", 1)
    client.api.import_image_from_data(payload.getvalue(), repository=repository, tag=tag)


def verl_deploy(*args: str):
    return CliRunner().invoke(app, list(args))


def test_build_push_then_pull_back(docker_client, cpu_image, base_image, torch_wheelhouse, registry):
    built = verl_deploy("images", "build", "--variant", "cpu", "--base-image", base_image,
                        "--wheelhouse", str(torch_wheelhouse), "--registry", registry, "--push")
    assert built.exit_code == 0, built.output
    ref = f"{registry}/verl-deploy:{__version__}-cpu"
    assert f"built {ref}" in built.output and "digest: sha256:" in built.output
    assert f"pushed {ref}@sha256:" in built.output  # pinned, for `run --target k8s --image`
    pushed_id = docker_client.api.inspect_image(ref)["Id"]

    docker_client.images.remove(ref)  # an untag: verl-deploy:<version>-cpu keeps the shared layers
    pulled = verl_deploy("images", "pull", "--variant", "cpu", "--registry", registry)
    assert pulled.exit_code == 0, pulled.output
    *layer_lines, last = pulled.output.strip().splitlines()
    assert last == f"Status: Downloaded newer image for {ref}"
    # Layers this host still holds read "Already exists"; any other (a source layer built since) is fetched.
    assert all(" Already exists " in line or " Pull complete " in line for line in layer_lines), layer_lines
    assert docker_client.api.inspect_image(ref)["Config"]["Labels"]["verl-deploy.variant"] == "cpu"
    assert docker_client.api.inspect_image(ref)["Id"] == pushed_id


def test_k8s_runs_the_services_from_the_services_image_its_registry_has(docker_client, services_image, registry):
    """The nodes pull the services image beside the run's from the registry: the run uses it once it is pushed,
    pinned to the digest the registry answers (asked again after this engine forgot its push), and the run's own
    image until then (test_services.py)."""
    from test_services import EXAMPLE, TOOL_PATH

    pushed = verl_deploy("images", "push", "--variant", "services", "--registry", registry)
    assert pushed.exit_code == 0, pushed.output
    ref = f"{registry}/verl-deploy:{__version__}-services"
    digest = pushed.output.split(f"pushed {ref}@")[1].split()[0]
    docker_client.images.remove(ref)  # an untag: this engine no longer knows the push, the registry still has it
    shown = verl_deploy("run", str(EXAMPLE), "--target", "k8s", "--image", f"{registry}/verl-deploy:{__version__}-cpu",
                        "--run-id", "agent", "--dry-run", *TOOL_PATH)
    assert shown.exit_code == 0, shown.output
    assert f"image: {ref}@{digest}\n" in shown.output and "cannot be had" not in shown.output


def test_pull_shows_a_bar_per_downloaded_layer(docker_client, registry):
    ref = f"{registry}/verl-deploy-test/layers:1"
    small_image(docker_client, ref)
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


def test_private_registry_takes_credentials_from_the_docker_config(docker_client, private_registry, tmp_path,
                                                                   monkeypatch):
    ref = f"{private_registry}/verl-deploy-test/private:1"
    small_image(docker_client, ref)
    assert '"error"' not in docker_client.images.push(ref, auth_config={"username": USER, "password": PASSWORD})
    docker_client.images.remove(ref)

    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # no credentials for it yet
    refused = verl_deploy("images", "pull", "--tag", ref)
    assert refused.exit_code == 1
    assert refused.output.strip() == (
        f"error: pull {ref}: registry {private_registry} refused access: run `docker login {private_registry}` "
        "with an account that may pull it"
    )

    docker_login(tmp_path, private_registry)
    pulled = verl_deploy("images", "pull", "--tag", ref)
    assert pulled.exit_code == 0, pulled.output
    assert "Pull complete" in pulled.output
    docker_client.images.remove(ref)


# --- images push: a local image into a registry, printed pinned to the digest the registry gave --------------------


def manifest_digest(registry: str, name: str, tag: str) -> str:
    """The digest the registry itself serves a tag's manifest under (its HTTP API, Docker-Content-Digest)."""
    request = urllib.request.Request(f"http://{registry}/v2/{name}/manifests/{tag}",
                                     headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers["Docker-Content-Digest"]


def test_push_prints_the_reference_pinned_to_the_registrys_digest(docker_client, registry):
    from verl_deploy.images.registry import pinned

    local, target = "verl-deploy-test/push:1", f"{registry}/team/verl-deploy-test/push:1"
    small_image(docker_client, local)
    try:
        result = verl_deploy("images", "push", "--tag", local, "--registry", f"{registry}/team")
        assert result.exit_code == 0, result.output
        *layer_lines, pushed, hint = result.output.strip().splitlines()
        assert pushed.startswith(f"pushed {target}@sha256:")
        assert any(" Pushed " in line for line in layer_lines), layer_lines
        ref = pushed.removeprefix("pushed ")
        assert hint == f"run it on Kubernetes: verl-deploy run CONFIG --target k8s --image {ref}"
        assert ref.partition("@")[2] == manifest_digest(registry, "team/verl-deploy-test/push", "1")
        assert pinned(target) == ref
        assert pinned(local) == local  # pushed under another name: the local tag has no digest of its own

        # `run --target k8s --image <the tag>` puts the pushed digest in the manifest: the nodes pull what was pushed
        import yaml

        from conftest import REPO

        dry = verl_deploy("run", str(REPO / "examples" / "quickstart.yaml"), "--target", "k8s", "--dry-run",
                          "--image", target, "--run-id", "pinned")
        assert dry.exit_code == 0, dry.output
        job = [d for d in yaml.safe_load_all(dry.stdout) if d and d["kind"] == "Job"][0]["spec"]["template"]["spec"]
        assert {(c["image"], c["imagePullPolicy"]) for c in job["containers"] + job["initContainers"]} == {
            (ref, "IfNotPresent")}
    finally:
        for tag in (local, target):
            docker_client.images.remove(tag)


def test_push_of_a_missing_local_image_is_one_line(docker_client, registry, monkeypatch):
    result = verl_deploy("images", "push", "--tag", "verl-deploy-test/absent:1", "--registry", registry)
    assert result.exit_code == 1
    assert result.output.strip() == (
        "error: verl-deploy-test/absent:1 is not on this host: `docker images` lists the local images")

    # A release no host has built, so the variant's image is missing whatever this engine holds.
    from verl_deploy.images import context

    monkeypatch.setattr(context, "__version__", "0.0.0-absent")
    tag = "verl-deploy:0.0.0-absent-cu128"
    assert not docker_client.images.list(name=tag)
    result = verl_deploy("images", "push", "--variant", "cu128", "--registry", registry)
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"error: {tag} is not on this host: build it first (verl-deploy images build --variant cu128), "
        "or name a local image with --tag")


def test_push_to_an_unreachable_registry_is_one_line(docker_client):
    local = "verl-deploy-test/push-nowhere:1"
    small_image(docker_client, local)
    registry = f"127.0.0.1:{free_port()}"
    try:
        result = verl_deploy("images", "push", "--tag", local, "--registry", registry)
        assert result.exit_code == 1
        assert result.output.startswith(f"error: cannot reach registry {registry}: check its address")
        assert len(result.output.strip().splitlines()) == 1
    finally:
        for tag in (local, f"{registry}/{local}"):
            docker_client.images.remove(tag)


def test_push_takes_credentials_from_the_docker_config(docker_client, private_registry, tmp_path, monkeypatch):
    local, target = "verl-deploy-test/private-push:1", f"{private_registry}/verl-deploy-test/private-push:1"
    small_image(docker_client, local)
    try:
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # no credentials for it yet
        refused = verl_deploy("images", "push", "--tag", local, "--registry", private_registry)
        assert refused.exit_code == 1
        assert refused.output.strip() == (
            f"error: push {target}: registry {private_registry} refused access: run `docker login {private_registry}` "
            "with an account that may push it"
        )

        docker_login(tmp_path, private_registry)
        pushed = verl_deploy("images", "push", "--tag", local, "--registry", private_registry)
        assert pushed.exit_code == 0, pushed.output
        assert f"pushed {target}@sha256:" in pushed.output
    finally:
        for tag in (local, target):
            docker_client.images.remove(tag)
