"""The wheel is the product: built from the checkout, installed into a fresh venv outside it (what pipx and uv tool
install do), it serves every command from an empty folder and builds the same image as a clone.

The venv is made once per module (about 20 s with the dependencies from the package index). The image comparison
(slow, docker) reuses the cpu image of tests/conftest.py and Docker's layer cache: the same context is all cached.
"""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, require
from verl_deploy import assets

# The distribution's view of the build context of the cpu image, printed as JSON by the Python it runs in: each
# member's sha256 and the sha256 of the whole tar (fixed options: nothing read from this host's environment).
CONTEXT_DIGEST = """
import hashlib, io, json
from verl_deploy.images import plan_build
from verl_deploy.images.context import context_members, write_context
opts, _ = plan_build("cpu", env={})
members = {name: hashlib.sha256(m if isinstance(m, bytes) else m.read_bytes()).hexdigest()
           for name, m in context_members(opts).items()}
tar = io.BytesIO()
write_context(opts, tar)
print(json.dumps({"members": members, "tar": hashlib.sha256(tar.getvalue()).hexdigest()}))
"""
REGISTRY_IMAGE = "registry.example.com/team/verl-deploy:1"
# A valid `run --runtime verl` (verl's own keys; see tests/test_verl_runtime.py).
VERL_OVERRIDES = ["data.train_files=/data/gsm8k/train.parquet", "data.val_files=/data/gsm8k/test.parquet",
                  "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct"]
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}  # dry runs never need one


def sh(*cmd, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def checked(*cmd, **kwargs) -> subprocess.CompletedProcess:
    done = sh(*cmd, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def outside_env(**extra) -> dict[str, str]:
    """This environment without what would point Python back at the checkout or the dev venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, **extra}


def wheel_contents(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def asset_files() -> dict[str, Path]:
    """Every asset of the checkout by its path under verl_deploy/assets (links followed, dotfiles included)."""
    found = {}
    for folder, dirs, names in os.walk(assets.root(), followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            path = Path(folder) / name
            found[path.relative_to(assets.root()).as_posix()] = path
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel as a user builds it from a clone: `pip wheel --no-deps .`. In a build folder of its own: setuptools
    packs what it finds in build/lib, so a stale one in the checkout could add files the source no longer has."""
    out = tmp_path_factory.mktemp("wheel")
    config = out / "setuptools.cfg"
    config.write_text(f"[build]\nbuild_base = {out / 'build'}\n")
    checked(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, REPO, timeout=300,
            env={**os.environ, "DIST_EXTRA_CONFIG": str(config)})
    return next(out.glob("verl_deploy-*.whl"))


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    """A fresh venv outside the checkout with the wheel and its dependencies (from the package index)."""
    root = tmp_path_factory.mktemp("wheel-venv") / "venv"
    assert not root.resolve().is_relative_to(REPO)
    checked(sys.executable, "-m", "venv", root)
    checked(root / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel,
            env=outside_env(), timeout=600)
    return root


@pytest.fixture
def empty(tmp_path) -> Path:
    """An empty folder to run the CLI from, with a tiny config in it."""
    (tmp_path / "my.yaml").write_text("model:\n  path: builtin:tiny\n")
    return tmp_path


def cli(venv: Path, cwd: Path, *args, env=None, timeout=300) -> subprocess.CompletedProcess:
    return sh(venv / "bin" / "verl-deploy", *args, cwd=cwd, env=outside_env(**(env or {})), timeout=timeout)


def test_the_assets_are_links_to_the_repository_files_at_the_same_paths():
    """One copy of each file: where clone users and their tools find it; the package links to it (mirror rule)."""
    for folder, dirs, names in os.walk(assets.root()):
        for name in [*dirs, *names]:
            entry = Path(folder) / name
            relative = entry.relative_to(assets.root())
            if name in ("__init__.py", "__pycache__") or (entry.is_dir() and not entry.is_symlink()):
                continue
            assert entry.is_symlink(), f"{relative} is a copy: make it a link to the repository's {relative}"
            assert not os.readlink(entry).startswith("/"), f"{relative} must be a relative link"
            assert entry.resolve() == (REPO / relative).resolve(), f"{relative} must link to the repository's one"
    for name in assets.STARTER:
        assert assets.path(name).is_file(), name


def test_the_wheel_carries_every_asset_as_a_file(wheel):
    contents = wheel_contents(wheel)
    for name, path in asset_files().items():
        assert contents.get(f"verl_deploy/assets/{name}") == path.read_bytes(), f"{name} is missing or differs"
    with zipfile.ZipFile(wheel) as zf:
        links = [i.filename for i in zf.infolist() if (i.external_attr >> 16) & 0o170000 == 0o120000]
    assert not links


def test_the_sdist_builds_the_same_wheel_and_both_pass_twine_check(wheel, tmp_path):
    """`make dist`: the sdist, then the wheel built from it (python -m build), checked with twine."""
    for tool in ("build", "twine"):
        require(importlib.util.find_spec(tool) is not None, f"{tool} is missing: make setup installs the dev extra")
    checked(sys.executable, "-m", "build", "--outdir", tmp_path, REPO, timeout=600)
    sdist, from_sdist = next(tmp_path.glob("verl_deploy-*.tar.gz")), next(tmp_path.glob("verl_deploy-*.whl"))
    assert wheel_contents(from_sdist) == wheel_contents(wheel)
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
    assert not [m.name for m in members if m.issym() or m.islnk()]
    assert not [m.name for m in members if "/tests/" in m.name]  # they need the whole repository: git has them
    checked(sys.executable, "-m", "twine", "check", "--strict", sdist, from_sdist)


def test_the_venv_imports_the_installed_package_not_the_checkout(venv, empty):
    code = "import verl_deploy, verl_runtime; print(verl_deploy.__file__); print(verl_runtime.__file__)"
    done = checked(venv / "bin" / "python", "-c", code, cwd=empty, env=outside_env())
    for line in done.stdout.split():
        assert Path(line).is_relative_to(venv), line


@pytest.mark.parametrize("args, env, codes", [
    (["--version"], {}, (0,)),
    (["doctor"], {}, (0, 1)),
    (["images", "list"], {}, (0,)),
    (["run", "my.yaml", "--target", "local", "--dry-run"], NO_ENGINE, (0,)),
    (["run", "my.yaml", "--target", "docker", "--dry-run"], NO_ENGINE, (0,)),
    (["run", "my.yaml", "--target", "k8s", "--dry-run", "--image", REGISTRY_IMAGE], NO_ENGINE, (0,)),
    (["run", "--runtime", "verl", "--gpus", "1", "--variant", "cu130", "--target", "docker", "--dry-run", "--",
      *VERL_OVERRIDES], NO_ENGINE,
     (0,)),
], ids=["version", "doctor", "images-list", "local", "docker", "k8s", "runtime-verl"])
def test_every_command_works_from_the_wheel_in_an_empty_folder(venv, empty, args, env, codes):
    done = cli(venv, empty, *args, env=env)
    output = done.stdout + done.stderr
    assert done.returncode in codes, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert sorted(p.name for p in empty.iterdir()) == ["my.yaml"]  # a dry run writes nothing


def test_the_wheel_gives_the_clones_build_context_byte_for_byte(venv, empty):
    clone = json.loads(checked(sys.executable, "-c", CONTEXT_DIGEST, cwd=REPO).stdout)
    installed = json.loads(checked(venv / "bin" / "python", "-c", CONTEXT_DIGEST, cwd=empty, env=outside_env()).stdout)
    assert installed["members"] == clone["members"]
    assert installed["tar"] == clone["tar"]
    assert "pyproject.toml" in clone["members"] and "build/verify.py" in clone["members"]


@pytest.mark.slow
@pytest.mark.docker
def test_the_cpu_image_from_the_wheel_is_the_clones(venv, empty, docker_client, cpu_image, base_image,
                                                    torch_wheelhouse):
    """Same context, so Docker's cache serves every step: the same layers and labels (seconds, not minutes)."""
    tag = "verl-deploy-test:from-wheel"
    done = cli(venv, empty, "images", "build", "--variant", "cpu", "--base-image", base_image,
               "--wheelhouse", torch_wheelhouse, "--tag", tag, timeout=1800)
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
    try:
        ours, clones = (docker_client.api.inspect_image(ref) for ref in (tag, cpu_image))
        assert ours["RootFS"]["Layers"] == clones["RootFS"]["Layers"]
        assert ours["Config"]["Labels"] == clones["Config"]["Labels"]
    finally:
        docker_client.images.remove(tag)


def test_init_from_the_wheel_gives_a_wheel_user_the_clones_files(venv, tmp_path):
    """`verl-deploy init` from the installed wheel: the configs, compose files and the kustomize tree, the same
    bytes as the repository's."""
    from verl_deploy import starter

    done = cli(venv, tmp_path, "init", "mine")
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    mine = tmp_path / "mine"
    written = {p.relative_to(mine).as_posix(): p.read_bytes() for p in mine.rglob("*") if p.is_file()}
    assert written == starter.starter_files()
    assert written["compose.yaml"] == (REPO / "compose.yaml").read_bytes()
    assert written["k8s/overlays/multi-node/rayjob.yaml"] == (REPO / "k8s/overlays/multi-node/rayjob.yaml").read_bytes()
