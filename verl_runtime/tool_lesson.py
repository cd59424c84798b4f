"""builtin:tiny-tools: builtin:tiny taught, by supervised fine-tuning on generated transcripts, to answer a
toy/calculator question (verl_runtime.data) either by calling a code tool or by guessing, half and half, so that the
agentic quickstart (examples/tool-calculator.yaml) starts from a policy that RL can teach to call.

A calling transcript is played as the tool loop plays it: the assistant calls verl's code tool (code_interpreter,
SandboxFusionTool's schema name) with ``print(A*B)``, the tool's turn holds what the sandbox prints, and the
assistant repeats it. A guessing one answers the product outright, which a two-layer model cannot learn to compute,
so guesses score nothing. The loss is on the assistant's turns only, as the RL step's response mask has it.

Why a mix and not calls alone: taught only to call, the model's first choice is certain and its remaining errors
are in copying the numbers, where its sampling has next to no entropy left for RL to explore (measured: the reward
stayed flat). Whether to call is a choice the lesson leaves at even odds, and RL moves it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from verl_runtime.data import CALCULATOR_PROMPT, calculator_numbers

TOOL_NAME = "code_interpreter"  # the function name in verl's sandbox_fusion_tool_config.yaml
LESSON_STEPS = 1000
LESSON_BATCH = 16
LESSON_LR = 3e-3
CALL_SHARE = 0.5  # of the transcripts, those that call the tool; the others guess the product outright


def tool_call(code: str) -> str:
    """An assistant's hermes tool call of the code tool (verl's HermesToolParser reads it)."""
    return "<tool_call>" + json.dumps({"name": TOOL_NAME, "arguments": {"code": code}}) + "</tool_call>"


def transcript(rng: random.Random) -> list[dict]:
    """One question and, as chat messages, either the call, the sandbox's reply (print's output) and the answer, or
    a guess (the product itself, which a tiny model cannot learn to compute)."""
    a, b = calculator_numbers(rng)
    question, product = CALCULATOR_PROMPT.format(a=a, b=b), a * b
    if rng.random() >= CALL_SHARE:
        return [{"role": "user", "content": question}, {"role": "assistant", "content": str(product)}]
    code = f"print({a}*{b})"
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": tool_call(code)},
        {"role": "tool", "content": f"{product}\n"},
        {"role": "assistant", "content": str(product)},
    ]


def encode(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """The transcript's token ids as the chat template writes them, and a mask of 1 on the assistant's tokens (its
    content and end-of-turn token)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] == "assistant":
            start = len(tokenizer.apply_chat_template(messages[:index], tokenize=False, add_generation_prompt=True))
            spans.append((start, start + len(message["content"]) + len(tokenizer.eos_token)))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(lo <= begin and end <= hi for lo, hi in spans)) for begin, end in encoded["offset_mapping"]]
    return encoded["input_ids"], mask


def teach(model_dir, steps: int = LESSON_STEPS, seed: int = 0) -> Path:
    """Fine-tune the model saved in model_dir on calculator transcripts, and save it there again."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rng = random.Random(f"tool-lesson/{seed}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LESSON_LR)
        model.train()
        for _ in range(steps):
            ids, mask = _batch(tokenizer, [encode(tokenizer, transcript(rng)) for _ in range(LESSON_BATCH)])
            labels = ids.masked_fill(mask == 0, -100)
            loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(), labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    model.save_pretrained(model_dir)
    return model_dir


def _batch(tokenizer, rows: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and loss masks (a causal model's positions need no shift for right padding)."""
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([row + [pad] * (width - len(row)) for row, _ in rows])
    mask = torch.tensor([m + [0] * (width - len(m)) for _, m in rows])
    return ids, mask
