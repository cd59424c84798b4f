"""Is a local image stale? One that would train other code than this CLI's: built for another release of its
runtime, or from other trainer code under the same release (the label verl-deploy.runtime-source).

`images list`, `run` and doctor say so in one line, instead of training old code without a word.
"""

from __future__ import annotations

from verl_deploy import compat
from verl_deploy.images.context import ImageError, runtime, runtime_source, runtime_version
from verl_deploy.images.engine import inspect_local


def stale_reason(labels: dict[str, str]) -> str | None:
    """Why an image with these labels is stale, or None (not ours, or current)."""
    if "verl-deploy.variant" not in labels:
        return None  # not one of our images: nothing to compare
    if labels.get("verl-deploy.verl-source"):
        return None  # a --verl-source image trains the user's verl: `run --verl-source` compares its source itself
    name = labels.get("verl-deploy.runtime") or compat.DEFAULT_RUNTIME
    try:
        expected = runtime_version(runtime(name).name)
    except ImageError:
        return f"built for runtime {name}, which this CLI does not know"
    built = labels.get("verl-deploy.runtime-version")
    if built and built != expected:
        return f"built for {name} {built}, this CLI runs {expected}"
    source = labels.get("verl-deploy.runtime-source")
    if name == compat.DEFAULT_RUNTIME and source and source != runtime_source():
        return f"built from other trainer code than this CLI's ({source[7:19]} vs {runtime_source()[7:19]})"
    return None


def rebuild_hint(labels: dict[str, str]) -> str:
    name = labels.get("verl-deploy.runtime") or compat.DEFAULT_RUNTIME
    flag = "" if name == compat.DEFAULT_RUNTIME else f" --runtime {name}"
    return f"verl-deploy images build --variant {labels.get('verl-deploy.variant', 'auto')}{flag}"


def warning(image: str, labels: dict[str, str]) -> str | None:
    """The one line to print for a stale image, or None."""
    reason = stale_reason(labels)
    if reason is None:
        return None
    return f"warning: image {image} is stale ({reason}): it would train other code; rebuild it: `{rebuild_hint(labels)}`"


def local_labels(image: str) -> dict[str, str] | None:
    """The labels of a local image, or None where there is no such image or no engine answers (never raises)."""
    found = inspect_local(image)
    return None if found is None else (found.get("Config") or {}).get("Labels") or {}
