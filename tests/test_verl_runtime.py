"""`--runtime verl`: upstream verl's images in the catalog, and its trainer (verl.trainer.main_ppo) launched through
the same `run` as our runtime. Fast tier: the catalog, the command lines, the Docker dry run and the Kubernetes
manifests (validated against the official schemas and KubeRay's CRD schema). The image itself is built and checked
in tests/test_images_verl.py."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from conftest import FIXTURES, REPO
from test_k8s import assert_hardened_pod, validate
from verl_deploy.sizes import parse_gpus
from verl_deploy import compat, runtimes
from verl_deploy.cli import app
from verl_deploy.images import plan_build
from verl_deploy.images.context import (
    DOCKER_DIR, build_args, context_members, dockerfile, image_tag, runtime_version, target,
)
from verl_deploy.launchers import upstream, verl_command
from verl_deploy.world import verl_world
from verl_deploy.runs import flat_metrics, resume_overrides

IMAGE = "verl-deploy:verl-0.9.1-cu130"
H200 = FIXTURES / "nvml" / "h200.json"
SECRET = "hf_secret_value_42"
# docs/verl-runtime.md's example: GRPO on GSM8K with a Hub model, on verl's own keys.
EXAMPLE = ["algorithm.adv_estimator=grpo", "data.train_files=/data/gsm8k/train.parquet",
           "data.val_files=/data/gsm8k/test.parquet", "data.train_batch_size=256", "data.max_prompt_length=512",
           "data.max_response_length=1024", "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
           "actor_rollout_ref.model.use_remove_padding=False", "actor_rollout_ref.actor.optim.lr=1e-6",
           "actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
           "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=4",
           "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
           "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8", "trainer.total_epochs=1"]


def run(*args, env=None):
    """`verl-deploy run` with no Docker engine in reach: the dry runs here never start verl's image (its own
    check of the overrides is tests/test_images_verl.py's). Those that need no image name verl's CUDA variant:
    auto would choose the one this host runs, and without a GPU it runs none."""
    return CliRunner().invoke(app, ["run", *args], env={"DOCKER_HOST": "unix:///nonexistent/docker.sock", **(env or {})})


# --- the catalog -------------------------------------------------------------------------------------------------

def test_the_verl_runtime_is_its_own_dependency_set_on_the_cu130_variants_cuda():
    verl = compat.load_runtimes()["verl"]
    assert verl.version == "0.9.1" and verl.trainer == ("python3", "-m", "verl.trainer.main_ppo")
    assert "verl[vllm]==0.9.1" in verl.packages and "transformers==5.9.0" in verl.packages
    ours, theirs = compat.load_catalog()["cu130"], compat.load_catalog(runtime="verl")["cu130"]
    assert (theirs.cuda, theirs.min_driver, theirs.compiler) == (ours.cuda, ours.min_driver, ours.compiler)
    assert (theirs.torch, theirs.vllm) == ("2.11.0", "0.24.0") and theirs.torch != ours.torch
    assert theirs.runtime == "verl" and ours.runtime == "verl-deploy"
    assert list(compat.load_catalog(runtime="verl")) == ["cu130"]  # no CPU or CUDA 12 pairing for verl 0.9.1


def test_a_verl_build_uses_its_dockerfile_its_pins_and_says_so_in_the_labels():
    opts, _ = plan_build("cu130", runtime_name="verl", env={})
    assert opts.tag == IMAGE == image_tag("cu130", runtime_name="verl")
    assert image_tag("cu130", "reg.local:5000", "verl") == f"reg.local:5000/{IMAGE}"
    args = build_args(opts)
    assert args["RUNTIME"] == "verl" and args["RUNTIME_VERSION"] == "0.9.1" == runtime_version("verl")
    assert args["TORCH_VERSION"] == "2.11.0" and args["VLLM_VERSION"] == "0.24.0"
    assert args["RUNTIME_PACKAGES"] == "verl[vllm]==0.9.1 transformers==5.9.0"
    members = context_members(opts)
    assert members["Dockerfile"] == dockerfile(opts.variant) == DOCKER_DIR / "verl.Dockerfile"
    assert target(opts) == "runtime"
    labels = (DOCKER_DIR / "verl.Dockerfile").read_text().split("LABEL ", 1)[1]
    for label in ("verl-deploy.runtime=", "verl-deploy.runtime-version=", "verl-deploy.variant=", "verl-deploy.torch="):
        assert label in labels
    assert 'verl-deploy.runtime="${RUNTIME}"' in (DOCKER_DIR / "Dockerfile").read_text()


def test_both_dockerfiles_share_the_base_user_and_compiler_steps():
    """One user, one set of folders, one compiler layer: the scripts both Dockerfiles run."""
    for name in ("Dockerfile", "verl.Dockerfile"):
        text = (DOCKER_DIR / name).read_text()
        assert "RUN sh /tmp/base.sh" in text and "sh /tmp/toolchain.sh" in text
        runtime = text.split("AS runtime\n", 1)[1].split("FROM runtime AS runtime-with-ca")[0]
        assert "USER 1000:1000" in runtime and "HF_HOME=/cache/huggingface" in runtime
        assert "/extras" not in runtime and "PIP_CERT" not in runtime
    verl = (DOCKER_DIR / "verl.Dockerfile").read_text()
    assert 'ENTRYPOINT ["python3", "/opt/verl-deploy/secrets.py"]' in verl
    assert "COPY verl_runtime/secrets.py /opt/verl-deploy/secrets.py" in verl


def test_auto_picks_verl_s_cuda_image_on_a_gpu_host_and_says_why_not_elsewhere(monkeypatch):
    monkeypatch.setenv("VERL_DEPLOY_NVML_READING", str(H200))
    opts, notes = plan_build("auto", runtime_name="verl", env={})
    assert opts.variant.name == "cu130" and opts.variant.runtime == "verl"
    verdicts = compat.check_variants(None, [], compat.load_catalog(runtime="verl"))
    with pytest.raises(LookupError, match="cu130: no NVIDIA GPU on this host"):
        compat.choose_variant(None, [], compat.load_catalog(runtime="verl"))
    assert not verdicts[0].runs


def test_auto_on_an_old_driver_names_the_driver_verl_needs(monkeypatch, tmp_path):
    reading = json.loads(H200.read_text())
    reading["driver_version"], reading["cuda_driver_version"] = "570.86.10", 12080
    path = tmp_path / "old.json"
    path.write_text(json.dumps(reading))
    monkeypatch.setenv("VERL_DEPLOY_NVML_READING", str(path))
    result = CliRunner().invoke(app, ["images", "build", "--runtime", "verl", "--variant", "auto"])
    assert result.exit_code == 2  # refused before the engine is asked, as `run` refuses it
    assert result.output.strip().splitlines()[-1].startswith("error: no verl image runs on this host: cu130: driver")
    assert "580.65.06" in result.output and "Traceback" not in result.output


def test_images_build_refuses_an_unknown_runtime_or_a_variant_verl_lacks():
    result = CliRunner().invoke(app, ["images", "build", "--runtime", "sglang", "--variant", "cu130"])
    assert result.exit_code == 2 and result.output.strip() == (
        "error: unknown runtime 'sglang': choose one of verl-deploy, verl")
    result = CliRunner().invoke(app, ["images", "build", "--runtime", "verl", "--variant", "cpu"])
    assert result.exit_code == 2 and result.output.strip() == (
        "error: unknown variant 'cpu' of runtime verl: choose one of cu130 or auto")


def test_images_list_shows_verl_s_image_beside_ours():
    from rich.console import Console

    from verl_deploy.images.listing import LocalImage, rows, table

    local = {"verl/cu130": [LocalImage((IMAGE,), 12_000_000_000, "2026-12-01 19:00")]}
    found = rows("580.159.04", ["9.0"], local)
    assert [(r.variant.runtime, r.variant.name) for r in found] == [
        ("verl-deploy", "cpu"), ("verl-deploy", "cu128"), ("verl-deploy", "cu130"), ("verl", "cu130"),
        ("verl-deploy", "services")]
    assert found[3].images and not found[2].images  # by the runtime label, not the variant's alone
    console = Console(width=250, record=True)
    console.print(table(found))
    text = console.export_text()
    assert IMAGE in text and "verl 0.9.1" in text and "--runtime verl" in text and "12.00 GB" in text


def test_doctor_says_which_verl_image_this_host_runs(tmp_path):
    from verl_deploy.doctor.core import Context
    from verl_deploy.doctor.gpu import _variant_findings
    from verl_deploy.host_facts import load_reading

    findings = {f.name: f for f in _variant_findings(Context(nvml=load_reading(H200)))}
    verl = findings["variant cu130 --runtime verl"]
    assert verl.status == "ok" and "verl 0.9.1: CUDA 13.0, torch 2.11.0" in verl.message
    none = {f.name: f for f in _variant_findings(Context(nvml={"error": "driver_not_loaded", "message": "no"}))}
    assert none["variant cu130 --runtime verl"].status == "skip"


# --- the command line ----------------------------------------------------------------------------------------

def test_overrides_are_kept_as_verl_takes_them():
    kept = runtimes.VERL.check_overrides(["a.b=1", "+new.key=x", "++c.d=[1,2]", "~trainer.val_before_train",
                                        "trainer.logger=['console']"])
    assert kept[1] == "+new.key=x" and kept[3] == "~trainer.val_before_train"
    for bad in ("trainer.total_epochs", "=1", "--foo=1"):
        with pytest.raises(ValueError, match="is not one verl takes"):
            runtimes.VERL.check_overrides([bad])


def test_gpus_and_nodes_become_verl_s_world_keys():
    assert verl_world([], parse_gpus("2"), 3) == (parse_gpus("2"), 3)
    assert verl_world(["trainer.n_gpus_per_node=4", "trainer.nnodes=2"], None, None) == (parse_gpus("4"), 2)
    with pytest.raises(ValueError, match="trainer.n_gpus_per_node=4 but --gpus 2"):
        verl_world(["trainer.n_gpus_per_node=4"], parse_gpus("2"), None)
    with pytest.raises(ValueError, match="pass --gpus N"):
        verl_world([], None, None)
    with pytest.raises(ValueError, match="--gpus all is not a count"):
        verl_world([], parse_gpus("all"), None)
    args = verl_command.trainer_args(["trainer.logger=['console']"], 2, 3, "/workspace/runs/r")
    assert args[:3] == ["trainer.n_gpus_per_node=2", "trainer.nnodes=3",
                        "trainer.default_local_dir=/workspace/runs/r/checkpoints"]
    assert args[-1] == "trainer.logger=['console']" and not any(a.startswith("trainer.logger=[\"") for a in args)


def test_docker_dry_run_starts_main_ppo_in_the_run_directory_without_secret_values(tmp_path):
    (tmp_path / "hf").mkdir()  # --hf-cache names an existing cache
    result = run("--runtime", "verl", "--gpus", "2", "--variant", "cu130", "--dry-run", "--runs-dir", str(tmp_path),
                 "--run-id", "grpo", "--hf-cache", str(tmp_path / "hf"), "--", *EXAMPLE, env={"HF_TOKEN": SECRET})
    assert result.exit_code == 0, result.output
    line = result.stdout.strip().splitlines()[-1]
    assert SECRET not in result.output
    assert f" {IMAGE} python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=2 trainer.nnodes=1 " in line
    assert line.endswith(" ".join(EXAMPLE))
    assert "--workdir /workspace/runs/grpo" in line and "--gpus 2" in line and "--read-only" in line
    assert "-e VERL_FILE_LOGGER_PATH=/workspace/runs/grpo/metrics.jsonl" in line
    assert ":/run/secrets:ro" in line and "/etc/verl-deploy" not in line  # secrets as files; no config file
    assert "--user" in line and "--cap-drop ALL" in line and "no-new-privileges" in line
    assert result.stderr.startswith(f"note: {IMAGE} is not on this host, so verl's config has not checked")


def test_docker_dry_run_of_several_nodes_starts_ray_with_the_secret_loader(tmp_path):
    result = run("--runtime", "verl", "--gpus", "8", "--nodes", "2", "--variant", "cu130", "--dry-run",
                 "--runs-dir", str(tmp_path), "--run-id", "big", "--", *EXAMPLE)
    assert result.exit_code == 0, result.output
    head = result.stdout.strip().splitlines()[-1]
    assert "python3 /opt/verl-deploy/secrets.py ray start --head" in head
    assert "python3 /opt/verl-deploy/secrets.py python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=8 trainer.nnodes=2" in head
    assert "python3 /opt/verl-deploy/secrets.py ray start --address=big:" in result.stdout


@pytest.mark.parametrize("nodes", [1, 2])
def test_k8s_dry_run_renders_a_job_or_ray_job_running_main_ppo_that_validates(tmp_path, nodes):
    result = run("--runtime", "verl", "--target", "k8s", "--gpus", "8", "--nodes", str(nodes), "--dry-run",
                 "--image", f"reg.io/team/{IMAGE}", "--run-id", "grpo", "--data", "gsm8k", "--runs-dir", str(tmp_path), "--", *EXAMPLE,
                 env={"HF_TOKEN": SECRET})
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    for obj in objects:
        validate(obj)
    assert "ConfigMap" not in [o["kind"] for o in objects]  # verl's config is its command line
    workload = objects[-1]
    if nodes == 1:
        assert workload["kind"] == "Job"
        pods = [workload["spec"]["template"]["spec"]]
        main = pods[0]["containers"][0]
        assert main["args"][:5] == ["python3", "-m", "verl.trainer.main_ppo", "trainer.n_gpus_per_node=8",
                                    "trainer.nnodes=1"]
        assert main["args"][-len(EXAMPLE):] == EXAMPLE and main["workingDir"] == "/workspace/runs/grpo"
    else:
        assert workload["kind"] == "RayJob"
        entry = workload["spec"]["entrypoint"]
        assert entry.startswith("python3 /opt/verl-deploy/secrets.py python3 -m verl.trainer.main_ppo "
                                "trainer.n_gpus_per_node=8 trainer.nnodes=2 ")
        cluster = workload["spec"]["rayClusterSpec"]
        pods = [cluster["headGroupSpec"]["template"]["spec"], cluster["workerGroupSpecs"][0]["template"]["spec"]]
        assert cluster["workerGroupSpecs"][0]["replicas"] == 1
    for pod in pods:
        assert_hardened_pod(pod)
        assert "initContainers" not in pod  # no `fetch` in verl's image: verl downloads the model itself
        main = pod["containers"][0]
        assert main["image"] == f"reg.io/team/{IMAGE}" and main["resources"]["limits"]["nvidia.com/gpu"] == "8"
        env = {e["name"]: e["value"] for e in main["env"]}
        assert env["HF_TOKEN_PATH"] == "/run/secrets/HF_TOKEN" and env["HF_HOME"] == "/cache/huggingface"
        assert {"name": "data", "mountPath": "/data", "readOnly": True} in main["volumeMounts"]
        [preferred] = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        driver = preferred["preference"]["matchExpressions"][0]
        assert driver == {"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": ["579"]}
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["nodeAffinity"]


@pytest.mark.parametrize("args, message", [
    (["examples/quickstart.yaml", "--gpus", "1"], "--runtime verl takes no CONFIG file"),
    (["--", "trainer.total_epochs=1"], "upstream verl trains on GPUs and needs their count per node: pass --gpus N"),
    (["--gpus", "1", "--", "a=1", "trainer.total_epochs"], "override 'trainer.total_epochs' is not one verl takes"),
    (["--gpus", "1", "--variant", "cpu", "--", "a=1"], "--variant: unknown variant 'cpu' of runtime verl"),
])
def test_mistakes_are_one_line_and_start_nothing(tmp_path, args, message):
    result = run("--runtime", "verl", "--runs-dir", str(tmp_path), *args)
    assert result.exit_code == 2, result.output
    assert result.output.strip().startswith(f"error: {message}") and len(result.output.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_an_unknown_runtime_is_one_line(tmp_path):
    result = run("--runtime", "trl", "--runs-dir", str(tmp_path), "--", "a=1")
    assert result.exit_code == 2 and result.output.strip() == (
        "error: unknown runtime 'trl': choose one of verl-deploy, verl")


def test_hydra_s_errors_become_one_line_with_its_hint():
    """Hydra's own messages, as main_ppo --cfg job prints them in verl's image (recorded there)."""
    recorded = (FIXTURES / "verl" / "hydra-errors.txt").read_text().split("\n---\n")
    lines = [upstream.composition_error(text) for text in recorded]
    assert lines[0] == ("Could not override 'trainer.totl_epochs'. Key 'totl_epochs' is not in struct "
                        "(to append to your config use +trainer.totl_epochs=1)")
    assert lines[2] == "Could not delete from config. 'trainer.no_such_key' does not exist."
    assert lines[3].startswith("no viable alternative at input '[grpo' (see https://hydra.cc/")
    for line in lines:
        assert "\n" not in line and "HYDRA_FULL_ERROR" not in line and "WARNING" not in line


def test_resume_starts_the_recorded_verl_run_again_with_what_changed(tmp_path):
    first = run("--runtime", "verl", "--gpus", "2", "--variant", "cu130", "--dry-run", "--runs-dir", str(tmp_path),
                "--run-id", "grpo", "--", *EXAMPLE, "~trainer.val_before_train")
    assert first.exit_code == 0, first.output
    from verl_deploy.launchers.jobspec import build_spec
    from verl_deploy.runs import write_record

    spec = build_spec(None, image=IMAGE, runs_root=tmp_path, run_id="grpo", gpus=parse_gpus("2"), runtime="verl",
                      overrides=(*EXAMPLE, "~trainer.val_before_train"), environ={})
    write_record(spec.run_dir, spec.launch("docker").to_json())
    again = run("--resume", "grpo", "--dry-run", "--runs-dir", str(tmp_path), "--", "trainer.total_epochs=3")
    assert again.exit_code == 0, again.output
    assert "resume grpo: trainer.total_epochs: 1 -> 3" in again.stderr
    line = again.stdout.strip().splitlines()[-1]
    assert "python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=2 " in line
    assert "~trainer.val_before_train" in line and line.endswith("trainer.total_epochs=3")


def test_a_resumed_verl_run_keeps_dropped_keys():
    merged, changes = resume_overrides(["~trainer.val_before_train", "a=1"], ["a=2"])
    assert merged == ["~trainer.val_before_train", "a=2"] and changes == ["a: 1 -> 2"]


def test_verl_s_file_logger_lines_read_as_our_metrics_lines():
    assert flat_metrics({"step": 3, "data": {"critic/score/mean": 0.5}}) == {"step": 3, "critic/score/mean": 0.5}
    ours = {"step": 3, "critic/score/mean": 0.5}
    assert flat_metrics(ours) == ours


def test_the_docs_put_the_two_runtimes_side_by_side():
    text = (REPO / "docs" / "verl-runtime.md").read_text()
    assert "--runtime verl" in text and "| " in text
    readme = (REPO / "README.md").read_text()
    assert "docs/verl-runtime.md" in readme
