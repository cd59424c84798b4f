"""`--verl-source SRC`: the user's own verl (a fork, or a research repository that vendors verl beside its
scripts) as the trainer of `--runtime verl`: where it is, which commit, what it declares it needs, and the torch,
vLLM, transformers and CUDA pins an image of it gets.

    resolve(SRC)          a local folder, a git reference (git+https://...@rev, cloned on this host) or a pip
                          requirement (verl==0.8.0, verl @ file://...; fetched with this host's pip): VerlSource
    choose_pins(source)   the catalogued variant (docker/variants.yaml) and the pins that run its declared
                          dependencies; SourceError (one line) where no catalogued variant can

The declarations are read, never executed: setup.py through `ast` (install_requires, extras_require), pyproject.toml
([project] dependencies, optional-dependencies), requirements*.txt, and a wheel's METADATA (Requires-Dist).
Nothing here imports torch.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from verl_deploy import compat

# The extra of a verl source that carries its GPU stack (verl's setup.py: extras_require["vllm"]): read on GPU
# variants only, as verl's docs install it (`pip install -e .[vllm]`).
GPU_EXTRA = "vllm"
# Requirement files read beside setup.py; the others (requirements-npu.txt, requirements_sglang.txt, ...) are for
# other hardware or engines.
REQUIREMENT_FILES = ("requirements.txt", "requirements-cuda.txt")
# What the image's Python is (docker/variants.yaml build.base_image: python 3.11 on Debian x86_64): the markers of
# the declarations are evaluated for it.
IMAGE_MARKERS = {"python_version": "3.11", "python_full_version": "3.11.0", "sys_platform": "linux",
                 "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                 "implementation_name": "cpython", "platform_python_implementation": "CPython"}
# Where fetched sources (git clones, unpacked pip distributions) are kept between commands.
CACHE = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "verl-deploy" / "verl-sources"
# Not part of the source an image needs (the same rule as the image context's: caches, dotfiles, .git).
SKIPPED_DIRS = {"__pycache__", "node_modules"}


class SourceError(ValueError):
    """A --verl-source the tool cannot use; the message is one line that says what to do."""


@dataclass(frozen=True)
class VerlSource:
    """One --verl-source, resolved on this host."""

    given: str  # SRC as written
    kind: str  # "directory", "git" or "pip"
    location: str  # the path or URL (credentials removed): the label verl-deploy.verl-source
    root: Path  # the folder copied into the image (/opt/verl-source): the repository, scripts and recipes beside verl
    package_parent: str  # the folder (relative to root, "." for root) holding the verl/ package
    commit: str | None  # git rev-parse HEAD (None: not a git checkout)
    dirty: bool  # git status --porcelain says changes are not committed
    version: str | None  # verl/version/version, as `import verl` reads it
    requirements: tuple[str, ...]  # declared, for every variant
    gpu_requirements: tuple[str, ...]  # the GPU_EXTRA, for GPU variants
    declared_in: tuple[str, ...]  # the files they were read from, relative to root
    digest: str = ""  # of the files as resolved (digest()): which edit an image holds

    @property
    def slug(self) -> str:
        """A short name for the image tag: the source folder's or repository's name."""
        name = re.sub(r"\.git$", "", self.location.rstrip("/").rsplit("/", 1)[-1].split("@")[0])
        if self.kind == "pip":
            name = re.split(r"[=<>!~ @\[]", self.given, maxsplit=1)[0] + "-" + (self.version or "pip")
        return re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-.")[:40] or "verl"

    @property
    def pythonpath(self) -> str:
        """PYTHONPATH in the image: the repository (its recipe/ and scripts), and where verl/ is when vendored deeper."""
        paths = ["/opt/verl-source"] + ([f"/opt/verl-source/{self.package_parent}"] if self.package_parent != "." else [])
        return ":".join(paths)

    def labels(self) -> dict[str, str]:
        return {"verl-deploy.verl-source": self.location, "verl-deploy.verl-source-commit": self.commit or "",
                "verl-deploy.verl-source-dirty": "true" if self.dirty else "false",
                "verl-deploy.verl-source-digest": self.digest}


@dataclass(frozen=True)
class Pins:
    """What an image of a source is built with: a catalogued variant (its CUDA, driver floor, compiler) with the
    torch and vLLM the source needs, and what pip installs beside them."""

    variant: compat.Variant  # the catalog's variant, torch and vllm replaced by the chosen ones
    torch: str
    vllm: str | None
    transformers: str | None  # a release, or the source's specifier where it pins none
    packages: tuple[str, ...]  # pip requirements beside torch and vLLM (the source's, transformers pinned)

    def labels(self) -> dict[str, str]:
        return {"verl-deploy.transformers": self.transformers or ""}


# --- resolving SRC -------------------------------------------------------------------------------------------------

def resolve(src: str, cache: Path | None = None) -> VerlSource:
    """SRC as a VerlSource; SourceError (one line) where it is none of the three forms or holds no verl."""
    cache = cache or CACHE
    if src.startswith("git+"):
        url, rev = _split_rev(src[4:])
        return from_directory(_clone(url, rev, cache), "git", given=src, location=_redact(src[4:]))
    path = Path(src).expanduser()
    if path.is_dir():
        return from_directory(path.resolve(), "directory", given=src, location=str(path.resolve()))
    if "/" in src and not re.search(r"[=<>@~]", src):
        raise SourceError(f"--verl-source {src}: no such directory (give a folder holding verl/, "
                          "git+https://HOST/REPO.git@REV or a pip requirement such as verl==0.8.0)")
    file_url = re.match(r"^\s*[\w.-]+(\[[^]]*\])?\s*@\s*file://(/.+)$", src)
    if file_url and Path(file_url[2]).is_dir():
        return from_directory(Path(file_url[2]).resolve(), "directory", given=src, location=str(Path(file_url[2])))
    return from_directory(_pip_fetch(src, cache), "pip", given=src, location=_redact(src))


def from_directory(folder: Path, kind: str, *, given: str, location: str) -> VerlSource:
    package = find_package(folder)
    if package is None:
        raise SourceError(f"--verl-source {given}: no verl package in it (a folder verl/ with __init__.py and "
                          "trainer/main_ppo.py): point it at your fork's or repository's root")
    parent = package.parent
    commit, dirty = git_state(folder)
    requirements, gpu, files = declared(folder, parent)
    return VerlSource(
        given=given, kind=kind, location=location, root=folder,
        package_parent=parent.relative_to(folder).as_posix() if parent != folder else ".",
        commit=commit, dirty=dirty, version=_version(package), requirements=requirements, gpu_requirements=gpu,
        declared_in=files, digest=digest(folder),
    )


def find_package(folder: Path, depth: int = 3) -> Path | None:
    """The verl/ package in folder: its own, else the shallowest vendored one (third_party/verl/verl, ...)."""
    def is_verl(path: Path) -> bool:
        return (path / "__init__.py").is_file() and (path / "trainer" / "main_ppo.py").is_file()

    level = [folder]
    for _ in range(depth + 1):
        for parent in level:
            if is_verl(parent / "verl"):
                return parent / "verl"
        level = sorted(child for parent in level for child in _subdirs(parent))
    return None


def _subdirs(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir()
                if p.is_dir() and not p.name.startswith(".") and p.name not in SKIPPED_DIRS]
    except OSError:
        return []


def _version(package: Path) -> str | None:
    file = package / "version" / "version"
    return file.read_text().strip() if file.is_file() else None


def git_state(folder: Path) -> tuple[str | None, bool]:
    """(HEAD's commit, whether the work tree has uncommitted changes); (None, False) outside a git checkout."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True)

    if shutil.which("git") is None:
        return None, False
    head = git("rev-parse", "HEAD")
    if head.returncode:
        return None, False
    return head.stdout.strip(), bool(git("status", "--porcelain").stdout.strip())


def _split_rev(url: str) -> tuple[str, str | None]:
    """git+https://host/repo.git@rev -> (https://host/repo.git, rev); an @ inside the host part is credentials."""
    head, at, rev = url.rpartition("@")
    if at and "/" not in rev and "://" in head and head.split("://", 1)[1].count("/") >= 1:
        return head, rev
    return url, None


def _redact(text: str) -> str:
    return re.sub(r"//[^/@\s]+@", "//***@", text)


def _clone(url: str, rev: str | None, cache: Path) -> Path:
    """A clone of url at rev in the cache (fetched again each time: a branch moves)."""
    if shutil.which("git") is None:
        raise SourceError("--verl-source git+...: git is not installed on this host")
    folder = cache / ("git-" + hashlib.sha256(url.encode()).hexdigest()[:16])
    if not (folder / ".git").is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["git", "clone", "--quiet", url, str(folder)], capture_output=True, text=True)
        if done.returncode:
            shutil.rmtree(folder, ignore_errors=True)
            raise SourceError(f"git clone {_redact(url)} failed: {_last(done.stderr)}")
    else:
        subprocess.run(["git", "-C", str(folder), "fetch", "--quiet", "--all", "--tags"], capture_output=True)
    target = rev or "origin/HEAD"
    done = subprocess.run(["git", "-C", str(folder), "checkout", "--quiet", "--detach", target],
                          capture_output=True, text=True)
    if done.returncode and rev:
        done = subprocess.run(["git", "-C", str(folder), "checkout", "--quiet", "--detach", f"origin/{rev}"],
                              capture_output=True, text=True)
    if done.returncode:
        raise SourceError(f"{_redact(url)} has no revision {target}: {_last(done.stderr)}")
    return folder


def _pip_fetch(requirement: str, cache: Path) -> Path:
    """A pip requirement fetched with this host's pip (its indexes and credentials), unpacked in the cache."""
    import tarfile
    import zipfile

    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                               "--quiet", "-d", tmp, requirement], capture_output=True, text=True)
        found = sorted(Path(tmp).iterdir())
        if done.returncode or not found:
            raise SourceError(f"--verl-source {requirement}: pip cannot fetch it ({_last(done.stderr)}): give a "
                              "release that exists (pip index versions verl), a folder or a git reference")
        archive = found[0]
        folder = cache / ("pip-" + hashlib.sha256(archive.read_bytes()).hexdigest()[:16])
        if not folder.is_dir():
            unpacked = Path(tempfile.mkdtemp(dir=cache.parent if cache.parent.is_dir() else None))
            if archive.suffix == ".whl" or archive.suffix == ".zip":
                zipfile.ZipFile(archive).extractall(unpacked)
            else:
                with tarfile.open(archive) as tar:
                    tar.extractall(unpacked, filter="data")
            inner = [p for p in unpacked.iterdir() if p.is_dir()]
            root = inner[0] if len(inner) == 1 and not (unpacked / "verl").is_dir() else unpacked
            folder.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(root), folder)
            shutil.rmtree(unpacked, ignore_errors=True)
    return folder


def _last(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def digest(root: Path) -> str:
    """sha256 of the source as the image copies it (source_files): the label that tells an image of another edit."""
    hasher = hashlib.sha256()
    for name, file in source_files(root).items():
        hasher.update(name.encode() + b"\0" + file.read_bytes() + b"\0")
    return f"sha256:{hasher.hexdigest()}"


def source_files(root: Path) -> dict[str, Path]:
    """The files of a source that go into its image, by their path under root, sorted: caches, .git and dotfiles
    left out."""
    found = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS and not d.endswith(".egg-info"))
        for name in names:
            if not name.startswith(".") and not name.endswith((".pyc", ".pyo")):
                path = Path(folder) / name
                if path.is_file():
                    found[path.relative_to(root).as_posix()] = path
    return dict(sorted(found.items()))


# --- the declarations ----------------------------------------------------------------------------------------------

def declared(root: Path, package_parent: Path) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(requirements, GPU-extra requirements, files read) of a source: setup.py, pyproject.toml, requirements*.txt
    and a wheel's METADATA, in the folder that holds verl/ (and the repository root, where that is another)."""
    base: list[str] = []
    gpu: list[str] = []
    files: list[str] = []
    for folder in dict.fromkeys([package_parent, root]):
        if (setup := folder / "setup.py").is_file():
            install, extras = setup_py_requirements(setup.read_text(errors="replace"))
            base += install
            gpu += _expand(extras, GPU_EXTRA)
            files.append(setup.relative_to(root).as_posix())
        if (pyproject := folder / "pyproject.toml").is_file():
            install, extras = pyproject_requirements(pyproject.read_text(errors="replace"))
            if install or extras:
                base += install
                gpu += _expand(extras, GPU_EXTRA)
                files.append(pyproject.relative_to(root).as_posix())
        for name in REQUIREMENT_FILES:
            if (file := folder / name).is_file():
                (gpu if "cuda" in name else base).extend(requirements_txt(file.read_text(errors="replace")))
                files.append(file.relative_to(root).as_posix())
        for metadata in sorted(folder.glob("*.dist-info/METADATA")):
            install, extras = metadata_requirements(metadata.read_text(errors="replace"))
            base += install
            gpu += _expand(extras, GPU_EXTRA)
            files.append(metadata.relative_to(root).as_posix())
    return _unique(base), _unique(gpu), tuple(files)


def _unique(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(" ".join(item.split()) for item in items if item.strip()))


def _expand(extras: dict[str, list[str]], name: str, seen: frozenset = frozenset()) -> list[str]:
    """An extra's requirements, with the extras of the project itself it names (verl[verl-core]) expanded."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for text in extras.get(name, []):
        try:
            req = Requirement(text)
        except InvalidRequirement:
            out.append(text)
            continue
        if _canonical(req.name) == "verl" and req.extras:
            for extra in sorted(req.extras - seen):
                out += _expand(extras, extra, seen | {name, extra})
        else:
            out.append(text)
    return out


def setup_py_requirements(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """install_requires and extras_require of a setup.py, read with ast (literals, and module-level names bound to
    literals or to sums of them); what is computed at run time (read from a file, a loop) is not seen."""
    tree = ast.parse(text)
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            names[node.target.id] = node.value

    def value(node: ast.AST, depth: int = 0):
        if depth > 10:
            return None
        if isinstance(node, ast.Name) and node.id in names:
            return value(names[node.id], depth + 1)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = [value(item, depth + 1) for item in node.elts]
            return [i for item in items for i in (item if isinstance(item, list) else [item]) if isinstance(i, str)]
        if isinstance(node, ast.Dict):
            return {value(k, depth + 1): value(v, depth + 1) or [] for k, v in zip(node.keys, node.values)
                    if k is not None}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = value(node.left, depth + 1), value(node.right, depth + 1)
            return (left or []) + (right or []) if isinstance(left or [], list) and isinstance(right or [], list) else None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return None

    install, extras = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "setup":
            for keyword in node.keywords:
                if keyword.arg == "install_requires":
                    install = value(keyword.value) or []
                elif keyword.arg == "extras_require":
                    found = value(keyword.value)
                    extras = {k: list(v) for k, v in found.items() if isinstance(k, str)} if isinstance(found, dict) else {}
    return list(install), extras


def pyproject_requirements(text: str) -> tuple[list[str], dict[str, list[str]]]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads(text).get("project") or {}
    return list(project.get("dependencies") or []), {k: list(v) for k, v in (project.get("optional-dependencies") or {}).items()}


def requirements_txt(text: str) -> list[str]:
    """The requirement lines of a requirements file (comments, options and includes left out)."""
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            out.append(line)
    return out


def metadata_requirements(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """A wheel's Requires-Dist, split into the unconditional ones and those of each extra."""
    install, extras = [], {}
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            if not line.strip():
                break  # the headers end at the first blank line
            continue
        requirement = line.split(":", 1)[1].strip()
        found = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if found:
            extras.setdefault(found[1], []).append(re.sub(r";\s*extra\s*==\s*[\"'][^\"']+[\"']\s*$", "", requirement))
        else:
            install.append(requirement)
    return install, extras


# --- the pins --------------------------------------------------------------------------------------------------------

def torch_builds() -> dict[str, str]:
    """torch release -> the CUDA of PyPI's Linux wheel of it (docker/variants.yaml `torch_builds`)."""
    return {str(k): str(v) for k, v in (compat._read(compat.CATALOG_PATH).get("torch_builds") or {}).items()}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(texts) -> list:
    """Parsed requirements whose markers hold in the image (IMAGE_MARKERS); SourceError for one pip cannot read."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for text in texts:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise SourceError(f"declared requirement {text!r} is not one pip reads ({exc}): correct it in the source") from None
        if req.marker is None or req.marker.evaluate({**IMAGE_MARKERS, "extra": ""}):
            out.append(req)
    return out


def _spec(reqs, name: str):
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet()
    for req in reqs:
        if _canonical(req.name) == name:
            spec &= req.specifier
    return spec


def _named(reqs, name: str) -> bool:
    return any(_canonical(req.name) == name for req in reqs)


def _exact(spec) -> str | None:
    pins = [s.version for s in spec if s.operator in ("==", "===") and "*" not in s.version]
    return pins[0] if pins else None


def _key(version: str) -> tuple:
    from packaging.version import Version

    return Version(version)


def candidates(asked: str, host=None, cluster_gpus: bool = False) -> list[compat.Variant]:
    """The catalogued variants to try, best first: the one asked; for auto, this host's choice first (no NVIDIA GPU:
    cpu), then the rest, newest CUDA first; for a cluster's GPU nodes (cluster_gpus), the CUDA ones, newest first."""
    catalog = compat.load_catalog()
    if asked != "auto":
        if asked not in catalog:
            raise SourceError(f"unknown variant '{asked}': choose one of {', '.join(catalog)} or auto")
        return [catalog[asked]]
    if cluster_gpus:
        return sorted((v for v in catalog.values() if not v.is_cpu), key=lambda v: compat.version_tuple(v.cuda),
                      reverse=True)
    from verl_deploy import host_facts

    host = host or host_facts.read()
    try:
        first = compat.choose_variant(host.driver, host.capabilities, catalog).name
    except LookupError:
        first = "cpu"
    rest = sorted((v for v in catalog.values() if v.name != first), key=lambda v: v.is_cpu)
    return [catalog[first], *reversed([v for v in rest if not v.is_cpu]), *[v for v in rest if v.is_cpu]]


def choose_pins(source: VerlSource, asked: str = "auto", host=None, cluster_gpus: bool = False) -> Pins:
    """The first candidate variant that runs the source's declared pins, with those pins; SourceError (one line)
    naming why each catalogued variant cannot."""
    why = []
    for variant in candidates(asked, host, cluster_gpus):
        try:
            return pins_for(source, variant)
        except SourceError as exc:
            why.append(f"{variant.name}: {exc}")
    declared = ", ".join(source.declared_in) or "no declaration found"
    on = "any catalogued variant" if asked == "auto" else f"variant {asked}"
    raise SourceError(f"verl source {source.location} cannot run on {on} ({'; '.join(why)}); "
                      f"read from {declared}: change its torch/vLLM pins to a release of docker/variants.yaml's "
                      "variants, or run upstream verl (--runtime verl without --verl-source)")


def pins_for(source: VerlSource, variant: compat.Variant) -> Pins:
    """The pins of a source on one variant; SourceError (the reason, short) where it cannot run there."""
    texts = list(source.requirements) + ([] if variant.is_cpu else list(source.gpu_requirements))
    reqs = _requirements(texts)
    builds = torch_builds()
    if variant.is_cpu and (_named(reqs, "vllm") or _named(reqs, "sglang")):
        raise SourceError("it requires vLLM or SGLang, which PyPI has for CUDA only")
    torch_spec = _spec(reqs, "torch")
    exact = _exact(torch_spec)
    if exact and exact.split("+")[0] not in builds:
        raise SourceError(f"torch=={exact} is no torch release on PyPI that the catalog knows ({', '.join(builds)})")
    # The catalog's torch first (its build is checked), then the newest release of this CUDA.
    known = [variant.torch] + sorted((t for t, cuda in builds.items()
                                      if variant.is_cpu or cuda == variant.cuda), key=_key, reverse=True)
    torch = next((t for t in dict.fromkeys(known) if torch_spec.contains(t, prereleases=True)), None)
    if torch is None:
        cudas = sorted({builds[t] for t in builds if torch_spec.contains(t, prereleases=True)})
        on = f"its PyPI builds are for CUDA {', '.join(cudas)}" if cudas else "PyPI has no such release"
        raise SourceError(f"torch{torch_spec} has no build for {'the CPU' if variant.is_cpu else 'CUDA ' + variant.cuda} ({on})")
    vllm = None if variant.is_cpu else _vllm(reqs, variant, torch)
    transformers = _transformers(reqs)
    held = {"torch", "vllm"}
    packages = []
    for req in reqs:
        name = _canonical(req.name)
        if name in held or name == "verl":
            continue
        if name == "transformers" and transformers and transformers[0].isdigit():
            packages.append(f"transformers=={transformers}")
            held.add("transformers")
            continue
        req.marker = None
        packages.append(str(req).replace(" @ ", "@"))
    packages = list(dict.fromkeys(packages))
    return Pins(variant=replace(variant, torch=torch, vllm=vllm, runtime="verl"), torch=torch, vllm=vllm,
                transformers=transformers, packages=tuple(packages))


def _vllm(reqs, variant: compat.Variant, torch: str) -> str | None:
    """vLLM for a GPU variant: a declared exact pin; else the catalog's release whose torch pin is the chosen torch
    (vLLM pins torch exactly), if it satisfies what is declared; None where the source names none."""
    spec = _spec(reqs, "vllm")
    if exact := _exact(spec):
        return exact
    pairs = {v.vllm: v.torch for runtime in compat.load_runtimes() for v in compat.load_catalog(runtime=runtime).values() if v.vllm}
    fits = [v for v, t in pairs.items() if t == torch and spec.contains(v, prereleases=True)]
    if fits:
        return sorted(fits, key=_key)[-1]
    if _named(reqs, "vllm"):
        raise SourceError(f"vllm{spec} has no release in the catalog whose torch pin is torch {torch}: pin vllm==X")
    return None


def _transformers(reqs) -> str | None:
    """transformers: the declared exact pin; else a release the project knows (upstream verl's image, this project's
    constraints) that satisfies the declaration; else the declaration itself (pip resolves it)."""
    spec = _spec(reqs, "transformers")
    if not _named(reqs, "transformers"):
        return None
    if exact := _exact(spec):
        return exact
    known = [p.split("==")[1] for r in compat.load_runtimes().values() for p in r.packages if p.startswith("transformers==")]
    for version in known:
        if spec.contains(version, prereleases=True):
            return version
    return str(spec) or None


# --- the source's own defaults ---------------------------------------------------------------------------------------

CONFIG_DIR = "verl/trainer/config"


def config_defaults(source: VerlSource, keys) -> dict[str, object]:
    """The source's own defaults of these dotted keys, as its main_ppo composes them: verl's generated full config
    (_generated_ppo_trainer.yaml, verl >= 0.5), then ppo_trainer.yaml's own values over it (what a fork edits; an
    old verl's is the whole config). Interpolations (${...}) are left out: Hydra resolves them."""
    import yaml

    folder = source.root / source.package_parent / CONFIG_DIR
    found: dict[str, object] = {}
    for name in ("_generated_ppo_trainer.yaml", "ppo_trainer.yaml"):
        if (file := folder / name).is_file():
            try:
                found.update(_flatten(yaml.safe_load(file.read_text()) or {}))
            except yaml.YAMLError as exc:
                raise SourceError(f"{file} is not YAML ({str(exc).splitlines()[0]}): correct it in the source") from None
    return {key: found[key] for key in keys if key in found and not (isinstance(found[key], str) and "${" in found[key])}


def _flatten(tree, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == "defaults":
                continue
            out.update(_flatten(value, f"{prefix}{key}."))
    else:
        out[prefix[:-1]] = tree
    return out


def default_overrides(source: VerlSource, upstream: dict[str, object]) -> list[str]:
    """key=value for each key of upstream's defaults (the planner's, verl 0.9.1's) that the source's own config
    sets otherwise: given before the command line's overrides, which win. Left out: Hydra's required marker (???)
    and the keys the planner keeps as None (unset or derived there: a micro batch size, the critic's model, which
    verl's own file gives as a placeholder path)."""
    own = config_defaults(source, upstream)
    return [f"{key}={_text(value)}" for key, value in own.items()
            if upstream[key] is not None and value != "???" and value != upstream[key]]


def _text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
