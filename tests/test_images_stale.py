"""A local image that would train other code than this CLI's is called stale, in one line, by `images list`,
`run` and doctor: built for another release, or from other trainer code under the same release."""

import io
import json
import tarfile

import pytest
from conftest import REPO
from typer.testing import CliRunner

from verl_deploy import __version__
from verl_deploy.cli import app
from verl_deploy.images import plan_build
from verl_deploy.images.context import build_args, runtime_source
from verl_deploy.images.stale import stale_reason, warning

CURRENT = {"verl-deploy.variant": "cpu", "verl-deploy.runtime": "verl-deploy",
           "verl-deploy.runtime-version": __version__, "verl-deploy.runtime-source": runtime_source()}


def test_an_image_built_from_this_code_is_current_and_others_are_stale():
    assert stale_reason(CURRENT) is None
    assert stale_reason({}) is None  # not one of ours
    assert stale_reason({**CURRENT, "verl-deploy.runtime-version": "0.0.9"}) == (
        f"built for verl-deploy 0.0.9, this CLI runs {__version__}")
    other = {**CURRENT, "verl-deploy.runtime-source": "sha256:" + "0" * 64}
    assert stale_reason(other).startswith("built from other trainer code than this CLI's (000000000000 vs ")
    assert stale_reason({k: v for k, v in CURRENT.items() if k != "verl-deploy.runtime-source"}) is None  # unknown
    verl = {"verl-deploy.variant": "cu130", "verl-deploy.runtime": "verl", "verl-deploy.runtime-version": "0.8.0"}
    assert stale_reason(verl) == "built for verl 0.8.0, this CLI runs 0.9.1"
    assert warning("img:1", other).endswith("it would train other code; rebuild it: "
                                            "`verl-deploy images build --variant cpu`")


def test_the_build_labels_the_image_with_the_code_it_copies():
    opts, _ = plan_build("cpu", base_image="b")
    assert build_args(opts)["RUNTIME_SOURCE"] == runtime_source()
    assert 'verl-deploy.runtime-source="${RUNTIME_SOURCE}"' in (REPO / "docker" / "Dockerfile").read_text()


def test_the_digest_follows_the_trainer_code(tmp_path, monkeypatch):
    import shutil

    from verl_deploy import assets

    copy = tmp_path / "verl_runtime"
    shutil.copytree(assets.package_dir("verl_runtime"), copy, ignore=shutil.ignore_patterns("__pycache__"))
    real = assets.package_dir
    monkeypatch.setattr(assets, "package_dir", lambda name: copy if name == "verl_runtime" else real(name))
    assert runtime_source() == CURRENT["verl-deploy.runtime-source"]
    (copy / "trainer.py").write_text((copy / "trainer.py").read_text() + "\n# changed\n")
    assert runtime_source() != CURRENT["verl-deploy.runtime-source"]


@pytest.mark.docker
def test_images_list_run_and_doctor_say_an_image_is_stale(docker_client, tmp_path):
    tag = "verl-deploy-test/stale:1"
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("empty"), io.BytesIO(b""))
    labels = {**CURRENT, "verl-deploy.runtime-source": "sha256:" + "0" * 64}
    docker_client.api.import_image_from_data(payload.getvalue(), repository=tag.split(":")[0], tag="1",
                                             changes=[f"LABEL {k}={v}" for k, v in labels.items()])
    try:
        listed = CliRunner().invoke(app, ["images", "list"], env={"COLUMNS": "400"})
        flat = " ".join(listed.output.replace("│", " ").split())  # the table folds long cells over lines
        assert listed.exit_code == 0 and f"{tag} (stale: built from other trainer code" in flat, listed.output
        run = CliRunner().invoke(app, ["run", str(REPO / "examples" / "quickstart.yaml"), "--target", "docker",
                                       "--image", tag, "--dry-run", "--runs-dir", str(tmp_path)])
        assert run.exit_code == 0, run.output
        assert run.stderr.strip().splitlines() == [warning(tag, labels)]
        doctor = CliRunner().invoke(app, ["doctor", "--json"])
        findings = json.loads(doctor.stdout)["findings"]
        [stale] = [f for f in findings if f["name"] == f"image {tag}"]
        assert stale["status"] == "warn" and stale["message"].startswith("stale: built from other trainer code")
        assert stale["remedy"] == "rebuild it: verl-deploy images build --variant cpu"
    finally:
        docker_client.images.remove(tag)
