"""`--verl-source`: a fork of verl 0.9.1 (made here from its PyPI wheel, with a config key and a reward manager of its
own, committed in a git repository) resolved, pinned, built into an image through the real Docker engine, its
command line composed by the fork's own Hydra files in that image, its reward manager run there; a source edit
rebuilt over the cached dependency layers; k8s and Slurm dry runs naming the fork's image; a fork whose pins no
catalogued variant runs refused in one line before building.

No training step: verl 0.9.1's rollout is server-only (vLLM, SGLang or TensorRT-LLM; docs/verl.md says why a CPU
step cannot run), so the image check is the fork's config and reward manager, as the issue's fallback asks.
"""

import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from verl_deploy import verl_source
from verl_deploy.cli import app
from verl_deploy.verl_source import SourceError

from conftest import FIXTURES
from verl_wheel import WheelUnavailable, download_wheel, unavailable, wheel_cache

FORK_KEY = "length_penalty.coef=0.05"
# The fork's reward manager: registered under its own name, scoring with a length penalty read from its own key.
REWARD_MANAGER = '''
import torch

from verl.workers.reward_manager import register
from verl.workers.reward_manager.abstract import AbstractRewardManager


@register("length_penalty")
class LengthPenaltyRewardManager(AbstractRewardManager):
    """Score 1 for a response that contains the ground truth, minus coef per response token."""

    def __init__(self, tokenizer, num_examine=0, compute_score=None, reward_fn_key="data_source", coef=0.01, **kwargs):
        self.tokenizer, self.coef = tokenizer, coef

    def __call__(self, data, return_dict=False):
        scores = []
        for item in data:
            mask = item.batch["attention_mask"][-item.batch["responses"].shape[-1]:]
            length = int(mask.sum())
            text = self.tokenizer.decode(item.batch["responses"][:length])
            truth = item.non_tensor_batch["reward_model"]["ground_truth"]
            scores.append(float(truth in text) - self.coef * length)
        reward = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        reward[:, 0] = torch.tensor(scores)
        return {"reward_tensor": reward} if return_dict else reward
'''
FORK_CONFIG = """
# The fork's own key (a research repository's length penalty): upstream verl has none.
length_penalty:
  coef: 0.0
  max_tokens: 1024
"""
SETUP_PY = '''from setuptools import find_packages, setup

install_requires = {install!r}
VLLM_REQUIRES = {gpu!r}
extras_require = {{"vllm": VLLM_REQUIRES, "test": ["pytest"]}}

setup(name="verl", version="0.9.1", packages=find_packages(), install_requires=install_requires,
      extras_require=extras_require)
'''


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          check=True, capture_output=True, text=True).stdout


def make_fork(wheel: Path, folder: Path, setup_install=None, setup_gpu=None) -> Path:
    """verl 0.9.1's source from its wheel, as a fork: setup.py declaring the wheel's requirements (or the ones given),
    the fork's key in ppo_trainer.yaml, its reward manager registered; committed in a fresh git repository."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(folder)
    metadata = next(folder.glob("verl-*.dist-info"))
    install, extras = verl_source.metadata_requirements((metadata / "METADATA").read_text())
    shutil.rmtree(metadata)  # a fork from verl's repository has its setup.py instead
    gpu = [r for r in extras["vllm"] if not r.startswith("verl[")]
    (folder / "setup.py").write_text(SETUP_PY.format(install=setup_install or install, gpu=setup_gpu or gpu))
    with open(folder / "verl/trainer/config/ppo_trainer.yaml", "a") as config:
        config.write(FORK_CONFIG)
    (folder / "verl/workers/reward_manager/length_penalty.py").write_text(REWARD_MANAGER)
    with open(folder / "verl/workers/reward_manager/__init__.py", "a") as init:
        init.write("\nfrom .length_penalty import LengthPenaltyRewardManager  # noqa: E402,F401 (the fork's)\n")
    (folder / "recipe" / "lp").mkdir(parents=True)
    (folder / "recipe" / "__init__.py").write_text("")
    (folder / "recipe" / "lp" / "__init__.py").write_text("")
    (folder / "recipe" / "lp" / "main_lp.py").write_text(
        "from verl.trainer.main_ppo import main\n\nif __name__ == '__main__':\n    main()\n")
    git(folder, "init", "--quiet")
    git(folder, "add", "-A")
    git(folder, "commit", "--quiet", "-m", "fork of verl 0.9.1: a length penalty")
    return folder


@pytest.fixture(scope="session")
def verl_wheel(request, tmp_path_factory) -> Path:
    try:
        return download_wheel(wheel_cache(request, tmp_path_factory))
    except WheelUnavailable as error:
        unavailable(error)


@pytest.fixture
def fork(verl_wheel, tmp_path) -> Path:
    return make_fork(verl_wheel, tmp_path / "lp-verl")


# --- fast: no Docker ------------------------------------------------------------------------------------------------

def test_a_fork_resolves_to_its_commit_its_declarations_and_upstream_verl_s_pins(fork):
    source = verl_source.resolve(str(fork))
    assert (source.kind, source.root, source.package_parent, source.version) == ("directory", fork, ".", "0.9.1")
    assert source.commit == git(fork, "rev-parse", "HEAD").strip() and not source.dirty
    assert source.declared_in == ("setup.py",)
    assert "ray[default]>=2.41.0" in source.requirements and "vllm==0.24.0" in source.gpu_requirements
    cu130 = verl_source.choose_pins(source, "cu130")
    # what verl 0.9.1 documents for its vllm extra, as the catalog's upstream verl image has it
    assert (cu130.torch, cu130.vllm, cu130.transformers, cu130.variant.cuda) == ("2.11.0", "0.24.0", "5.9.0", "13.0")
    cpu = verl_source.choose_pins(source, "cpu")
    assert (cpu.torch, cpu.vllm, cpu.transformers) == ("2.13.0", None, "5.9.0")
    assert "transformers==5.9.0" in cpu.packages and not any(p.startswith(("torch==", "vllm")) for p in cpu.packages)


def test_an_edit_makes_the_fork_dirty_and_changes_its_digest(fork):
    before = verl_source.resolve(str(fork))
    (fork / "verl/workers/reward_manager/length_penalty.py").write_text(REWARD_MANAGER + "\n# tuned\n")
    after = verl_source.resolve(str(fork))
    assert after.dirty and after.commit == before.commit
    assert after.labels()["verl-deploy.verl-source-digest"] != before.labels()["verl-deploy.verl-source-digest"]


def test_a_repository_vendoring_verl_puts_both_on_the_image_s_pythonpath(verl_wheel, tmp_path):
    repo = tmp_path / "search-r1"
    make_fork(verl_wheel, repo / "third_party" / "verl")
    (repo / "scripts").mkdir()
    (repo / "scripts" / "train.sh").write_text("python3 -m verl.trainer.main_ppo\n")
    source = verl_source.resolve(str(repo))
    assert source.package_parent == "third_party/verl" and source.declared_in == ("third_party/verl/setup.py",)
    assert source.pythonpath == "/opt/verl-source:/opt/verl-source/third_party/verl"


def test_a_git_reference_is_cloned_at_its_revision(fork, tmp_path):
    first = git(fork, "rev-parse", "HEAD").strip()
    (fork / "README.md").write_text("later\n")
    git(fork, "add", "README.md")
    git(fork, "commit", "--quiet", "-m", "later")
    source = verl_source.resolve(f"git+file://{fork}@{first}", cache=tmp_path / "cache")
    assert (source.kind, source.commit, source.dirty, source.version) == ("git", first, False, "0.9.1")
    assert source.location == f"file://{fork}@{first}" and not (source.root / "README.md").exists()
    assert source.slug == "lp-verl"


def test_a_pip_requirement_is_fetched_with_this_host_s_pip_and_read_from_its_metadata(verl_wheel, tmp_path):
    source = verl_source.resolve(f"verl @ file://{verl_wheel}", cache=tmp_path / "cache")
    assert (source.kind, source.version, source.commit) == ("pip", "0.9.1", None)
    assert source.declared_in == ("verl-0.9.1.dist-info/METADATA",)
    assert "tensordict!=0.9.0,<=0.10.0,>=0.8.0" in source.requirements and "vllm==0.24.0" in source.gpu_requirements
    assert verl_source.choose_pins(source, "cu130").vllm == "0.24.0"


def test_status_says_which_verl_source_a_run_trains(fork, tmp_path):
    """What launch.json keeps of a --verl-source run (JobSpec.record) is what `status` shows."""
    from verl_deploy.launchers.jobspec import JobSpec

    source = verl_source.resolve(str(fork))
    labels = {key.removeprefix("verl-deploy."): value for key, value in source.labels().items()}
    spec = JobSpec(run_id="lp", image="verl-deploy:verl-src-lp-verl-cpu", config_path=None, config_text="",
                   runtime="verl", verl_source=labels, trainer=("python3", "-m", "recipe.lp.main_lp"))
    run_dir = tmp_path / "lp"
    run_dir.mkdir()
    (run_dir / "launch.json").write_text(json.dumps(spec.launch("local").to_json()))
    result = CliRunner().invoke(app, ["status", "lp", "--runs-dir", str(tmp_path)])
    assert f"verl source: {fork} @ {source.commit[:12]}" in result.output, result.output
    assert spec.launch("local").trainer == ("python3", "-m", "recipe.lp.main_lp")


def test_setup_py_is_read_without_running_it(tmp_path):
    text = ('import os\nos.system("touch pwned")\nBASE = ["numpy"]\n'
            'setup(install_requires=BASE + ["torch==2.8.0"], extras_require={"vllm": ["vllm==0.10.1"]})\n')
    install, extras = verl_source.setup_py_requirements(text)
    assert install == ["numpy", "torch==2.8.0"] and extras == {"vllm": ["vllm==0.10.1"]}
    assert not (tmp_path / "pwned").exists()


def test_a_fork_whose_pins_no_variant_runs_is_refused_in_one_line_before_building(verl_wheel, tmp_path):
    """An old fork (verl 0.2's era): torch 2.4.0, whose PyPI build is CUDA 12.1, and vLLM in its install_requires."""
    old = make_fork(verl_wheel, tmp_path / "old-fork", setup_install=["torch==2.4.0", "vllm<=0.6.3", "ray"],
                    setup_gpu=["vllm<=0.6.3"])
    with pytest.raises(SourceError) as refused:
        verl_source.choose_pins(verl_source.resolve(str(old)))
    assert "cu130: torch==2.4.0 has no build for CUDA 13.0 (its PyPI builds are for CUDA 12.1)" in str(refused.value)
    assert "cpu: it requires vLLM or SGLang" in str(refused.value)
    # through the CLI: one line, exit 2, and no engine was asked (there is none at this address)
    result = CliRunner().invoke(app, ["images", "build", "--runtime", "verl", "--verl-source", str(old)],
                                env={"DOCKER_HOST": "tcp://127.0.0.1:9"})
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: verl source ") and "cannot run on any catalogued variant" in lines[0]
    assert "Traceback" not in result.output


def test_a_pin_pypi_does_not_have_is_refused(verl_wheel, tmp_path):
    fork = make_fork(verl_wheel, tmp_path / "typo-fork", setup_install=["torch==2.6.1", "ray"], setup_gpu=["ray"])
    with pytest.raises(SourceError, match=r"torch==2.6.1 is no torch release on PyPI"):
        verl_source.choose_pins(verl_source.resolve(str(fork)), "cu128")


def test_not_a_verl_source_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["images", "build", "--runtime", "verl", "--verl-source", str(tmp_path)])
    assert result.exit_code == 2 and "no verl package in it" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_plan_reads_the_fork_s_own_defaults_where_they_differ_from_verl_s(verl_wheel, tmp_path):
    """A fork whose ppo_trainer.yaml makes GRPO the default estimator: planned without a critic, unless the command
    line says otherwise; a fork with verl's defaults plans as upstream verl does."""
    from conftest import FIXTURES
    from verl_deploy.plan.workload import VERL_DEFAULTS

    same = make_fork(verl_wheel, tmp_path / "same")
    grpo = make_fork(verl_wheel, tmp_path / "grpo")
    config = grpo / "verl/trainer/config/ppo_trainer.yaml"
    config.write_text(config.read_text().replace("\n  adv_estimator: gae\n", "\n  adv_estimator: grpo\n"))
    assert verl_source.default_overrides(verl_source.resolve(str(same)), VERL_DEFAULTS) == []
    assert verl_source.default_overrides(verl_source.resolve(str(grpo)), VERL_DEFAULTS) == ["algorithm.adv_estimator=grpo"]
    line = [f"actor_rollout_ref.model.path={FIXTURES / 'models' / 'Qwen2.5-0.5B-Instruct'}",
            "actor_rollout_ref.rollout.name=vllm", "data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8"]

    def phases(fork, *extra):
        result = CliRunner().invoke(app, ["plan", "--runtime", "verl", "--verl-source", str(fork), "--gpu-type", "H100",
                                          "--gpus", "8", "--json", "--", *line, *extra])
        assert result.exit_code in (0, 1), result.output
        return {phase["name"] for phase in json.loads(result.stdout)["phases"]}

    assert any("critic" in name for name in phases(same))
    assert not any("critic" in name for name in phases(grpo))
    assert any("critic" in name for name in phases(grpo, "algorithm.adv_estimator=gae"))


# --- dry runs on the clusters: the fork's image by its tag (no engine needed) ---------------------------------------

EXAMPLE = ["algorithm.adv_estimator=grpo", "data.train_files=/data/gsm8k/train.parquet",
           "data.val_files=/data/gsm8k/test.parquet", "data.train_batch_size=16", "data.max_prompt_length=64",
           "data.max_response_length=64", "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
           "actor_rollout_ref.model.use_remove_padding=False", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.name=vllm",
           "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
           "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "reward.reward_manager.name=length_penalty",
           FORK_KEY, "trainer.total_epochs=1"]


def run_cli(*args, docker_host: str | None = "unix:///nonexistent/docker.sock"):
    return CliRunner().invoke(app, ["run", *args], env={"DOCKER_HOST": docker_host} if docker_host else {})


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_k8s_dry_run_names_the_fork_s_image_and_its_recipe_entry(fork, tmp_path, nodes):
    import yaml

    result = run_cli("--runtime", "verl", "--verl-source", str(fork), "--target", "k8s", "--gpus", "8",
                     "--nodes", str(nodes), "--entry", "-m recipe.lp.main_lp", "--image-preloaded", "--dry-run", "--runs-dir",
                     str(tmp_path / "runs"), "--run-id", "lp", "--", *EXAMPLE)
    assert result.exit_code == 0, result.output
    workload = [doc for doc in yaml.safe_load_all(result.stdout) if doc][-1]
    if nodes == 1:
        main = workload["spec"]["template"]["spec"]["containers"][0]
        assert main["image"] == "verl-deploy:verl-src-lp-verl-cu130"  # GPU nodes: the newest CUDA its pins run
        assert main["args"][:3] == ["python3", "-m", "recipe.lp.main_lp"] and FORK_KEY in main["args"]
    else:
        assert workload["kind"] == "RayJob"
        assert "python3 -m recipe.lp.main_lp trainer.n_gpus_per_node=8 trainer.nnodes=2" in workload["spec"]["entrypoint"]
        head = workload["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        assert head["image"] == "verl-deploy:verl-src-lp-verl-cu130"


def test_a_slurm_dry_run_names_the_fork_s_image_and_runs_its_own_script(fork, tmp_path):
    result = run_cli("--runtime", "verl", "--verl-source", str(fork), "--target", "slurm", "--container", "docker",
                     "--gpus", "4", "--nodes", "2", "--entry", "recipe/lp/main_lp.py",
                     "--dry-run", "--runs-dir", str(tmp_path / "runs"), "--run-id", "lp", "--", *EXAMPLE)
    assert result.exit_code == 0, result.output
    assert "verl-deploy:verl-src-lp-verl-cu130" in result.stdout
    assert "python3 /opt/verl-source/recipe/lp/main_lp.py trainer.n_gpus_per_node=4 trainer.nnodes=2" in result.stdout


def test_a_variant_the_fork_s_pins_do_not_run_on_is_refused_before_planning(fork, tmp_path):
    """verl 0.9.1's vllm extra pins torch 2.11.0, a CUDA 13.0 build: no cu128 image of it."""
    result = run_cli("--runtime", "verl", "--verl-source", str(fork), "--target", "k8s", "--gpus", "8",
                     "--variant", "cu128", "--dry-run", "--runs-dir", str(tmp_path), "--", *EXAMPLE)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "cannot run on variant cu128 (cu128: torch==2.11.0 has no build for CUDA 12.8" in result.output


def test_an_entry_script_that_is_not_in_the_source_is_one_line(fork, tmp_path):
    result = run_cli("--runtime", "verl", "--verl-source", str(fork), "--target", "k8s", "--gpus", "8",
                     "--entry", "recipe/nope/main.py", "--dry-run", "--runs-dir", str(tmp_path), "--", *EXAMPLE)
    assert result.exit_code == 2 and "no such script in the verl source" in result.output
    assert len(result.output.strip().splitlines()) == 1


# --- the host's Python: --target local, Slurm's --container none -------------------------------------------------

# The fork's own entry script (`--entry scripts/smoke_ppo.py`), standing in for its trainer, which needs a GPU: a Hydra
# app over the fork's own ppo_trainer.yaml, as verl's main_ppo is. It says where `import verl` would load verl from
# and what its config holds, and logs one step in verl's file-logger format.
SMOKE = """import importlib.util, json, os
import hydra

@hydra.main(config_path="../verl/trainer/config", config_name="ppo_trainer", version_base=None)
def main(config):
    print("verl from", importlib.util.find_spec("verl").origin)
    print("coef", config.length_penalty.coef, "checkpoints", config.trainer.default_local_dir)
    with open(os.environ["VERL_FILE_LOGGER_PATH"], "a") as log:
        log.write(json.dumps({"step": 1, "data": {"critic/score/mean": config.length_penalty.coef}}) + "\\n")

if __name__ == "__main__":
    main()
"""
LIGHT = ["torch", "pyyaml", "hydra-core"]  # a fork declaring only what this venv has


@pytest.fixture
def gpu_host(monkeypatch):
    """verl trains on GPUs only: this host replayed as an H200 box (its NVML reading, as doctor records one)."""
    monkeypatch.setenv("VERL_DEPLOY_NVML_READING", str(FIXTURES / "nvml" / "h200.json"))


@pytest.fixture
def light_fork(verl_wheel, tmp_path, monkeypatch, gpu_host) -> Path:
    """A fork whose declarations this venv meets, with its smoke script; this venv's python3 first on PATH (the smoke
    script needs no GPU)."""
    fork = make_fork(verl_wheel, tmp_path / "lp-verl", setup_install=LIGHT, setup_gpu=["pyyaml>=5"])
    (fork / "scripts").mkdir(exist_ok=True)
    (fork / "scripts" / "smoke_ppo.py").write_text(SMOKE)
    git(fork, "add", "-A")
    git(fork, "commit", "--quiet", "-m", "a smoke script")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)  # Hydra writes its outputs/ where the run starts, as verl's main_ppo does
    return fork


def test_a_local_run_trains_the_fork_in_this_host_s_python_with_its_verl_first(light_fork, tmp_path):
    runs = tmp_path / "runs"
    result = run_cli("--runtime", "verl", "--verl-source", str(light_fork), "--target", "local", "--gpus", "1",
                     "--entry", "scripts/smoke_ppo.py", "--runs-dir", str(runs), "--run-id", "lp", "--no-plan", "--",
                     FORK_KEY, "trainer.total_training_steps=1")
    assert result.exit_code == 0, result.output
    assert f"checking the overrides with verl's config in {Path(sys.executable).parent}/python3" in result.output
    assert f"verl from {light_fork}/verl/__init__.py" in result.output  # the fork's, not an installed verl
    assert f"coef 0.05 checkpoints {runs}/lp/checkpoints" in result.output  # the fork's key, composed by its config
    status = json.loads(CliRunner().invoke(app, ["status", "lp", "--runs-dir", str(runs), "--json"]).stdout)
    assert (status["target"], status["state"], status["exit_code"]) == ("local", "succeeded", 0)
    assert status["last_metrics"]["critic/score/mean"] == 0.05  # verl's file logger's line, read back
    shown = CliRunner().invoke(app, ["status", "lp", "--runs-dir", str(runs)]).output
    assert f"verl source: {light_fork} @ " in shown

    (light_fork / "scripts" / "smoke_ppo.py").write_text(SMOKE.replace('"step": 1', '"step": 2'))  # an edit
    again = run_cli("--resume", "lp", "--runs-dir", str(runs), "--no-plan")
    assert again.exit_code == 0, again.output  # the recorded source, entry and fork key; the edit runs
    assert [json.loads(line)["step"] for line in (runs / "lp" / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_key_the_fork_s_config_lacks_is_refused_by_its_own_hydra_before_anything_starts(light_fork, tmp_path):
    result = run_cli("--runtime", "verl", "--verl-source", str(light_fork), "--target", "local", "--gpus", "1",
                     "--entry", "scripts/smoke_ppo.py", "--runs-dir", str(tmp_path / "runs"), "--no-plan", "--",
                     "length_penalty.coeff=0.05")
    assert result.exit_code == 2, result.output
    [error] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "verl's config rejects the overrides: Could not override 'length_penalty.coeff'" in error
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()


def test_the_local_dry_run_shows_the_python_the_source_path_and_the_fork_s_script(light_fork, tmp_path):
    result = run_cli("--runtime", "verl", "--verl-source", str(light_fork), "--target", "local", "--gpus", "1",
                     "--entry", "scripts/smoke_ppo.py", "--runs-dir", str(tmp_path / "runs"), "--run-id", "lp",
                     "--dry-run", "--no-plan", "--", FORK_KEY)
    assert result.exit_code == 0, result.output
    line = result.stdout.strip().splitlines()[-1]
    assert f"PYTHONPATH={light_fork}" in line and f"VERL_FILE_LOGGER_PATH={tmp_path}/runs/lp/metrics.jsonl" in line
    assert "CUDA_VISIBLE_DEVICES=0" in line
    assert f"{Path(sys.executable).parent}/python3 {light_fork}/scripts/smoke_ppo.py trainer.n_gpus_per_node=1" in line
    assert line.endswith(FORK_KEY) and not (tmp_path / "runs").exists()


def test_a_python_lacking_what_the_fork_declares_is_refused_in_one_line(fork, tmp_path, monkeypatch, gpu_host):
    """verl 0.9.1's own requirements (the fork's setup.py), against this venv: codetiming and others are not here."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    result = run_cli("--runtime", "verl", "--verl-source", str(fork), "--target", "local", "--gpus", "1",
                     "--no-plan", "--runs-dir", str(tmp_path / "runs"), "--", FORK_KEY)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "lacks what your verl source declares (setup.py): " in result.output
    assert "codetiming (not installed)" in result.output and "or use --target docker" in result.output
    assert not (tmp_path / "runs").exists()


def test_a_python_without_verl_is_one_line(tmp_path, monkeypatch, gpu_host):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bare' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    runs = tmp_path / "runs"
    result = run_cli("--runtime", "verl", "--target", "local", "--gpus", "1", "--no-plan", "--runs-dir", str(runs),
                     "--", "trainer.total_epochs=1")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert f"{tmp_path}/bare/bin/python3 has no verl: install it there (pip install verl==0.9.1)" in result.output
    assert not runs.exists()


def test_a_host_without_gpus_is_told_where_verl_can_train(light_fork, tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_DEPLOY_NVML_READING", str(FIXTURES / "nvml" / "no-driver.json"))
    result = run_cli("--runtime", "verl", "--verl-source", str(light_fork), "--target", "local", "--gpus", "1",
                     "--entry", "scripts/smoke_ppo.py", "--no-plan", "--runs-dir", str(tmp_path / "runs"), "--",
                     FORK_KEY)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "this host has no NVIDIA GPU, and verl trains on GPUs only" in result.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_slurm_run_without_a_container_runs_the_fork_in_the_venv(light_fork, tmp_path, nodes):
    result = run_cli("--runtime", "verl", "--verl-source", str(light_fork), "--target", "slurm", "--gpus", "4",
                     "--nodes", str(nodes), "--entry", "scripts/smoke_ppo.py", "--dry-run", "--runs-dir",
                     str(tmp_path), "--run-id", "lp", "--no-plan", "--", FORK_KEY)
    assert result.exit_code == 0, result.output
    venv = Path(sys.executable).parent
    assert f"PYTHONPATH={light_fork}" in result.stdout
    assert f"{venv}/python3 {light_fork}/scripts/smoke_ppo.py trainer.n_gpus_per_node=4 trainer.nnodes={nodes}" \
        in result.stdout
    assert (f"{venv}/ray start --head" in result.stdout) == (nodes > 1)  # the venv's Ray, with no image's loader
    assert "/opt/verl-deploy/secrets.py" not in result.stdout


# --- the image, built for real -------------------------------------------------------------------------------------

def build_fork(fork: Path, base_image: str, wheelhouse: Path):
    """The fork's cpu image through verl_deploy.images (its default tag), and the build's console text."""
    from verl_deploy.images import plan_build
    from verl_deploy.images.build import build

    opts, notes = plan_build("cpu", base_image=base_image, wheelhouse=wheelhouse, runtime_name="verl",
                             verl_source=verl_source.resolve(str(fork)))
    console = Console(record=True, width=240, stderr=True)
    for note in notes:
        console.print(note, markup=False)
    return build(opts, console), console.export_text()


@pytest.fixture(scope="module")
def fork_image(docker_client, base_image, torch_wheelhouse, verl_wheel, tmp_path_factory):
    from conftest import remove_images_made_since

    before = {image.id for image in docker_client.images.list(all=True)}
    fork = make_fork(verl_wheel, tmp_path_factory.mktemp("fork") / "lp-verl")
    built, _ = build_fork(fork, base_image, torch_wheelhouse)
    yield fork, built.tag
    remove_images_made_since(docker_client, before, built.tag)


def in_image(client, image: str, *command: str) -> str:
    return client.containers.run(image, list(command), remove=True, network_disabled=True,
                                 environment={"HOME": "/tmp"}, working_dir="/tmp").decode()


@pytest.mark.docker
@pytest.mark.slow
def test_the_fork_s_image_carries_its_source_pins_and_the_verl_flavour_s_hardening(docker_client, fork_image):
    fork, tag = fork_image
    assert tag == "verl-deploy:verl-src-lp-verl-cpu"
    labels = docker_client.images.get(tag).labels
    assert labels["verl-deploy.verl-source"] == str(fork)
    assert labels["verl-deploy.verl-source-commit"] == git(fork, "rev-parse", "HEAD").strip()
    assert labels["verl-deploy.verl-source-dirty"] == "false"
    assert (labels["verl-deploy.torch"], labels["verl-deploy.transformers"], labels["verl-deploy.vllm"]) == ("2.13.0", "5.9.0", "")
    assert (labels["verl-deploy.runtime"], labels["verl-deploy.runtime-version"]) == ("verl", "0.9.1")
    out = in_image(docker_client, tag, "sh", "-c", "id -u; python3 -c 'import verl; print(verl.__file__)'; "
                   "find / -xdev -perm /6000 -type f 2>/dev/null | wc -l; touch /opt/verl-source/x 2>&1 || echo read-only")
    uid, where, setuid, *_, readonly = out.strip().splitlines()
    assert (uid, where, setuid, readonly) == ("1000", "/opt/verl-source/verl/__init__.py", "0", "read-only")
    listing = CliRunner().invoke(app, ["images", "list"], env={"COLUMNS": "250"})
    assert tag in listing.output and "--verl-source" in listing.output and str(fork)[:30] in listing.output


@pytest.mark.docker
@pytest.mark.slow
def test_the_fork_s_command_line_composes_by_its_own_hydra_files_in_its_image(docker_client, fork_image, tmp_path):
    """Through `run`: the fork's key and reward manager on the command line, checked in the image (main_ppo --cfg job,
    then verl's validate_config), before anything starts; and by the recipe's entry."""
    fork, tag = fork_image
    args = ["--runtime", "verl", "--verl-source", str(fork), "--gpus", "1", "--dry-run", "--runs-dir",
            str(tmp_path), "--run-id", "lp"]
    result = run_cli(*args, "--", *EXAMPLE, docker_host=None)
    assert result.exit_code == 0, result.output
    assert f"checking the overrides with verl's config in {tag}" in result.stderr
    assert f" {tag} python3 -m verl.trainer.main_ppo " in result.stdout and FORK_KEY in result.stdout
    result = run_cli(*args, "--entry", "-m recipe.lp.main_lp", "--", *EXAMPLE, docker_host=None)
    assert result.exit_code == 0, result.output
    # a key neither upstream verl nor the fork has: Hydra's one line
    result = run_cli(*args, "--", *EXAMPLE, "length_penalty.nope=1", docker_host=None)
    assert result.exit_code == 2 and "length_penalty.nope" in result.output, result.output
    composed = in_image(docker_client, tag, "python3", "-m", "verl.trainer.main_ppo", FORK_KEY, "--cfg", "job")
    assert "length_penalty:\n  coef: 0.05\n  max_tokens: 1024" in composed


@pytest.mark.docker
@pytest.mark.slow
def test_the_fork_s_reward_manager_scores_in_its_image(docker_client, fork_image):
    _, tag = fork_image
    script = """
import torch
from verl import DataProto
from verl.workers.reward_manager import get_reward_manager_cls

class Tokenizer:
    def decode(self, ids):
        return " ".join(str(int(i)) for i in ids)

cls = get_reward_manager_cls("length_penalty")
responses = torch.tensor([[7, 8, 0], [5, 0, 0]])
data = DataProto.from_dict(
    tensors={"responses": responses, "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])},
    non_tensors={"reward_model": [{"ground_truth": "8"}, {"ground_truth": "8"}]})
reward = cls(Tokenizer(), coef=0.1)(data)
print(cls.__name__, [round(float(x), 3) for x in reward[:, 0]])
"""
    out = in_image(docker_client, tag, "python3", "-c", script)
    assert out.strip().splitlines()[-1] == "LengthPenaltyRewardManager [0.8, -0.1]"


@pytest.mark.docker
@pytest.mark.slow
def test_a_source_edit_rebuilds_over_the_cached_dependency_layers(docker_client, fork_image, base_image,
                                                                  torch_wheelhouse):
    fork, tag = fork_image
    with open(fork / "verl/workers/reward_manager/length_penalty.py", "a") as f:
        f.write(f"# tuned {uuid.uuid4().hex}\n")  # unique: a daemon keeping its cache between runs would have it
    built, text = build_fork(fork, base_image, torch_wheelhouse)
    steps = [line for line in text.splitlines() if line.startswith("✓ Step")]
    step = lambda text: next(line for line in steps if text in line)  # noqa: E731
    assert step('pip install "torch==').endswith("cached")
    assert step("RUN set -f && pip install").endswith("cached")  # what the source declares
    assert step("COPY --from=deps /opt/venv /opt/venv").endswith("cached")
    assert not step("COPY source/ /opt/verl-source/").endswith("cached")
    labels = docker_client.images.get(built.tag).labels
    assert built.tag == tag and labels["verl-deploy.verl-source-dirty"] == "true"
    assert labels["verl-deploy.verl-source-digest"] == verl_source.resolve(str(fork)).digest
    print(f"\nsource-only rebuild of the fork's image: {built.seconds:.1f} s")
