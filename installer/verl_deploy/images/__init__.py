"""`verl-deploy images`: build, pull, push and list the image variants of docker/variants.yaml.

    context   options, build args and the build context (pure; no engine)
    build     the build through the docker SDK with a live display of its steps
    registry  pull and push with a bar per layer, one line when a registry says no
    listing   the variants, their local images, and whether this host runs them
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from verl_deploy import host_facts, runtimes
from verl_deploy.compat import DEFAULT_RUNTIME
from verl_deploy.images.context import (
    SERVICES, BuildOptions, ImageError, build_defaults, host_ca_bundle, image_tag, runtime, services_tag, source_tag,
    variant,
)

__all__ = ["SERVICES", "BuildOptions", "ImageError", "ensure", "image_tag", "plan_build", "pull_ref", "resolve_variant",
           "services_tag"]


def resolve_variant(name: str, runtime_name: str = DEFAULT_RUNTIME) -> str:
    """A variant name of a runtime; `auto` is compat.variant_for's for an image this host runs (what its driver and
    GPUs run best; no NVIDIA GPU: cpu, where the runtime has one; else ImageError saying why none runs)."""
    from verl_deploy import compat

    if name == SERVICES and runtime_name == DEFAULT_RUNTIME:
        return name
    try:
        name = compat.variant_for(name, wants_gpus=True, on_this_host=True, runtime=runtime(runtime_name).name)
    except (LookupError, ValueError) as exc:  # none runs here; a recorded reading that is not one
        raise ImageError(str(exc)) from None
    return variant(name, runtime_name).name


def plan_build(
    variant_name: str,
    *,
    base_image: str | None = None,
    tag: str | None = None,
    registry: str | None = None,
    pip_index_url: str | None = None,
    pip_extra_index_urls: tuple[str, ...] = (),
    torch_index_url: str | None = None,
    wheelhouse: Path | None = None,
    ca_bundle: Path | None = None,
    keep_ca_bundle: bool = False,
    no_cache: bool = False,
    env: dict[str, str] | None = None,
    runtime_name: str = DEFAULT_RUNTIME,
    verl_source=None,
) -> tuple[BuildOptions, list[str]]:
    """The options of one build and notes for the user (which CA bundle, which variant `auto` chose). verl_source: a
    resolved verl_source.VerlSource (`--runtime verl --verl-source SRC`): the variant and pins are chosen for it
    (verl_source.SourceError, one line, where no catalogued variant runs its declared pins)."""
    notes = []
    env = os.environ if env is None else env
    pins = None
    if verl_source is not None:
        from verl_deploy.verl_source import choose_pins

        try:
            runtimes.trainer(runtime_name).check_verl_source()
        except ValueError as exc:
            raise ImageError(str(exc)) from None
        pins = choose_pins(verl_source, variant_name)
        name = pins.variant.name
        notes.append(f"verl source {verl_source.location} (commit {(verl_source.commit or 'none')[:12]}"
                     f"{', with uncommitted changes' if verl_source.dirty else ''}): variant {name}, torch {pins.torch}"
                     + (f", vLLM {pins.vllm}" if pins.vllm else "") + f", transformers {pins.transformers or 'unpinned'}"
                     + f" (from {', '.join(verl_source.declared_in) or 'no declared dependencies'})")
    else:
        name = resolve_variant(variant_name, runtime_name)
    if variant_name == "auto" and pins is None:
        notes.append(f"variant auto: {name} (what this host's driver and GPUs run best)")
    # This host's pip settings carry over into the build unless told otherwise: mirrors, then the CA bundle.
    if pip_index_url is None and env.get("PIP_INDEX_URL"):
        pip_index_url = env["PIP_INDEX_URL"]
        notes.append("using this host's package index (from PIP_INDEX_URL) inside the build")
    if not pip_extra_index_urls and env.get("PIP_EXTRA_INDEX_URL"):
        pip_extra_index_urls = tuple(env["PIP_EXTRA_INDEX_URL"].split())
        notes.append("using this host's extra package indexes (from PIP_EXTRA_INDEX_URL) inside the build")
    if ca_bundle is None and (found := host_ca_bundle(env)):
        ca_bundle = found[0]
        notes.append(f"using this host's CA bundle {found[0]} (from {found[1]}) for pip inside the build; "
                     f"it stays out of the image{'' if keep_ca_bundle else ' (--keep-ca-bundle keeps it)'}")
    opts = BuildOptions(
        variant=pins.variant if pins else variant(name, runtime_name),
        tag=tag or (source_tag(verl_source, name, registry) if pins else image_tag(name, registry, runtime_name)),
        base_image=base_image or build_defaults()["base_image"],
        pip_index_url=pip_index_url,
        pip_extra_index_urls=tuple(pip_extra_index_urls),
        torch_index_url=torch_index_url,
        wheelhouse=wheelhouse,
        ca_bundle=ca_bundle,
        keep_ca_bundle=keep_ca_bundle,
        no_cache=no_cache,
        source=verl_source,
        pins=pins,
    )
    return opts, notes


def pull_ref(variant_name: str, registry: str | None, tag: str | None, runtime_name: str = DEFAULT_RUNTIME) -> str:
    """What `images pull` pulls: --tag as given, else the variant's tag in --registry (there is no default one)."""
    if tag:
        return tag
    if not registry:
        raise ImageError("no registry publishes verl-deploy images: pass --registry HOST[:PORT] (where you pushed "
                         "them) or --tag REF, or build one: verl-deploy images build --variant V")
    return image_tag(resolve_variant(variant_name, runtime_name), registry, runtime_name)


def ensure(variant_name: str, console: Console | None = None, runtime_name: str = DEFAULT_RUNTIME) -> str:
    """The tag of a variant's local image, built first (with the defaults) when this host lacks it."""
    import docker

    from verl_deploy.images.build import build
    from verl_deploy.images.engine import engine

    name = resolve_variant(variant_name, runtime_name)
    tag = image_tag(name, runtime_name=runtime_name)
    try:
        engine().images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    if not variant(name, runtime_name).is_cpu and not host_facts.read().has_gpu:
        # A CUDA build is GBs and minutes; on a host without a GPU it is never what `run` was meant to start.
        ours = runtime_name == DEFAULT_RUNTIME  # only our runtime has a cpu variant to offer instead
        flags = f"--variant {name}" + ("" if ours else f" --runtime {runtime_name}")
        instead = "use --variant cpu, or " if ours else ""
        raise ImageError(f"{tag} is not on this host, and {name} is a CUDA image while this host has no NVIDIA GPU: "
                         f"{instead}build it on purpose first: verl-deploy images build {flags}")
    console = console or Console(stderr=True)
    opts, notes = plan_build(name, runtime_name=runtime_name)
    for note in notes:
        console.print(note)
    console.print(f"{tag} is not on this host: building it (once)")
    return build(opts, console).tag


def ensure_source(verl_source, variant_name: str = "auto", console: Console | None = None, build_it: bool = True) -> str:
    """The tag of a --verl-source image for this source as it is now (its commit and edit: the labels), built first
    when this host has none or one of another edit (the dependency layers come from the cache: seconds). With
    build_it False (a dry run, a cluster target) only the tag."""
    from verl_deploy.images.stale import local_labels

    opts, notes = plan_build(variant_name, runtime_name="verl", verl_source=verl_source)
    if not build_it:
        return opts.tag
    labels = local_labels(opts.tag) or {}
    wanted = verl_source.labels()
    if all(labels.get(key) == value for key, value in wanted.items()):
        return opts.tag
    if not opts.variant.is_cpu and not host_facts.read().has_gpu:
        raise ImageError(f"{opts.tag} is a CUDA image ({opts.variant.name}) and this host has no NVIDIA GPU: build it "
                         f"on purpose first: verl-deploy images build --runtime verl --verl-source {verl_source.given} "
                         f"--variant {opts.variant.name}")
    from verl_deploy.images.build import build

    console = console or Console(stderr=True)
    for note in notes:
        console.print(note, markup=False)
    console.print(f"{opts.tag} is {'of another edit of the source' if labels else 'not on this host'}: building it",
                  markup=False)
    return build(opts, console).tag
