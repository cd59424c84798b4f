"""`images push` without an engine: which references name a registry, which --registry strings Docker's reference
grammar takes, where a local image goes, and the digest in push's closing line. The push itself, against a real
registry: tests/test_images_registry.py."""

import time

import pytest
from typer.testing import CliRunner

from conftest import free_port
from verl_deploy.cli import app
from verl_deploy.images import ImageError
from verl_deploy.images.registry import check_registry, digest_in, has_registry, pinned, push_target, registry_of

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize("ref", [
    "127.0.0.1:5000/verl-deploy:0.1.0-cpu", "registry.example.com/team/verl-deploy:1", "localhost/verl-deploy:1",
    "localhost:5000/a/b:1", "[::1]:5000/verl-deploy:1", f"ghcr.io/team/verl-deploy@{DIGEST}",
])
def test_a_reference_with_a_host_names_its_registry(ref):
    assert has_registry(ref)


@pytest.mark.parametrize("ref", [
    "verl-deploy:0.1.0-cu128", "ubuntu:22.04", "ubuntu", "team/verl-deploy:1", "verl-deploy-test/layers:1",
    "localhost", f"verl-deploy@{DIGEST}",
])
def test_a_reference_without_a_host_is_docker_hubs(ref):
    assert not has_registry(ref)
    assert registry_of(ref) == "docker.io"


@pytest.mark.parametrize("registry", [
    "127.0.0.1:5000", "127.0.0.1:5000/team", "registry.example.com", "localhost", "localhost:5000/a/b",
    "my-registry.local:443/team-a/sub_path", "Registry.Example.com/team", "[::1]:5000/x", "ghcr.io/a.b/c__d/e---f",
])
def test_a_registry_in_the_reference_grammar_is_taken(registry):
    assert check_registry(registry) == registry
    assert check_registry(registry + "/") == registry


@pytest.mark.parametrize("registry, says", [
    (None, "where to? pass --registry HOST[:PORT][/PATH]"),
    ("", "where to? pass --registry HOST[:PORT][/PATH]"),
    ("http://127.0.0.1:5000", "drop the scheme"),
    ("myregistry", "Docker reads 'myregistry' as a Docker Hub account, not a host"),
    ("myregistry/team", "Docker reads 'myregistry' as a Docker Hub account, not a host"),
    ("127.0.0.1:5000/Team", "path component 'Team' must be lowercase"),
    ("127.0.0.1:5000/team//x", "path component '' must be lowercase"),
    ("127.0.0.1:5000/-team", "path component '-team' must be lowercase"),
    ("127.0.0.1:5000/team.", "path component 'team.' must be lowercase"),
    ("registry.example.com:port", "'registry.example.com:port' is not a host[:port]"),
    ("-bad.example.com", "'-bad.example.com' is not a host[:port]"),
    ("bad_host.example.com", "'bad_host.example.com' is not a host[:port]"),
    ("127.0.0.1:5000/team verl", "path component 'team verl' must be lowercase"),
])
def test_a_registry_outside_the_grammar_is_one_line(registry, says):
    with pytest.raises(ImageError) as err:
        check_registry(registry)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("local, registry, target", [
    ("verl-deploy:0.1.0-cpu", "127.0.0.1:5000/team", "127.0.0.1:5000/team/verl-deploy:0.1.0-cpu"),
    ("verl-deploy:verl-0.9.1-cu130", "registry.example.com", "registry.example.com/verl-deploy:verl-0.9.1-cu130"),
    # A local image built for another registry (`images build --registry`) keeps its name and tag, not its host.
    ("127.0.0.1:5000/verl-deploy:0.1.0-cpu", "ghcr.io/team", "ghcr.io/team/verl-deploy:0.1.0-cpu"),
    ("verl-deploy-test/layers:1", "localhost:5000", "localhost:5000/verl-deploy-test/layers:1"),
    ("verl-deploy", "localhost:5000", "localhost:5000/verl-deploy:latest"),
])
def test_a_local_image_goes_under_the_registry_with_its_name_and_tag(local, registry, target):
    assert push_target(local, registry) == target


def test_a_local_image_by_digest_or_a_name_too_long_is_one_line():
    with pytest.raises(ImageError, match="name the local image by its tag"):
        push_target(f"verl-deploy@{DIGEST}", "127.0.0.1:5000")
    with pytest.raises(ImageError, match="longer than the 255 characters"):
        push_target("verl-deploy:1", "127.0.0.1:5000/" + "a" * 250)


def test_the_digest_is_read_from_pushs_closing_line():
    assert digest_in(f"0.1.0-cpu: digest: {DIGEST} size: 527") == DIGEST
    assert digest_in("pushed 127.0.0.1:5000/verl-deploy:1") is None


def test_pinned_keeps_a_digest_and_answers_without_an_engine(monkeypatch):
    assert pinned(f"127.0.0.1:5000/verl-deploy:1@{DIGEST}") == f"127.0.0.1:5000/verl-deploy:1@{DIGEST}"
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")  # nothing answers there
    started = time.monotonic()
    assert pinned("127.0.0.1:5000/verl-deploy:1") == "127.0.0.1:5000/verl-deploy:1"
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("args, says", [
    ([], "error: where to? pass --registry HOST[:PORT][/PATH], e.g. registry.example.com:5000/team"),
    (["--registry", "127.0.0.1:5000/Team"], "error: registry 127.0.0.1:5000/Team: path component 'Team' must be "
                                            "lowercase letters and digits, joined by '.', '_', '__' or '-'"),
    (["--registry", "myregistry"], "error: registry myregistry: Docker reads 'myregistry' as a Docker Hub account, "
                                   "not a host: give a host with a '.' or a :PORT (myregistry:5000, "
                                   "myregistry.example.com) or localhost"),
])
def test_push_to_a_bad_registry_string_is_one_line(args, says):
    """Checked before anything else: no engine, no image needed."""
    result = CliRunner().invoke(app, ["images", "push", "--tag", "verl-deploy:1", *args])
    assert result.exit_code == 2  # bad input, as on every command
    assert result.output.strip() == says


def test_push_help_renders():
    """Typer renders help as rich markup: a `[/PATH]` there would be a closing tag and a traceback."""
    result = CliRunner().invoke(app, ["images", "push", "--help"])
    assert result.exit_code == 0, result.output
    assert "--registry" in result.output and "--tag" in result.output
