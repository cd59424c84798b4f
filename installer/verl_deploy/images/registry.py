"""Pull and push images with a progress bar per layer, and one clear line when a registry says no; where an
image goes when pushed to a registry, and the digest the registry gave it."""

from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn

from verl_deploy.images.context import ImageError
from verl_deploy.images.engine import ask_quietly, engine, inspect_local

# Per-layer statuses that end a layer's bar.
LAYER_DONE = ("Pull complete", "Already exists", "Pushed", "Layer already exists", "Mounted from")


def has_registry(ref: str) -> bool:
    """Whether ref names its registry host: its first component has a '.' or a ':' or is localhost, as Docker
    reads it. `verl-deploy:0.1.0-cu128`, `ubuntu:22.04` and `team/verl-deploy:1` do not: they are Docker Hub's."""
    first, _, rest = ref.partition("/")
    return bool(rest) and ("." in first or ":" in first or first == "localhost")


def registry_of(ref: str) -> str:
    """The registry host of an image reference (Docker Hub when the first part is not a host)."""
    return ref.partition("/")[0] if has_registry(ref) else "docker.io"


# Docker's reference grammar (github.com/distribution/reference, regexp.go): a host is dot-separated
# alphanumeric components with inner dashes, or an IPv6 address in brackets, with an optional :port; a path
# component is lowercase alphanumerics joined by one '.', one or two '_', or any number of '-'.
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[a-fA-F0-9:]+\])"
_PORT = r"(?::[0-9]+)?"
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*")
_NAME_MAX = 255  # the longest repository name (registry and path) a reference may have
_REGISTRY_FORM = "HOST[:PORT][/PATH], e.g. registry.example.com:5000/team"


def check_registry(registry: str | None) -> str:
    """--registry HOST[:PORT][/PATH] checked against Docker's reference grammar, without a trailing '/';
    ImageError (one line) saying what is wrong."""
    if not registry:
        raise ImageError(f"where to? pass --registry {_REGISTRY_FORM}")
    if "://" in registry:
        raise ImageError(f"registry {registry}: drop the scheme, a registry is {_REGISTRY_FORM} (whether it "
                         "speaks HTTPS or plain HTTP is the Docker engine's setting)")
    host, _, path = registry.rstrip("/").partition("/")
    if not re.fullmatch(_HOST + _PORT, host):
        raise ImageError(f"registry {registry}: {host!r} is not a host[:port] ({_REGISTRY_FORM})")
    if not has_registry(f"{host}/x"):
        # Docker would read it as a Docker Hub account and push there.
        raise ImageError(f"registry {registry}: Docker reads {host!r} as a Docker Hub account, not a host: give a "
                         f"host with a '.' or a :PORT ({host}:5000, {host}.example.com) or localhost")
    for component in path.split("/") if path else []:
        if not _PATH_COMPONENT.fullmatch(component):
            raise ImageError(f"registry {registry}: path component {component!r} must be lowercase letters and "
                             "digits, joined by '.', '_', '__' or '-'")
    return registry.rstrip("/")


def push_target(local_ref: str, registry: str) -> str:
    """Where local_ref goes in registry (checked HOST[:PORT][/PATH]): REGISTRY/<repository>:<tag>, its repository
    name and tag kept, its own registry host (when it names one) left out: verl-deploy:0.1.0-cpu in
    127.0.0.1:5000/team is 127.0.0.1:5000/team/verl-deploy:0.1.0-cpu."""
    if "@" in local_ref:
        raise ImageError(f"{local_ref}: name the local image by its tag (REPOSITORY:TAG); a digest names what is "
                         "already in a registry")
    repository, tag = _split_tag(local_ref)
    if has_registry(repository):
        repository = repository.partition("/")[2]
    target = f"{registry}/{repository}"
    if len(target) > _NAME_MAX:
        raise ImageError(f"{target} is longer than the {_NAME_MAX} characters a repository name may have: "
                         "use a shorter --registry path")
    return f"{target}:{tag or 'latest'}"


def _split_tag(ref: str) -> tuple[str, str]:
    """(repository, tag) of REPOSITORY[:TAG]; the tag is after the last ':' that follows the last '/' (a ':' before
    it is a registry's port)."""
    repository, colon, tag = ref.rpartition(":")
    return (repository, tag) if colon and "/" not in tag else (ref, "")


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

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self.layers:
            # A failure is said in one line: its bars go (a terminal clears them, a log never gets them).
            self.progress.live.transient = exc_type is not None
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


def digest_in(line: str) -> str | None:
    """The sha256 digest in push's closing line (`<tag>: digest: sha256:... size: N`), if it has one."""
    found = re.search(r"digest: (sha256:[0-9a-f]{64})", line)
    return found.group(1) if found else None


def publish(local_ref: str, registry: str, console: Console, missing: str) -> str:
    """Push local_ref to registry (checked HOST[:PORT][/PATH]) as push_target names it, tagging it so first (the
    tag stays, as after `docker tag`); the pushed reference pinned to the registry's digest (REF@sha256:...). When
    local_ref is not here but its target is (built with `images build --registry`), that is pushed. ImageError
    (one line): the image is missing (`missing` then says what to do), or the registry says no."""
    import docker

    target = push_target(local_ref, registry)
    client = engine()
    try:
        client.images.get(local_ref).tag(*_split_tag(target))
    except docker.errors.ImageNotFound:
        try:
            client.images.get(target)
        except docker.errors.ImageNotFound:
            raise ImageError(f"{local_ref} is not on this host: {missing}") from None
    except docker.errors.APIError as exc:  # e.g. a --tag that is no image reference at all
        raise ImageError(f"cannot tag {local_ref} as {target}: {_short(str(exc.explanation or exc))}") from None
    line = push(target, console)
    digest = digest_in(line)
    return f"{target}@{digest}" if digest else pinned(target)


def pinned(ref: str) -> str:
    """ref pinned to the digest its registry gave when this engine pushed or pulled it (REPO:TAG@sha256:...,
    which Kubernetes pulls as that exact image); ref as given when it has a digest already, when the engine does
    not know it, or when no engine answers (never raises).

    Where the fact comes from: the Docker engine API's image inspect (GET /images/{name}/json) lists RepoDigests,
    REPOSITORY@DIGEST, which the engine records when it pushes the image to or pulls it from a registry. The image
    is the one ref's tag names here now, so a tag moved to a new build since its push is not pinned to the old."""
    if "@" in ref:
        return ref
    repository = _split_tag(ref)[0]
    for entry in (inspect_local(ref) or {}).get("RepoDigests") or []:  # no engine or no such image: none
        name, _, digest = entry.partition("@")
        if _familiar(name) == _familiar(repository):
            return f"{ref}@{digest}"
    return ref


def registry_pinned(ref: str, timeout: int = 10) -> str | None:
    """ref pinned to the digest its registry has for it now, or None where the registry does not have it, cannot
    be reached, or no engine answers (never raises): for a choice with a fallback, such as the services image.

    Where the fact comes from: the registry itself, asked through the Docker engine API's distribution inspect
    (GET /distribution/{name}/json), with this engine's credentials for it."""
    digest = ask_quietly(lambda client: client.images.get_registry_data(ref).id, timeout)
    return f"{ref}@{digest}" if digest and digest.startswith("sha256:") else None


def _familiar(repository: str) -> str:
    """Docker Hub's repositories as the engine shows them (docker.io/library/ubuntu is ubuntu)."""
    if has_registry(repository):
        host, _, path = repository.partition("/")
        if host not in ("docker.io", "index.docker.io"):
            return repository
        repository = path
    return repository.removeprefix("library/")


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
