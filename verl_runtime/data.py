"""Prompt data in verl's row layout: reading, tokenizing, batching, and the toy tasks.

A row is a dict with ``data_source`` (which scorer applies), ``prompt`` (a list of chat messages),
``ability``, ``reward_model: {style, ground_truth}`` and ``extra_info``; a parquet file made by verl's
preprocessing scripts reads here unchanged. Files are ``.parquet`` (pyarrow) or ``.jsonl``.
"""

from __future__ import annotations

import json
import logging
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from verl_runtime.errors import DataError
from verl_runtime.verl_keys import RUN_WITH_VERL

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")  # ability and extra_info are optional
TRUNCATION_MODES = ("error", "left", "right", "filter")
DATA_SUFFIXES = (".parquet", ".jsonl")  # the file types read_records reads
TOY_PREFIX = "toy:"  # data.train_files entry "toy:<task>": a generated toy task (make_toy_rows), not a file


def read_records(path) -> list[dict]:
    """Rows of a .parquet or .jsonl file as plain Python dicts (nested columns become dicts and lists)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} not found")
    if path.suffix == ".parquet":
        return _read_parquet(path)
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    raise DataError(f"data file {path} has an unsupported type '{path.suffix}': use {' or '.join(DATA_SUFFIXES)}")


def _read_parquet(path: Path) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason = re.sub(r"^Could not open Parquet input source '[^']*': ", "", reason)  # it names the file again
        raise DataError(f"cannot read parquet file {path}: {reason}") from None


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}, line {line_no}: invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}, line {line_no}: each line must be a JSON object")
            rows.append(row)
    return rows


def require_columns(rows: list[dict], columns, path) -> None:
    """Raise a DataError naming the columns a row lacks."""
    for i, row in enumerate(rows):
        missing = [c for c in columns if c not in row]
        if missing:
            names = ", ".join(repr(c) for c in missing)
            raise DataError(f"{path}: missing column(s) {names} (row {i}); expected columns: {', '.join(columns)}")


# The columns of images, videos and audio verl's RLHFDataset reads (data.image_key, video_key, audio_key defaults).
MEDIA_COLUMNS = ("images", "videos", "audios")


def load_rows(path) -> list[dict]:
    """Read a data file in verl's layout; missing columns and malformed prompts are named."""
    rows = read_records(path)
    if not rows:
        raise DataError(f"data file {path} holds no rows")
    require_columns(rows, REQUIRED_COLUMNS, path)
    for i, row in enumerate(rows):
        media = next((column for column in MEDIA_COLUMNS if _present(row.get(column))), None)
        if media:  # verl reads these columns by default: training on the text alone would give other numbers
            raise DataError(f"{path}, row {i} holds {media!r}: multi-modal data is out of this runtime's scope; "
                            f"run it with {RUN_WITH_VERL}")
        if not _is_chat(row["prompt"]):
            raise DataError(
                f"{path}, row {i}: 'prompt' must be a list of chat messages like "
                "[{\"role\": \"user\", \"content\": \"...\"}]"
            )
    return rows


def _present(value) -> bool:
    """A cell that holds something (None and empty lists, as parquet gives text-only rows, do not)."""
    return value is not None and (not hasattr(value, "__len__") or len(value) > 0)


def _is_chat(prompt) -> bool:
    return (
        isinstance(prompt, list)
        and len(prompt) > 0
        and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt)
    )


@dataclass
class Prompt:
    """One tokenized prompt ready for rollout."""

    index: int  # position of the row in the data set
    input_ids: list[int]
    raw_prompt: list[dict]
    data_source: str
    ground_truth: object
    extra_info: dict = field(default_factory=dict)


def prompt_token_ids(messages: list[dict], tokenizer, apply_chat_template: bool = True, tools=None) -> list[int]:
    """Token ids of a chat prompt, with the tokenizer's chat template when it has one (given the tools' schemas of
    a multi-turn run, which the template lists, as verl's agent loop gives them).

    The template already writes any BOS token, so its text is encoded without special tokens;
    without a template the message contents are joined and encoded as plain text.
    """
    if apply_chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)
        return tokenizer.encode(text, add_special_tokens=False)
    text = "\n".join(m["content"] for m in messages)
    return tokenizer.encode(text, add_special_tokens=True)


def encode_prompts(
    rows: list[dict],
    tokenizer,
    max_prompt_length: int,
    truncation: str = "error",
    apply_chat_template: bool = True,
    filter_overlong: bool = False,
    tools: list[dict] | None = None,
) -> list[Prompt]:
    """Tokenize rows and apply the prompt-length policy.

    filter_overlong (verl's filter_overlong_prompts) drops every prompt longer than max_prompt_length first (and logs
    how many were dropped), as verl filters its dataset when loading it; then truncation acts on what is left:
    "error" stops on a prompt longer than max_prompt_length; "left" keeps its last tokens, "right" its first ones;
    "filter" (an earlier spelling of filter_overlong) drops it.
    """
    if truncation not in TRUNCATION_MODES:
        raise DataError(f"unknown data.truncation '{truncation}': use one of {', '.join(TRUNCATION_MODES)}")
    prompts = []
    for i, row in enumerate(rows):
        reward_model = row.get("reward_model") or {}
        prompts.append(
            Prompt(
                index=i,
                input_ids=prompt_token_ids(row["prompt"], tokenizer, apply_chat_template, tools),
                raw_prompt=row["prompt"],
                data_source=row["data_source"],
                ground_truth=reward_model.get("ground_truth"),
                extra_info=row.get("extra_info") or {},
            )
        )
    if filter_overlong:
        prompts = apply_length_policy(prompts, max_prompt_length, "filter")
    return apply_length_policy(prompts, max_prompt_length, truncation)


def apply_length_policy(prompts: list[Prompt], max_prompt_length: int, truncation: str) -> list[Prompt]:
    too_long = [p for p in prompts if len(p.input_ids) > max_prompt_length]
    if not too_long:
        return prompts
    if truncation == "error":
        longest = max(len(p.input_ids) for p in too_long)
        raise DataError(
            f"{len(too_long)} prompt(s) exceed data.max_prompt_length={max_prompt_length} "
            f"(the longest has {longest} tokens): raise data.max_prompt_length, "
            "or set data.filter_overlong_prompts=true (or data.truncation to left or right)"
        )
    if truncation == "filter":
        kept = [p for p in prompts if len(p.input_ids) <= max_prompt_length]
        if not kept:
            raise DataError(
                f"all {len(prompts)} prompts exceed data.max_prompt_length={max_prompt_length}: raise it"
            )
        log.warning(
            "dropped %d of %d prompts longer than data.max_prompt_length=%d",
            len(too_long), len(prompts), max_prompt_length,
        )
        return kept
    for p in too_long:
        p.input_ids = p.input_ids[-max_prompt_length:] if truncation == "left" else p.input_ids[:max_prompt_length]
    return prompts


def batch_indices(n: int, batch_size: int, seed: int, epoch: int, shuffle: bool = True) -> list[list[int]]:
    """The batches of one epoch: row indices, a fresh seeded shuffle per epoch, the last partial batch dropped.

    The same (seed, epoch) always gives the same batches, so a resumed run sees the same data.
    """
    if batch_size <= 0:
        raise DataError(f"data.batch_size must be positive, got {batch_size}")
    if batch_size > n:
        raise DataError(f"data.batch_size={batch_size} is larger than the data set ({n} prompts): lower it")
    order = list(range(n))
    if shuffle:
        random.Random(f"{seed}/{epoch}").shuffle(order)
    return [order[start : start + batch_size] for start in range(0, n - batch_size + 1, batch_size)]


# --- the toy tasks ---------------------------------------------------------------------------------------------
#
# "toy/letter": every prompt asks for one letter, repeated. The reward (rewards/toy.py) is the fraction of the
# response's non-whitespace characters that are that letter. A random-init model can learn it by plain policy
# gradient: the reward is dense (each right character counts), it does not depend on the prompt, and it only
# asks the policy to move probability mass onto one token, so the mean reward climbs within tens of steps.

TOY_LETTER = "a"
_LETTER_PROMPTS = (
    "Write the letter {c} as many times as you can.",
    "Repeat the letter {c} again and again.",
    "Type {c} over and over.",
    "Fill the line with the letter {c}.",
    "Say {c}, then {c} again, and keep going.",
    "Output nothing but the letter {c}.",
    "Give me a long row of {c}.",
    "How many times can you write {c}? Show me.",
)
# "toy/calculator": "What is 37*48?", two two-digit numbers; the reward is 1 when the response's last number is the
# product. A tiny model cannot multiply, so it solves the task only by calling a tool: the agentic quickstart
# (examples/tool-calculator.yaml), whose model builtin:tiny-tools was taught to call a code tool or guess
# (verl_runtime/tool_lesson.py) and learns by RL to call.
CALCULATOR_PROMPT = "What is {a}*{b}?"
TOY_TASKS = ("letter", "calculator")


def calculator_numbers(rng: random.Random) -> tuple[int, int]:
    """The two numbers of one toy/calculator question."""
    return rng.randint(10, 99), rng.randint(10, 99)


def make_toy_rows(task: str, n: int, seed: int) -> list[dict]:
    """n rows of a toy task in verl's layout (data_source "toy/<task>"), wording varied by a seeded draw."""
    if task not in TOY_TASKS:
        raise DataError(f"unknown toy task '{task}': choose one of {', '.join(TOY_TASKS)}")
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        if task == "calculator":
            a, b = calculator_numbers(rng)
            prompt, truth = CALCULATOR_PROMPT.format(a=a, b=b), a * b
        else:
            prompt, truth = rng.choice(_LETTER_PROMPTS).format(c=TOY_LETTER), TOY_LETTER
        rows.append({
            "data_source": f"toy/{task}",
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "toy",
            "reward_model": {"style": "rule", "ground_truth": str(truth)},
            "extra_info": {"split": "train", "index": i},
        })
    return rows
