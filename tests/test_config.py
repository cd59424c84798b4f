"""The typed config: algorithm defaults, the tutorial's keys, YAML, --set overrides and one-line errors."""

import subprocess
import sys

import pytest

from conftest import REPO
from verl_runtime.config import get_default_config, load_config, to_yaml
from verl_runtime.errors import ConfigError


def test_defaults_per_algorithm():
    assert get_default_config("ppo").algorithm.adv_estimator == "gae"
    grpo = get_default_config("grpo")
    assert grpo.algorithm.adv_estimator == "grpo" and grpo.rollout.n > 1 and grpo.actor.use_kl_loss
    assert get_default_config("rloo").algorithm.adv_estimator == "rloo"
    assert get_default_config("reinforce_plus_plus").algorithm.adv_estimator == "reinforce_plus_plus"
    with pytest.raises(ConfigError, match="did you mean 'grpo'"):
        get_default_config("gpro")


def test_tutorial_keys_are_real_keys():
    config = get_default_config(algo="ppo")
    config.data.batch_size = 8
    config.train.num_epochs = 1
    config.model.pretrained_model_name_or_path = "/models/opt"
    assert config.trainer.num_epochs == 1  # train is the trainer section
    assert config.model.path == "/models/opt"  # model.path is the same stored value
    assert "pretrained_model_name_or_path: /models/opt" in to_yaml(config)


def test_every_import_path_gives_the_same_function():
    import verl_runtime
    from verl_runtime.config import get_default_config as from_config
    from verl_runtime.utils.config import get_default_config as from_utils

    assert verl_runtime.get_default_config is from_config is from_utils
    assert verl_runtime.__version__


def test_importing_the_package_does_not_import_torch():
    code = "import sys, verl_runtime, verl_runtime.config; verl_runtime.get_default_config(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "algorithm: {adv_estimator: grpo}\n"
        "data: {batch_size: 16, train_files: a.parquet}\n"
        "model: {path: /models/tiny}\n"
        "actor: {lr: 1e-5}\n"  # YAML reads this as a string; the float field takes it
        "train: {num_epochs: 3}\n"
    )
    config = load_config(path, ["actor.lr=2e-6", "rollout.n=8", "trainer.tensorboard=true", "actor.clip_ratio_high=null"])
    assert config.algorithm.adv_estimator == "grpo" and config.actor.use_kl_loss  # the grpo preset applied
    assert config.data.batch_size == 16 and config.data.train_files == ["a.parquet"]
    assert config.model.pretrained_model_name_or_path == "/models/tiny"
    assert config.actor.lr == 2e-6 and config.rollout.n == 8 and config.trainer.tensorboard is True
    assert config.trainer.num_epochs == 3 and config.actor.clip_ratio_high is None


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.batchsize=4", "unknown config key 'data.batchsize' on the command line; did you mean 'data.batch_size'?"),
        ("actr.lr=1", "did you mean 'actor.lr'?"),
        ("data.batch_size=many", "data.batch_size: expected an integer, got 'many'"),
        ("algorithm.adv_estimator=gpro", "did you mean 'grpo'?"),
        ("novalue", "override 'novalue' needs the form key=value"),
    ],
)
def test_bad_overrides_are_one_line(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("trainer:\n  save_frequency: 5\n")
    with pytest.raises(ConfigError, match=r"'trainer.save_frequency' in .*bad.yaml; did you mean 'trainer.save_freq'"):
        load_config(path)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.batch_size=2", "actor.ppo_mini_batch_size=4"],
         "data.batch_size (2) must be >= actor.ppo_mini_batch_size (4), as in verl"),
        (["data.batch_size=3", "rollout.n=1", "trainer.n_workers=2"],
         "data.batch_size * rollout.n (3 * 1 = 3 samples) must be divisible by trainer.n_workers (2), as in verl"),
        (["data.batch_size=0"], "data.batch_size=0 on the command line is out of range: it must be >= 1"),
    ],
)
def test_sizes_that_do_not_divide_are_named(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert message in str(info.value)


@pytest.mark.parametrize("overrides", [["algorithm.adv_estimator=rloo", "rollout.n=1"],
                                       ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"]])
def test_one_sample_per_prompt_under_a_group_estimator_runs_as_in_verl_and_says_so(overrides, capsys):
    config = load_config(None, overrides)  # verl runs it: a group of one has no baseline
    assert config.rollout.n == 1
    err = capsys.readouterr().err
    assert "each advantage is the sample's own score" in err and "set rollout.n to 2 or more" in err


def test_broken_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("data:\n  batch_size: 8\n  train_files: [a\n")
    with pytest.raises(ConfigError, match=r"broken.yaml line \d+: not valid YAML"):
        load_config(path)


def test_the_resolved_config_reads_back_the_same(tmp_path):
    config = load_config(REPO / "examples" / "gsm8k-ppo.yaml", ["trainer.run_dir=/runs/x"])
    written = tmp_path / "config.yaml"
    written.write_text(to_yaml(config))
    assert load_config(written) == config


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "examples").glob("*.yaml")))
def test_the_examples_are_valid(name):
    load_config(REPO / "examples" / name)
