"""Turn raw data sets into verl's row layout, offline.

``prepare_gsm8k`` writes the same rows as verl's ``examples/data_preprocess/gsm8k.py`` (column order,
instruction suffix, ground truth, extra_info), from GSM8K rows ``{question, answer}`` already on disk
(for example the ``main/train-*.parquet`` and ``main/test-*.parquet`` files of the GSM8K data set). With
``tools=True``, those of its ``gsm8k_multiturn_w_tool.py``: the multi-turn rows whose episodes call the GSM8K answer
tool (``calc_gsm8k_reward``, examples/tools/gsm8k_tool_config.yaml), its ground truth in ``extra_info.tools_kwargs``.
"""

from __future__ import annotations

import re
from pathlib import Path

from verl_runtime.data import read_records, require_columns
from verl_runtime.errors import DataError

GSM8K_DATA_SOURCE = "openai/gsm8k"
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def _gsm8k_schema():
    import pyarrow as pa

    # the column and field order of the parquet files verl's script writes
    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("split", pa.string()),
                        ("index", pa.int64()),
                        ("answer", pa.string()),
                        ("question", pa.string()),
                    ]
                ),
            ),
        ]
    )


def gsm8k_row(question: str, answer: str, split: str, index: int) -> dict:
    """One GSM8K example in verl's layout; the ground truth is the number after '####', commas removed."""
    if not (isinstance(question, str) and isinstance(answer, str)):
        raise ValueError("question and answer must be strings")
    found = _GSM8K_ANSWER.search(answer)
    if found is None:
        raise ValueError("the answer has no '#### <number>' line")
    return {
        "data_source": GSM8K_DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + " " + GSM8K_INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": found.group(1).replace(",", "")},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


# verl's examples/data_preprocess/gsm8k_multiturn_w_tool.py: its instruction (backquotes, not gsm8k.py's quotes) and
# system prompt; the tool's name is the function name of its gsm8k_tool_config.yaml
GSM8K_TOOL_INSTRUCTION = "Let's think step by step and output the final answer after `####`."
GSM8K_TOOL_SYSTEM = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "Reasoning step by step before any tool call. "
    "You should use the `calc_gsm8k_reward` tool after step by step solving the question, "
    "before generate final answer at least once and refine your answer if necessary. "
    "Put your final answer in the format of `#### <answer>`."
)
GSM8K_TOOL = "calc_gsm8k_reward"


def gsm8k_tool_row(question: str, answer: str, split: str, index: int) -> dict:
    """One GSM8K example as verl's multi-turn tool script writes it, with the row-level agent_name that verl's
    agent loop reads to run its tool agent for the row."""
    row = gsm8k_row(question, answer, split, index)
    truth = row["reward_model"]["ground_truth"]
    row["prompt"] = [{"role": "system", "content": GSM8K_TOOL_SYSTEM},
                     {"role": "user", "content": question + " " + GSM8K_TOOL_INSTRUCTION}]
    row["extra_info"].update({
        "need_tools_kwargs": True,
        "tools_kwargs": {GSM8K_TOOL: {"create_kwargs": {"ground_truth": truth}}},
        "interaction_kwargs": {"query": row["prompt"][1]["content"], "ground_truth": truth},
    })
    return {**row, "agent_name": "tool_agent"}


def split_of(path: Path) -> str:
    """'test' when the file name says so, else 'train'."""
    return "test" if "test" in path.name.lower() else "train"


def prepare_gsm8k(input_path, output_dir, tools: bool = False) -> dict[str, Path]:
    """GSM8K rows (a .jsonl/.parquet file, or a directory of train*/test* files) -> <split>.parquet files; tools:
    the multi-turn tool rows (gsm8k_tool_row).

    The split of a file comes from its name (test* -> test.parquet, anything else -> train.parquet).
    Returns {split: output path}.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    input_path, output_dir = Path(input_path), Path(output_dir)
    inputs = _gsm8k_inputs(input_path)
    splits = [split_of(p) for p in inputs]
    if len(set(splits)) != len(splits):
        raise DataError(f"{input_path} holds more than one file per split: pass one file at a time")

    output_dir.mkdir(parents=True, exist_ok=True)
    make_row = gsm8k_tool_row if tools else gsm8k_row
    schema = None if tools else _gsm8k_schema()  # the tool rows' nested kwargs: as pyarrow infers them
    written = {}
    for path, split in zip(inputs, splits):
        records = read_records(path)
        require_columns(records, ("question", "answer"), path)
        rows = []
        for index, record in enumerate(records):
            try:
                rows.append(make_row(record["question"], record["answer"], split, index))
            except ValueError as exc:
                raise DataError(f"{path}, row {index}: {exc}") from None
        out = output_dir / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), out)
        written[split] = out
    return written


def _gsm8k_inputs(input_path: Path) -> list[Path]:
    if input_path.is_file():
        return [input_path]
    if not input_path.is_dir():
        raise DataError(f"GSM8K input {input_path} not found")
    inputs = sorted(
        p for p in input_path.iterdir()
        if p.suffix in (".jsonl", ".parquet") and p.name.lower().startswith(("train", "test"))
    )
    if not inputs:
        raise DataError(f"{input_path} holds no train*/test* .jsonl or .parquet files")
    return inputs
