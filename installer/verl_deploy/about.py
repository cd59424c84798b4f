"""What `verl-deploy --version` says: one release for the CLI and the trainer in its images, and the variant
catalog those images are built from (named by its digest, since it changes between releases as PyPI moves)."""

from __future__ import annotations

import hashlib

from verl_deploy import __version__, assets, compat


def version_lines() -> list[str]:
    catalog = assets.path("docker/variants.yaml")
    digest = hashlib.sha256(catalog.read_bytes()).hexdigest()[:12]
    flavours = []
    for name, runtime in compat.load_runtimes().items():
        variants = ", ".join(compat.load_catalog(runtime=name))
        flavours.append(variants if runtime.is_default else f"{name} {runtime.version}: {variants}")
    return [
        f"verl-deploy {__version__}",
        f"runtime: verl_runtime {__version__} (the images' tags: verl-deploy:{__version__}-<variant>)",
        f"catalog: docker/variants.yaml sha256:{digest} ({'; '.join(flavours)})",
    ]
