"""What an image holds, as far as this host can know without starting it: the checks before a launch ask whether
vLLM and a tracker's client are there, where a container would find out only once the trainer starts.

The source of truth is the image's build, not a container: docker/Dockerfile installs the project with the extras
IMAGE_EXTRAS in every variant (the trackers' clients among them), and vLLM at the variant's pin of
docker/variants.yaml (none for cpu); the build checks the pins (docker/build/verify.py) and writes them into the
labels. So an image of the catalog's tag is known from the catalog, and one named with --image from its labels
where this host's engine has it (verl-deploy.vllm: the release, empty for none). Anything else is not known here.
"""

from __future__ import annotations

from verl_deploy import compat

# The extras docker/Dockerfile's deps stage installs in every variant (`pip install ".[runtime,trackers]"`);
# tests/test_prelaunch_checks.py holds the two equal.
IMAGE_EXTRAS = ("runtime", "trackers")
VLLM = "vllm"


def _tracker_modules() -> tuple[str, ...]:
    from verl_runtime.trackers import TRACKERS  # torch-free; each tracker's module is its name

    return TRACKERS if "trackers" in IMAGE_EXTRAS else ()


def of_variant(variant: compat.Variant) -> dict[str, bool]:
    """The modules the checks ask about -> whether an image of this catalog variant has them."""
    return {VLLM: bool(variant.vllm), **{name: True for name in _tracker_modules()}}


def of_labels(labels: dict[str, str] | None) -> dict[str, bool] | None:
    """The same from an image's labels; None for an image that is not one of ours with our runtime (unknown)."""
    if not labels or "verl-deploy.variant" not in labels or "verl-deploy.vllm" not in labels:
        return None
    if (labels.get("verl-deploy.runtime") or compat.DEFAULT_RUNTIME) != compat.DEFAULT_RUNTIME:
        return None
    return {VLLM: bool(labels["verl-deploy.vllm"]), **{name: True for name in _tracker_modules()}}


def with_vllm(runtime: str = compat.DEFAULT_RUNTIME) -> list[str]:
    """The catalog's variants whose images have vLLM."""
    return [name for name, v in compat.load_catalog(runtime=runtime).items() if v.vllm]
