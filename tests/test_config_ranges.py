"""Every numeric config key has a range, checked at load in one line (exit 2) by each entrypoint: `python -m
verl_runtime train`, verl's `python -m verl_runtime.main_ppo` (under verl's key names) and `verl-deploy run`, which
refuses before it creates anything. Data, reward and model paths are checked before the model loads, and a
refused start leaves no run directory."""

import json
import subprocess
import sys
import typing

import pytest
from typer.testing import CliRunner

from conftest import REPO
from verl_deploy.cli import app
from verl_runtime import verl_keys
from verl_runtime.__main__ import main as runtime_main
from verl_runtime.config import RANGES, Config, _field_types, all_keys, load_config
from verl_runtime.local_paths import check_local_paths
from verl_runtime.main_ppo import main as main_ppo

QUICKSTART = REPO / "examples" / "quickstart.yaml"


def out_of_range(rule) -> list:
    """Values just outside a range: below its low bound, above its high one (ints for integer keys)."""
    integer = _numeric_type(rule.key) is int
    values = []
    if rule.low is not None:
        values.append(rule.low if rule.low_open else rule.low - (1 if integer else 0.5))
    if rule.high is not None:
        values.append(rule.high + (1 if integer else 0.5) if not rule.high_open else rule.high)
    return [int(v) if integer else v for v in values]


def _numeric_type(key: str):
    """int or float for a numeric key (an optional one too), else None (a list of numbers such as actor.betas is
    checked by validate on its own)."""
    node = Config
    *sections, name = key.split(".")
    for section in sections:
        node = _field_types(node)[section]
    tp = _field_types(node)[name]
    if typing.get_origin(tp) is list:
        return None
    options = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    return next((t for t in options if t in (int, float)), None)


BAD = [(rule.key, value) for rule in RANGES for value in out_of_range(rule)]


def one_error_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in text, text
    return lines[0]


# --- the table ----------------------------------------------------------------------------------------------------


def test_every_numeric_key_has_one_range():
    numeric = {key for key in all_keys() if _numeric_type(key) is not None}
    keys = [rule.key for rule in RANGES]
    assert len(keys) == len(set(keys)), "a key with two ranges"
    assert set(keys) == numeric, {"without a range": numeric - set(keys), "not a numeric key": set(keys) - numeric}


def test_the_defaults_and_the_examples_are_in_range():
    for algo in ("ppo", "grpo", "rloo", "reinforce_plus_plus"):
        load_config(None, [f"algorithm.adv_estimator={'gae' if algo == 'ppo' else algo}"])
    for example in sorted((REPO / "examples").glob("*.yaml")):
        load_config(example)


@pytest.mark.parametrize("override", [
    "rollout.temperature=0", "rollout.top_p=1", "rollout.top_p=0.01", "rollout.top_k=-1", "rollout.top_k=0",
    "rollout.top_k=1", "algorithm.gamma=0", "algorithm.gamma=1", "algorithm.lam=0", "trainer.save_freq=-1",
    "trainer.test_freq=0", "actor.entropy_coeff=0", "actor.kl_loss_coef=0", "actor.weight_decay=0",
    "data.val_batch_size=null", "rollout.gpu_memory_utilization=1", "trainer.seed=0", "actor.clip_ratio_c=1.5",
])
def test_the_edges_of_each_range_are_accepted(override):
    load_config(QUICKSTART, [override])


# --- python -m verl_runtime train ---------------------------------------------------------------------------------


def test_a_negative_temperature_is_one_line_and_exit_2_from_the_real_entrypoint(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "verl_runtime", "train", str(QUICKSTART), "--set", "rollout.temperature=-1",
         "--set", f"trainer.run_dir={run_dir}"], capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )
    assert result.returncode == 2
    assert one_error_line(result.stderr) == ("error: rollout.temperature=-1 on the command line is out of range: it must be >= 0 "
                                             "(0 means greedy sampling)")
    assert result.stdout == "" and not run_dir.exists()


@pytest.mark.parametrize("key, value", BAD)
def test_each_out_of_range_value_is_refused_by_train(key, value, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = runtime_main(["train", str(QUICKSTART), "--set", f"{key}={value}", "--set", f"trainer.run_dir={run_dir}"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2
    assert line.startswith(f"error: {key}=") and "is out of range: it must be" in line, line
    assert not run_dir.exists()


@pytest.mark.parametrize("text", ["nan", ".inf", "-.inf"])
def test_not_a_number_is_out_of_every_range(text, capsys):
    assert runtime_main(["train", str(QUICKSTART), "--set", f"actor.lr={text}"]) == 2
    assert "actor.lr=" in one_error_line(capsys.readouterr().err)


def test_a_value_in_the_yaml_file_is_named_with_its_file(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(QUICKSTART.read_text().replace("n: 4 ", "n: 0 "))
    assert runtime_main(["train", str(config)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"error: rollout.n=0 in {config} is out of range: it must be >= 1 (samples per prompt)"


# --- verl's command line: the same ranges under verl's names ------------------------------------------------------

VERL_SPELLINGS = [
    (rule.pattern, rule.target) for rule in verl_keys.RULES
    if rule.kind == verl_keys.MAPS and "*" not in rule.pattern and rule.target in {r.key for r in RANGES}
]


def test_verl_spells_most_ranged_keys():
    assert len(VERL_SPELLINGS) >= 20 and ("actor_rollout_ref.rollout.temperature", "rollout.temperature") in VERL_SPELLINGS


@pytest.mark.parametrize("verl_key, key", VERL_SPELLINGS)
def test_main_ppo_refuses_out_of_range_values_under_verl_names(verl_key, key, tmp_path, capsys):
    [rule] = [r for r in RANGES if r.key == key]
    value = out_of_range(rule)[0]
    code = main_ppo([f"{verl_key}={value}", f"trainer.run_dir={tmp_path / 'run'}"])
    line = one_error_line(capsys.readouterr().err)
    # one line naming verl's key: the range's, or a translated key's own (a global micro-batch size over the world)
    assert code == 2 and line.startswith(f"error: {verl_key}={value} "), line
    assert not (tmp_path / "run").exists()


# --- verl-deploy run ----------------------------------------------------------------------------------------------


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("key, value", BAD)
def test_verl_deploy_run_refuses_before_it_creates_anything(key, value, tmp_path):
    result = invoke("run", QUICKSTART, "--target", "local", "--set", f"{key}={value}", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 2, result.output
    line = one_error_line(result.output)
    assert line.startswith(f"error: {key}=") and "is out of range" in line, line
    assert not (tmp_path / "runs").exists()


def test_verl_deploy_run_reads_verl_overrides_the_same_way(tmp_path):
    result = invoke("run", QUICKSTART, "--target", "local", "--runs-dir", tmp_path / "runs", "--",
                    "actor_rollout_ref.rollout.top_p=2.0")
    assert result.exit_code == 2
    assert one_error_line(result.output) == ("error: actor_rollout_ref.rollout.top_p=2 on the command line is out of range: it "
                                             "must be in (0, 1] (1 keeps every token)")
    assert not (tmp_path / "runs").exists()


# --- paths: checked before the model loads, no run directory left ---------------------------------------------------


def _row() -> str:
    return json.dumps({"data_source": "toy/letter", "prompt": [{"role": "user", "content": "a"}],
                       "reward_model": {"style": "rule", "ground_truth": "a"}}) + "\n"


@pytest.fixture
def files(tmp_path):
    (tmp_path / "train.jsonl").write_text(_row())
    (tmp_path / "rows.csv").write_text("a,b\n")
    (tmp_path / "folder.jsonl").mkdir()
    (tmp_path / "empty-model").mkdir()
    (tmp_path / "reward.py").write_text("def compute_score(*args):\n    return 0.0\n")
    return tmp_path


PATH_CASES = [
    (["data.train_files=missing.parquet"],
     "data.train_files: data file missing.parquet not found: give a .parquet or .jsonl file in verl's layout"),
    (["data.val_files=[train.jsonl,missing.jsonl]"], "data.val_files: data file missing.jsonl not found"),
    (["data.train_files=folder.jsonl"], "data.train_files: data file folder.jsonl is a directory, not a file"),
    (["data.train_files=rows.csv"], "data.train_files: data file rows.csv has an unsupported type '.csv'"),
    (["data.train_files=toy:letters"], "data.train_files: unknown toy task 'toy:letters': choose one of toy:letter, toy:calculator"),
    (["data.train_files=[]"], "data.train_files is empty"),
    (["reward.function=missing.py:score"], "reward.function: reward function file missing.py not found"),
    (["reward.function=reward.txt"], "must look like path/to/file.py:function_name"),
    (["model.path=./no-model"], "model.path: model directory ./no-model not found"),
    (["model.path=empty-model"], "model.path: model directory empty-model has no config.json"),
    (["critic.model_path=/no/critic"], "critic.model_path: model directory /no/critic not found"),
    (["reward.model_path=/no/rm"], "reward.model_path: model directory /no/rm not found"),
]


@pytest.mark.parametrize("overrides, message", PATH_CASES)
def test_a_missing_path_is_refused_before_the_run_directory_exists(overrides, message, files, monkeypatch, capsys):
    monkeypatch.chdir(files)
    sets = [arg for override in overrides for arg in ("--set", override)]
    code = runtime_main(["train", str(QUICKSTART), *sets, "--set", "trainer.run_dir=run"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and message in line, line
    assert not (files / "run").exists()


def test_a_missing_data_file_stops_before_the_model_loads(tmp_path):
    """The real entrypoint: refused before torch is even imported (the model load takes seconds)."""
    code = ("import sys, runpy; sys.argv = ['verl_runtime', 'train', sys.argv[1], '--set', "
            "'data.train_files=/no/train.parquet']\ntry:\n    runpy.run_module('verl_runtime', run_name='__main__')\n"
            "except SystemExit as exit:\n    print('torch' in sys.modules, exit.code)")
    result = subprocess.run([sys.executable, "-c", code, str(QUICKSTART)], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60)
    assert result.stdout.split() == ["False", "2"], result
    assert "data.train_files: data file /no/train.parquet not found" in one_error_line(result.stderr)
    assert not (tmp_path / "runs").exists()


def test_present_paths_and_hub_ids_pass(files, monkeypatch):
    monkeypatch.chdir(files)
    config = load_config(QUICKSTART, ["data.train_files=train.jsonl", "data.val_files=[toy:letter]",
                                      "reward.function=reward.py:compute_score", "model.path=Qwen/Qwen2.5-0.5B"])
    check_local_paths(config)  # a Hub id is not a path: the trainer downloads it (or finds it in the cache)


@pytest.mark.parametrize("overrides, message", [case for case in PATH_CASES if "empty" not in case[1]])
def test_verl_deploy_run_local_checks_the_paths_before_it_creates_anything(overrides, message, files, monkeypatch):
    monkeypatch.chdir(files)
    sets = [arg for override in overrides for arg in ("--set", override)]
    result = invoke("run", QUICKSTART, "--target", "local", *sets, "--runs-dir", files / "runs")
    assert result.exit_code == 2
    assert message in one_error_line(result.output)
    assert not (files / "runs").exists()


def test_docker_finds_data_paths_in_the_data_directory(files, monkeypatch):
    """/data in the container is --data on the host: a path under it is looked for there (without --data, the
    image's own /data is the trainer's to check)."""
    monkeypatch.chdir(files)
    common = ["run", QUICKSTART, "--target", "docker", "--dry-run", "--image", "verl-deploy:test", "--no-plan",
              "--runs-dir", files / "runs", "--set", "data.train_files=/data/train.jsonl"]
    assert invoke(*common).exit_code == 0
    assert invoke(*common, "--data", files).exit_code == 0
    missing = invoke(*common, "--data", files / "folder.jsonl")
    assert missing.exit_code == 2
    assert (f"data file /data/train.jsonl ({files / 'folder.jsonl' / 'train.jsonl'} here) not found"
            in one_error_line(missing.output))
    reward = invoke(*common, "--data", files, "--set", "reward.function=missing.py")
    assert "reward function file missing.py not found" in one_error_line(reward.output)


def test_k8s_checks_the_reward_file_it_ships_and_leaves_the_claim_to_the_trainer(files, monkeypatch):
    monkeypatch.chdir(files)
    common = ["run", QUICKSTART, "--target", "k8s", "--dry-run", "--image", "reg.io/verl:1", "--no-plan",
              "--runs-dir", files / "runs", "--set", "data.train_files=/data/train.parquet"]
    assert invoke(*common).exit_code == 0  # on the claim (or in the image): not visible from here
    refused = invoke(*common, "--set", "reward.function=missing.py:score")
    assert refused.exit_code == 2
    assert "reward function file missing.py not found" in one_error_line(refused.output)


def test_the_checks_need_no_torch():
    """The host side (verl-deploy) loads and checks configs without torch."""
    code = ("import sys\nfrom verl_runtime.config import load_config\nfrom verl_runtime.local_paths import "
            "check_local_paths\ncheck_local_paths(load_config(sys.argv[1]))\nprint('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code, str(QUICKSTART)], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr
