"""`verl-deploy init DIR`: a user's own starting files — the example configs, compose.yaml with .env.example and a
.secrets/ folder, the kustomize tree k8s/ — the same files the repository ships, from the same sources (the
assets, and launchers/kustomize.py for the tree), so a wheel user has what a clone user has."""

from __future__ import annotations

import os
from pathlib import Path

from verl_deploy import assets

K8S_CONFIG = "k8s/base/config.yaml"  # the tree's one hand-written file; kustomize.files renders the rest from it
K8S_EXTRA = ("k8s/policy-exceptions.yaml",)  # for the cluster admin who scans the manifests


class InitError(Exception):
    """One line: what is in the way and what to do."""


def starter_files() -> dict[str, bytes]:
    """Path in DIR -> content, for every file `init` writes."""
    from verl_deploy.launchers import kustomize

    files = {name: assets.path(name).read_bytes() for name in (*assets.STARTER, K8S_CONFIG, *K8S_EXTRA)}
    for relative, text in kustomize.files(assets.path(K8S_CONFIG)).items():
        files[f"k8s/{relative}"] = text.encode()
    return dict(sorted(files.items()))


def write(folder: Path, force: bool = False) -> list[str]:
    """Write the starter files into folder; InitError, with nothing written, where a different file is in the way
    (unless force). Files already equal are left as they are. Returns the paths written."""
    files = starter_files()
    differing = [name for name, data in files.items()
                 if (folder / name).exists() and not _same(folder / name, data)]
    if differing and not force:
        shown = ", ".join(differing[:3]) + (f" and {len(differing) - 3} more" if len(differing) > 3 else "")
        raise InitError(f"{folder} already has {shown}, different from the starter files: nothing written; pass "
                        "--force to overwrite them, or init another folder")
    written = []
    try:
        for name, data in files.items():
            target = folder / name
            if target.exists() and _same(target, data):
                continue
            _write_atomic(target, data)
            written.append(name)
        (folder / ".secrets").chmod(0o700)  # credentials go there as files; only their owner reads them
    except OSError as exc:
        raise InitError(f"cannot write {exc.filename or folder}: {exc.strerror.lower()}; choose a folder you can "
                        "write to") from None
    return written


def _same(path: Path, data: bytes) -> bool:
    try:
        return path.is_file() and path.read_bytes() == data
    except OSError:
        return False


def _write_atomic(target: Path, data: bytes) -> None:
    """A whole file or none: written beside the target, then renamed over it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.init-tmp")
    try:
        partial.write_bytes(data)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
