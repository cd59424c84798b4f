"""Upstream verl's image (`images build --variant cu130 --runtime verl`) built for real from PyPI alone, with no layer
cache, then checked inside: the tutorial's own verification (`import verl` gives 0.9.1), the labels against what is
installed, verl's config composing the README's example (`main_ppo --cfg job`) and refusing a typo in one line
through `verl-deploy run`, the secret files reaching huggingface_hub through the entrypoint, non-root without setuid
binaries. Everything the build made is removed afterwards.

No GPU here: a verl training step needs one (docs/verl-runtime.md says what was run). Slow tier: about ten minutes
and ~20 GB of disk. VERL_DEPLOY_TEST_VERL_IMAGE=TAG checks an image that is already here instead.
"""

import json
import os
import sys
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from verl_deploy.sizes import parse_gpus
from verl_deploy import compat
from verl_deploy.cli import app
from verl_deploy.images import plan_build
from verl_deploy.images.build import build
from verl_deploy.launchers import upstream, verl_command

from conftest import make_room, remove_images_made_since
from test_verl_runtime import EXAMPLE

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TAG = "verl-deploy-test:verl-cu130"
TOKEN = "hf_test_token_for_the_entrypoint"


@pytest.fixture(scope="module")
def verl_image(docker_client, base_image):
    if tag := os.environ.get("VERL_DEPLOY_TEST_VERL_IMAGE"):
        yield SimpleNamespace(tag=tag)
        return
    make_room(docker_client, need_gb=22, what="verl's cu130 image build")
    before = {image.id for image in docker_client.images.list(all=True)}
    opts, notes = plan_build("cu130", base_image=base_image, tag=TAG, no_cache=True, runtime_name="verl")
    console = Console(stderr=True, width=200, force_terminal=False)
    for note in notes:
        console.print(note)
    try:
        built = build(opts, console)
        print(f"\nverl cu130 image: {built.size / 1e9:.2f} GB, built in {built.seconds:.0f} s", file=sys.stderr)
        yield SimpleNamespace(tag=built.tag)
    finally:
        remove_images_made_since(docker_client, before, TAG)


def in_image(client, image: str, command: list[str], **options) -> str:
    return client.containers.run(image, command, remove=True, network_disabled=True, **options).decode()


def test_the_tutorials_check_prints_verl_s_version(docker_client, verl_image):
    """`python -c "import verl; print(verl.__version__)"`, through the image's entrypoint; and it is the default
    command."""
    said = in_image(docker_client, verl_image.tag, ["python3", "-c", "import verl; print(verl.__version__)"])
    assert said.strip().splitlines()[-1] == "0.9.1"
    assert in_image(docker_client, verl_image.tag, []).strip().splitlines()[-1] == "0.9.1"


def test_labels_are_what_the_image_holds(docker_client, verl_image):
    variant = compat.load_catalog(runtime="verl")["cu130"]
    labels = docker_client.api.inspect_image(verl_image.tag)["Config"]["Labels"]
    assert labels["verl-deploy.runtime"] == "verl" and labels["verl-deploy.runtime-version"] == "0.9.1"
    assert labels["verl-deploy.variant"] == "cu130" and labels["verl-deploy.cuda"] == variant.cuda
    probe = ("import json, importlib.metadata as m, torch; print(json.dumps({'torch': torch.__version__, "
             "'cuda': torch.version.cuda, **{n: m.version(n) for n in ('verl', 'vllm', 'transformers', 'tensordict')}}))")
    found = json.loads(in_image(docker_client, verl_image.tag, ["python3", "-c", probe]).strip().splitlines()[-1])
    assert found["torch"].split("+")[0] == labels["verl-deploy.torch"] == variant.torch
    assert found["cuda"] == variant.cuda and found["vllm"] == labels["verl-deploy.vllm"] == variant.vllm
    assert found["verl"] == "0.9.1" and found["transformers"] == "5.9.0"
    assert found["tensordict"].startswith("0.10")


def test_non_root_without_setuid_binaries(docker_client, verl_image):
    said = in_image(docker_client, verl_image.tag,
                    ["sh", "-c", "id -u; find / -xdev -perm /6000 -type f 2>/dev/null | wc -l"])
    assert said.split() == ["1000", "0"]


def test_verl_s_config_composes_and_validates_the_docs_example(docker_client, verl_image):
    args = verl_command.trainer_args(EXAMPLE, 8, 1, "/workspace/runs/r")
    composed = upstream.check_in_image(docker_client, verl_image.tag, args)
    assert "adv_estimator: grpo" in composed and "path: Qwen/Qwen2.5-0.5B-Instruct" in composed
    assert "n_gpus_per_node: 8" in composed and "default_local_dir: /workspace/runs/r/checkpoints" in composed


def test_verl_s_own_validation_stops_a_run_that_would_fail_at_start(docker_client, verl_image):
    """A config Hydra composes but verl's trainer refuses in its first seconds (validate_config)."""
    args = verl_command.trainer_args([*EXAMPLE, "data.train_batch_size=4"], 8, 1, "/workspace/runs/r")
    with pytest.raises(upstream.LaunchError) as refused:
        upstream.check_in_image(docker_client, verl_image.tag, args)
    assert str(refused.value) == ("verl's config check fails: ValueError: train_batch_size (4) must be >= "
                                  "actor.ppo_mini_batch_size (64)")


def test_a_typo_stops_run_in_one_line_before_anything_starts(docker_client, verl_image, tmp_path):
    result = CliRunner().invoke(app, ["run", "--runtime", "verl", "--gpus", "1", "--image", verl_image.tag,
                                      "--runs-dir", str(tmp_path), "--", *EXAMPLE, "trainer.totl_epochs=1"])
    assert result.exit_code == 2, result.output
    error = result.stderr.strip().splitlines()[-1]
    assert error == ("error: verl's config rejects the overrides: Could not override 'trainer.totl_epochs'. "
                     "Key 'totl_epochs' is not in struct (to append to your config use +trainer.totl_epochs=1)")
    assert not list(tmp_path.iterdir())  # no run directory, no container
    assert not docker_client.containers.list(all=True, filters={"ancestor": verl_image.tag})


def test_dry_run_with_the_image_here_checks_the_overrides_and_prints_the_line(verl_image, tmp_path):
    result = CliRunner().invoke(app, ["run", "--runtime", "verl", "--gpus", "1", "--image", verl_image.tag,
                                      "--dry-run", "--runs-dir", str(tmp_path), "--", *EXAMPLE])
    assert result.exit_code == 0, result.output
    assert "checking the overrides with verl's config" in result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("docker run ")


def test_the_entrypoint_hands_the_secret_files_to_huggingface_hub(docker_client, verl_image, tmp_path):
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "HF_TOKEN").write_text(TOKEN)
    (secrets / "WANDB_API_KEY").write_text("wandb-key")
    os.chmod(secrets / "HF_TOKEN", 0o644)
    os.chmod(secrets / "WANDB_API_KEY", 0o644)
    probe = ("import os, huggingface_hub; print(os.environ.get('HF_TOKEN_PATH')); print(huggingface_hub.get_token()); "
             "print(os.environ.get('WANDB_API_KEY')); print('HF_TOKEN' in os.environ)")
    container = docker_client.containers.run(
        verl_image.tag, ["python3", "-c", probe], detach=True, network_disabled=True, read_only=True,
        tmpfs={"/tmp": ""}, environment={"HOME": "/tmp"},
        volumes={str(secrets): {"bind": "/run/secrets", "mode": "ro"}})
    try:
        container.wait(timeout=120)
        said = container.logs().decode().split()[-4:]
        env = docker_client.api.inspect_container(container.id)["Config"]["Env"]
    finally:
        container.remove(force=True)
    assert said == ["/run/secrets/HF_TOKEN", TOKEN, "wandb-key", "False"]
    assert not any(TOKEN in item or "wandb-key" in item for item in env)  # nothing in `docker inspect`


def test_a_verl_run_in_docker_follows_status_logs_and_stop(docker_client, verl_image, tmp_path):
    """main_ppo for real in its container, through the Docker launcher: Ray starts and verl's TaskRunner prints its
    config, then waits for the GPU this host lacks (no device request here: there is no GPU runtime). `status`
    says running, `logs` shows verl's output, `stop` ends it as stopped, and its console stays in train.log."""
    import dataclasses
    import time

    from verl_deploy.launchers.docker import DockerLauncher
    from verl_deploy.launchers.jobspec import Gpus, build_spec

    overrides = (*EXAMPLE, "trainer.n_gpus_per_node=1")
    spec = build_spec(None, image=verl_image.tag, runs_root=tmp_path, run_id="verl-run", gpus=parse_gpus("1"), runtime="verl",
                      overrides=overrides, shm_size="2g", environ={"HF_HUB_OFFLINE": "1"})
    spec = dataclasses.replace(spec, gpus=Gpus())  # no GPU to ask the engine for
    launcher = DockerLauncher(tmp_path)
    try:
        assert launcher.launch(spec, detach=True) == 0
        deadline, log = time.monotonic() + 240, ""
        while "TaskRunner" not in log and time.monotonic() < deadline:
            time.sleep(3)
            log = "".join(launcher.logs("verl-run"))
        assert "TaskRunner" in log and "'adv_estimator': 'grpo'" in log, log[-2000:]
        assert launcher.status("verl-run").state == "running"
        assert launcher.stop("verl-run") is None
        ended = launcher.status("verl-run")
        assert ended.state == "stopped", ended
        assert not docker_client.containers.list(all=True, filters={"label": "verl-deploy.run-id=verl-run"})
        assert "TaskRunner" in (tmp_path / "verl-run" / "train.log").read_text()
        assert "TaskRunner" in "".join(launcher.logs("verl-run"))  # from train.log now
        record = json.loads((tmp_path / "verl-run" / "launch.json").read_text())
        assert record["runtime"] == "verl" and record["command"][:5] == [
            "python3", "/opt/verl-deploy/secrets.py", "python3", "-m", "verl.trainer.main_ppo"]
        assert (tmp_path / "verl-run" / "outputs").is_dir()  # Hydra's, in the run directory (the root is read-only)
    finally:
        for container in docker_client.containers.list(all=True, filters={"label": "verl-deploy.run-id=verl-run"}):
            container.remove(force=True)
