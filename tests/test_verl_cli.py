"""verl's command line runs here: `python -m verl_runtime.main_ppo KEY=VALUE ...` and `verl-deploy run -- KEY=VALUE`,
and every key of verl 0.9.1's config tree maps to ours, is accepted with a warning, or is refused in one line
(verl_runtime/verl_keys.py, the one table that config loading and docs/verl.md read)."""

import json
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from conftest import FIXTURES, REPO
from verl_deploy import runs
from verl_deploy.cli import app
from verl_deploy.launchers.jobspec import NO_CONFIG, build_spec
from verl_runtime import verl_keys
from verl_runtime.__main__ import main as runtime_main
from verl_runtime.config import ALIASES, all_keys, load_config
from verl_runtime.errors import ConfigError
from verl_runtime.main_ppo import main as main_ppo
from verl_wheel import WheelUnavailable, download_wheel, unavailable, wheel_cache

# verl's documented GSM8K PPO quickstart (docs/start/quickstart.rst), its keys as written; only the paths and the
# sizes differ (a tiny model on the CPU: 2 prompts, 8 tokens, one step). {data} and {model} are filled in below.
VERL_QUICKSTART = [
    "data.train_files={data}/train.parquet",
    "data.val_files={data}/test.parquet",
    "data.train_batch_size=2",
    "data.max_prompt_length=512",
    "data.max_response_length=8",
    "actor_rollout_ref.model.path={model}",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    "critic.optim.lr=1e-5",
    "critic.model.path={model}",
    "critic.ppo_micro_batch_size_per_gpu=1",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.logger=['console']",
    "trainer.val_before_train=False",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.save_freq=10",
    "trainer.test_freq=10",
    "trainer.total_epochs=15",
]


def quickstart(data="/data/gsm8k", model="builtin:tiny"):
    return [item.format(data=data, model=model) for item in VERL_QUICKSTART]


@pytest.fixture(scope="module")
def gsm8k_dir(tmp_path_factory):
    """verl-layout parquet made by `python -m verl_runtime prepare gsm8k` from the GSM8K sample."""
    out = tmp_path_factory.mktemp("gsm8k")
    assert runtime_main(["prepare", "gsm8k", "--input", str(FIXTURES / "data" / "gsm8k_sample.jsonl"),
                         "--output", str(out)]) == 0
    shutil.copy(out / "train.parquet", out / "test.parquet")  # the sample has no test split
    return out


# --- the key table ------------------------------------------------------------------------------------------------


def test_every_verl_key_is_ours_or_has_a_rule():
    ours = set(all_keys()) | set(ALIASES)
    unclassified = [key for key in sorted(verl_keys.verl_keys()) if key not in ours and verl_keys.rule_for(key) is None]
    assert len(verl_keys.verl_keys()) > 800 and not unclassified, unclassified


def test_every_rule_is_for_some_verl_key():
    keys = verl_keys.verl_keys() | set(verl_keys.ADDED_KEYS)
    dead = [rule.pattern for rule in verl_keys.RULES if not any(rule.matches(key) for key in keys)]
    assert not dead, dead


def test_every_mapping_reaches_one_of_our_keys():
    ours = set(all_keys()) | set(ALIASES)
    for rule in verl_keys.RULES:
        if rule.kind == verl_keys.MAPS:
            assert rule.target in ours, rule


@pytest.fixture(scope="session")
def verl_wheel(request, tmp_path_factory):
    """verl 0.9.1's wheel (tests/verl_wheel.py: downloaded once, sha256 checked)."""
    try:
        return download_wheel(wheel_cache(request, tmp_path_factory))
    except WheelUnavailable as error:
        unavailable(error)


def test_the_committed_key_list_is_the_wheels(verl_wheel):
    assert sorted(verl_keys.extract_keys(verl_wheel)) == sorted(verl_keys.verl_keys())


def test_the_docs_table_is_the_code_table():
    docs = (REPO / "docs" / "verl.md").read_text()
    table = re.search(r"<!-- verl-keys table -->\n(.*?)\n<!-- end -->", docs, re.S)
    assert table, "docs/verl.md has no <!-- verl-keys table --> ... <!-- end --> block"
    assert table.group(1).strip() == verl_keys.table_markdown(), \
        "docs/verl.md's key table differs from verl_runtime/verl_keys.py: regenerate it with verl_keys.table_markdown()"


# --- config loading: verl's keys and value syntax -----------------------------------------------------------------


def test_the_quickstart_keys_land_on_ours(capsys):
    config = load_config(None, quickstart())
    assert config.data.batch_size == 2 and config.data.train_files == ["/data/gsm8k/train.parquet"]
    assert config.model.path == "builtin:tiny" and config.critic.model_path == "builtin:tiny"
    assert config.actor.lr == 1e-6 and config.critic.lr == 1e-5 and config.actor.ppo_mini_batch_size == 2
    assert config.rollout.name == "hf" and config.rollout.gpu_memory_utilization == 0.4
    assert config.algorithm.kl_ctrl.kl_coef == 0.001 and config.trainer.num_epochs == 15
    assert config.trainer.val_before_train is False and config.trainer.tensorboard is False
    assert config.trainer.n_workers == 1  # trainer.n_gpus_per_node x trainer.nnodes
    assert capsys.readouterr().err == ""  # every quickstart key means something here: no warnings


def test_verl_value_syntax():
    config = load_config(None, [
        "data.train_files=[a.parquet,'b c.parquet']", "trainer.val_before_train=True", "+trainer.seed=7",
        "trainer.experiment_name='my run'", "critic.model.path=null", "actor.clip_ratio_high=0.28",
        "~actor.clip_ratio_high", "trainer.logger=[console,tensorboard]",
    ])
    assert config.data.train_files == ["a.parquet", "b c.parquet"] and config.trainer.val_before_train is True
    assert config.trainer.seed == 7 and config.trainer.experiment_name == "my run"
    assert config.critic.model_path is None and config.actor.clip_ratio_high is None  # ~key: back to the default
    assert config.trainer.tensorboard is True


def test_val_before_train_defaults_to_true_as_in_verl():
    assert load_config().trainer.val_before_train is True
    assert load_config(REPO / "examples" / "quickstart.yaml").trainer.val_before_train is False  # minutes to training


def test_keys_without_effect_warn_in_one_line(capsys):
    config = load_config(None, [
        "actor_rollout_ref.model.use_fused_kernels=True", "actor_rollout_ref.actor.fsdp_config.forward_prefetch=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True", "trainer.project_name=verl_examples",
        "trainer.logger=['console','wandb']",
    ])
    assert config.model.gradient_checkpointing is True
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("warning: ") for line in lines), lines
    assert "actor_rollout_ref.model.use_fused_kernels has no effect here: engine plumbing" in lines[0]
    assert "fsdp_config.forward_prefetch has no effect here" in lines[1]
    assert config.trainer.project_name == "verl_examples" and config.trainer.trackers == ["wandb"]  # test_trackers.py


@pytest.mark.parametrize("override, message", [
    ("trainer.critic_warmup=5", "trainer.critic_warmup=5 on the command line is refused: the actor is updated from the first step here (accepted: 0)"),
    ("actor_rollout_ref.actor.optim.optimizer=SGD", "the optimizer is AdamW here"),
    ("trainer.resume_mode=resume_path", "resuming from a given checkpoint is not here"),
    ("critic.model.lora_rank=8", "LoRA on the critic is not here"),
    ("algorithm.use_pf_ppo=true", "PF-PPO"),
])
def test_keys_that_would_change_results_are_refused_in_one_line(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_refused_keys_at_our_values_pass_silently(capsys):
    load_config(None, ["trainer.critic_warmup=0", "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
                       "actor_rollout_ref.actor.optim.betas=[0.9,0.999]"])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("override, hint", [
    ("trainer.total_steps=10", "did you mean 'trainer.total_training_steps'?"),
    ("actor_rollout_ref.actor.optim.weight_decy=0.1", "did you mean 'actor_rollout_ref.actor.optim.weight_decay'?"),
    ("trainer.n_gpu_per_node=2", "did you mean 'trainer.n_gpus_per_node'?"),
])
def test_unknown_keys_point_at_the_key_meant(override, hint):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert "unknown config key" in str(info.value) and hint in str(info.value)


def test_verl_reward_and_data_keys_have_their_verl_meaning():
    config = load_config(None, ["custom_reward_function.path=/rewards/mine.py", "custom_reward_function.name=score",
                                "data.filter_overlong_prompts=True", "reward_model.model.path=/rm"])
    assert config.reward.function == "/rewards/mine.py:score" and config.data.filter_overlong_prompts
    assert config.data.truncation == "error"  # a setting of its own, as in verl (tests/test_verl_defaults.py)
    assert config.reward.model_path == "/rm"
    assert load_config(None, ["reward_model.model.path=/rm", "reward_model.enable=False"]).reward.model_path is None
    assert load_config(None, ["reward.custom_reward_function.path=r.py"]).reward.function == "r.py"
    assert load_config(None, ["trainer.resume_mode=disable"]).trainer.resume == "disable"


def test_world_size_is_gpus_per_node_times_nodes():
    assert load_config(None, ["trainer.n_gpus_per_node=2", "trainer.nnodes=2", "data.batch_size=8"]).trainer.n_workers == 4
    with pytest.raises(ConfigError, match=r"trainer.n_workers=2 but trainer.n_gpus_per_node x trainer.nnodes = 2 x 2 = 4"):
        load_config(None, ["trainer.n_gpus_per_node=2", "trainer.nnodes=2", "trainer.n_workers=2"])
    with pytest.raises(ConfigError, match="trainer.nnodes needs trainer.n_gpus_per_node"):
        load_config(None, ["trainer.nnodes=2"])


# --- python -m verl_runtime.main_ppo -------------------------------------------------------------------------------


def test_the_verl_quickstart_command_line_trains_here(tmp_path, tiny_model_dir, gsm8k_dir, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # verl's runs land in the working directory: runs/<experiment_name>
    code = main_ppo([*quickstart(gsm8k_dir, tiny_model_dir), "trainer.total_training_steps=1", "trainer.device=cpu"])
    assert code == 0, capsys.readouterr().err
    run = tmp_path / "runs" / "default"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and "critic/vf_loss" in metrics[0]  # PPO, with its critic
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["actor"]["lr"] == 1e-6 and saved["critic"]["lr"] == 1e-5 and saved["trainer"]["n_workers"] == 1


def test_main_ppo_takes_one_of_our_yaml_files(tmp_path, capsys):
    (tmp_path / "mine.yaml").write_text("data: {batch_size: 4}\n")
    code = main_ppo(["--config-path", str(tmp_path), "--config-name", "mine", "trainer.total_steps=1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err and "trainer.total_training_steps" in err
    assert main_ppo(["--config-name=missing", f"trainer.run_dir={tmp_path}"]) == 2
    assert "config file missing.yaml not found" in capsys.readouterr().err


def test_main_ppo_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "verl_runtime.main_ppo", "trainer.critic_warmup=3"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: trainer.critic_warmup=3"), done.stderr


# --- verl-deploy run [CONFIG] -- KEY=VALUE -------------------------------------------------------------------------


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def overrides_of(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]


def test_docker_dry_run_passes_verl_overrides_without_a_config(tmp_path):
    result = invoke("run", "--target", "docker", "--dry-run", "--image", "i", "--run-id", "v", "--runs-dir", tmp_path,
                    "--", *quickstart(), "+trainer.seed=3")
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.stdout.strip().splitlines()[-1])
    sets = overrides_of(argv)
    assert "actor_rollout_ref.actor.optim.lr=1e-6" in sets and "trainer.total_epochs=15" in sets
    assert "trainer.seed=3" in sets  # Hydra's +key=value is key=value here
    assert sets.index("trainer.n_workers=1") < sets.index("trainer.n_gpus_per_node=1")
    assert argv[argv.index("--gpus") + 1] == "1"  # derived from trainer.n_gpus_per_node x trainer.nnodes
    assert f"{NO_CONFIG}:/etc/verl-deploy/config.yaml:ro" in argv


def test_k8s_dry_run_passes_the_same_overrides(tmp_path):
    result = invoke("run", REPO / "examples" / "gsm8k-ppo.yaml", "--target", "k8s", "--dry-run", "--image", "reg.io/i",
                    "--run-id", "v", "--runs-dir", tmp_path, "--set", "trainer.save_freq=5",
                    "--", "trainer.total_epochs=2", "actor_rollout_ref.actor.optim.lr=2e-6")
    assert result.exit_code == 0, result.output
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    job = next(o for o in objects if o["kind"] == "Job")
    container = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "trainer")
    sets = overrides_of(container["args"])
    assert sets[-3:] == ["trainer.save_freq=5", "trainer.total_epochs=2", "actor_rollout_ref.actor.optim.lr=2e-6"]


@pytest.mark.parametrize("args, message", [
    (["--gpus", "2", "--", "trainer.n_gpus_per_node=1"], "trainer.n_gpus_per_node=1 but --gpus 2 gives 2 per node"),
    (["--nodes", "2", "--", "trainer.n_gpus_per_node=1", "trainer.nnodes=1"], "trainer.nnodes=1 but --nodes 2"),
    (["--", "trainer.critic_warmup=1"], "trainer.critic_warmup=1 on the command line is refused"),
    (["--", "~trainer.seed"], "dropping a key, ~key, is for python -m verl_runtime.main_ppo"),
])
def test_run_refuses_disagreeing_input_in_one_line(tmp_path, args, message):
    result = invoke("run", "--target", "k8s", "--dry-run", "--image", "reg.io/i", "--runs-dir", tmp_path, *args)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output


def test_run_derives_nodes_and_gpus_from_verl_keys(tmp_path):
    result = invoke("run", "--target", "k8s", "--dry-run", "--image", "reg.io/i", "--run-id", "v", "--runs-dir", tmp_path,
                    "--", "trainer.n_gpus_per_node=2", "trainer.nnodes=2", "data.train_batch_size=8",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=8")  # verl's default mini-batch is 256 prompts
    assert result.exit_code == 0, result.output
    kinds = [o["kind"] for o in yaml.safe_load_all(result.stdout) if o]
    assert "RayJob" in kinds and "trainer.n_workers=4" in result.stdout


def test_verl_overrides_are_recorded_for_resume(tmp_path):
    spec = build_spec(None, image="i", runs_root=tmp_path, run_id="v", overrides=("trainer.total_epochs=2", "+trainer.seed=3"))
    runs.write_record(spec.run_dir, spec.launch("docker").to_json())
    again = runs.plan_resume(tmp_path, "v", config=None, target=None, overrides=["trainer.total_epochs=4"], gpus=None,
                             nodes=None, image=None)
    assert again.config == NO_CONFIG and again.overrides == ["trainer.seed=3", "trainer.total_epochs=4"]
    assert again.changes == ["trainer.total_epochs: 2 -> 4"]


def test_verls_null_val_batch_size_is_one_validation_batch(tmp_path):
    from verl_runtime.config import load_config
    from verl_runtime.metrics import read_metrics
    from verl_runtime.trainer import SingleControllerTrainer

    config = load_config(None, ["data.val_batch_size=null", "model.path=builtin:tiny", "trainer.device=cpu",
                                f"trainer.run_dir={tmp_path}", "data.toy_size=16", "data.batch_size=4",
                                "data.max_response_length=4", "data.val_files=[toy:letter]",
                                "trainer.total_training_steps=1", "trainer.save_freq=-1"])
    assert config.data.val_batch_size is None
    SingleControllerTrainer(config).fit()
    assert "val-core/toy/letter/reward/mean@1" in read_metrics(tmp_path)[0]
