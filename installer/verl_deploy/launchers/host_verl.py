"""Upstream verl in a Python of this host, not in an image: `run --runtime verl --target local`, and Slurm's
`--container none` (a venv on shared storage). The Python is the `python3` on PATH: the environment a user installed
verl, or their fork's requirements, into. A --verl-source goes first on PYTHONPATH, so its verl is the one imported.
Before anything starts, that Python is checked against what the source declares (or for an installed verl), and what
it lacks is one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from verl_deploy.launchers import verl_command
from verl_deploy.launchers.jobspec import JobSpec, LaunchError

# What the Python has: its version (for requirement markers), its distributions, whether verl and Hydra import.
_PROBE = (
    "import json, sys, importlib.metadata as m, importlib.util as u; "
    "print(json.dumps({'python': '%d.%d.%d' % sys.version_info[:3], 'hydra': bool(u.find_spec('hydra')), "
    "'verl': bool(u.find_spec('verl')), 'dists': {d.metadata['Name']: d.version for d in m.distributions() "
    "if d.metadata['Name']}}))"
)
PROBE_TIMEOUT_S = 60
_SHOWN = 4  # unmet requirements named in the line; the rest are counted


def python() -> str:
    """The python3 on PATH, as an absolute path (a venv's own: not resolved through its symlink)."""
    found = shutil.which("python3")
    if found is None:
        raise LaunchError("--runtime verl on this host: no python3 on PATH: activate the environment that has "
                          "verl (or your fork's requirements), or use --target docker")
    return os.path.abspath(found)


def source_paths(spec: JobSpec) -> list[str]:
    """The --verl-source's folders on this host's PYTHONPATH: the repository, and where verl/ is when vendored
    deeper (VerlSource.pythonpath's, with host paths); [] without a source."""
    root = spec.verl_source.get("root")
    if not root:
        return []
    parent = spec.verl_source.get("package_parent", ".")
    return [root] + ([str(Path(root) / parent)] if parent != "." else [])


def environment(spec: JobSpec, environ=os.environ) -> dict[str, str]:
    """The trainer's environment on top of the host's: the source first on PYTHONPATH, verl's file logger into the
    run directory, unbuffered output, and the run's --env."""
    paths = [*source_paths(spec), *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {"PYTHONUNBUFFERED": "1", **verl_command.environment(str(spec.run_dir))}
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    if spec.hf_cache:
        env["HF_HOME"] = str(spec.hf_cache)
    return {**env, **spec.env}


def trainer(spec: JobSpec, python_path: str) -> list[str]:
    """The trainer's command with this host's paths: the image's `python3` is python_path, a script of the source
    (verl_command.SOURCE_DIR/...) is the source's file here."""
    from verl_deploy import compat

    command = list(spec.trainer or compat.load_runtimes()[spec.runtime].trainer)
    command[0] = python_path
    if root := spec.verl_source.get("root"):
        inside = verl_command.SOURCE_DIR + "/"
        command = [str(Path(root) / part[len(inside):]) if part.startswith(inside) else part for part in command]
    return command


def argv(spec: JobSpec, python_path: str) -> list[str]:
    """The whole command: the trainer, then main_ppo's arguments with the host's run directory."""
    return [*trainer(spec, python_path), *spec.command.host_args]


def probe(python_path: str, env: dict[str, str]) -> dict:
    try:
        done = subprocess.run([python_path, "-c", _PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              env={**os.environ, **env})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"--runtime verl on this host: {python_path} does not run ({exc}): activate a working "
                          "Python environment, or use --target docker") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise LaunchError(f"--runtime verl on this host: {python_path} fails to start ({last}): activate a working "
                          "Python environment, or use --target docker")
    return json.loads(done.stdout.strip().splitlines()[-1])


def unmet(requirements, found: dict) -> list[str]:
    """The requirements (PEP 508 strings) this Python does not meet: not installed, or of another version; those
    whose markers exclude it, and verl itself (the source is verl), are met."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    installed = {canonicalize_name(name): version for name, version in found["dists"].items()}
    python_version = found["python"]
    markers = {"python_version": ".".join(python_version.split(".")[:2]), "python_full_version": python_version}
    missing = []
    for text in requirements:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue  # a line pip would refuse too: the source's to mend, not a missing package
        name = canonicalize_name(requirement.name)
        if name == "verl" or (requirement.marker and not requirement.marker.evaluate(markers)):
            continue
        if name not in installed:
            missing.append(f"{requirement.name} (not installed)")
        elif requirement.specifier and not requirement.specifier.contains(installed[name], prereleases=True):
            missing.append(f"{requirement} ({installed[name]} is)")
    return missing


def check(spec: JobSpec, source, python_path: str, where: str) -> dict:
    """That python_path can run this verl: it imports verl (the source's, from PYTHONPATH, or an installed one) and
    has what the source declares (with the GPU extra's when the run asks for GPUs). What it found (probe), or
    LaunchError: one line naming what is missing and the two ways out."""
    found = probe(python_path, environment(spec))
    if not found["verl"]:
        from verl_runtime.verl_keys import VERL_VERSION

        raise LaunchError(f"{where}: {python_path} has no verl: install it there (pip install verl=={VERL_VERSION}), "
                          "give --verl-source DIR (your fork), or use --target docker")
    if source is None:
        return found
    wanted = [*source.requirements, *(source.gpu_requirements if spec.gpus.wanted else ())]
    if missing := unmet(wanted, found):
        more = f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
        files = ", ".join(source.declared_in) or "its metadata"
        raise LaunchError(f"{where}: {python_path} lacks what your verl source declares ({files}): "
                          f"{', '.join(missing[:_SHOWN])}{more}: install them there (pip install -e {source.root}), "
                          "or use --target docker, whose image is built with them")
    return found

