"""Tools as verl declares them: a tool config file (`tools: [{class_name, config, tool_schema}]`, verl/tools/
tool_registry.py) with an OpenAI function schema per tool, and tool objects with verl's BaseTool methods (create,
execute, release; verl/tools/base_tool.py), async or not. verl's own tool classes map to ours (VERL_TOOLS); any
other class_name is imported as verl imports it (module.path.ClassName, the module on PYTHONPATH)."""

from __future__ import annotations

import contextvars
import importlib
import importlib.util
import inspect
import json
import re
import time
import urllib.error
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml

from verl_runtime.errors import ConfigError
from verl_runtime.rewards import gsm8k
from verl_runtime.services import client

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
# When the tool loop stops waiting for the call being made (time.monotonic(); rollout.multi_turn.tool_timeout from
# its start): a service's tool retries a busy service until then, not past it. Set by the loop; a context variable
# reaches the thread a blocking execute runs in (asyncio.to_thread copies it).
CALL_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("CALL_DEADLINE", default=None)


@dataclass
class ToolResponse:
    text: str = ""


class BaseTool:
    """verl's BaseTool: one instance per episode (create), calls on it (execute), then release."""

    def __init__(self, config: dict, tool_schema: dict):
        self.config = dict(config or {})
        self.tool_schema = tool_schema
        self.name = tool_schema["function"]["name"]

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid.uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> tuple[ToolResponse, float, dict]:
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        pass


class Gsm8kTool(BaseTool):
    """verl's GSM8K answer tool (verl.tools.gsm8k_tool.Gsm8kTool): the episode's ground truth comes with create
    (the row's tools_kwargs); each answer is scored as verl's gsm8k scorer does (flexible), the tool reward -0.05
    for an answer no better than the last."""

    def __init__(self, config: dict, tool_schema: dict):
        super().__init__(config, tool_schema)
        self._episodes: dict[str, dict] = {}

    async def create(self, instance_id=None, ground_truth=None, **kwargs):
        instance_id = instance_id or str(uuid.uuid4())
        # verl 0.9.1's loop passes the row's create_kwargs as one keyword; earlier ones spread them
        truth = ground_truth if ground_truth is not None else (kwargs.get("create_kwargs") or {}).get("ground_truth")
        self._episodes[instance_id] = {"ground_truth": str(truth), "reward": 0.0}
        return instance_id, ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        answer = str(parameters.get("answer", ""))
        episode = self._episodes.setdefault(instance_id, {"ground_truth": "", "reward": 0.0})
        shown = answer if answer.startswith("#### ") else f"#### {answer}"
        reward = gsm8k.compute_score(shown, episode["ground_truth"], method="flexible", format_score=0.0, score=1.0)
        tool_reward = 0.0 if reward > episode["reward"] else -0.05
        episode["reward"] = reward
        return ToolResponse(text=f"Current parsed answer={shown!r} reward={reward}"), tool_reward, {}

    async def calc_reward(self, instance_id, **kwargs):
        return self._episodes.get(instance_id, {}).get("reward", 0.0)

    async def release(self, instance_id, **kwargs):
        self._episodes.pop(instance_id, None)


class SandboxFusionTool(BaseTool):
    """verl's code tool (verl.tools.sandbox_fusion_tools.SandboxFusionTool): the `code` argument runs in a sandbox
    that speaks SandboxFusion's run_code API (ours: verl_runtime/services/sandbox.py) at config.sandbox_fusion_url."""

    service = "sandbox"  # the run's services.sandbox, where declared, gives the URL

    def __init__(self, config: dict, tool_schema: dict):
        super().__init__(config, tool_schema)
        self.url = self.config.get("sandbox_fusion_url")
        if not self.url:
            raise ConfigError(f"tool {self.name}: config.sandbox_fusion_url is needed (the sandbox's run_code URL, "
                              "e.g. http://127.0.0.1:8080/run_code), or services.sandbox.enable=true to run ours "
                              "with the run")
        self.timeout = float(self.config.get("default_timeout", 30))
        self.language = self.config.get("default_language", "python")
        self.memory_mb = int(self.config.get("memory_limit_mb", 1024))

    def execute(self, instance_id, parameters, **kwargs):  # blocking HTTP: the loop runs it in a thread
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResponse(text="Error: the code argument is missing or empty"), 0.0, {}
        request = {"code": code, "language": self.language, "run_timeout": self.timeout, "memory_limit_MB": self.memory_mb}
        try:
            result = post_json(self.url, request, self.timeout + 10)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return ToolResponse(text=f"Error: the sandbox at {self.url} did not answer: {exc}"), 0.0, {}
        run = result.get("run_result") or {}
        text = (run.get("stdout") or "") + (run.get("stderr") or "")
        if result.get("status") != "Success" and not text:
            text = f"Error: {result.get('message') or run.get('status') or result.get('status')}"
        return ToolResponse(text=text), 0.0, {"status": run.get("status")}


class SearchTool(BaseTool):
    """verl's search tool (verl.tools.search_tool.SearchTool): the `query_list` argument goes to a retriever that
    speaks Search-R1's retrieve API (ours: verl_runtime/services/retriever.py) at config.retrieval_service_url; the
    passages come back as verl formats them ("Doc 1 (Title: ...)"), in {"result": ...}."""

    service = "retriever"  # the run's services.retriever, where declared, gives the URL

    def __init__(self, config: dict, tool_schema: dict):
        super().__init__(config, tool_schema)
        self.url = self.config.get("retrieval_service_url")
        if not self.url:
            raise ConfigError(f"tool {self.name}: config.retrieval_service_url is needed (the retriever's retrieve "
                              "URL, e.g. http://127.0.0.1:8000/retrieve), or services.retriever.enable=true to run "
                              "ours with the run")
        self.topk, self.timeout = int(self.config.get("topk", 3)), float(self.config.get("timeout", 30))

    def execute(self, instance_id, parameters, **kwargs):  # blocking HTTP: the loop runs it in a thread
        queries = parameters.get("query_list")
        if not isinstance(queries, list) or not queries or not all(isinstance(q, str) for q in queries):
            return ToolResponse(text=json.dumps({"result": "Error: query_list must be a list of strings"})), 0.0, {}
        try:
            results = post_json(self.url, {"queries": queries, "topk": self.topk, "return_scores": True},
                                self.timeout)["result"]
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            return ToolResponse(text=json.dumps({"result": f"Error: the retriever at {self.url}: {exc}"})), 0.0, {}
        text = "\n---\n".join(passages(hits) for hits in results)
        return ToolResponse(text=json.dumps({"result": text})), 0.0, {"queries": len(queries)}


def passages(hits: list[dict]) -> str:
    """verl's _passages2string: each hit's title (its first line) and text."""
    shown = []
    for number, hit in enumerate(hits, 1):
        title, _, text = hit.get("document", hit)["contents"].partition("\n")
        shown.append(f"Doc {number} (Title: {title})\n{text}")
    return "\n\n".join(shown)


class CalculatorTool(BaseTool):
    """Ours: evaluates an arithmetic expression (+ - * / // % ** and parentheses over numbers), nothing else."""

    def execute(self, instance_id, parameters, **kwargs):
        expression = str(parameters.get("expression", ""))
        if not re.fullmatch(r"[\d\s.+\-*/%()]{1,200}", expression):
            return ToolResponse(text="Error: only numbers, + - * / % ** and parentheses"), 0.0, {}
        try:
            value = eval(expression, {"__builtins__": {}}, {})  # noqa: S307 - the pattern above admits arithmetic only
        except Exception as exc:  # a malformed expression is the episode's error, told to the model
            return ToolResponse(text=f"Error: {type(exc).__name__}: {exc}"), 0.0, {}
        return ToolResponse(text=str(value)), 0.0, {}


def post_json(url: str, body: dict, timeout: float) -> dict:
    """A service's JSON reply to a JSON POST (the sandbox's, the retriever's), tried again with backoff while the
    service is busy, until the tool loop's deadline for this call (CALL_DEADLINE) or else for `timeout`."""
    deadline = CALL_DEADLINE.get()
    within = timeout if deadline is None else deadline - time.monotonic()
    return client.post_json(url, body, timeout, within=within)


# verl's tool classes (its examples' tool configs name them) -> ours
VERL_TOOLS = {
    "verl.tools.gsm8k_tool.Gsm8kTool": Gsm8kTool,
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": SandboxFusionTool,
    "verl.tools.search_tool.SearchTool": SearchTool,
    "verl_runtime.agent.tools.CalculatorTool": CalculatorTool,
    "verl_runtime.agent.tools.Gsm8kTool": Gsm8kTool,
    "verl_runtime.agent.tools.SandboxFusionTool": SandboxFusionTool,
    "verl_runtime.agent.tools.SearchTool": SearchTool,
}


def check_schema(schema, where: str) -> dict:
    """An OpenAI function tool schema, as verl's OpenAIFunctionToolSchema validates it; ConfigError (one line)."""
    def fail(why):
        raise ConfigError(f"{where}: tool_schema {why} (OpenAI's function schema: type: function, function: {{name, "
                          "description, parameters: {type: object, properties, required}}})")

    if not isinstance(schema, dict) or schema.get("type") != "function" or not isinstance(schema.get("function"), dict):
        fail("needs type: function and a function mapping")
    function = schema["function"]
    if not isinstance(function.get("name"), str) or not _NAME.match(function["name"]):
        fail(f"function.name {function.get('name')!r} must be 1-64 letters, digits, _ or -")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        fail("function.parameters must be type: object")
    properties = parameters.get("properties") or {}
    required = parameters.get("required") or []
    if not isinstance(properties, dict) or not isinstance(required, list):
        fail("function.parameters needs properties as a mapping and required as a list")
    if missing := [name for name in required if name not in properties]:
        fail(f"requires {', '.join(map(str, missing))}, which properties does not define")
    return schema


def tool_class(class_name: str):
    """verl's get_tool_class: ours for verl's own tools, else module.path.ClassName imported."""
    if class_name in VERL_TOOLS:
        return VERL_TOOLS[class_name]
    module_name, _, name = str(class_name).rpartition(".")
    try:
        spec = importlib.util.find_spec(module_name) if module_name else None
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ConfigError(f"unknown tool class {class_name!r}: use one of {', '.join(sorted(VERL_TOOLS))}, or "
                          "module.path.ClassName with the module on PYTHONPATH (as verl loads tools)")
    cls = getattr(importlib.import_module(module_name), name, None)
    if not inspect.isclass(cls) or not callable(getattr(cls, "execute", None)):
        raise ConfigError(f"tool class {class_name!r}: {module_name} has no class {name} with an execute method")
    return cls


def with_service_url(config: dict, cls, services: dict[str, str], where: str) -> dict:
    """A tool's config with the URL of the run's service it calls (services: {name: base URL}), where the run
    declares that service: the tool class's own (`service`), or any tool whose config names the service's key."""
    from verl_runtime.services.registry import SERVICES

    for name, base in services.items():
        service = SERVICES[name]
        if getattr(cls, "service", None) == name or service.url_key in config:
            url = service.url(base)
            if config.get(service.url_key) not in (None, url):
                print(f"{where}: {service.url_key} is the run's {name} service, {url} (was {config[service.url_key]})",
                      flush=True)
            config = {**config, service.url_key: url}
    return config


def load_tools(path, services: dict[str, str] | None = None) -> dict:
    """The tools of a verl tool config file, by name; ConfigError (one line) for a file that does not hold them.
    services: the run's services ({name: base URL}); the tools that call one get its URL."""
    path = Path(path).expanduser()
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"rollout.multi_turn.tool_config_path {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"tool config {path} is not YAML: {str(exc).splitlines()[0]}") from None
    entries = document.get("tools") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"tool config {path} has no tools: list them as tools: [{{class_name, config, "
                          "tool_schema}}] (verl's format)")
    tools = {}
    for index, entry in enumerate(entries):
        where = f"{path} tools[{index}]"
        if not isinstance(entry, dict) or not entry.get("class_name"):
            raise ConfigError(f"{where}: needs a class_name")
        config = entry.get("config") or {}
        if config.get("type", "native") != "native":
            raise ConfigError(f"{where}: tool type {config['type']!r} is not here (native only; MCP tools are not)")
        schema = check_schema(entry.get("tool_schema"), where)
        cls = tool_class(entry["class_name"])
        tool = cls(config=with_service_url(config, cls, services or {}, where), tool_schema=schema)
        if tool.name in tools:
            raise ConfigError(f"{where}: a second tool named {tool.name!r}: give each tool its own function name")
        tools[tool.name] = tool
    return tools
