"""Tool calls in the hermes format, as verl's HermesToolParser reads them (verl/experimental/agent_loop/
tool_parser.py): each `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in the decoded turn is one call; one
that is not JSON with a name and arguments is an error of the episode (counted), not a crash."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

START, END = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass
class Parsed:
    content: str  # the turn's text without its tool calls
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line per call that could not be read


def parse(text: str) -> Parsed:
    """The tool calls of one assistant turn's text."""
    if START not in text or END not in text:
        return Parsed(text)
    parsed = Parsed(_CALL.sub("", text))
    for body in _CALL.findall(text):
        try:
            call = json.loads(body)
            name, arguments = call["name"], call["arguments"]
            if isinstance(arguments, str):  # some models write the arguments as a JSON string
                arguments = json.loads(arguments)
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise TypeError("name must be a string and arguments an object")
        except (ValueError, KeyError, TypeError) as exc:
            parsed.errors.append(f"tool call {body.strip()[:80]!r} is not JSON with a name and arguments: {exc}")
            continue
        parsed.calls.append(ToolCall(name, arguments))
    return parsed
