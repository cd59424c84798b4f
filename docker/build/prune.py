"""Remove what the image carries but nothing in it uses (docker/variants.yaml `unused`, `unused_paths`).

    python prune.py SITE_PACKAGES...

UNUSED (environment): distribution names, removed file by file from their RECORD (pip would refuse: /opt/deps
is outside its environment), whatever requires them (vLLM requires FlashInfer, which the images leave out on purpose).
ORPHANS: distributions that only those removed required, removed the same way where no distribution staying in the
image requires them (kept otherwise, and said), so that a list read off one image cannot break another.
UNUSED_PATHS: globs under site-packages (C++ test binaries, test suites, Java jars).
STRIP: globs under site-packages whose ELF files lose their symbol tables (`strip --strip-unneeded`: names for
debuggers; what the dynamic loader needs stays), except under auditwheel's `*.libs` folders, whose patchelf-rewritten
libraries strip can leave unloadable. Every stripped shared library is then loaded once in a fresh Python, and the
build stops in one line at one that no longer loads.
"""

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # the build's venv before the dependencies: pip's own copy
    from pip._vendor.packaging.requirements import Requirement

ELF_MAGIC = b"\x7fELF"


def canonical(name: str) -> str:
    return name.lower().replace("_", "-")


def size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() or p.is_symlink())


def remove(path: Path) -> int:
    freed = size(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    return freed


def still_required(sites: list[str], unused: set[str], orphans: set[str]) -> dict[str, str]:
    """The orphans that a distribution staying in the image requires (name -> one that requires it): staying is
    neither unused nor an orphan, or an orphan kept so."""
    requires: dict[str, set[str]] = {}  # distribution -> the orphans it requires (extras aside)
    for dist in importlib.metadata.distributions(path=sites):
        wanted = requires.setdefault(canonical(dist.metadata["Name"] or ""), set())
        for line in dist.requires or ():
            req = Requirement(line)
            if canonical(req.name) in orphans and (req.marker is None or req.marker.evaluate({"extra": ""})):
                wanted.add(canonical(req.name))
    kept: dict[str, str] = {}
    while True:
        gone = unused | (orphans - kept.keys())
        found = {orphan: name for name, wanted in requires.items() if name not in gone
                 for orphan in wanted - kept.keys()}
        if not found:
            return kept
        kept.update(found)


def prune_dists(site: Path, names: set[str]) -> tuple[int, set[str]]:
    freed, found = 0, set()
    prefix = site.parents[2]  # .../lib/python3.X/site-packages -> the prefix that also holds bin/
    for dist in importlib.metadata.distributions(path=[str(site)]):
        name = canonical(dist.metadata["Name"] or "")
        if name not in names:
            continue
        found.add(name)
        for file in dist.files or ():
            path = Path(os.path.normpath(dist.locate_file(file)))
            if prefix in path.parents and (path.is_file() or path.is_symlink()):
                freed += remove(path)
        shutil.rmtree(dist._path, ignore_errors=True)  # the .dist-info folder, RECORD included
    for folder in sorted((p for p in site.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()  # packages' folders left empty
    return freed, found


def prune_paths(site: Path, patterns: list[str]) -> int:
    freed = 0
    for pattern in patterns:
        for path in sorted(site.glob(pattern), key=lambda p: len(p.parts)):
            if path.exists() or path.is_symlink():
                freed += remove(path)
    return freed


def is_elf(path: Path) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    with path.open("rb") as file:
        return file.read(4) == ELF_MAGIC


def strippable(site: Path, patterns: list[str]) -> list[Path]:
    """The ELF files the globs match, each once, none under an auditwheel `*.libs` folder."""
    found = {path for pattern in patterns for path in site.glob(pattern)}
    return sorted(p for p in found if not any(part.endswith(".libs") for part in p.relative_to(site).parts[:-1])
                  and is_elf(p))


# Loads each shared library given on the command line, each on its own, and prints those that do not load.
LOAD_CHECK = """
import ctypes, sys
for path in sys.argv[1:]:
    try:
        ctypes.CDLL(path)
    except OSError as error:
        print(f"{path}: {error}")
"""


def unloadable(libraries: list[str]) -> dict[str, str]:
    """Library -> why it does not load (dlopen, every symbol bound now), in a fresh Python."""
    out = subprocess.run([sys.executable, "-c", LOAD_CHECK, *libraries], capture_output=True, text=True).stdout
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def strip_symbols(site: Path, patterns: list[str]) -> int:
    """Strip the matching ELF files; stop the build at a library that loaded before and no longer does."""
    files = strippable(site, patterns)
    if not files:
        return 0
    if not shutil.which("strip"):
        print("verl-deploy: `strip` (binutils) is not in the build stage; the Dockerfile installs it where STRIP is set")
        sys.exit(1)
    before = sum(p.stat().st_size for p in files)
    libraries = [str(p) for p in files if ".so" in p.name]
    broken_before = unloadable(libraries)
    subprocess.run(["strip", "--strip-unneeded", *map(str, files)], check=True)
    broken = {lib: why for lib, why in unloadable(libraries).items() if lib not in broken_before}
    if broken:
        lib, why = next(iter(broken.items()))
        print(f"verl-deploy: {lib} no longer loads once stripped ({why}); take it out of the variant's `strip` "
              f"globs in docker/variants.yaml")
        sys.exit(1)
    return before - sum(p.stat().st_size for p in files)


def main(sites: list[str]) -> int:
    unused = {canonical(n) for n in os.environ.get("UNUSED", "").split()}
    orphans = {canonical(n) for n in os.environ.get("ORPHANS", "").split()} - unused
    patterns = os.environ.get("UNUSED_PATHS", "").split()
    strip = os.environ.get("STRIP", "").split()
    freed, found, stripped = 0, set(), 0
    kept = still_required(sites, unused, orphans)
    names = (unused | orphans) - kept.keys()
    for site in map(Path, sites):
        dists_freed, dists_found = prune_dists(site, names)
        freed += dists_freed + prune_paths(site, patterns)
        found |= dists_found
        stripped += strip_symbols(site, strip) if strip else 0
    missing = f"; not installed: {', '.join(sorted(names - found))}" if names - found else ""
    missing += "".join(f"; kept {name}: {by} requires it" for name, by in sorted(kept.items()))
    print(f"verl-deploy: removed {len(found)} unused distributions and {len(patterns)} unused paths "
          f"({freed / 1e6:,.0f} MB){missing}")
    if strip:
        print(f"verl-deploy: stripped the symbol tables of native libraries ({stripped / 1e6:,.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
