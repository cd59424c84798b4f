"""verl 0.9.1's own maths, loaded from its PyPI wheel without installing verl or its dependencies.

`load_verl(cache_dir)` downloads the wheel once (``pip download --no-deps verl==0.9.1``, checked against its
sha256), unpacks it, and imports the pure modules the parity tests compare with:
verl/trainer/ppo/core_algos.py, verl/utils/torch_functional.py, verl/utils/reward_score/ and
verl/trainer/ppo/metric_utils.py. What those import at module level and that is not installed here (omegaconf,
tensordict, verl's config dataclasses, device helpers, DataProto) is stubbed: they use it as annotations or in
code paths the tests do not take. The `verl` modules live in sys.modules only inside `verl_modules()`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

from verl_runtime import verl_keys

VERSION = verl_keys.VERL_VERSION  # the release whose keys and maths we follow
WHEEL = f"verl-{VERSION}-py3-none-any.whl"
SHA256 = "db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14"
MEMBERS = ("verl/trainer/ppo/", "verl/utils/", "verl/__init__.py")


class WheelUnavailable(RuntimeError):
    """The wheel could not be downloaded (no network, no index)."""


def wheel_cache(request, tmp_path_factory) -> Path:
    """Where the wheel is kept: pytest's cache, or a temp dir where there is none (-p no:cacheprovider)."""
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("verl-wheel") if cache else tmp_path_factory.mktemp("verl-wheel")


def unavailable(error: Exception):
    """With CI=true the tests of verl's behaviour must run: no wheel fails them. Elsewhere they skip, saying why."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{error} (CI=true: the tests against verl's wheel must run)")
    pytest.skip(str(error))


def download_wheel(cache_dir: Path) -> Path:
    """verl's wheel in cache_dir, downloaded with pip the first time and checked against its sha256."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    wheel = cache_dir / WHEEL
    if not wheel.is_file():
        command = [sys.executable, "-m", "pip", "download", "--no-deps", f"verl=={VERSION}", "-d", str(cache_dir)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise WheelUnavailable(f"pip download verl=={VERSION} failed: {error}") from error
        if done.returncode != 0 or not wheel.is_file():
            raise WheelUnavailable(f"pip download verl=={VERSION} failed: {done.stderr.strip()[-500:]}")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != SHA256:
        wheel.unlink()
        raise RuntimeError(f"{WHEEL} has sha256 {digest}, expected {SHA256}")
    return wheel


def fetch_wheel(cache_dir: Path) -> Path:
    """The unpacked wheel under cache_dir, downloading it the first time."""
    unpacked = cache_dir / f"verl-{VERSION}"
    if (unpacked / "verl/trainer/ppo/core_algos.py").is_file():
        return unpacked
    wheel = download_wheel(cache_dir)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked, [n for n in archive.namelist() if n.startswith(MEMBERS) and n.endswith(".py")])
    return unpacked


def _module(name: str, path: Path | None = None, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    if path is not None:
        module.__path__ = [str(path)]
    module.__dict__.update(attrs)
    return module


class _Stub:
    """A class verl names in annotations or isinstance checks."""

    def __init__(self, *args, **kwargs):
        self.__dict__.update(kwargs)

    def get(self, key, default=None):
        return getattr(self, key, default)


def _stubs(root: Path) -> dict[str, types.ModuleType]:
    verl = root / "verl"
    return {
        "omegaconf": _module("omegaconf", DictConfig=type("DictConfig", (dict,), {}), OmegaConf=_Stub),
        "tensordict": _module("tensordict", TensorDict=type("TensorDict", (dict,), {})),
        "verl": _module("verl", verl, DataProto=type("DataProto", (_Stub,), {})),
        "verl.trainer": _module("verl.trainer", verl / "trainer"),
        "verl.trainer.ppo": _module("verl.trainer.ppo", verl / "trainer/ppo"),
        "verl.trainer.config": _module("verl.trainer.config", AlgoConfig=type("AlgoConfig", (_Stub,), {})),
        "verl.workers": _module("verl.workers"),
        "verl.workers.config": _module("verl.workers.config", ActorConfig=type("ActorConfig", (_Stub,), {})),
        "verl.utils": _module("verl.utils", verl / "utils"),
        "verl.utils.device": _module(
            "verl.utils.device", get_device_name=lambda: "cpu", get_torch_device=lambda: importlib.import_module("torch").cpu
        ),
        "verl.utils.fs": _module("verl.utils.fs", copy_to_local=lambda path, **kwargs: path),
        "verl.utils.model": _module("verl.utils.model", update_model_config=lambda *args, **kwargs: None),
    }


@contextlib.contextmanager
def verl_modules(root: Path):
    """verl's core_algos, torch_functional, reward_score and metric_utils as a namespace, while in the block."""
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] in ("verl", "omegaconf", "tensordict")}
    sys.modules.update(_stubs(root))
    try:
        groupwise = importlib.import_module("verl.utils.groupwise")
        utils = sys.modules["verl.utils"]
        utils.as_torch_index, utils.group_mean_std = groupwise.as_torch_index, groupwise.group_mean_std
        yield types.SimpleNamespace(
            core_algos=importlib.import_module("verl.trainer.ppo.core_algos"),
            F=importlib.import_module("verl.utils.torch_functional"),
            reward_score=importlib.import_module("verl.utils.reward_score"),
            gsm8k=importlib.import_module("verl.utils.reward_score.gsm8k"),
            math_reward=importlib.import_module("verl.utils.reward_score.math_reward"),
            math_dapo=importlib.import_module("verl.utils.reward_score.math_dapo"),
            metric_utils=importlib.import_module("verl.trainer.ppo.metric_utils"),
            DataProto=sys.modules["verl"].DataProto,
            root=root,
        )
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] in ("verl", "omegaconf", "tensordict")]:
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.fixture(scope="module")
def verl(request, tmp_path_factory):
    """verl 0.9.1's modules loaded from its wheel (skipped with a reason where the wheel cannot be had, outside CI).
    A test module uses it with `from verl_wheel import verl`."""
    try:
        root = fetch_wheel(wheel_cache(request, tmp_path_factory))
    except WheelUnavailable as error:
        unavailable(error)
    with verl_modules(root) as modules:
        yield modules
