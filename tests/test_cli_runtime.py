"""``python -m verl_runtime``: the container entrypoint, its run directory, and one-line errors for bad input."""

import json
import subprocess
import sys

import pytest

from conftest import FIXTURES
from verl_runtime.__main__ import main
from verl_runtime.errors import ConfigError


@pytest.fixture(scope="module")
def gsm8k_dir(tmp_path_factory):
    """verl-layout parquet made by `python -m verl_runtime prepare gsm8k` from the GSM8K sample."""
    out = tmp_path_factory.mktemp("gsm8k")
    assert main(["prepare", "gsm8k", "--input", str(FIXTURES / "data" / "gsm8k_sample.jsonl"), "--output", str(out)]) == 0
    return out


def write_config(path, model_dir, data_file, **sections):
    lines = [
        f"model: {{path: '{model_dir}'}}",
        f"data: {{train_files: '{data_file}', batch_size: 2, max_prompt_length: 512, max_response_length: 8}}",
        "algorithm: {adv_estimator: grpo}",
        "rollout: {n: 2}",
        f"trainer: {{device: cpu, total_training_steps: 1, run_dir: '{path.parent / 'run'}'}}",
    ]
    lines += [f"{name}: {value}" for name, value in sections.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_train_writes_the_run_directory_and_exits_0(tmp_path, tiny_model_dir, gsm8k_dir):
    config = write_config(tmp_path / "gsm8k.yaml", tiny_model_dir, gsm8k_dir / "train.parquet")
    done = subprocess.run(
        [sys.executable, "-m", "verl_runtime", "train", str(config), "--set", "trainer.experiment_name=cli",
         "--set", f"data.val_files={gsm8k_dir / 'train.parquet'}", "--set", "trainer.test_freq=1",
         "--set", "trainer.val_before_train=false"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    run = tmp_path / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["step"] == 1 and "val-core/openai/gsm8k/reward/mean@1" in metrics[0]
    assert "experiment_name: cli" in (run / "config.yaml").read_text()
    assert (run / "checkpoints" / "step_1" / "state.pt").is_file()
    log = (run / "train.log").read_text()
    assert "[INFO] Initializing SingleControllerTrainer..." in log and "step 1/1" in log


def run_main(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.err.strip()


def assert_one_line_error(code, err, *fragments):
    assert code == 2
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err


def test_missing_model_directory(tmp_path, gsm8k_dir, capsys):
    config = write_config(tmp_path / "c.yaml", tmp_path / "no-such-model", gsm8k_dir / "train.parquet")
    assert_one_line_error(*run_main(["train", str(config)], capsys), "model directory", "no-such-model", "not found")


def test_unknown_key_suggests_the_closest(tmp_path, tiny_model_dir, gsm8k_dir, capsys):
    config = write_config(tmp_path / "c.yaml", tiny_model_dir, gsm8k_dir / "train.parquet")
    code, err = run_main(["train", str(config), "--set", "actor.ppo_mini_batchsize=2"], capsys)
    assert_one_line_error(code, err, "unknown config key 'actor.ppo_mini_batchsize'", "did you mean 'actor.ppo_mini_batch_size'?")


def test_sizes_that_do_not_divide(tmp_path, tiny_model_dir, gsm8k_dir, capsys):
    config = write_config(tmp_path / "c.yaml", tiny_model_dir, gsm8k_dir / "train.parquet")
    code, err = run_main(["train", str(config), "--set", "actor.ppo_mini_batch_size=3"], capsys)  # verl's check
    assert_one_line_error(code, err, "data.batch_size (2) must be >= actor.ppo_mini_batch_size (3)")


def test_debug_shows_the_traceback(tmp_path, tiny_model_dir, gsm8k_dir):
    config = write_config(tmp_path / "c.yaml", tiny_model_dir, gsm8k_dir / "train.parquet")
    with pytest.raises(ConfigError):
        main(["train", str(config), "--set", "data.batch_size=x", "--debug"])


def test_corrupt_parquet(tmp_path, tiny_model_dir, capsys):
    broken = tmp_path / "train.parquet"
    broken.write_bytes(b"PAR1 this is not a parquet file")
    config = write_config(tmp_path / "c.yaml", tiny_model_dir, broken)
    assert_one_line_error(*run_main(["train", str(config)], capsys), "train.parquet")


def test_missing_columns_are_named(tmp_path, tiny_model_dir, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"data_source": "openai/gsm8k", "question": "1 + 1?"}) + "\n")
    config = write_config(tmp_path / "c.yaml", tiny_model_dir, rows)
    assert_one_line_error(*run_main(["train", str(config)], capsys), "missing column(s) 'prompt', 'reward_model'")


def test_reward_function_import_error_names_file_and_line(tmp_path, tiny_model_dir, gsm8k_dir, capsys):
    reward = tmp_path / "my_reward.py"
    reward.write_text("import math\nimport no_such_module_here\n\ndef compute_score(*args):\n    return 0.0\n")
    config = write_config(tmp_path / "c.yaml", tiny_model_dir, gsm8k_dir / "train.parquet",
                          reward=f"{{function: '{reward}:compute_score'}}")
    assert_one_line_error(*run_main(["train", str(config)], capsys), "my_reward.py", "line 2", "no_such_module_here")


def test_nan_loss_stops_with_the_checkpoint_kept(tmp_path, tiny_model_dir, gsm8k_dir, capsys):
    config = write_config(tmp_path / "c.yaml", tiny_model_dir, gsm8k_dir / "train.parquet")
    code, err = run_main(["train", str(config), "--set", "actor.lr=1e30", "--set", "trainer.total_training_steps=3",
                          "--set", "trainer.save_freq=1"], capsys)
    assert_one_line_error(code, err, "the actor diverged", "lower actor.lr", "checkpoints/step_1 is kept")
    assert (tmp_path / "run" / "checkpoints" / "step_1").is_dir()
    assert err in (tmp_path / "run" / "train.log").read_text()


def test_prepare_gsm8k_writes_verl_layout(gsm8k_dir):
    import pyarrow.parquet as pq

    row = pq.read_table(gsm8k_dir / "train.parquet").to_pylist()[0]
    assert row["data_source"] == "openai/gsm8k" and row["reward_model"]["ground_truth"] == "27"


def test_out_of_memory_names_the_knobs(tmp_path, tiny_model_dir, gsm8k_dir, capsys):
    # No GPU here: the reward function raises the error CUDA raises, from inside the training step.
    reward = tmp_path / "oom.py"
    reward.write_text(
        "import torch\n"
        "def compute_score(*args):\n"
        "    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
    )
    config = write_config(tmp_path / "c.yaml", tiny_model_dir, gsm8k_dir / "train.parquet",
                          reward=f"{{function: '{reward}:compute_score'}}")
    code, err = run_main(["train", str(config), "--set", "actor.ppo_micro_batch_size_per_gpu=2"], capsys)
    assert_one_line_error(code, err, "out of memory in the reward scoring of step 1", "lower data.batch_size (now 2)",
                          "no checkpoint was written yet")
