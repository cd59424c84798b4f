"""The build's own checks (docker/build/*.py) run here as they run inside a build, and the progress a build shows.

preflight.py asks real sockets (a closed port, a local HTTP server); verify.py checks this host's own torch (a
CPU build) against what a variant says; prune.py removes real installed distributions from a real site folder.
"""

import ctypes
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from verl_deploy.images.build import BuildLog, _failure
from verl_deploy.images.context import BUILD_SCRIPTS
from verl_deploy.images.progress import Heartbeat, StepStatus
from rich.console import Console

from conftest import free_port


def script(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BUILD_SCRIPTS / name), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def pip_conf(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text("[global]\n" + text)
    return str(path)


@pytest.fixture
def index_server():
    """A local HTTP server standing in for a package index: it answers (404 for every page)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()


def test_preflight_passes_when_every_index_answers(tmp_path, index_server):
    general = pip_conf(tmp_path, "pip.conf", f"index-url = {index_server}\n")
    torch_conf = pip_conf(tmp_path, "pip-torch.conf", f"index-url = {index_server}\nextra-index-url = {index_server}/torch\n")
    result = script("preflight.py", general, torch_conf)
    assert result.returncode == 0 and result.stdout == ""


def test_an_unreachable_torch_index_fails_fast_in_one_line_without_its_credentials(tmp_path, index_server):
    dead = f"http://user:s3cret@127.0.0.1:{free_port()}/whl/cpu"
    general = pip_conf(tmp_path, "pip.conf", f"index-url = {index_server}\n")
    torch_conf = pip_conf(tmp_path, "pip-torch.conf", f"index-url = {index_server}\nextra-index-url = {dead}\n")
    result = script("preflight.py", general, torch_conf)
    assert result.returncode == 1
    line = result.stdout.strip()
    assert "\n" not in line and line.startswith("verl-deploy: cannot reach the package index http://***@127.0.0.1:")
    assert "s3cret" not in line and "--torch-index-url" in line and "Connection refused" in line


def test_an_unreachable_package_index_names_the_mirror_option(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/simple"
    general = pip_conf(tmp_path, "pip.conf", f"index-url = {dead}\n")
    result = script("preflight.py", general, general)
    assert result.returncode == 1 and "--pip-index-url" in result.stdout


def test_verify_accepts_the_torch_the_variant_names(tmp_path):
    env = {"VARIANT": "cpu", "TORCH_VERSION": torch.__version__.split("+")[0], "CUDA": torch.version.cuda or "none"}
    result = script("verify.py", "torch", env=env)
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip().endswith("is what variant cpu says")


def test_verify_stops_a_build_whose_torch_is_not_the_variants_cuda():
    """The trap of a PyTorch index given as an extra index: pip quietly takes another build."""
    if torch.version.cuda:
        pytest.skip("this host's torch is a CUDA build")
    env = {"VARIANT": "cu130", "TORCH_VERSION": torch.__version__.split("+")[0], "CUDA": "13.0"}
    result = script("verify.py", "torch", env=env)
    assert result.returncode == 1
    line = result.stdout.strip()
    assert line.startswith(f"verl-deploy: torch {torch.__version__} from ") and "is a CPU build" in line
    assert "variant cu130 needs CUDA 13.0" in line and "--torch-index-url" in line


def test_verify_stops_a_build_whose_dependencies_replaced_torch():
    env = {"VARIANT": "cu130", "TORCH_VERSION": "2.99.0", "VLLM_VERSION": ""}
    result = script("verify.py", "deps", env=env)
    assert result.returncode == 1 and "replaced torch 2.99.0 with" in result.stdout


def installed(site: Path, name: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> None:
    """A distribution laid out as pip installs one: its files, METADATA and a RECORD that lists them."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
    record = [f"{rel},," for rel in files] + [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")


def test_prune_removes_distributions_and_paths_from_a_site_folder(tmp_path):
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    installed(site, "video_codec", {"video_codec/__init__.py": "", "video_codec/lib.so": "x" * 1000})
    installed(site, "keep", {"keep/__init__.py": "", "keep/tests/test_x.py": "", "keep/sub/tests/test_y.py": ""})
    result = script("prune.py", str(site), env={"UNUSED": "Video-Codec not-there", "UNUSED_PATHS": "keep/**/tests"})
    assert result.returncode == 0, result.stderr
    assert not (site / "video_codec").exists() and not list(site.glob("video_codec-*"))
    assert (site / "keep" / "__init__.py").exists() and (site / "keep-1.0.dist-info").exists()
    assert not list(site.glob("keep/**/tests"))
    assert "removed 1 unused distributions" in result.stdout and "not installed: not-there" in result.stdout


def test_prune_keeps_an_orphan_that_one_staying_requires(tmp_path):
    """The orphans are read off one image; in another a package may need one of them."""
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    installed(site, "dateparse", {"dateparse/__init__.py": ""})
    installed(site, "plotting", {"plotting/__init__.py": ""}, requires=("dateparse>=1", "extra-only; extra == 'x'"))
    installed(site, "extra_only", {"extra_only/__init__.py": ""})
    installed(site, "loader", {"loader/__init__.py": ""}, requires=("dateparse",))
    result = script("prune.py", str(site), env={"UNUSED": "plotting", "ORPHANS": "dateparse extra-only"})
    assert result.returncode == 0, result.stderr
    assert not (site / "plotting").exists() and not (site / "extra_only").exists()
    assert (site / "dateparse" / "__init__.py").exists()
    assert "removed 2 unused distributions" in result.stdout and "kept dateparse: loader requires it" in result.stdout
    # An unused distribution goes whatever requires it: a variant's own list says so on purpose (vLLM's FlashInfer).
    result = script("prune.py", str(site), env={"UNUSED": "dateparse"})
    assert result.returncode == 0 and not (site / "dateparse").exists()


needs_toolchain = pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("strip")) and os.environ.get("CI") != "true",
                                     reason="needs gcc and strip (binutils) to build and strip a real library")


def shared_library(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    c = path.with_suffix(".c")
    c.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-g", "-o", str(path), str(c)], check=True)
    c.unlink()
    return path


@needs_toolchain
def test_prune_strips_symbol_tables_and_the_library_still_loads_and_works(tmp_path):
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    lib = shared_library(site / "native" / "libadd.so", "static int helper(int a) { return a + 1; }\n"
                         "int add_one(int a) { return helper(a); }\n")
    vendored = shared_library(site / "native.libs" / "libvendored.so", "int vendored(void) { return 7; }\n")
    sizes = {p: p.stat().st_size for p in (lib, vendored)}
    (site / "native" / "notes.so.txt").write_text("not an ELF file")
    result = script("prune.py", str(site), env={"STRIP": "**/*.so **/*.so.*"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert lib.stat().st_size < sizes[lib] and vendored.stat().st_size == sizes[vendored]
    symbols = subprocess.run(["nm", str(lib)], capture_output=True, text=True)
    assert "no symbols" in symbols.stderr  # the static helper's name is gone from the symbol table...
    assert ctypes.CDLL(str(lib)).add_one(41) == 42  # ...and the exported function still loads and runs
    assert "stripped the symbol tables of native libraries" in result.stdout


@needs_toolchain
def test_prune_stops_in_one_line_at_a_library_that_no_longer_loads_once_stripped(tmp_path):
    """A strip that leaves a library unloadable (as it can a patchelf-rewritten one; here a stand-in strip that
    tears the file): the build stops, naming the library, instead of shipping it."""
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    lib = shared_library(site / "native" / "libfine.so", "int fine(void) { return 1; }\n")
    fake_strip = tmp_path / "bin" / "strip"
    fake_strip.parent.mkdir()
    fake_strip.write_text("#!/bin/sh\nfor f in \"$@\"; do case $f in -*) ;; *) printf 'torn' > \"$f\";; esac; done\n")
    fake_strip.chmod(0o755)
    result = script("prune.py", str(site), env={"STRIP": "**/*.so", "PATH": f"{fake_strip.parent}:{os.environ['PATH']}"})
    assert result.returncode == 1
    assert result.stdout.strip().splitlines()[-1].startswith(f"verl-deploy: {lib} no longer loads once stripped")


def test_pip_download_progress_becomes_package_size_and_speed():
    now = [0.0]
    status = StepStatus(clock=lambda: now[0])
    assert status.feed("  Downloading torch-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl (554.6 MB)") == [
        "  Downloading torch-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl (554.6 MB)"]
    logged = []
    for second in range(1, 41):
        now[0] = second
        logged += status.feed(f"Progress {second * 10_000_000} of 400000000")
    assert status.status == "torch-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl: 400 MB of 400 MB, 10 MB/s"
    # A plain log gets a progress line every 15 s and the last one, not 160 of them.
    assert logged == [
        "torch-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl: 150 MB of 400 MB, 10 MB/s",
        "torch-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl: 300 MB of 400 MB, 10 MB/s",
        "torch-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl: 400 MB of 400 MB, 10 MB/s",
    ]


def test_progress_lines_stay_out_of_a_failing_steps_log_tail():
    log = BuildLog(clock=lambda: 0.0)
    log.feed({"stream": "Step 1/1 : RUN pip install torch\n"})
    log.feed({"stream": "  Downloading torch.whl (1 MB)\nProgress 1 of 2\nProgress 2 of 2\nERROR: boom\n"})
    assert log.current.log == ["  Downloading torch.whl (1 MB)", "ERROR: boom"]


def test_the_builds_own_one_line_reason_is_the_error():
    log = BuildLog(clock=lambda: 0.0)
    log.feed({"stream": "Step 7/9 : RUN python3 /extras/build/preflight.py\n"})
    log.feed({"stream": "verl-deploy: cannot reach the package index https://x.example (timed out): pass --pip-index-url\n"})
    log.feed({"error": "The command '/bin/sh -c python3 /extras/build/preflight.py' returned a non-zero code: 1"})
    error = _failure(log, Console(file=open(os.devnull, "w")), "base")
    assert str(error) == ("build failed at step 7/9 (RUN python3 /extras/build/preflight.py): cannot reach the "
                          "package index https://x.example (timed out): pass --pip-index-url")


def test_a_quiet_step_gets_a_line_every_so_often_in_a_plain_log():
    said = []
    now = [0.0]
    beat = Heartbeat(said.append, quiet_s=0.05, clock=lambda: now[0])
    with beat:
        beat.beat("Step 13/48 RUN pip install torch")
        now[0] = 100.0
        for _ in range(100):
            if said:
                break
            threading.Event().wait(0.05)
    assert said and said[0] == "    … Step 13/48 RUN pip install torch: still running (100 s)"
