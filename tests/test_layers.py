"""The host package's layers: the planner, doctor and the small fact modules never import the launchers or the CLI,
not even inside a function (such an import hides a circle until one day it runs)."""

from __future__ import annotations

import ast
from pathlib import Path

import verl_deploy

PACKAGE = Path(verl_deploy.__file__).parent
# lower layer -> what it must not import (an upper one)
RULES = {
    "plan": ("verl_deploy.launchers", "verl_deploy.cli", "verl_deploy.doctor"),
    "doctor": ("verl_deploy.launchers", "verl_deploy.cli"),
    "runtimes.py": ("verl_deploy.",),
    "targets.py": ("verl_deploy.",),
    "world.py": ("verl_deploy.launchers", "verl_deploy.plan", "verl_deploy.doctor", "verl_deploy.cli"),
    "sizes.py": ("verl_deploy.launchers", "verl_deploy.plan", "verl_deploy.doctor", "verl_deploy.cli"),
}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def test_lower_layers_never_import_upper_ones():
    broken = []
    for part, upper in RULES.items():
        files = sorted((PACKAGE / part).glob("*.py")) if (PACKAGE / part).is_dir() else [PACKAGE / part]
        assert files and all(f.exists() for f in files), part
        for path in files:
            bad = {name for name in imports(path) if name.startswith(upper)}
            if bad:
                broken.append(f"{path.relative_to(PACKAGE)} imports {sorted(bad)}")
    assert not broken, "\n".join(broken)
