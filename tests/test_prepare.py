"""prepare_gsm8k writes the rows verl's examples/data_preprocess/gsm8k.py writes."""

import json
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import FIXTURES, REPO

from verl_runtime.data import load_rows
from verl_runtime.errors import DataError
from verl_runtime.metrics import read_metrics
from verl_runtime.prepare import prepare_gsm8k
from verl_runtime.rewards import default_compute_score

SAMPLE = FIXTURES / "data" / "gsm8k_sample.jsonl"
SUFFIX = ' Let\'s think step by step and output the final answer after "####".'


def raw_rows():
    return [json.loads(line) for line in SAMPLE.read_text().splitlines()]


def test_rows_equal_verl_rows(tmp_path):
    outputs = prepare_gsm8k(SAMPLE, tmp_path / "out")
    assert outputs == {"train": tmp_path / "out" / "train.parquet"}
    rows = load_rows(outputs["train"])
    raw = raw_rows()

    assert rows[0] == {
        "data_source": "openai/gsm8k",
        "prompt": [
            {
                "role": "user",
                "content": "Mia picks 12 apples in the morning and 15 apples in the afternoon. "
                "How many apples does she pick in all?" + SUFFIX,
            }
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "27"},
        "extra_info": {
            "split": "train",
            "index": 0,
            "answer": "In all she picks 12 + 15 = <<12+15=27>>27 apples.\n#### 27",
            "question": "Mia picks 12 apples in the morning and 15 apples in the afternoon. "
            "How many apples does she pick in all?",
        },
    }
    # commas are dropped from the ground truth, signs kept
    assert [r["reward_model"]["ground_truth"] for r in rows] == [
        "27", "16", "120", "1200", "7", "15", "56", "150", "15", "-6",
    ]
    for i, (row, src) in enumerate(zip(rows, raw)):
        assert row["prompt"] == [{"role": "user", "content": src["question"] + SUFFIX}]
        assert row["extra_info"] == {"split": "train", "index": i, "answer": src["answer"], "question": src["question"]}


def test_parquet_schema_matches_verl(tmp_path):
    out = prepare_gsm8k(SAMPLE, tmp_path)["train"]
    schema = pq.read_schema(out)
    assert schema.names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert schema.field("prompt").type == pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert schema.field("extra_info").type.field("index").type == pa.int64()


def test_a_directory_of_splits_from_parquet(tmp_path):
    src = tmp_path / "main"
    src.mkdir()
    pq.write_table(pa.Table.from_pylist(raw_rows()[:6]), src / "train-00000-of-00001.parquet")
    shutil.copy(SAMPLE, src / "test.jsonl")
    outputs = prepare_gsm8k(src, tmp_path / "gsm8k")
    assert set(outputs) == {"train", "test"}
    assert len(load_rows(outputs["train"])) == 6
    test_rows = load_rows(outputs["test"])
    assert {r["extra_info"]["split"] for r in test_rows} == {"test"}


def test_prepared_ground_truth_scores_the_reference_answer(tmp_path):
    rows = load_rows(prepare_gsm8k(SAMPLE, tmp_path)["train"])
    for row in rows:
        answer, truth = row["extra_info"]["answer"], row["reward_model"]["ground_truth"]
        assert default_compute_score(row["data_source"], answer, truth) == 1.0


def test_bad_inputs_are_named(tmp_path):
    bad = tmp_path / "train.jsonl"
    bad.write_text(json.dumps({"question": "q?", "answer": "no marker here"}) + "\n")
    with pytest.raises(DataError, match=r"train.jsonl, row 0: the answer has no '#### <number>' line"):
        prepare_gsm8k(bad, tmp_path / "out")
    bad.write_text(json.dumps({"question": "q?"}) + "\n")
    with pytest.raises(DataError, match=r"missing column\(s\) 'answer'"):
        prepare_gsm8k(bad, tmp_path / "out")
    with pytest.raises(DataError, match="not found"):
        prepare_gsm8k(tmp_path / "absent.jsonl", tmp_path / "out")


def test_tool_rows_equal_verls_multiturn_tool_rows(tmp_path):
    """--tools: the rows of verl's examples/data_preprocess/gsm8k_multiturn_w_tool.py, and the agent_name that picks
    verl's tool agent loop for them."""
    rows = load_rows(prepare_gsm8k(SAMPLE, tmp_path / "out", tools=True)["train"])
    raw = raw_rows()[0]
    question = raw["question"] + " Let's think step by step and output the final answer after `####`."
    assert list(rows[0]) == ["data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name"]
    assert rows[0]["prompt"][0]["role"] == "system" and "`calc_gsm8k_reward` tool" in rows[0]["prompt"][0]["content"]
    assert rows[0]["prompt"][1] == {"role": "user", "content": question}
    assert rows[0]["extra_info"] == {
        "split": "train", "index": 0, "answer": raw["answer"], "question": raw["question"],
        "need_tools_kwargs": True, "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "27"}}},
        "interaction_kwargs": {"query": question, "ground_truth": "27"},
    }
    assert rows[0]["agent_name"] == "tool_agent" and rows[0]["reward_model"]["ground_truth"] == "27"


@pytest.mark.slow
def test_the_gsm8k_tool_example_trains_a_cpu_step_on_prepared_rows(tmp_path):
    """verl's GSM8K tool config (examples/tools/gsm8k_tool_config.yaml) and prepared tool rows, on the CPU."""
    data = tmp_path / "gsm8k-tools"
    done = subprocess.run([sys.executable, "-m", "verl_runtime", "prepare", "gsm8k", "--tools", "--input", str(SAMPLE),
                           "--output", str(data)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == f"train: {data / 'train.parquet'}\n", done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "verl_runtime", "train", str(REPO / "examples" / "gsm8k-tools.yaml"),
         "--set", f"data.train_files={data / 'train.parquet'}", "--set", "data.val_files=[]",
         "--set", "model.path=builtin:tiny", "--set", "trainer.device=cpu", "--set", "rollout.name=hf",
         "--set", "data.batch_size=2", "--set", "actor.ppo_mini_batch_size=2", "--set", "rollout.n=2",
         "--set", "data.max_response_length=32",
         "--set", "trainer.total_training_steps=1", "--set", f"trainer.run_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Training finished at step 1" in done.stdout
    metrics = read_metrics(tmp_path / "run")[-1]
    assert metrics["num_turns/min"] >= 2  # the prompt and at least one assistant turn, from the tool loop
