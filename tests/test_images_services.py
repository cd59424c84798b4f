"""The services image (`images build --variant services`, docker/services.Dockerfile): the tool services without
torch or CUDA, numpy kept for the code tools run; labelled and hardened as the runtime images, and small."""

import json

import pytest

from verl_deploy import __version__
from verl_deploy.images import SERVICES, context, plan_build, services_tag

MAX_SIZE_BYTES = 300 * 10**6  # issue #49's aim; docs/images.md states the measured size


def test_the_services_variant_is_its_own_dockerfile_and_tag():
    opts, _ = plan_build(SERVICES, base_image="base:1")
    assert opts.tag == f"verl-deploy:{__version__}-services"
    assert context.dockerfile(opts.variant).name == "services.Dockerfile"
    assert context.build_args(opts)["VARIANT"] == "services" and opts.variant.is_cpu


def test_a_runs_image_of_the_catalog_has_its_services_image_beside_it():
    assert services_tag(f"reg.example:5000/verl-deploy:{__version__}-cu130") == \
        f"reg.example:5000/verl-deploy:{__version__}-services"
    assert services_tag(f"verl-deploy:{__version__}-cpu") == f"verl-deploy:{__version__}-services"
    # not ours to guess: another name, another version, an unversioned tag, a digest
    for image in ("myorg/trainer:1.0-cpu", "verl-deploy:0.0.1-cpu", "verl-deploy:cpu", "reg:5000/verl-deploy@sha256:ab"):
        assert services_tag(image) is None, image


@pytest.mark.docker
@pytest.mark.slow
def test_the_services_image_is_small_hardened_labelled_and_serves(docker_client, services_image):
    image = docker_client.images.get(services_image)
    assert image.attrs["Size"] <= MAX_SIZE_BYTES, image.attrs["Size"]
    config = image.attrs["Config"]
    assert config["User"] == "1000:1000" and config["Labels"]["verl-deploy.variant"] == "services"
    assert config["Labels"]["verl-deploy.runtime-version"] == __version__ and config["Labels"]["verl-deploy.cuda"] == "none"
    assert not [e for e in config["Env"] if e.startswith(("PIP_", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"))]
    probe = ("import importlib.util, json, numpy; print(json.dumps([importlib.util.find_spec(m) is None for m in "
             "('torch', 'transformers', 'ray', 'verl_deploy')]))")
    assert json.loads(docker_client.containers.run(services_image, ["-c", probe], remove=True)) == [True] * 4
    # the sandbox serves in it as a launcher runs it: no network, no capabilities, read-only
    code = ("import json, threading, urllib.request; from verl_runtime.services import sandbox; "
            "s = sandbox.serve('127.0.0.1', 0, isolation='external'); threading.Thread(target=s.serve_forever, "
            "daemon=True).start(); r = urllib.request.urlopen(urllib.request.Request(f'http://127.0.0.1:{s.server_port}"
            "/run_code', json.dumps({'code': 'import numpy; print(numpy.arange(4).sum())'}).encode()), timeout=30); "
            "print(json.loads(r.read())['run_result']['stdout'].strip())")
    out = docker_client.containers.run(services_image, ["-c", code], network_mode="none", cap_drop=["ALL"],
                                       read_only=True, tmpfs={"/tmp": "rw,exec"}, remove=True)
    assert out.decode().strip().splitlines()[-1] == "6"
    # read-only with nowhere to write a run's working directory: the sandbox says so at its start, not at each request
    refused = docker_client.containers.run(services_image, ["-m", "verl_runtime.services.sandbox", "--network-isolation",
                                                            "external"], read_only=True, detach=True)
    try:
        assert refused.wait(timeout=60)["StatusCode"] == 2
        assert refused.logs().decode().strip().splitlines() == [
            "error: no writable temporary directory for the runs' working directories: give the sandbox one at /tmp "
            "(a read-only container: docker run --tmpfs /tmp, a Kubernetes emptyDir) or name one in TMPDIR"]
    finally:
        refused.remove(force=True)
