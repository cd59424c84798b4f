"""`verl-deploy images list`: every catalog variant, its local images, and whether this host can run it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich.markup import escape
from rich.table import Table

from verl_deploy import compat, host_facts
from verl_deploy.images.context import SERVICES, ImageError, image_tag, services_variant
from verl_deploy.images.engine import engine
from verl_deploy.images.stale import rebuild_hint, stale_reason


@dataclass(frozen=True)
class LocalImage:
    tags: tuple[str, ...]
    size: int
    created: str
    stale: str | None = None  # why it would train other code than this CLI's (images/stale.py)
    source: dict | None = None  # a --verl-source image's labels (verl-deploy.verl-source, its commit, the pins)


@dataclass(frozen=True)
class Row:
    variant: compat.Variant
    verdict: compat.Verdict
    images: tuple[LocalImage, ...]


def rows(driver: str | None, capabilities: list[str], local: dict[str, list[LocalImage]]) -> list[Row]:
    """One row per variant of each runtime (ours first): its local images (by the verl-deploy.variant and
    .runtime labels) and compat's verdict; last the services image's, which any host runs (no torch, no CUDA)."""
    services = services_variant()
    return [
        Row(verdict.variant, verdict, tuple(local.get(_key(verdict.variant.runtime, verdict.variant.name), ())))
        for runtime in compat.load_runtimes()
        for verdict in compat.check_variants(driver, capabilities, compat.load_catalog(runtime=runtime))
    ] + [Row(services, compat.Verdict(services, runs=True), tuple(local.get(SERVICES, ())))]


def _key(runtime: str, variant: str) -> str:
    return variant if runtime == compat.DEFAULT_RUNTIME else f"{runtime}/{variant}"


SOURCES = "--verl-source"  # local_images' key of the images built from a user's verl


def local_images() -> dict[str, list[LocalImage]]:
    """This host's verl-deploy images by variant (another runtime's: "runtime/variant"), newest first."""
    found: dict[str, list[LocalImage]] = {}
    for image in engine().api.images(filters={"label": "verl-deploy.variant"}):
        labels = image.get("Labels") or {}
        name = _key(labels.get("verl-deploy.runtime") or compat.DEFAULT_RUNTIME, labels.get("verl-deploy.variant", ""))
        created = datetime.fromtimestamp(image["Created"]).strftime("%Y-%m-%d %H:%M")
        tags = tuple(t for t in image.get("RepoTags") or () if t != "<none>:<none>")
        if tags and labels.get("verl-deploy.verl-source"):  # the user's verl: rows of their own (source_rows)
            found.setdefault(SOURCES, []).append(LocalImage(tags, image["Size"], created, None, labels))
        elif tags:
            found.setdefault(name, []).append(LocalImage(tags, image["Size"], created, stale_reason(labels)))
    for images in found.values():
        images.sort(key=lambda i: i.created, reverse=True)
    return found


def table(found: list[Row], engine_note: str = "", sources: list[LocalImage] | None = None) -> Table:
    """One row per variant. `image` is the tag `run` and `smoke` start (the one `images build` makes); other local
    tags of the variant (a registry's, a --tag of your own) follow it, dimmed."""
    out = Table(title="verl-deploy image variants", caption=engine_note or None)
    for column in ("variant", "CUDA / torch", "image (run uses)", "size", "created", "runs here"):
        # Long registry tags fold rather than squeezing the short columns to an ellipsis.
        out.add_column(column, no_wrap=column in ("variant", "size", "created"), overflow="fold")
    for row in found:
        v, tag = row.variant, image_tag(row.variant.name, runtime_name=row.variant.runtime)
        image = next((i for i in row.images if tag in i.tags), None)
        stale = {t: i.stale for i in row.images for t in i.tags if i.stale}
        others = [t + (f" [yellow](stale: {escape(stale[t])})[/]" if t in stale else "")
                  for t in sorted({t for i in row.images for t in i.tags} - {tag})]
        runs = "[green]yes[/]" if row.verdict.runs else f"[yellow]no[/]: {row.verdict.reason}"
        out.add_row(
            v.name if v.runtime == compat.DEFAULT_RUNTIME else f"{v.name}\n[dim]--runtime {v.runtime}[/]",
            "no torch: the tool services" if v.name == SERVICES else
            f"{v.cuda or 'cpu'} / {v.torch}" + (f" + vLLM {v.vllm}" if v.vllm else "") + _runtime_note(v),
            (tag if image else f"{tag} [dim](not built or pulled)[/]")
            + (f"\n[yellow]stale[/]: {escape(image.stale)}; rebuild: {_hint(v)}" if image and image.stale else "")
            + (f"\n[dim]also: {', '.join(others)}[/]" if others else ""),
            f"{image.size / 1e9:.2f} GB" if image else "",
            image.created if image else "",
            runs,
        )
    for image in sources or ():
        add_source_row(out, image)
    return out


def add_source_row(out: Table, image: LocalImage) -> None:
    """A --verl-source image: its variant, its pins, the source (path or URL, commit, uncommitted changes)."""
    labels = image.source or {}
    pins = f"{labels.get('verl-deploy.cuda') if labels.get('verl-deploy.cuda') not in (None, '', 'none') else 'cpu'}"
    pins += f" / {labels.get('verl-deploy.torch', '')}"
    pins += f" + vLLM {labels['verl-deploy.vllm']}" if labels.get("verl-deploy.vllm") else ""
    pins += f"\ntransformers {labels['verl-deploy.transformers']}" if labels.get("verl-deploy.transformers") else ""
    commit = (labels.get("verl-deploy.verl-source-commit") or "no commit")[:12]
    dirty = " [yellow](uncommitted changes)[/]" if labels.get("verl-deploy.verl-source-dirty") == "true" else ""
    out.add_row(
        f"{labels.get('verl-deploy.variant', '')}\n[dim]--verl-source[/]", pins,
        f"{escape(image.tags[0])}\n[dim]{escape(labels.get('verl-deploy.verl-source', ''))} @ {commit}[/]{dirty}"
        + (f"\n[dim]verl {escape(labels.get('verl-deploy.runtime-version', ''))}[/]"),
        f"{image.size / 1e9:.2f} GB", image.created, "",
    )


def _hint(v: compat.Variant) -> str:
    return rebuild_hint({"verl-deploy.variant": v.name, "verl-deploy.runtime": v.runtime})


def _runtime_note(v: compat.Variant) -> str:
    runtime = compat.load_runtimes()[v.runtime]
    return "" if runtime.is_default else f"\n{runtime.name} {runtime.version}"


def list_variants() -> tuple[list[Row], str, list[LocalImage]]:
    """The rows for this host, a note when the engine could not be asked for local images, and the images built
    from a --verl-source."""
    local: dict[str, Any] = {}
    note = ""
    try:
        local = local_images()
    except ImageError as exc:
        note = str(exc)
    host = host_facts.read()
    return rows(host.driver, host.capabilities, local), note, local.get(SOURCES, [])
