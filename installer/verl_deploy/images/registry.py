"""Pull and push images with a progress bar per layer, and one clear line when a registry says no."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn

from verl_deploy.images.context import ImageError
from verl_deploy.images.engine import engine

# Per-layer statuses that end a layer's bar.
LAYER_DONE = ("Pull complete", "Already exists", "Pushed", "Layer already exists", "Mounted from")


def registry_of(ref: str) -> str:
    """The registry host of an image reference (Docker Hub when the first part is not a host)."""
    first, _, rest = ref.partition("/")
    return first if rest and ("." in first or ":" in first or first == "localhost") else "docker.io"


def explain(message: str, ref: str, action: str) -> str:
    """One line for a registry failure: refused credentials, an unknown tag, or a registry out of reach."""
    registry, text = registry_of(ref), " ".join(message.split())
    low = text.lower()
    if any(s in low for s in ("connection refused", "no such host", "i/o timeout", "network is unreachable",
                              "no route to host", "tls handshake timeout", "context deadline exceeded")):
        return f"cannot reach registry {registry}: check its address and that it is up ({_short(text)})"
    if "http response to https client" in low:
        return (f"registry {registry} speaks plain HTTP: add it to the engine's insecure-registries "
                f"(/etc/docker/daemon.json) or serve it over TLS")
    if any(s in low for s in ("unauthorized", "authentication required", "no basic auth credentials",
                              "denied", "forbidden")):
        return (f"{action} {ref}: registry {registry} refused access: run `docker login {registry}` "
                f"with an account that may {action} it")
    if any(s in low for s in ("manifest unknown", "not found", "does not exist")):
        return (f"{ref} is not in registry {registry}: check the tag (`verl-deploy images list`), "
                f"or build and push it (`verl-deploy images build --variant V --tag {ref} --push`)")
    return f"{action} {ref} failed: {_short(text)}"


def _short(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class LayerBars:
    """A rich progress bar per layer, fed by the engine's pull/push events."""

    def __init__(self, console: Console):
        self.progress = Progress(
            TextColumn("{task.fields[layer]}"), TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
            console=console,
        )
        self.layers: dict[str, TaskID] = {}
        self.messages: list[str] = []

    def __enter__(self) -> "LayerBars":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.layers:
            self.progress.stop()

    def feed(self, event: dict) -> None:
        status, layer = event.get("status", ""), event.get("id")
        if not layer or not status or status.startswith(("Pulling from", "The push refers to")):
            if status:
                self.messages.append(status)
            return
        if not self.layers:
            self.progress.start()  # only now: a failure before the first layer prints its one line alone
        if layer not in self.layers:
            self.layers[layer] = self.progress.add_task(status, layer=layer, total=None)
        task, detail = self.layers[layer], event.get("progressDetail") or {}
        if status.startswith(LAYER_DONE):
            total = self.progress.tasks[self.layers[layer]].total or 1
            self.progress.update(task, description=escape(status), total=total, completed=total)
        elif detail.get("total"):
            self.progress.update(task, description=escape(status), total=detail["total"], completed=detail["current"])
        else:
            self.progress.update(task, description=escape(status))


def pull(ref: str, console: Console) -> str:
    """Pull ref with a bar per layer; the engine's closing status line. ImageError (one line) when the
    registry says no."""
    messages = _transfer("pull", ref, console)
    return messages[-1] if messages else f"pulled {ref}"


def push(ref: str, console: Console) -> str:
    """Push ref with a bar per layer; the registry's digest line. ImageError (one line) when it says no."""
    messages = _transfer("push", ref, console)
    return next((m for m in reversed(messages) if "digest:" in m), f"pushed {ref}")


def _transfer(action: str, ref: str, console: Console) -> list[str]:
    import docker
    from docker.utils import parse_repository_tag

    api = engine(timeout=3600).api
    repository, tag = parse_repository_tag(ref)
    call = api.pull if action == "pull" else api.push
    try:
        with LayerBars(console) as bars:
            for event in call(repository, tag=tag or "latest", stream=True, decode=True):
                if "error" in event:
                    raise ImageError(explain(event["error"], ref, action))
                bars.feed(event)
    except docker.errors.APIError as exc:
        raise ImageError(explain(str(exc.explanation or exc), ref, action)) from None
    return bars.messages
