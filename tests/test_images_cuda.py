"""The cu130 image built for real, from PyPI alone (through this machine's TLS-intercepting proxy, with the host's CA
bundle handed to the build), with no layer cache, then checked inside: what torch and vLLM report against the
labels and the catalog, a C/C++ compiler for Triton and inductor, non-root without setuid binaries, vLLM's
text-generation path importable without what the build removed, and the quickstart training 2 steps on the CPU.
Everything the build made is removed afterwards.

There is no GPU here: the image's GPU path (Triton compiling its launcher, vLLM on CUDA) is for `make gpu-check`
on a GPU host. Slow tier: the build takes about ten minutes and ~20 GB of disk.
"""

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from rich.console import Console

from verl_deploy import compat
from verl_deploy.images import plan_build
from verl_deploy.images.build import build
from verl_deploy.images.context import nvidia_require_cuda, unused

from conftest import REPO, make_room, remove_images_made_since

pytestmark = [pytest.mark.docker, pytest.mark.slow]

VARIANT = "cu130"
TAG = f"verl-deploy-test:{VARIANT}"
GIB = 1024**3
SIZE_GOAL = 9 * GIB


@pytest.fixture(scope="module")
def cuda_image(docker_client, base_image):
    """The cu130 image, built without cache; every image the build made is removed when the module ends.
    VERL_DEPLOY_TEST_CUDA_IMAGE=TAG checks an image that is already here instead (and removes nothing)."""
    if tag := os.environ.get("VERL_DEPLOY_TEST_CUDA_IMAGE"):
        image = docker_client.api.inspect_image(tag)
        yield SimpleNamespace(tag=tag, size=image["Size"], seconds=0.0, log=None)
        return
    make_room(docker_client, need_gb=22, what="the cu130 image build")
    before = {image.id for image in docker_client.images.list(all=True)}
    root = docker_client.info()["DockerRootDir"]
    free_before = shutil.disk_usage(root).free if os.path.isdir(root) else None
    opts, notes = plan_build(VARIANT, base_image=base_image, tag=TAG, no_cache=True)
    # A plain log (not a terminal), as in CI; recorded for the test of what it shows (run with -s to follow it).
    console = Console(stderr=True, width=200, record=True, force_terminal=False)
    for note in notes:
        console.print(note)
    try:
        built = build(opts, console)
        used = f", {(free_before - shutil.disk_usage(root).free) / 1e9:.1f} GB of disk" if free_before else ""
        print(f"\n{VARIANT} image: {built.size / 1e9:.2f} GB ({built.size / GIB:.2f} GiB), built in {built.seconds:.0f} s"
              f"{used}", file=sys.stderr)
        yield SimpleNamespace(tag=built.tag, size=built.size, seconds=built.seconds, log=console.export_text())
    finally:
        remove_images_made_since(docker_client, before, TAG)


def run(client, image: str, script: str, user: str | None = None) -> str:
    return client.containers.run(image, ["-c", script], entrypoint=["sh"], user=user, remove=True,
                                 network_disabled=True).decode()


def test_what_torch_and_vllm_report_is_what_labels_and_catalog_say(docker_client, cuda_image):
    variant = compat.load_catalog()[VARIANT]
    config = docker_client.api.inspect_image(cuda_image.tag)["Config"]
    labels, env = config["Labels"], dict(item.split("=", 1) for item in config["Env"])
    probe = (
        "import json, re, importlib.metadata as m, torch; "
        "archs = torch.cuda.get_arch_list() or torch._C._cuda_getArchFlags().split(); "
        "ccs = sorted({f'{a[3:-1]}.{a[-1]}' for a in archs if re.fullmatch(r'sm_\\d+', a)}, key=lambda c: tuple(map(int, c.split('.')))); "
        "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'ccs': ccs, 'vllm': m.version('vllm')}))"
    )
    found = json.loads(run(docker_client, cuda_image.tag, f'python -W ignore -c "{probe}"').strip().splitlines()[-1])
    assert found["cuda"] == labels["verl-deploy.cuda"] == variant.cuda
    assert found["torch"].split("+")[0] == labels["verl-deploy.torch"] == variant.torch
    assert found["ccs"] == labels["verl-deploy.compute-capabilities"].split(",") == list(variant.compute_capabilities)
    assert found["vllm"] == labels["verl-deploy.vllm"] == variant.vllm
    assert env["NVIDIA_REQUIRE_CUDA"] == nvidia_require_cuda(variant) == f"cuda>={variant.cuda}"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_the_build_log_said_what_each_step_was_doing(cuda_image):
    """Downloads with their sizes and speed under their step, the build's own checks, no minutes of silence."""
    if cuda_image.log is None:
        pytest.skip("VERL_DEPLOY_TEST_CUDA_IMAGE: no build to read the log of")
    lines = cuda_image.log.splitlines()
    torch_step = next(i for i, line in enumerate(lines) if line.startswith("✓ Step") and 'pip install "torch==' in line)
    before = lines[:torch_step]
    assert any(line.startswith("    Downloading torch-") or "Downloading torch-" in line for line in before)
    assert any(line.strip().startswith("torch-") and " MB of " in line and "/s" in line for line in before)
    assert any("verl-deploy: torch 2.14.0+cu130 (CUDA 13.0) is what variant cu130 says" in line for line in before)
    assert any("verl-deploy: removed " in line for line in lines)


def test_vllm_text_generation_path_imports_without_what_the_build_removed(docker_client, cuda_image):
    removed = unused(compat.load_catalog()[VARIANT])
    script = (
        "import importlib.metadata as m, importlib.util, vllm; from vllm import LLM, SamplingParams; "
        "import vllm.model_executor.models.qwen2, vllm.model_executor.models.llama; "
        "import vllm.v1.engine.llm_engine, vllm.v1.worker.gpu_model_runner, vllm.v1.sample.sampler; "
        "import vllm.v1.attention.backends.flash_attn; "
        "names = {d.metadata['Name'].lower().replace('_', '-') for d in m.distributions()}; "
        "print('left:', sorted(names & " + repr(set(removed)) + ") + (['flashinfer'] if importlib.util.find_spec('flashinfer') else []))"
    )
    out = run(docker_client, cuda_image.tag, f'python -W ignore -c "{script}" 2>&1')
    assert out.strip().splitlines()[-1] == "left: []", out[-3000:]


def test_a_compiler_builds_what_triton_and_inductor_build(docker_client, cuda_image):
    """Triton compiles its CUDA launcher as a Python extension with `cc`; inductor compiles C++ with g++."""
    script = (
        "set -e; cd /tmp; "
        "printf '#include <Python.h>\\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, \"probe\"};\\n"
        "PyMODINIT_FUNC PyInit_probe(void) { return PyModule_Create(&m); }\\n' > probe.c; "
        "cc -shared -fPIC -O2 probe.c -o probe$(python -c 'import sysconfig; print(sysconfig.get_config_var(\"EXT_SUFFIX\"))') "
        "-I$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"include\"])'); "
        "python -c 'import probe; print(\"extension ok\")'; "
        "printf '#include <vector>\\nint main() { return std::vector<int>{1}.size() - 1; }\\n' > p.cpp && g++ p.cpp -o p && ./p && echo 'c++ ok'"
    )
    out = run(docker_client, cuda_image.tag, script)
    assert out.split() == ["extension", "ok", "c++", "ok"]


def test_runs_as_non_root_without_setuid_binaries(docker_client, cuda_image):
    out = run(docker_client, cuda_image.tag, "id -u; find / -xdev -perm /6000 -type f 2>/dev/null | wc -l", user=None)
    assert out.split() == ["1000", "0"]


def test_layers_and_size(docker_client, cuda_image):
    """torch + NVIDIA libraries, the other dependencies and the source are separate layers; the size goal holds."""
    layers = [(layer["Size"], layer["CreatedBy"]) for layer in docker_client.api.history(cuda_image.tag)]
    copies = [size for size, created_by in layers if "COPY" in created_by and size > 0]
    print("\nlayers (MB, newest first): " + ", ".join(f"{size / 1e6:,.0f}" for size, _ in layers if size > 1e6),
          file=sys.stderr)
    assert len([size for size in copies if size > 1e9]) == 2  # the torch layer and the dependencies' layer
    assert min(copies) < 10e6  # the source layer
    assert cuda_image.size <= SIZE_GOAL, f"{cuda_image.size / GIB:.2f} GiB"


def test_quickstart_trains_two_steps_on_the_cpu_and_says_no_gpu_is_visible(tmp_path, cuda_image):
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "verl_deploy", "run", str(REPO / "examples" / "quickstart.yaml"), "--target", "docker",
           "--image", cuda_image.tag, "--runs-dir", str(runs), "--run-id", "cuda-cpu", "--shm-size", "1g",
           "--set", "trainer.total_training_steps=2", "--set", "trainer.test_freq=-1", "--set", "trainer.device=auto"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = [json.loads(line) for line in (runs / "cuda-cpu" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "step" in m][-1] == 2
    assert "[WARN] torch here is built for CUDA 13.0 but no GPU is visible" in result.stdout + result.stderr


def test_vllm_rollout_without_a_gpu_is_one_line(tmp_path, cuda_image):
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "verl_deploy", "run", str(REPO / "examples" / "quickstart.yaml"), "--target", "docker",
           "--image", cuda_image.tag, "--runs-dir", str(runs), "--run-id", "cuda-vllm", "--shm-size", "1g",
           "--set", "trainer.total_training_steps=1", "--set", "rollout.name=vllm"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "error: rollout.name=vllm: this vLLM is built for CUDA and no GPU is visible" in output
    assert "Traceback" not in output and "Device string must not be empty" not in output
