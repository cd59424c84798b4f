"""Data in verl's layout: files, prompt encoding, length policy, batching, toy rows."""

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import FIXTURES

from verl_runtime.data import batch_indices, encode_prompts, load_rows, make_toy_rows
from verl_runtime.errors import DataError, UserError

TOKENIZER_DIR = FIXTURES / "data" / "tiny_tokenizer"

ROWS = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "What is 2 + 3?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "5"},
        "extra_info": {"split": "train", "index": 0},
    },
    {
        "data_source": "toy/letter",
        "prompt": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Write the letter a as many times as you can."},
        ],
        "ability": "toy",
        "reward_model": {"style": "rule", "ground_truth": "a"},
        "extra_info": {"split": "train", "index": 1},
    },
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_parquet_round_trip_keeps_nested_columns(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    assert load_rows(path) == ROWS


def test_jsonl_round_trip(tmp_path):
    assert load_rows(write_jsonl(tmp_path / "train.jsonl", ROWS)) == ROWS


def test_missing_columns_are_named(tmp_path):
    rows = [{k: v for k, v in r.items() if k not in ("reward_model", "data_source")} for r in ROWS]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(DataError, match=r"missing column\(s\) 'data_source', 'reward_model'"):
        load_rows(path)


def test_corrupt_parquet_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1 this is not really parquet")
    with pytest.raises(DataError) as err:
        load_rows(path)
    message = str(err.value)
    assert str(path) in message and "\n" not in message
    assert isinstance(err.value, UserError)


def test_missing_file_and_bad_json_are_named(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_rows(tmp_path / "absent.parquet")
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl, line 2: invalid JSON"):
        load_rows(path)


def test_prompt_must_be_chat_messages(tmp_path):
    path = write_jsonl(tmp_path / "plain.jsonl", [{**ROWS[0], "prompt": "What is 2 + 3?"}])
    with pytest.raises(DataError, match="row 0: 'prompt' must be a list of chat messages"):
        load_rows(path)


def test_chat_template_is_applied_once_with_one_bos(tokenizer):
    (prompt,) = encode_prompts(ROWS[:1], tokenizer, max_prompt_length=256)
    text = tokenizer.decode(prompt.input_ids)
    assert text == "<|bos|><|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert prompt.input_ids.count(tokenizer.bos_token_id) == 1
    assert (prompt.index, prompt.data_source, prompt.ground_truth) == (0, "openai/gsm8k", "5")
    assert prompt.extra_info == {"split": "train", "index": 0}
    assert prompt.raw_prompt == ROWS[0]["prompt"]


def test_without_template_message_contents_are_joined(tokenizer):
    prompts = encode_prompts(ROWS, tokenizer, max_prompt_length=256, apply_chat_template=False)
    assert tokenizer.decode(prompts[1].input_ids) == (
        "<|bos|>Be brief.\nWrite the letter a as many times as you can."
    )


def test_too_long_prompt_names_the_length_and_the_knob(tokenizer):
    with pytest.raises(DataError) as err:
        encode_prompts(ROWS, tokenizer, max_prompt_length=20)
    longest = len(encode_prompts(ROWS, tokenizer, max_prompt_length=1000)[1].input_ids)
    assert f"the longest has {longest} tokens" in str(err.value)
    assert "data.max_prompt_length=20" in str(err.value)


def test_left_and_right_truncation_keep_the_ends(tokenizer):
    full = encode_prompts(ROWS, tokenizer, max_prompt_length=1000)
    left = encode_prompts(ROWS, tokenizer, max_prompt_length=20, truncation="left")
    right = encode_prompts(ROWS, tokenizer, max_prompt_length=20, truncation="right")
    for f, lt, rt in zip(full, left, right):
        assert lt.input_ids == f.input_ids[-20:]
        assert rt.input_ids == f.input_ids[:20]
    assert tokenizer.decode(left[0].input_ids).endswith("<|im_start|>assistant\n")


def test_filter_drops_long_prompts_and_reports_how_many(tokenizer, caplog):
    lengths = [len(p.input_ids) for p in encode_prompts(ROWS, tokenizer, max_prompt_length=1000)]
    limit = min(lengths)
    with caplog.at_level(logging.WARNING):
        kept = encode_prompts(ROWS, tokenizer, max_prompt_length=limit, truncation="filter")
    assert [p.index for p in kept] == [0]
    assert "dropped 1 of 2 prompts" in caplog.text


def test_unknown_truncation_mode(tokenizer):
    with pytest.raises(DataError, match="unknown data.truncation 'middle'"):
        encode_prompts(ROWS, tokenizer, max_prompt_length=10, truncation="middle")


def test_batch_indices_are_deterministic_and_reshuffled_per_epoch():
    epoch0 = batch_indices(10, 3, seed=7, epoch=0)
    assert epoch0 == batch_indices(10, 3, seed=7, epoch=0)
    assert len(epoch0) == 3 and all(len(b) == 3 for b in epoch0)  # the last partial batch is dropped
    assert len({i for b in epoch0 for i in b}) == 9
    assert batch_indices(10, 3, seed=7, epoch=1) != epoch0
    assert batch_indices(10, 3, seed=8, epoch=0) != epoch0
    assert batch_indices(5, 2, seed=0, epoch=3, shuffle=False) == [[0, 1], [2, 3]]


def test_batch_larger_than_data_is_an_error():
    with pytest.raises(DataError, match="data.batch_size=8 is larger than the data set"):
        batch_indices(5, 8, seed=0, epoch=0)


def test_toy_rows_are_in_verl_layout_and_seeded():
    rows = make_toy_rows("letter", 16, seed=3)
    assert rows == make_toy_rows("letter", 16, seed=3)
    assert {r["data_source"] for r in rows} == {"toy/letter"}
    assert {r["reward_model"]["ground_truth"] for r in rows} == {"a"}
    assert len({r["prompt"][0]["content"] for r in rows}) > 1  # varied wording
    assert [r["extra_info"]["index"] for r in rows] == list(range(16))


def test_toy_rows_load_back_from_parquet(tmp_path):
    path = tmp_path / "toy.parquet"
    pq.write_table(pa.Table.from_pylist(make_toy_rows("letter", 4, seed=0)), path)
    assert load_rows(path) == make_toy_rows("letter", 4, seed=0)


def test_unknown_toy_task():
    with pytest.raises(DataError, match="unknown toy task 'chess'"):
        make_toy_rows("chess", 4, seed=0)


@pytest.mark.parametrize("images", [[{"image": "a.png"}], ["a.png"]])
def test_a_multimodal_row_is_refused_naming_verl_not_trained_text_only(tmp_path, images):
    """verl reads the images column of a row by default, with no key set: ignoring it would train other numbers."""
    rows = [{"data_source": "geo3k", "prompt": [{"role": "user", "content": "<image> angle?"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "30"}, "extra_info": {}, "images": images}]
    path = tmp_path / "vl.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError) as refused:
        load_rows(path)
    assert "row 0 holds 'images'" in str(refused.value) and "--runtime verl" in str(refused.value)


def test_text_rows_with_empty_media_columns_train(tmp_path):
    rows = [{"data_source": "gsm8k", "prompt": [{"role": "user", "content": "1+1?"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {}, "images": [], "videos": None}]
    path = tmp_path / "text.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert len(load_rows(path)) == 1
