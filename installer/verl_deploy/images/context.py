"""What a build of one image variant is made of: the options, the build args and the build context (a tar).

Pure functions over the variant catalog (docker/variants.yaml, read through compat) and the project source; no
Docker here, so every choice below is tested without an engine. Every file comes from the installed packages (their
code and verl_deploy.assets), so a wheel install and a clone give the same context, byte for byte.
"""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import IO, Any

from verl_deploy import __version__, assets, compat

DOCKER_DIR = assets.path("docker")
DOCKERFILE = DOCKER_DIR / "Dockerfile"  # verl-deploy's runtime; another runtime's is named in the catalog
# The build's own steps (base, toolchain, preflight, verify, prune): under build/ in the context.
BUILD_SCRIPTS = DOCKER_DIR / "build"
# Where the build-only extras sit in the deps stage (see docker/Dockerfile).
EXTRAS = "/extras"


class ImageError(Exception):
    """A problem the user can fix; the message is one line that says how."""


@dataclass(frozen=True)
class BuildOptions:
    """One `verl-deploy images build`."""

    variant: compat.Variant
    tag: str
    base_image: str
    pip_index_url: str | None = None
    pip_extra_index_urls: tuple[str, ...] = ()
    torch_index_url: str | None = None  # None: the catalog's
    wheelhouse: Path | None = None
    ca_bundle: Path | None = None
    keep_ca_bundle: bool = False
    no_cache: bool = False
    # --verl-source: the user's verl (verl_source.VerlSource) and the pins chosen for it (verl_source.Pins); the
    # variant is then pins.variant, built from docker/verl-source.Dockerfile.
    source: Any = None
    pins: Any = None


@lru_cache(maxsize=1)
def build_defaults() -> dict[str, Any]:
    """The catalog's `build:` section: base_image, repository."""
    import yaml

    return dict(yaml.safe_load(compat.CATALOG_PATH.read_text())["build"])


def runtime(name: str = compat.DEFAULT_RUNTIME) -> compat.Runtime:
    """A runtime by name; ImageError naming the known ones otherwise."""
    runtimes = compat.load_runtimes()
    if name not in runtimes:
        raise ImageError(f"unknown runtime '{name}': choose one of {', '.join(runtimes)}")
    return runtimes[name]


SERVICES = "services"  # the variant name of the services image (the catalog's `services:` section)


@lru_cache(maxsize=1)
def services_section() -> dict[str, Any]:
    """The catalog's `services:` section: the services image's description and Dockerfile."""
    import yaml

    return dict(yaml.safe_load(compat.CATALOG_PATH.read_text())["services"])


def services_variant() -> compat.Variant:
    """The services image as a variant: no torch, no CUDA, no vLLM (its Dockerfile installs the services extra)."""
    return compat.Variant(name=SERVICES, description=services_section()["description"], cuda=None, torch="",
                          torch_index_url=None, vllm=None, min_driver=None, compute_capabilities=())


def variant(name: str, runtime_name: str = compat.DEFAULT_RUNTIME) -> compat.Variant:
    """A catalog variant of a runtime by name (`services`: the services image); ImageError naming the known ones
    otherwise."""
    if name == SERVICES and runtime_name == compat.DEFAULT_RUNTIME:
        return services_variant()
    catalog = compat.load_catalog(runtime=runtime(runtime_name).name)
    if name not in catalog:
        of = "" if runtime_name == compat.DEFAULT_RUNTIME else f" of runtime {runtime_name}"
        raise ImageError(f"unknown variant '{name}'{of}: choose one of {', '.join(catalog)} or auto")
    return catalog[name]


def runtime_version(runtime_name: str = compat.DEFAULT_RUNTIME) -> str:
    """The release a runtime's images carry: this project's for its own, the catalog's for the others."""
    return runtime(runtime_name).version or __version__


def image_tag(variant_name: str, registry: str | None = None, runtime_name: str = compat.DEFAULT_RUNTIME) -> str:
    """The tag of a variant's image: [REGISTRY/]verl-deploy:<version>-<variant> for verl-deploy's runtime,
    [REGISTRY/]verl-deploy:<runtime>-<version>-<variant> for another (verl-deploy:verl-0.9.1-cu130)."""
    version = runtime_version(runtime_name)
    prefix = "" if runtime_name == compat.DEFAULT_RUNTIME else f"{runtime_name}-"
    name = f"{build_defaults()['repository']}:{prefix}{version}-{variant_name}"
    return f"{registry.rstrip('/')}/{name}" if registry else name


def dockerfile(v: compat.Variant) -> Path:
    """The Dockerfile of a variant's runtime (docker/Dockerfile for verl-deploy's own; the services image's own)."""
    if v.name == SERVICES:
        return DOCKER_DIR / services_section()["dockerfile"]
    return DOCKER_DIR / runtime(v.runtime).dockerfile


def services_tag(image: str) -> str | None:
    """The services image beside a run's image of the catalog ([REGISTRY/]verl-deploy:<version>-<variant> ->
    [REGISTRY/]verl-deploy:<version>-services); None for an image of another name or runtime."""
    name, _, tag = image.rpartition(":")
    repository = build_defaults()["repository"]
    if "/" in tag or not (name == repository or name.endswith("/" + repository)):
        return None
    version, _, variant_name = tag.rpartition("-")
    if version != runtime_version() or variant_name not in {*compat.load_catalog(), SERVICES}:
        return None
    return f"{name}:{version}-{SERVICES}"


SOURCE_DOCKERFILE = DOCKER_DIR / "verl-source.Dockerfile"  # --verl-source images
SOURCE_TAG_PREFIX = "verl-src-"


def source_tag(source, variant_name: str, registry: str | None = None) -> str:
    """The tag of a --verl-source image: [REGISTRY/]verl-deploy:verl-src-<source name>-<variant>; one per source and
    variant, its commit and edit in its labels (verl_source.VerlSource.labels)."""
    name = f"{build_defaults()['repository']}:{SOURCE_TAG_PREFIX}{source.slug}-{variant_name}"
    return f"{registry.rstrip('/')}/{name}" if registry else name


def host_ca_bundle(env: dict[str, str] | None = None) -> tuple[Path, str] | None:
    """The CA bundle pip uses on this host (PIP_CERT, else REQUESTS_CA_BUNDLE) and the variable that named it."""
    env = os.environ if env is None else env
    for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE"):
        if env.get(name) and Path(env[name]).is_file():
            return Path(env[name]), name
    return None


def wheelhouse_has_torch(wheelhouse: Path | None, torch_version: str) -> bool:
    """Whether the wheelhouse holds a torch wheel of this release (any local build: +cpu, +cu128, ...)."""
    if wheelhouse is None:
        return False
    return any(
        wheel.name.split("-")[1].split("+")[0] == torch_version for wheel in wheelhouse.glob("torch-*.whl")
    )


def torch_index(opts: BuildOptions) -> str | None:
    """The index torch comes from besides the package index: --torch-index-url, else the catalog's (only where
    PyPI lacks the build, e.g. +cpu). None when the wheelhouse holds the pinned torch (then no torch index is
    consulted, which also keeps an air-gapped build off the network for torch) or PyPI has it."""
    if wheelhouse_has_torch(opts.wheelhouse, opts.variant.torch):
        return None
    return opts.torch_index_url or opts.variant.torch_index_url or None


def pip_config(opts: BuildOptions, for_torch: bool = False) -> str:
    """pip.conf for the deps stage. Indexes live here, not in build args, so that a mirror URL with a token
    in it never shows in an image's history."""
    extra = list(opts.pip_extra_index_urls)
    if for_torch and torch_index(opts):
        extra.insert(0, torch_index(opts))
    lines = ["[global]"]
    if opts.pip_index_url:
        lines.append(f"index-url = {opts.pip_index_url}")
    if extra:
        lines.append("extra-index-url = " + "\n    ".join(extra))
    if opts.wheelhouse:
        lines.append(f"find-links = {EXTRAS}/wheelhouse")
    if opts.ca_bundle:
        lines.append(f"cert = {EXTRAS}/ca-bundle.pem")
    # Few retries: preflight.py has already asked every index once.
    lines += ["retries = 2", "timeout = 60", "root-user-action = ignore"]
    return "\n".join(lines) + "\n"


def nvidia_require_cuda(v: compat.Variant) -> str:
    """NVIDIA_REQUIRE_CUDA for the container toolkit: the CUDA its lowest driver runs in full (minor-version
    compatibility makes a cu128 image run on any CUDA 12 driver from 525.60.13, so: cuda>=12.0)."""
    if v.is_cpu or not v.min_driver:
        return ""
    return f"cuda>={compat.max_cuda(v.min_driver)}"


def build_args(opts: BuildOptions) -> dict[str, str]:
    """The Dockerfile's ARGs for this build: the variant's pins and what the labels say (the services image: the
    labels' only, it has no pins)."""
    v = opts.variant
    if v.name == SERVICES:
        return {"BASE_IMAGE": opts.base_image, "VARIANT": v.name, "RUNTIME_VERSION": runtime_version(),
                "RUNTIME_SOURCE": runtime_source()}
    return {
        "BASE_IMAGE": opts.base_image,
        "RUNTIME": v.runtime,
        "RUNTIME_PACKAGES": " ".join(runtime(v.runtime).packages),
        "VARIANT": v.name,
        "CUDA": v.cuda or "none",
        "TORCH_VERSION": v.torch,
        "COMPUTE_CAPABILITIES": ",".join(v.compute_capabilities),
        "VLLM_VERSION": v.vllm or "",
        "COMPILER": "true" if v.compiler else "false",
        "UNUSED": " ".join(unused(v)),
        "ORPHANS": " ".join(build_defaults().get("orphans") or ()),
        "UNUSED_PATHS": " ".join(unused_paths(v)),
        "STRIP": " ".join(v.strip),
        "RUNTIME_VERSION": runtime_version(v.runtime),
        # Our trainer's code, so that an image built from other code under the same version is seen as stale.
        "RUNTIME_SOURCE": runtime_source() if v.runtime == compat.DEFAULT_RUNTIME else "",
        "NVIDIA_VISIBLE_DEVICES": "void" if v.is_cpu else "all",
        "NVIDIA_REQUIRE_CUDA": nvidia_require_cuda(v),
        **(source_build_args(opts) if opts.source is not None else {}),
    }


def source_build_args(opts: BuildOptions) -> dict[str, str]:
    """A --verl-source image's ARGs: the pins chosen for the source (the dependency layers' key) and its labels."""
    source, pins = opts.source, opts.pins
    labels = source.labels()
    return {
        "RUNTIME": "verl",
        "RUNTIME_PACKAGES": " ".join(pins.packages),
        "RUNTIME_VERSION": source.version or "unknown",
        "TRANSFORMERS_VERSION": pins.transformers or "",
        "SOURCE_PYTHONPATH": source.pythonpath,
        "VERL_SOURCE": labels["verl-deploy.verl-source"],
        "VERL_SOURCE_COMMIT": labels["verl-deploy.verl-source-commit"],
        "VERL_SOURCE_DIRTY": labels["verl-deploy.verl-source-dirty"],
        "VERL_SOURCE_DIGEST": labels["verl-deploy.verl-source-digest"],
    }


def unused(v: compat.Variant) -> list[str]:
    """The distributions the build removes: those of every image, then the variant's own."""
    return list(build_defaults().get("unused") or ()) + list(v.unused)


def unused_paths(v: compat.Variant) -> list[str]:
    """What the build removes under site-packages: the catalog's list, and torch's C++ headers where the image
    has no compiler to read them."""
    return list(build_defaults().get("unused_paths") or ()) + ([] if v.compiler else ["torch/include"])


def target(opts: BuildOptions) -> str:
    """The Dockerfile stage to build: the CA bundle stays out of the image unless asked to keep it."""
    return "runtime-with-ca" if opts.keep_ca_bundle else "runtime"


def check(opts: BuildOptions) -> None:
    """ImageError for inputs that would only fail later, inside the build."""
    if opts.wheelhouse and not opts.wheelhouse.is_dir():
        raise ImageError(f"--wheelhouse {opts.wheelhouse} is not a directory")
    if opts.ca_bundle and not opts.ca_bundle.is_file():
        raise ImageError(f"--ca-bundle {opts.ca_bundle} is not a file: pass the PEM bundle of your proxy's CA")
    if opts.keep_ca_bundle and not opts.ca_bundle:
        raise ImageError("--keep-ca-bundle needs a CA bundle: pass --ca-bundle FILE")


def project_sources() -> dict[str, Path]:
    """The project the image installs, by its path in the context (where the Dockerfile COPYs it from): pyproject.toml
    and the pins from the assets (a wheel has no pyproject.toml of its own), the packages from where Python imports
    them (in a clone, the checkout)."""
    return {
        "pyproject.toml": assets.path("pyproject.toml"),
        "installer/constraints.txt": assets.path("installer/constraints.txt"),
        "verl_runtime": assets.package_dir("verl_runtime"),
        "installer/verl_deploy": assets.package_dir("verl_deploy"),
    }


def runtime_source() -> str:
    """A digest of the trainer's code as the image build copies it (verl_runtime, walked as the context walks it):
    the label verl-deploy.runtime-source, which `images list`, `run` and doctor compare with this CLI's."""
    import hashlib

    root, digest = assets.package_dir("verl_runtime"), hashlib.sha256()
    for file in tree(root):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")
    return f"sha256:{digest.hexdigest()}"


def _skipped(name: str) -> bool:
    """Not part of a package as a wheel ships it: caches that Python writes beside the code, and dotfiles (an editor's
    leftovers in a clone; the assets' .env.example and .secrets/, which the image has no use for)."""
    return name == "__pycache__" or name.endswith((".pyc", ".egg-info")) or name.startswith(".")


def tree(root: Path) -> list[Path]:
    """The files under root, sorted; links followed (a clone's assets are links to the repository's files)."""
    found = []
    for folder, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = [d for d in dirs if not _skipped(d)]
        found += [Path(folder) / name for name in names if not _skipped(name)]
    return sorted(found)


def context_members(opts: BuildOptions) -> dict[str, Path | bytes]:
    """Every file of the build context: archive name -> a file on disk or the content itself."""
    members: dict[str, Path | bytes] = {
        "Dockerfile": SOURCE_DOCKERFILE if opts.source is not None else dockerfile(opts.variant)}
    for name, source in project_sources().items():
        if source.is_file():
            members[name] = source
        else:
            members.update((f"{name}/{file.relative_to(source).as_posix()}", file) for file in tree(source))
    for script in sorted([*BUILD_SCRIPTS.glob("*.py"), *BUILD_SCRIPTS.glob("*.sh")]):
        members[f"build/{script.name}"] = script
    members["extras/pip.conf"] = pip_config(opts).encode()
    members["extras/pip-torch.conf"] = pip_config(opts, for_torch=True).encode()
    if opts.ca_bundle:
        members["extras/ca-bundle.pem"] = opts.ca_bundle
    if opts.wheelhouse:
        for wheel in sorted(opts.wheelhouse.glob("*.whl")):
            members[f"extras/wheelhouse/{wheel.name}"] = wheel
    if opts.source is not None:
        from verl_deploy.verl_source import source_files

        members.update((f"source/{name}", file) for name, file in source_files(opts.source.root).items())
    return members


def write_context(opts: BuildOptions, fileobj: IO[bytes]) -> None:
    """The build context as a tar into fileobj. Times and owners are fixed (0, root) so that Docker's layer
    cache sees content changes only."""
    with tarfile.open(fileobj=fileobj, mode="w") as tar:
        for name, source in context_members(opts).items():
            info = tarfile.TarInfo(name)
            info.mode = 0o644
            if isinstance(source, bytes):
                info.size = len(source)
                tar.addfile(info, io.BytesIO(source))
            else:
                info.size = source.stat().st_size
                with source.open("rb") as handle:
                    tar.addfile(info, handle)
