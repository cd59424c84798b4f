"""Compatibility facts: NVIDIA driver -> CUDA, GPU compute capability -> image variant.

Facts from NVIDIA's CUDA compatibility guide and toolkit release notes (Linux x86_64), kept as data.
The variant catalog itself lives in docker/variants.yaml; this module reads it and decides what runs where.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from verl_deploy import assets, host_facts

CATALOG_PATH = assets.path("docker/variants.yaml")

# The runtime of the catalog's `variants:` (verl_runtime); the others are the catalog's `runtimes:`.
DEFAULT_RUNTIME = "verl-deploy"

# The driver floor the verl tutorial asks for; it is also CUDA 12.x's minor-version-compatibility floor.
DRIVER_FLOOR = "525.60.13"

# Driver bundled with each CUDA toolkit release: from this driver on, that CUDA has its full feature set.
TOOLKIT_DRIVERS: tuple[tuple[str, str], ...] = (
    ("11.0", "450.51.06"),
    ("11.1", "455.23.05"),
    ("11.2", "460.27.03"),
    ("11.3", "465.19.01"),
    ("11.4", "470.42.01"),
    ("11.5", "495.29.05"),
    ("11.6", "510.39.01"),
    ("11.7", "515.43.04"),
    ("11.8", "520.61.05"),
    ("12.0", "525.60.13"),
    ("12.1", "530.30.02"),
    ("12.2", "535.54.03"),
    ("12.3", "545.23.06"),
    ("12.4", "550.54.14"),
    ("12.5", "555.42.02"),
    ("12.6", "560.28.03"),
    ("12.8", "570.86.10"),
    ("12.9", "575.51.03"),
    ("13.0", "580.65.06"),
    ("13.1", "590.44.01"),
    ("13.2", "595.45.04"),
)

# Minor-version compatibility: anything built with a CUDA major.x toolkit runs on a driver at the family's floor.
FAMILY_FLOORS: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

# Blackwell (compute capability 10.x, 12.x) needs CUDA >= 12.8 and a driver that knows the GPU (the 12.8 one).
BLACKWELL_MAJORS = (10, 12)
BLACKWELL_MIN_CUDA = "12.8"
BLACKWELL_MIN_DRIVER = "570.86.10"


@dataclass(frozen=True)
class Variant:
    """One image variant of docker/variants.yaml."""

    name: str
    description: str
    cuda: str | None
    torch: str
    torch_index_url: str | None  # None: PyPI has this build
    vllm: str | None
    min_driver: str | None
    compute_capabilities: tuple[str, ...]
    compiler: bool = False
    unused: tuple[str, ...] = ()  # distributions the build removes again: nothing in the image uses them
    strip: tuple[str, ...] = ()  # globs under site-packages whose ELF files lose their symbol tables
    runtime: str = DEFAULT_RUNTIME  # what trains in the image (the catalog's `runtimes:`)

    @property
    def is_cpu(self) -> bool:
        return self.cuda is None


@dataclass(frozen=True)
class Runtime:
    """What trains inside an image: verl-deploy's own runtime, or one of the catalog's `runtimes:`."""

    name: str
    description: str
    version: str | None = None  # None: this project's version
    dockerfile: str = "Dockerfile"  # under docker/
    packages: tuple[str, ...] = ()  # pip requirements beside torch and vLLM
    trainer: tuple[str, ...] = ()  # the training command ((): `python -m verl_runtime`, the image's entrypoint)

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_RUNTIME


@dataclass(frozen=True)
class Verdict:
    """Whether a variant runs on a host, and why not when it does not."""

    variant: Variant
    runs: bool
    reason: str = ""
    remedy: str = ""
    needs_driver: str | None = None  # set when a newer driver alone would make it run


def load_catalog(path: Path | None = None, runtime: str = DEFAULT_RUNTIME) -> dict[str, Variant]:
    """The variants of one runtime's images, in file order, keyed by name (KeyError: no such runtime)."""
    return dict(_load_catalog(path or CATALOG_PATH)[runtime])


def load_runtimes(path: Path | None = None) -> dict[str, Runtime]:
    """Every runtime an image can carry, verl-deploy's own first."""
    return dict(_load_runtimes(path or CATALOG_PATH))


@lru_cache(maxsize=4)
def _read(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


@lru_cache(maxsize=4)
def _load_runtimes(path: Path) -> tuple[tuple[str, Runtime], ...]:
    own = Runtime(DEFAULT_RUNTIME, "verl_runtime, this project's single-controller trainer")
    others = (
        Runtime(name=name, description=spec.get("description", ""), version=str(spec["version"]),
                dockerfile=spec["dockerfile"], packages=tuple(spec.get("packages") or ()),
                trainer=tuple(spec["trainer"]))
        for name, spec in (_read(path).get("runtimes") or {}).items()
    )
    return tuple((runtime.name, runtime) for runtime in (own, *others))


@lru_cache(maxsize=4)
def _load_catalog(path: Path) -> dict[str, tuple[tuple[str, Variant], ...]]:
    data = _read(path)
    catalogs = {DEFAULT_RUNTIME: tuple((name, _variant(name, spec)) for name, spec in data["variants"].items())}
    for runtime, spec in (data.get("runtimes") or {}).items():
        # A runtime's variant keeps its plain variant's CUDA, driver floor and compiler; its pins replace the rest.
        catalogs[runtime] = tuple(
            (name, _variant(name, {"cuda": data["variants"][name]["cuda"],
                                   "min_driver": data["variants"][name]["min_driver"],
                                   "compiler": data["variants"][name].get("compiler", False), **own}, runtime))
            for name, own in spec["variants"].items()
        )
    return catalogs


def _variant(name: str, spec: dict, runtime: str = DEFAULT_RUNTIME) -> Variant:
    return Variant(
        name=name,
        description=spec.get("description", ""),
        cuda=_str_or_none(spec.get("cuda")),
        torch=str(spec["torch"]),
        torch_index_url=_str_or_none(spec.get("torch_index_url")),
        vllm=_str_or_none(spec.get("vllm")),
        min_driver=_str_or_none(spec.get("min_driver")),
        compute_capabilities=tuple(str(cc) for cc in spec.get("compute_capabilities") or ()),
        compiler=bool(spec.get("compiler", False)),
        unused=tuple(str(name) for name in spec.get("unused") or ()),
        strip=tuple(str(glob) for glob in spec.get("strip") or ()),
        runtime=runtime,
    )


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def version_tuple(version: str) -> tuple[int, ...]:
    """'580.159.04' -> (580, 159, 4); '12.8' -> (12, 8)."""
    return tuple(int(part) for part in version.strip().split("."))


def cuda_from_nvml(value: int) -> str:
    """NVML's integer CUDA version (13000) as 'major.minor' ('13.0')."""
    return f"{value // 1000}.{value % 1000 // 10}"


def max_cuda(driver: str) -> str | None:
    """The newest CUDA toolkit this driver fully supports, or None when older than any CUDA 11."""
    best = None
    for cuda, bundled in TOOLKIT_DRIVERS:
        if version_tuple(driver) >= version_tuple(bundled):
            best = cuda
    return best


def driver_runs_cuda(driver: str, cuda: str) -> bool:
    """Whether a driver runs code built for a CUDA version (minor-version compatibility included)."""
    floor = FAMILY_FLOORS.get(version_tuple(cuda)[0])
    return floor is not None and version_tuple(driver) >= version_tuple(floor)


def meets_floor(driver: str) -> bool:
    return version_tuple(driver) >= version_tuple(DRIVER_FLOOR)


def is_blackwell(capability: str) -> bool:
    return version_tuple(capability)[0] in BLACKWELL_MAJORS


def capability_supported(capability: str, built: tuple[str, ...]) -> bool:
    """A GPU runs a wheel's kernels when built for its compute capability or an older one of the same major
    (CUDA binary compatibility: sm_86 code runs on an sm_89 GPU, never across majors)."""
    major, minor = version_tuple(capability)[:2]
    return any(
        version_tuple(cc)[0] == major and version_tuple(cc)[1] <= minor for cc in built
    )


def check_variant(variant: Variant, driver: str | None, capabilities: list[str]) -> Verdict:
    """Whether `variant` runs on a host with this driver (None: no NVIDIA driver) and these GPUs."""
    if variant.is_cpu:
        return Verdict(variant, True)
    if driver is None or not capabilities:
        return Verdict(variant, False, "no NVIDIA GPU on this host", "use the cpu variant, or run on a GPU host")
    blackwell = False
    for capability in sorted(set(capabilities), key=version_tuple):
        if not capability_supported(capability, variant.compute_capabilities):
            built = ", ".join(variant.compute_capabilities)
            hint = f"; Blackwell needs CUDA >= {BLACKWELL_MIN_CUDA}" if is_blackwell(capability) else ""
            return Verdict(
                variant,
                False,
                f"compute capability {capability} is not built into {variant.name}'s wheels (built: {built}){hint}",
                "pick a variant whose wheels include it",
            )
        if is_blackwell(capability) and version_tuple(variant.cuda) < version_tuple(BLACKWELL_MIN_CUDA):
            return Verdict(
                variant,
                False,
                f"Blackwell (compute capability {capability}) needs CUDA >= {BLACKWELL_MIN_CUDA}",
                "pick a CUDA >= 12.8 variant",
            )
        blackwell = blackwell or is_blackwell(capability)
    if variant.min_driver and version_tuple(driver) < version_tuple(variant.min_driver):
        return Verdict(
            variant,
            False,
            f"driver {driver} is older than {variant.min_driver}, the lowest that runs CUDA {variant.cuda}",
            f"upgrade the NVIDIA driver to >= {variant.min_driver}",
            variant.min_driver,
        )
    if blackwell and version_tuple(driver) < version_tuple(BLACKWELL_MIN_DRIVER):
        return Verdict(
            variant,
            False,
            f"driver {driver} predates Blackwell; it needs >= {BLACKWELL_MIN_DRIVER} (CUDA {BLACKWELL_MIN_CUDA})",
            f"upgrade the NVIDIA driver to >= {BLACKWELL_MIN_DRIVER}",
            BLACKWELL_MIN_DRIVER,
        )
    return Verdict(variant, True)


def check_variants(
    driver: str | None, capabilities: list[str], catalog: dict[str, Variant] | None = None
) -> list[Verdict]:
    """A verdict for every variant of the catalog, in catalog order."""
    catalog = catalog if catalog is not None else load_catalog()
    return [check_variant(variant, driver, capabilities) for variant in catalog.values()]


def choose_variant(
    driver: str | None, capabilities: list[str], catalog: dict[str, Variant] | None = None
) -> Variant:
    """The best variant for a host: the newest CUDA the driver fully supports; else (minor-version
    compatibility only) the oldest CUDA that runs, as it leans least on that compatibility; else cpu."""
    verdicts = check_variants(driver, capabilities, catalog)
    runnable = [v.variant for v in verdicts if v.runs]
    cuda = sorted((v for v in runnable if not v.is_cpu), key=lambda v: version_tuple(v.cuda))
    if cuda:
        newest_full = driver is not None and max_cuda(driver)
        full = [v for v in cuda if newest_full and version_tuple(v.cuda) <= version_tuple(newest_full)]
        return full[-1] if full else cuda[0]
    cpu = [v for v in runnable if v.is_cpu]
    if not cpu:
        # A runtime with CUDA images only (upstream verl): say why none of them runs here.
        raise LookupError("; ".join(f"{v.variant.name}: {v.reason}" + (f" ({v.remedy})" * bool(v.needs_driver))
                                    for v in verdicts) or "the variant catalog has no cpu variant")
    return cpu[0]


# A cluster's nodes (Kubernetes, Slurm) are not this host, so `auto` cannot ask their driver: CUDA 12.8 runs on
# drivers from 525 on and covers Volta to Blackwell; on Kubernetes, node affinity then prefers nodes whose driver
# runs it.
CLUSTER_GPU_VARIANT = "cu128"


def cluster_variant(runtime: str = DEFAULT_RUNTIME) -> str:
    """The variant a cluster's GPU nodes get for `auto`: CLUSTER_GPU_VARIANT, or another runtime's first (upstream
    verl has cu130 alone)."""
    return CLUSTER_GPU_VARIANT if runtime == DEFAULT_RUNTIME else next(iter(load_catalog(runtime=runtime)))


def variant_for(asked: str, *, wants_gpus: bool, on_this_host: bool, runtime: str = DEFAULT_RUNTIME,
                host: host_facts.HostFacts | None = None) -> str:
    """The one choice of an image variant; a name other than `auto` is kept as asked. `auto` means the newest
    variant the machine that will run it can run:
      - no GPU asked: cpu (where the runtime has one);
      - on this host (local, docker, `images build/pull`): what this host's driver and GPUs run best
        (choose_variant over host_facts, read here unless `host` is given; no NVIDIA GPU: cpu);
      - on a cluster's nodes (k8s, slurm), which are not this host: cluster_variant.
    LookupError (one line) when no variant of the runtime runs on this host."""
    if asked != "auto":
        return asked
    catalog = load_catalog(runtime=runtime)
    cpu = next((v.name for v in catalog.values() if v.is_cpu), None)
    if not wants_gpus and cpu:
        return cpu
    if not on_this_host:
        return cluster_variant(runtime)
    host = host or host_facts.read()
    try:
        return choose_variant(host.driver, host.capabilities, catalog).name
    except LookupError as exc:
        raise LookupError(f"no {runtime} image runs on this host: {exc}") from None
