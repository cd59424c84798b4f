"""The Docker engine client (imported lazily: `verl-deploy --help` stays instant)."""

from __future__ import annotations

from typing import Any, Callable

from verl_deploy.images.context import ImageError


def engine(timeout: int = 60) -> Any:
    """A connected docker client; ImageError with what to do when no engine answers. Registry credentials come
    from the usual Docker config (~/.docker/config.json and its credential helpers), read by the SDK."""
    import docker

    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except docker.errors.DockerException as exc:
        raise ImageError(f"cannot reach the Docker engine ({exc}): start it, or run `verl-deploy doctor`") from None
    return client


def ask_quietly(question: Callable[[Any], Any], timeout: int = 5) -> Any:
    """question(client) with a client of its own, or None where it fails or no engine answers within `timeout`
    seconds: for the checks that only add a word or choose a fallback, and must never stop a command. Never raises."""
    try:
        import docker

        client = docker.from_env(timeout=timeout)
        try:
            return question(client)
        finally:
            client.close()
    except Exception:
        return None


def inspect_local(ref: str) -> dict | None:
    """The engine's inspect of a local image (GET /images/{name}/json), or None where there is no such image, the
    reference is malformed or no engine answers within a few seconds (a pinned digest, a stale warning)."""
    return ask_quietly(lambda client: client.api.inspect_image(ref))
