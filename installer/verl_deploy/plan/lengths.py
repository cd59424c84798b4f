"""The sequence lengths a plan assumes, and why: a typical case (what a step usually holds) and the worst case (every
response at the limit). Lengths are the main unknown of a plan, so both are planned (docs/plan.md, "Lengths").

Padded micro-batches (our runtime) are as wide as their longest prompt plus data.max_response_length: the engines
pad every response to max_response_length, and prompts are left-padded to the batch's longest. So both cases take the
longest prompt of the data file (tokenized with the model's tokenizer, when the file and the tokenizer are on this
host), else data.max_prompt_length, and the response limit.

Padding-free micro-batches (verl's use_remove_padding, its default) hold the real tokens only, so their memory follows
the mean lengths. Typical: the data file's mean prompt when it can be read, else TYPICAL_PROMPT x max_prompt_length;
the mean response --response-length, else TYPICAL_RESPONSE x max_response_length. Worst: the data file's longest
prompt (else the limit) and every response at max_response_length.

The default fractions come from published runs' length curves: verl's own GSM8K log (docs/start/quickstart.rst:116 at
volcengine/verl@b178a3c: prompt_length/mean 104.9 of max_prompt_length 512 = 0.20; the tuning scripts'
GSM8K runs answer in ~240 of their 1024 response tokens = 0.23) and DAPO's training curve (arXiv:2503.14476, Fig. 7:
the mean response grows from ~1,000 to ~4,500 tokens of a 20,480-token limit, 0.05 to 0.22). A quarter of each limit
sits at the upper end of both: what a run usually holds, not its last and longest steps (the worst case covers those).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

SAMPLE_ROWS = 4000  # rows tokenized at most (evenly spread over the file): a few seconds for any tokenizer
TYPICAL_PROMPT = 0.25  # of data.max_prompt_length, when the data file is not read (module docstring: the source)
TYPICAL_RESPONSE = 0.25  # of data.max_response_length, without --response-length


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


@dataclass(frozen=True)
class Cases:
    typical: Lengths
    worst: Lengths

    @property
    def same(self) -> bool:
        return (self.typical.prompt, self.typical.response) == (self.worst.prompt, self.worst.response)


def assume(padding_free: bool, max_prompt: int, max_response: int, stats: PromptStats | None,
           prompt_length: int | None = None, response_length: int | None = None, why_not_read: str = "") -> Cases:
    """The typical and the worst lengths to plan for (see the module docstring)."""
    sampled = ""
    if stats is not None:
        sampled = f"{stats.rows:,} of {stats.of_rows:,} rows" if stats.rows < stats.of_rows else f"{stats.rows:,} rows"
    if not padding_free:
        if prompt_length is not None:
            prompt, prompt_how = min(prompt_length, max_prompt), f"--prompt-length {prompt_length}"
        elif stats is not None:
            prompt = min(stats.longest, max_prompt)
            prompt_how = f"longest prompt of {stats.where} ({sampled}): prompts are left-padded to the batch's longest"
        else:
            prompt = max_prompt
            prompt_how = "data.max_prompt_length" + (f" ({why_not_read})" if why_not_read else "")
        response_how = "data.max_response_length: responses are padded to it"
        if response_length is not None:
            response_how += f" (--response-length {response_length} does not shrink padded micro-batches)"
        padded = Lengths(prompt, max_response, prompt_how, response_how)
        return Cases(padded, padded)
    if prompt_length is not None:
        prompt = worst_prompt = min(prompt_length, max_prompt)
        prompt_how = worst_how = f"--prompt-length {prompt_length}"
    elif stats is not None:
        prompt, worst_prompt = min(round(stats.mean), max_prompt), min(stats.longest, max_prompt)
        prompt_how = f"mean prompt of {stats.where} ({sampled})"
        worst_how = f"longest prompt of {stats.where}"
    else:
        prompt, worst_prompt = max(round(TYPICAL_PROMPT * max_prompt), 1), max_prompt
        prompt_how = (f"{TYPICAL_PROMPT:g} x data.max_prompt_length, a typical mean"
                      + (f" ({why_not_read})" if why_not_read else ""))
        worst_how = "data.max_prompt_length"
    if response_length is not None:
        response, response_how = min(response_length, max_response), f"--response-length {response_length}"
    else:
        response = max(round(TYPICAL_RESPONSE * max_response), 1)
        response_how = (f"{TYPICAL_RESPONSE:g} x data.max_response_length, a typical mean (padding-free micro-batches "
                        "hold the real tokens; --response-length N plans your data's)")
    typical = Lengths(prompt, response, prompt_how, response_how)
    worst = Lengths(worst_prompt, max_response, worst_how, "data.max_response_length: every response at the limit")
    return Cases(typical, worst)


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
