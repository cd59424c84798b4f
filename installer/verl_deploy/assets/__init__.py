"""The files verl-deploy reads at run time or hands to its users, found the same way from a wheel, an sdist and a git
clone: through importlib.resources, never through a path computed from the checkout.

This folder mirrors the repository: path("docker/variants.yaml") is the repository's docker/variants.yaml,
path("compose.yaml") its compose.yaml. In the repository each entry here is a relative link to that file or folder,
so there is one copy, where clone users and their tools (compose, kustomize, make, install.sh) find it; setuptools
copies what a link points to into the wheel and the sdist (tests/test_distribution.py checks both).

    docker/                                     Dockerfiles, the variant catalog (variants.yaml), the build's scripts
    pyproject.toml, installer/constraints.txt   what the image's `pip install` of the project reads
    k8s/                                        the kustomize tree (base/config.yaml by hand, the rest generated)
    STARTER                                     a user's own starting files (`verl-deploy init`)
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importlib.abc's (3.10) moved to importlib.resources.abc (3.11) and goes in 3.14
    from importlib.resources.abc import Traversable

# The files a user starts from, by their path in the repository (and in a folder `init` writes). The kustomize tree
# is not listed: launchers/kustomize.py generates it from k8s/base/config.yaml.
STARTER = (
    "examples/quickstart.yaml",
    "examples/gsm8k-grpo.yaml",
    "examples/gsm8k-ppo.yaml",
    "examples/tool-calculator.yaml",  # the agentic quickstart, with the tool config it names
    "examples/tools/sandbox_fusion_tool_config.yaml",
    "compose.yaml",
    "compose.cpu.yaml",
    ".env.example",
    ".secrets/README.md",
)


def files() -> Traversable:
    """The assets folder as importlib.resources sees it."""
    return resources.files(__name__)


def root() -> Path:
    """The assets folder on the file system (Docker and kubectl read real files)."""
    return package_dir(__name__)


def package_dir(package: str) -> Path:
    """The folder an installed package is imported from: site-packages for a wheel, the checkout for a clone's
    editable install. The image build copies verl_runtime and verl_deploy from there."""
    found = resources.files(package)
    if not isinstance(found, Path):  # a zipped install, which pip, pipx and uv never make
        raise RuntimeError(f"{package} is not installed as files ({found}): install the wheel with pip, pipx or uv")
    return found


def path(relative: str) -> Path:
    """An asset by its path in the repository, e.g. path("docker/variants.yaml")."""
    return root() / relative
