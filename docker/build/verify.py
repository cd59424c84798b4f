"""Check that what the build installed is what the variant catalog says, and stop the build when it is not.

    python verify.py torch   after torch: its release, its CUDA (or a CPU build) and its GPU architectures
    python verify.py deps    after the dependencies: vLLM's release, every == pin of RUNTIME_PACKAGES, and torch
                             still the one verified
    python verify.py services  the services image: its services import (numpy too, for the code tools run) and no
                             torch or CUDA library came with them
    python verify.py verl    upstream verl's images: `import verl` gives RUNTIME_VERSION (the tutorial's check) and
                             its trainer's Hydra config composes (`python -m verl.trainer.main_ppo --cfg job`)

The expected values come as the build's ARGs (environment): VARIANT, TORCH_VERSION, CUDA ("none": CPU),
COMPUTE_CAPABILITIES ("7.5,8.0,..."), VLLM_VERSION (empty: no vLLM). The failure is one line that starts with
"verl-deploy:", which `verl-deploy images build` shows as its error.
"""

import configparser
import importlib.metadata
import os
import re
import sys

TORCH_CONF = "/extras/pip-torch.conf"


def source() -> str:
    """Where torch came from, for the message: the torch step's indexes and wheelhouse, credentials removed."""
    config = configparser.ConfigParser()
    config.read(TORCH_CONF)
    section = config["global"] if config.has_section("global") else {}
    where = [section.get("index-url", "https://pypi.org/simple")] + section.get("extra-index-url", "").split()
    if section.get("find-links"):
        where.insert(0, "the wheelhouse")
    return ", ".join(re.sub(r"//[^/@]+@", "//***@", w) for w in where)


def fail(message: str) -> None:
    print(f"verl-deploy: {message}")
    sys.exit(1)


def capabilities(torch) -> list[str]:
    """The sm_XY architectures compiled into torch as 'X.Y' (get_arch_list() is empty without a GPU on some
    releases; the compiled-in flags are not)."""
    archs = torch.cuda.get_arch_list() or torch._C._cuda_getArchFlags().split()
    found = {f"{m[1][:-1]}.{m[1][-1]}" for a in archs if (m := re.fullmatch(r"sm_(\d+)a?", a))}
    return sorted(found, key=lambda cc: tuple(int(p) for p in cc.split(".")))


def check_torch() -> None:
    import warnings

    warnings.filterwarnings("ignore")  # torch without NumPy (installed in the next step) says so at import
    import torch

    variant, want_version, want_cuda = os.environ["VARIANT"], os.environ["TORCH_VERSION"], os.environ["CUDA"]
    have_version = torch.__version__.split("+")[0]
    have_cuda = torch.version.cuda or "none"
    if have_version != want_version:
        fail(f"torch {torch.__version__} from {source()} is installed, variant {variant} pins {want_version}")
    if have_cuda != want_cuda:
        built = "a CPU build" if have_cuda == "none" else f"built for CUDA {have_cuda}"
        wanted = "a CPU build" if want_cuda == "none" else f"CUDA {want_cuda}"
        fail(f"torch {torch.__version__} from {source()} is {built}, variant {variant} needs {wanted}: "
             "pass --torch-index-url URL of an index that has that build, or --wheelhouse DIR holding it")
    if want_cuda != "none":
        want_ccs = [cc for cc in os.environ.get("COMPUTE_CAPABILITIES", "").split(",") if cc]
        have_ccs = capabilities(torch)
        if have_ccs != want_ccs:
            fail(f"torch {torch.__version__} is compiled for compute capabilities {','.join(have_ccs)}, "
                 f"docker/variants.yaml says {','.join(want_ccs)} for {variant}: correct the catalog")
    print(f"verl-deploy: torch {torch.__version__} ({built_for(have_cuda)}) is what variant {variant} says")


def built_for(cuda: str) -> str:
    return "CPU build" if cuda == "none" else f"CUDA {cuda}"


def check_deps() -> None:
    variant, want_torch, want_vllm = os.environ["VARIANT"], os.environ["TORCH_VERSION"], os.environ.get("VLLM_VERSION", "")
    have_torch = importlib.metadata.version("torch").split("+")[0]
    if have_torch != want_torch:
        fail(f"the dependencies replaced torch {want_torch} with {have_torch}: a package pins another torch; "
             f"align docker/variants.yaml's torch for {variant} with it")
    if want_vllm:
        try:
            have_vllm = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            fail(f"vLLM {want_vllm} is not installed in variant {variant}")
        if have_vllm != want_vllm:
            fail(f"vLLM {have_vllm} is installed, variant {variant} pins {want_vllm}")
    pinned = []
    for requirement in os.environ.get("RUNTIME_PACKAGES", "").split():
        name, sep, want = requirement.partition("==")
        if not sep:
            continue
        name = name.split("[")[0]
        have = importlib.metadata.version(name)
        if have != want:
            fail(f"{name} {have} is installed, docker/variants.yaml pins {want} for runtime {os.environ.get('RUNTIME')}")
        pinned.append(f"{name} {have}")
    print(f"verl-deploy: torch {have_torch}" + (f", vLLM {want_vllm}" if want_vllm else "")
          + "".join(f", {pin}" for pin in pinned) + f" as variant {variant} says")


def check_verl() -> None:
    """The tutorial's own check, then verl's trainer composing its config as it does before every run."""
    import subprocess

    want = os.environ["RUNTIME_VERSION"]
    probe = subprocess.run([sys.executable, "-c", "import verl; print(verl.__version__)"], capture_output=True, text=True)
    have = probe.stdout.strip().splitlines()[-1:] or [""]
    if probe.returncode or have[0] != want:
        fail(f"`import verl` gives {have[0] or 'an error'!r}, not {want}: {last_line(probe.stderr)}")
    composed = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", "--cfg", "job"],
                              capture_output=True, text=True)
    if composed.returncode or "actor_rollout_ref:" not in composed.stdout:
        fail(f"verl's trainer cannot compose its config (main_ppo --cfg job): {last_line(composed.stderr)}")
    print(f"verl-deploy: import verl gives {have[0]}; main_ppo --cfg job composes verl's config")


def check_services() -> None:
    import importlib

    # uvloop and httptools: uvicorn serves with them where they import, else quietly with asyncio and h11
    for module in ("numpy", "uvloop", "httptools", "verl_runtime.services.sandbox", "verl_runtime.services.retriever"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            fail(f"the services image cannot import {module}: {exc}")
    heavy = [d.metadata["Name"] for d in importlib.metadata.distributions()
             if re.match(r"(torch|nvidia-|triton|vllm)", d.metadata["Name"] or "", re.I)]
    if heavy:
        fail(f"the services image holds {', '.join(sorted(heavy))}: the services extra pulled them in; remove them")
    print("verl-deploy: the services import; no torch, no CUDA")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


if __name__ == "__main__":
    {"torch": check_torch, "deps": check_deps, "verl": check_verl, "services": check_services}[sys.argv[1]]()
