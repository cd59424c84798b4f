"""The sequence lengths a plan assumes, and why.

Padded micro-batches (our runtime) are as wide as their longest prompt plus data.max_response_length: the engines
pad every response to max_response_length, and prompts are left-padded to the batch's longest. So the plan takes the
longest prompt of the data file (tokenized with the model's tokenizer, when the file and the tokenizer are on this
host), else data.max_prompt_length.

Padding-free micro-batches (verl's use_remove_padding, its default) hold the real tokens only, so their memory follows
the mean lengths: the data file's mean prompt when it can be read, else max_prompt_length; and, unless told
(--response-length), every response as long as data.max_response_length: a run's responses grow, and the step at
which a long one arrives is where runs die. --prompt-length / --response-length give typical lengths instead.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

SAMPLE_ROWS = 4000  # rows tokenized at most (evenly spread over the file): a few seconds for any tokenizer


@dataclass(frozen=True)
class Lengths:
    prompt: int  # tokens per sequence's prompt (padded: the longest; padding-free: the mean)
    response: int
    prompt_how: str
    response_how: str

    @property
    def total(self) -> int:
        return self.prompt + self.response


@dataclass(frozen=True)
class PromptStats:
    mean: float
    longest: int
    rows: int
    of_rows: int
    where: str


def assume(padding_free: bool, max_prompt: int, max_response: int, stats: PromptStats | None,
           prompt_length: int | None = None, response_length: int | None = None, why_not_read: str = "") -> Lengths:
    """The lengths to plan for (see the module docstring)."""
    if prompt_length is not None:
        prompt, prompt_how = min(prompt_length, max_prompt), f"--prompt-length {prompt_length}"
    elif stats is not None:
        sampled = f"{stats.rows:,} of {stats.of_rows:,} rows" if stats.rows < stats.of_rows else f"{stats.rows:,} rows"
        if padding_free:
            prompt = min(round(stats.mean), max_prompt)
            prompt_how = f"mean prompt of {stats.where} ({sampled}; longest {stats.longest})"
        else:
            prompt = min(stats.longest, max_prompt)
            prompt_how = f"longest prompt of {stats.where} ({sampled}): prompts are left-padded to the batch's longest"
    else:
        prompt = max_prompt
        prompt_how = "data.max_prompt_length" + (f" ({why_not_read})" if why_not_read else "")
    if not padding_free:
        response, response_how = max_response, "data.max_response_length: responses are padded to it"
        if response_length is not None:
            response_how += f" (--response-length {response_length} does not shrink padded micro-batches)"
    elif response_length is not None:
        response, response_how = min(response_length, max_response), f"--response-length {response_length}"
    else:
        response = max_response
        response_how = ("data.max_response_length: padding-free micro-batches hold the real tokens, and every "
                        "response may reach the limit (--response-length N plans typical lengths)")
    return Lengths(prompt, response, prompt_how, response_how)


def prompt_stats(files: list[str], tokenizer_folder: Path | None, hub_id: str | None, max_prompt: int,
                 apply_chat_template: bool = True, toy_size: int = 512, seed: int = 1) -> tuple[PromptStats | None, str]:
    """Token lengths of the prompts in the data files (ours: toy:<task> too), with the model's tokenizer; (None, why)
    when the files or the tokenizer are not on this host."""
    if not files:
        return None, "no data file given"
    try:
        from verl_runtime.data import load_rows, make_toy_rows, prompt_token_ids
        from verl_runtime.errors import UserError
    except ImportError as exc:
        return None, f"the data reader is not importable ({exc})"
    rows, names = [], []
    for name in files:
        if str(name).startswith("toy:"):
            try:
                rows += make_toy_rows(str(name).removeprefix("toy:"), toy_size, seed)
            except UserError as exc:
                return None, str(exc)
        elif Path(name).expanduser().is_file():
            try:
                rows += load_rows(Path(name).expanduser())
            except (UserError, ImportError) as exc:
                return None, f"{name} is not readable here: {exc}"
        else:
            return None, f"{name} is not on this host"
        names.append(str(name))
    tokenizer, why = _tokenizer(tokenizer_folder, hub_id)
    if tokenizer is None:
        return None, why
    step = max(len(rows) // SAMPLE_ROWS, 1)
    sample = rows[::step][:SAMPLE_ROWS]
    try:
        lengths = [len(prompt_token_ids(row["prompt"], tokenizer, apply_chat_template)) for row in sample]
    except Exception as exc:  # a tokenizer or template that fails on a row: plan without the lengths
        return None, f"the tokenizer failed on a prompt ({type(exc).__name__}: {exc})"
    kept = [n for n in lengths if n <= max_prompt] or lengths
    where = names[0] if len(names) == 1 else f"{len(names)} data files"
    return PromptStats(statistics.fmean(kept), max(kept), len(sample), len(rows), where), ""


def _tokenizer(folder: Path | None, hub_id: str | None):
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging
    except ImportError:
        return None, "transformers is not installed to tokenize the prompts"
    logging.set_verbosity_error()
    for source, options in ((folder, {}), (hub_id, {"local_files_only": True})):
        if source is None:
            continue
        try:
            return AutoTokenizer.from_pretrained(str(source), **options), ""
        except Exception:  # no tokenizer files there, or one transformers cannot read
            continue
    return None, "the model's tokenizer is not on this host"
