"""The multi-turn tool loop (verl's ToolAgentLoop, verl/experimental/agent_loop/tool_agent_loop.py), run by the
controller around any rollout engine: each turn the unfinished episodes generate together (one generate call, so
every engine and every worker count works), their hermes tool calls run concurrently with a time limit, and the
tool responses are appended in the chat template's own form. An episode ends at an answer (a turn without tool
calls), a turn limit or the response length. Assistant tokens train (response mask 1); tool tokens are context only
(mask 0), as in verl."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from dataclasses import dataclass, field

import torch

from verl_runtime.agent import hermes
from verl_runtime.agent.tools import CALL_DEADLINE
from verl_runtime.models import position_ids_from_mask
from verl_runtime.rollout.base import SamplingParams, left_pad

_TOOL_ROLE = "tool"


@dataclass
class Episode:
    prompt: list[int]
    tools_kwargs: dict
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1: the assistant's token, 0: a tool response's
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_rewards: list[float] = field(default_factory=list)
    last_turn: int = 0  # where the latest assistant turn starts in the response
    done: bool = False


class ToolLoop:
    """generate(contexts, params) -> a rollout batch dict (the actor group's generate); tools by name."""

    def __init__(self, generate, tokenizer, tools: dict, settings, max_response_length: int):
        self.generate, self.tokenizer, self.tools, self.settings = generate, tokenizer, tools, settings
        self.max_response_length = max_response_length
        self.schemas = [tool.tool_schema for tool in tools.values()]
        self.pad_id = tokenizer.pad_token_id
        self.separator = _after_end_of_turn(tokenizer)
        self.anchor = [{"role": "user", "content": "."}]  # what a tool turn's text is rendered after (_render_turn)
        self.anchor_text = _template(tokenizer, self.anchor, self.schemas, generation=False)

    def rollout(self, prompts: list[list[int]], tools_kwargs: list[dict], params: SamplingParams) -> tuple[dict, dict]:
        """Episodes of prompts (each params.n times, adjacent) as one rollout batch, and the loop's metrics."""
        episodes = [Episode(list(p), dict(k or {})) for p, k in zip(prompts, tools_kwargs) for _ in range(params.n)]
        started, tool_seconds = time.perf_counter(), 0.0
        turn = 0
        while active := [e for e in episodes if not e.done]:
            self._generate_turn(active, params, turn)
            calling = [(e, hermes.parse(self._text(e.response[e.last_turn:]))) for e in active if not self._ended(e)]
            for episode, parsed in calling:
                episode.tool_errors += len(parsed.errors)
                if not parsed.calls:
                    episode.done = True
            calling = [(e, p) for e, p in calling if p.calls]
            if calling:
                tick = time.perf_counter()
                responses = asyncio.run(self._run_calls(calling))
                tool_seconds += time.perf_counter() - tick
                for (episode, _), texts in zip(calling, responses):
                    self._append_tool_turn(episode, texts)
            turn += 1
        batch = self._batch(episodes)
        metrics = loop_metrics(episodes, tool_seconds, time.perf_counter() - started)
        return batch, metrics

    # --- one turn ----------------------------------------------------------------------------------------------

    def _generate_turn(self, active: list[Episode], params: SamplingParams, turn: int) -> None:
        budget = max(self.max_response_length - len(e.response) for e in active)
        seed = None if params.seed is None else params.seed + turn
        turn_params = dataclasses.replace(params, n=1, max_new_tokens=budget, seed=seed, prompt_width=None)
        out = self.generate([e.prompt + e.response for e in active], turn_params)
        rows, lengths = out["responses"].tolist(), out["response_mask"].sum(-1).tolist()
        for episode, row, length in zip(active, rows, lengths):
            tokens = row[: min(int(length), self.max_response_length - len(episode.response))]
            episode.last_turn = len(episode.response)
            episode.response += tokens
            episode.mask += [1] * len(tokens)
            episode.assistant_turns += 1

    def _ended(self, episode: Episode) -> bool:
        """verl's limits after a turn: the response length, the assistant's turns, the tool turns."""
        limits = self.settings
        episode.done = (len(episode.response) >= self.max_response_length
                        or bool(limits.max_assistant_turns and episode.assistant_turns >= limits.max_assistant_turns)
                        or bool(limits.max_user_turns and episode.user_turns >= limits.max_user_turns))
        return episode.done

    async def _run_calls(self, calling) -> list[list[str]]:
        return await asyncio.gather(*(
            asyncio.gather(*(self._call(call, episode) for call in parsed.calls[: self.settings.max_parallel_calls]))
            for episode, parsed in calling))

    async def _call(self, call: hermes.ToolCall, episode: Episode) -> str:
        """One tool call's response text; whatever goes wrong is told to the model and counted, never raised."""
        episode.tool_calls += 1
        tool = self.tools.get(call.name)
        if tool is None:
            episode.tool_errors += 1
            return f"Unknown function '{call.name}'. Available tools: {list(self.tools)}"
        instance = None
        try:
            create_kwargs = (episode.tools_kwargs.get(call.name) or {}).get("create_kwargs") or {}
            instance, _ = await _awaited(tool.create, create_kwargs=create_kwargs)  # verl 0.9.1's call
            CALL_DEADLINE.set(time.monotonic() + self.settings.tool_timeout)  # this task's own context
            response, reward, _ = await asyncio.wait_for(_awaited(tool.execute, instance, call.arguments),
                                                         self.settings.tool_timeout)
            if reward is not None:
                episode.tool_rewards.append(float(reward))
            text = getattr(response, "text", response) or ""
        except asyncio.TimeoutError:
            episode.tool_errors += 1
            text = f"Error executing tool '{call.name}': no answer in {self.settings.tool_timeout:g} s"
        except Exception as exc:  # a tool's failure is the episode's, as in verl
            episode.tool_errors += 1
            text = f"Error executing tool '{call.name}': {exc}"
        finally:
            if instance is not None:
                await _awaited(tool.release, instance)
        return truncate(str(text), self.settings.max_tool_response_length, self.settings.tool_response_truncate_side)

    def _append_tool_turn(self, episode: Episode, texts: list[str]) -> None:
        messages = [{"role": _TOOL_ROLE, "content": text} for text in texts]
        ids = self.tokenizer.encode(self.separator + self._render_turn(messages), add_special_tokens=False)
        if len(episode.response) + len(ids) >= self.max_response_length:  # verl: no room for the answer
            episode.done = True
            return
        episode.response += ids
        episode.mask += [0] * len(ids)
        episode.user_turns += 1

    def _render_turn(self, messages: list[dict]) -> str:
        """The tool messages as the chat template writes them after an assistant turn, up to the next assistant
        turn: the template's text of [anchor, *messages] past its text of the anchor (verl's trick of rendering a
        delta)."""
        full = _template(self.tokenizer, self.anchor + messages, self.schemas, generation=True)
        return full[len(self.anchor_text):] if full.startswith(self.anchor_text) else full

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    # --- the batch ---------------------------------------------------------------------------------------------

    def _batch(self, episodes: list[Episode]) -> dict:
        width = self.max_response_length
        prompt_ids, prompt_mask = left_pad([e.prompt for e in episodes], self.pad_id)
        responses = torch.tensor([e.response + [self.pad_id] * (width - len(e.response)) for e in episodes])
        valid = torch.tensor([[1] * len(e.response) + [0] * (width - len(e.response)) for e in episodes])
        response_mask = torch.tensor([e.mask + [0] * (width - len(e.mask)) for e in episodes])
        attention_mask = torch.cat([prompt_mask, valid], dim=1)
        return {
            "input_ids": torch.cat([prompt_ids, responses], dim=1), "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask), "responses": responses,
            "response_mask": response_mask,
        }


def loop_metrics(episodes: list[Episode], tool_seconds: float, seconds: float) -> dict[str, float]:
    """verl's num_turns/* (its turns: the prompt, the assistant's and the tools'), and the tool calls per episode."""
    turns = torch.tensor([1 + e.assistant_turns + e.user_turns for e in episodes], dtype=torch.float32)
    calls = torch.tensor([e.tool_calls for e in episodes], dtype=torch.float32)
    errors = sum(e.tool_errors for e in episodes)
    return {
        "num_turns/min": turns.min().item(), "num_turns/max": turns.max().item(), "num_turns/mean": turns.mean().item(),
        "tool_calls/mean": calls.mean().item(), "tool_calls/max": calls.max().item(),
        "tool_calls/episodes_with_calls": (calls > 0).float().mean().item(),
        "tool_calls/errors": float(errors), "timing_s/tool_calls": tool_seconds, "timing_s/agent_loop": seconds,
    }


def truncate(text: str, limit: int, side: str) -> str:
    """verl's truncation of a long tool response."""
    if len(text) <= limit:
        return text
    if side == "left":
        return "(truncated)..." + text[-limit:]
    if side == "right":
        return text[:limit] + "...(truncated)"
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:]


async def _awaited(method, *args, **kwargs):
    """A tool method's result, async or not (a blocking one in a thread, so calls run concurrently)."""
    if inspect.iscoroutinefunction(method):
        return await method(*args, **kwargs)
    return await asyncio.to_thread(method, *args, **kwargs)


def _after_end_of_turn(tokenizer) -> str:
    """What the template writes between an assistant's end-of-turn token and the next message (Qwen's: a newline),
    which the engine stops before."""
    if not getattr(tokenizer, "chat_template", None) or tokenizer.eos_token is None:
        return ""
    text = _template(tokenizer, [{"role": "user", "content": "."}, {"role": "assistant", "content": "X"}], [], False)
    tail = text.rsplit("X" + tokenizer.eos_token, 1)
    return tail[1] if len(tail) == 2 else ""


def _template(tokenizer, messages, schemas, generation: bool) -> str:
    if not getattr(tokenizer, "chat_template", None):
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + ("assistant: " if generation else "")
    return tokenizer.apply_chat_template(messages, tools=schemas or None, tokenize=False,
                                         add_generation_prompt=generation)
