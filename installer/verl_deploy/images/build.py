"""Build an image variant through the Docker engine (docker SDK, low-level API) with a live display of its steps."""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from verl_deploy.images.context import BuildOptions, ImageError, build_args, check, target, write_context
from verl_deploy.images.engine import engine
from verl_deploy.images.progress import PROGRESS, Heartbeat, StepStatus

STEP_LINE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
STEP_DONE = re.compile(r"^ ---> ([0-9a-f]{12})$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the engine colours a step's stderr
NOISE = re.compile(r"^( ---> Running in |Removing intermediate container |Successfully (built|tagged) )")
TAIL_LINES = 25
OWN_PREFIX = "verl-deploy: "  # how docker/build/*.py start the line that says what went wrong


class BuildFailed(ImageError):
    """The engine reported an error; the failing step and its log tail were shown."""


@dataclass
class Step:
    number: int
    total: int
    instruction: str
    started: float
    cached: bool = False
    seconds: float | None = None
    log: list[str] = field(default_factory=list)
    status: StepStatus = field(default_factory=StepStatus)


@dataclass
class BuildLog:
    """Folds the classic builder's decoded JSON stream into steps and their log lines."""

    clock: Callable[[], float] = time.monotonic
    steps: list[Step] = field(default_factory=list)
    image_id: str | None = None
    error: str | None = None
    plain: list[str] = field(default_factory=list)  # what a plain log prints of the steps' output, not yet taken

    @property
    def current(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    def feed(self, event: dict) -> list[Step]:
        """Take one event; return the steps it finished."""
        if "error" in event:
            self.error = str(event["error"]).strip()
            return []
        if "aux" in event:
            self.image_id = event["aux"].get("ID", self.image_id)
            return []
        text = ANSI.sub("", event.get("stream") or _status_line(event))
        return [step for line in text.splitlines() if (step := self._line(line.rstrip()))]

    def _line(self, line: str) -> Step | None:
        """Take one line; return the step it finished: by its layer id, or by the next step starting (steps
        such as a global ARG make no layer)."""
        step, now = self.current, self.clock()
        if match := STEP_LINE.match(line):
            self.steps.append(Step(int(match[1]), int(match[2]), match[3], now, status=StepStatus(self.clock)))
            return self._finish(step, now) if step and step.seconds is None else None
        if step and line == " ---> Using cache":
            step.cached = True
        elif step and step.seconds is None and STEP_DONE.match(line):
            return self._finish(step, now)
        elif step and line.strip() and not NOISE.match(line):
            self.plain += step.status.feed(line)
            if not PROGRESS.match(line.strip()):
                step.log.append(line)
        return None

    def take_plain(self) -> list[str]:
        taken, self.plain = self.plain, []
        return taken

    @staticmethod
    def _finish(step: Step, now: float) -> Step:
        step.seconds = now - step.started
        return step


def _status_line(event: dict) -> str:
    """A base-image pull inside a build reports status events; keep their text as log lines."""
    status = event.get("status")
    return f"{event.get('id', '')} {status}".strip() if status and "progressDetail" not in event else ""


@dataclass(frozen=True)
class Built:
    tag: str
    image_id: str
    size: int
    seconds: float


def build(opts: BuildOptions, console: Console) -> Built:
    """Build opts.variant as opts.tag; BuildFailed after showing the failing step and the tail of its log."""
    import docker

    check(opts)
    api = engine(timeout=3600).api
    log, started = BuildLog(), time.monotonic()
    with tempfile.TemporaryFile() as context, Display(console, opts.tag) as display:
        write_context(opts, context)
        context.seek(0)
        stream = api.build(
            fileobj=context, custom_context=True, tag=opts.tag, buildargs=build_args(opts), target=target(opts),
            nocache=opts.no_cache, rm=True, forcerm=True, decode=True,
        )
        for event in _events(stream, docker.errors.APIError):
            display.show(log, log.feed(event))
    if log.error:
        raise _failure(log, console, opts.base_image)
    image = api.inspect_image(opts.tag)
    return Built(opts.tag, image["Id"], image["Size"], time.monotonic() - started)


class Display:
    """A ✓ line per finished step, and what the current step is doing: in a terminal a step bar with the step's
    status under it; in a log its output as plain lines (progress throttled) and a line when it has been quiet."""

    def __init__(self, console: Console, tag: str):
        self.console, self.terminal = console, console.is_terminal
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console,
        )
        self.task = self.progress.add_task(f"building {tag}", total=None)
        self.status = Text("", style="dim", no_wrap=True, overflow="ellipsis")
        self.live = Live(Group(self.progress, self.status), console=console, transient=True)
        self.heartbeat = Heartbeat(self._plain)

    def __enter__(self) -> "Display":
        (self.live if self.terminal else self.heartbeat).__enter__()
        return self

    def __exit__(self, *exc) -> None:
        (self.live if self.terminal else self.heartbeat).__exit__(*exc)

    def show(self, log: BuildLog, finished: list[Step]) -> None:
        for line in log.take_plain():
            if not self.terminal:
                self._plain(f"    {line}")
        for step in finished:
            self.console.print(_step_line(step), soft_wrap=True)
        if step := log.current:
            doing = f"Step {step.number}/{step.total} {_short(step.instruction, 50)}"
            self.heartbeat.beat(doing)
            self.progress.update(self.task, total=step.total, completed=step.number - 1, description=escape(doing))
            self.status.plain = step.status.status

    def _plain(self, line: str) -> None:
        self.console.print(escape(line), highlight=False, soft_wrap=True)


def _events(stream, api_error: type[Exception]):
    """The engine's events; an API error (a Dockerfile it cannot parse, a bad target) as an error event."""
    try:
        yield from stream
    except api_error as exc:
        yield {"error": str(getattr(exc, "explanation", None) or exc)}


def _step_line(step: Step) -> str:
    when = "cached" if step.cached else f"{step.seconds:.1f}s"
    return f"[green]✓[/] Step {step.number}/{step.total} {escape(_short(step.instruction, 90))} [dim]{when}[/]"


def _failure(log: BuildLog, console: Console, base_image: str) -> BuildFailed:
    step = log.current
    if step is None:
        return BuildFailed(f"build failed before its first step: {log.error}")
    if step.instruction.startswith("FROM ${BASE_IMAGE}"):
        return BuildFailed(f"base image {base_image} is not on this host and could not be pulled ({log.error}): "
                           "pull it, or pass --base-image IMAGE that this engine has")
    console.print(f"[red]✗ Step {step.number}/{step.total} {escape(_short(step.instruction, 90))}[/]", soft_wrap=True)
    for line in step.log[-TAIL_LINES:]:
        console.print(f"    {escape(line)}", highlight=False, soft_wrap=True)
    # The build's own checks (docker/build/*.py) say what is wrong and what to do in one line: that is the error.
    said = [line.strip()[len(OWN_PREFIX):] for line in step.log if line.strip().startswith(OWN_PREFIX)]
    why = said[-1] if said else log.error
    return BuildFailed(f"build failed at step {step.number}/{step.total} ({_short(step.instruction, 60)}): {why}")


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
