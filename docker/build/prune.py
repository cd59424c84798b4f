"""Remove what the image carries but nothing in it uses (docker/variants.yaml `unused`, `unused_paths`).

    python prune.py SITE_PACKAGES...

UNUSED (environment): distribution names, removed file by file from their RECORD (pip would refuse: /opt/deps
is outside its environment). UNUSED_PATHS: globs under site-packages (C++ test binaries, test suites, Java jars).
"""

import importlib.metadata
import os
import shutil
import sys
from pathlib import Path


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


def main(sites: list[str]) -> int:
    names = {canonical(n) for n in os.environ.get("UNUSED", "").split()}
    patterns = os.environ.get("UNUSED_PATHS", "").split()
    freed, found = 0, set()
    for site in map(Path, sites):
        dists_freed, dists_found = prune_dists(site, names)
        freed += dists_freed + prune_paths(site, patterns)
        found |= dists_found
    missing = f"; not installed: {', '.join(sorted(names - found))}" if names - found else ""
    print(f"verl-deploy: removed {len(found)} unused distributions and {len(patterns)} unused paths "
          f"({freed / 1e6:,.0f} MB){missing}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
