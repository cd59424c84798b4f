"""installer/install.sh, run for real: its options, and which installer (uv or pip) it picks and where from.

Each install goes into a fresh venv in tmp_path and installs one tiny wheel made here, so no test takes long.
"""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

INSTALL = REPO / "installer" / "install.sh"


def make_wheel(folder: Path, name: str = "verl_probe", version: str = "1.0") -> Path:
    """A pure-Python wheel whose module says it was installed."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(f"{name}.py", "INSTALLED = True\n")
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", f"{name}.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return path


def no_uv_path(tmp_path: Path) -> str:
    """A PATH without uv whose python3 is this interpreter's base Python (no uv beside it either)."""
    if shutil.which("uv", path="/usr/bin:/bin"):
        pytest.skip("uv is installed system-wide here: the pip fallback cannot be shown")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(Path(sys._base_executable).resolve())
    return f"{bin_dir}:/usr/bin:/bin"


def install(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def imports_probe(venv: Path) -> bool:
    return subprocess.run([str(venv / "bin" / "python"), "-c", "import verl_probe"]).returncode == 0


def test_help_lists_the_installer_choice():
    result = install("--help")
    assert result.returncode == 0
    assert "--installer auto|uv|pip" in result.stdout
    assert "pip does the installs where uv cannot be had" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--installer", "conda"], "install.sh: --installer is auto, uv or pip, not 'conda'\n"),
    (["--frobnicate"], "install.sh: unknown option '--frobnicate' (see --help)\n"),
])
def test_a_bad_option_is_one_line(args, message, tmp_path):
    result = install(*args, "--venv", str(tmp_path / "venv"))
    assert result.returncode == 1
    assert result.stderr == message
    assert not (tmp_path / "venv").exists()


def test_without_uv_auto_installs_with_pip_offline(tmp_path):
    wheelhouse = tmp_path / "wheels"
    make_wheel(wheelhouse)
    venv = tmp_path / "venv"
    result = install("--venv", str(venv), "--wheelhouse", str(wheelhouse), "--packages", "verl-probe",
                     env={"PATH": no_uv_path(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "uv could not be installed: installing with pip" in result.stdout
    assert "(with uv)" not in result.stdout
    assert imports_probe(venv)
    assert not (venv / "bin" / "uv").exists()


def test_uv_asked_for_and_not_to_be_had_is_one_line(tmp_path):
    wheelhouse = tmp_path / "wheels"
    make_wheel(wheelhouse)
    result = install("--venv", str(tmp_path / "venv"), "--wheelhouse", str(wheelhouse), "--installer", "uv",
                     "--packages", "verl-probe", env={"PATH": no_uv_path(tmp_path)})
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "install.sh: uv could not be had (not on PATH, and pip could not install it): pass --installer pip"]


def test_uv_installs_from_what_pip_is_configured_with(tmp_path):
    # The probe is only on a find-links folder given to pip through its environment: uv must be handed it.
    links = tmp_path / "links"
    make_wheel(links)
    venv = tmp_path / "venv"
    result = install("--python", sys.executable, "--venv", str(venv), "--installer", "uv",
                     "--packages", "verl-probe", env={"PIP_FIND_LINKS": str(links)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "==> installing verl-probe (with uv)" in result.stdout
    assert imports_probe(venv)


def test_pip_when_asked_installs_from_the_same_sources(tmp_path):
    links = tmp_path / "links"
    make_wheel(links)
    venv = tmp_path / "venv"
    result = install("--venv", str(venv), "--installer", "pip", "--packages", "verl-probe",
                     env={"PIP_FIND_LINKS": str(links)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "==> installing verl-probe\n" in result.stdout
    assert imports_probe(venv)
