"""What the user types for resources — sizes, CPUs, GPUs, node counts — parsed once, for every target.

The same `--memory lots` gets the same one-line error whether the run goes to this host, Docker or Kubernetes,
because every launcher reads the values parsed here (JobSpec holds them), never the raw strings.

Sizes: Docker's spellings (`16g`, `512m`, `16gb`) and Kubernetes' binary ones (`16Gi`, `512Mi`) are accepted;
a single-letter suffix means what Docker means by it (binary: `16g` = `16G` = `16Gi` = 16 GiB), so a value
copied from a `docker run` line asks for the same bytes on a cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4
_UNITS = {"k": KiB, "m": MiB, "g": GiB, "t": TiB}
# '', 'b', then for each unit: 'g', 'gb', 'gi', 'gib' (lower-cased before the look-up).
_SUFFIX = {"": 1, "b": 1, **{u + tail: size for u, size in _UNITS.items() for tail in ("", "b", "i", "ib")}}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)", re.IGNORECASE)
# Docker refuses a memory limit under 6 MB (`docker run --memory`, "Minimum memory limit allowed is 6MB").
MIN_MEMORY = 6 * MiB


class SizeError(ValueError):
    """One line naming the flag, the value and an example of what works."""


def parse_size(flag: str, text: str | int | None, example: str = "16g") -> int | None:
    """'16g' | '16Gi' | '512m' | '16gb' | 1073741824 -> bytes (None stays None); SizeError for anything else,
    zero or a negative size."""
    if text is None:
        return None
    if isinstance(text, int) and not isinstance(text, bool):
        number, unit = float(text), ""
    else:
        match = _SIZE.fullmatch(str(text).strip())
        if not match or match.group(2).lower() not in _SUFFIX:
            raise SizeError(f"{flag} {str(text)!r} is not a size: use e.g. {example} (or {example[:-1]}Gi)")
        number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * _SUFFIX[unit])
    if size <= 0:
        raise SizeError(f"{flag} {str(text)!r} must be more than zero: use e.g. {example}")
    return size


def parse_memory(text: str | int | None) -> int | None:
    size = parse_size("--memory", text, "64g")
    if size is not None and size < MIN_MEMORY:
        raise SizeError(f"--memory {str(text)!r} is below the 6m a container needs to start: use e.g. 64g")
    return size


# The least host memory a trainer beside one GPU runs in: torch's CUDA libraries and context take 2-3 GiB resident
# before any model, and the model's weights pass through host memory on their way to the GPU. A limit below it is
# killed at start-up, not saved by training slower.
MIN_MEMORY_PER_GPU = 4 * GiB


def check_gpu_memory(text, memory: int | None, gpus: Gpus) -> None:
    """SizeError (one line, with the least that can work) for a --memory below MIN_MEMORY_PER_GPU for each GPU of a
    node (--gpus all: at least one)."""
    if memory is None or not gpus.wanted:
        return
    count = gpus.number or 1
    least = MIN_MEMORY_PER_GPU * count
    if memory < least:
        per_gpu = f" ({docker_size(MIN_MEMORY_PER_GPU)} per GPU)" if count > 1 else ""
        raise SizeError(f"--memory {str(text)!r} is below the {docker_size(least)} a run on {count} GPU"
                        f"{'s' * (count > 1)} needs at least{per_gpu}: torch's CUDA libraries and context, and the "
                        f"weights on their way to the GPU: give --memory {docker_size(least)} or more (on k8s and "
                        "Slurm the limit is --memory plus /dev/shm, --shm-size)")


def parse_cpus(value: float | str | None) -> float | None:
    """--cpus: a positive number of cores (fractions allowed: 0.5)."""
    if value is None:
        return None
    try:
        cpus = float(value)
    except (TypeError, ValueError):
        raise SizeError(f"--cpus {value!r} is not a number of cores: use e.g. 8 or 0.5") from None
    if not cpus > 0 or cpus != cpus or cpus == float("inf"):
        raise SizeError(f"--cpus {value!r} must be a number of cores above zero: use e.g. 8 or 0.5")
    return cpus


def parse_nodes(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise SizeError(f"--nodes {value} must be at least 1")
    return value


@dataclass(frozen=True)
class Gpus:
    """GPUs asked for: all of them, a count, or specific devices (indices or UUIDs)."""

    count: int = 0  # -1 means all
    device_ids: tuple[str, ...] = ()

    @property
    def wanted(self) -> bool:
        return self.count != 0 or bool(self.device_ids)

    @property
    def number(self) -> int | None:
        """How many GPUs, when known without asking the host (None for 'all')."""
        if self.device_ids:
            return len(self.device_ids)
        return None if self.count < 0 else self.count

    def __str__(self) -> str:
        if self.device_ids:
            return "device=" + ",".join(self.device_ids)
        return "all" if self.count < 0 else str(self.count)


def parse_gpus(text: str | None) -> Gpus:
    """'all' | '2' | '0,1' | 'GPU-3f9...,GPU-77a...' | None/'0'/'none' -> Gpus."""
    text = (text or "").strip()
    if text in ("", "0", "none"):
        return Gpus()
    if text == "all":
        return Gpus(count=-1)
    if text.isdigit():
        return Gpus(count=int(text))
    ids = tuple(part.strip() for part in text.removeprefix("device=").split(",") if part.strip())
    if not ids or not all(i.isdigit() or i.startswith(("GPU-", "MIG-")) for i in ids):
        raise SizeError(f"--gpus {text!r} is not understood: use all, a count (2), indices (0,1) or UUIDs (GPU-...)")
    twice = sorted({i for i in ids if ids.count(i) > 1}, key=ids.index)
    if twice:  # one device counted twice: two workers on one GPU, and Docker's device=0,0
        raise SizeError(f"--gpus {text!r} names a GPU more than once ({', '.join(twice)}): name each GPU once, "
                        f"e.g. --gpus {','.join(dict.fromkeys(ids))}, or say how many: --gpus {len(ids)}")
    return Gpus(device_ids=ids)


# --- how much a trainer asks for on a shared node (Kubernetes, Slurm), from its GPUs ---------------------------

# Per GPU, what a trainer process group uses beside it: data loader and tokenizer workers, Ray, the rollout
# engine's CPU side, pinned host buffers for weight sync and checkpoints. Chosen to fit common 8-GPU nodes with
# room for the node's own daemons: 8 x (4 CPUs, 32 GiB) = 32 CPUs and 256 GiB (+ shared memory), which fits
# 8x L4 (GKE g2-standard-96: 96 vCPU, 384 GB), 8x A100 (AWS p4d.24xlarge: 96 vCPU, 1152 GiB; Azure ND96asr_v4:
# 96 vCPU, 900 GiB) and 8x H100/H200 (AWS p5.48xlarge: 192 vCPU, 2 TiB; GKE a3-highgpu-8g: 208 vCPU, 1872 GB).
CPUS_PER_GPU = 4
MEMORY_PER_GPU = 32 * GiB
# /dev/shm: NCCL's shared-memory transport and PyTorch's data-loader workers; grows with the GPUs, capped.
SHM_PER_GPU = 2 * GiB
SHM_CAP = 16 * GiB
# A CPU-only run (the quickstart on a cluster): small, so it schedules anywhere.
CPU_ONLY_CPUS = 2
CPU_ONLY_MEMORY = 8 * GiB
CPU_ONLY_SHM = 1 * GiB


@dataclass(frozen=True)
class PodSize:
    """One trainer pod's (or Slurm task's) share of a node. Shared memory is memory: a memory-backed /dev/shm
    counts against the container's memory limit, so the limit is the trainer's memory plus the shm size."""

    cpus: float
    memory: int  # the trainer's own memory, bytes
    shm: int  # /dev/shm, bytes

    @property
    def memory_limit(self) -> int:
        return self.memory + self.shm


def pod_size(gpus_per_node: int, cpus: float | None = None, memory: int | None = None,
             shm: int | None = None) -> PodSize:
    """The pod's CPUs, memory and shared memory: what the user gave, else the per-GPU defaults above."""
    if gpus_per_node > 0:
        defaults = (CPUS_PER_GPU * gpus_per_node, MEMORY_PER_GPU * gpus_per_node,
                    min(SHM_CAP, SHM_PER_GPU * gpus_per_node))
    else:
        defaults = (CPU_ONLY_CPUS, CPU_ONLY_MEMORY, CPU_ONLY_SHM)
    return PodSize(cpus=cpus or defaults[0], memory=memory or defaults[1], shm=shm or defaults[2])


# --- how each target spells them -------------------------------------------------------------------------------


def k8s_quantity(size: int) -> str:
    """Bytes as a Kubernetes quantity: the largest binary suffix that divides exactly (34359738368 -> '32Gi')."""
    for suffix, unit in (("Ti", TiB), ("Gi", GiB), ("Mi", MiB), ("Ki", KiB)):
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def k8s_cpus(cpus: float) -> str:
    """Cores as a Kubernetes quantity: '32', or millicores ('1500m') for a fraction."""
    return str(int(cpus)) if float(cpus).is_integer() else f"{round(cpus * 1000)}m"


def docker_size(size: int) -> str:
    """Bytes as Docker writes them (binary units): 17179869184 -> '16g'."""
    for suffix, unit in (("g", GiB), ("m", MiB), ("k", KiB)):  # the units docker-py's parse_bytes reads
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return f"{size}b"
