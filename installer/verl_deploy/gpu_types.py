"""The GPU types a user can name (`--gpu-type H100`): their memory, bf16 support and the node labels clusters
carry for them. The data, and where each value comes from, is gpu_types.yaml beside this file."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources


@dataclass(frozen=True)
class GpuType:
    name: str
    memory_gib: int
    bf16: bool
    labels: dict[str, tuple[str, ...]]  # node label key -> the values that mean this GPU
    aliases: tuple[str, ...] = ()


@lru_cache(maxsize=1)
def catalog() -> dict[str, GpuType]:
    import yaml

    data = yaml.safe_load(resources.files("verl_deploy").joinpath("gpu_types.yaml").read_text())
    return {
        name: GpuType(name=name, memory_gib=entry["memory_gib"], bf16=entry["bf16"],
                      labels={key: tuple(values) for key, values in entry["labels"].items()},
                      aliases=tuple(str(a) for a in entry.get("aliases", ())))
        for name, entry in data.items()
    }


def _key(name: str) -> str:
    return name.upper().replace("_", "-").replace(" ", "-").removeprefix("NVIDIA-")


def lookup(name: str) -> GpuType:
    """The type called `name` (case, spaces, '_' and a leading 'NVIDIA' do not matter; aliases too); ValueError
    naming the known types otherwise."""
    wanted = _key(name)
    for gpu in catalog().values():
        if wanted in {_key(gpu.name), *map(_key, gpu.aliases)}:
            return gpu
    raise ValueError(f"--gpu-type {name!r} is not a GPU type this tool knows: use one of {', '.join(catalog())} "
                     "(or --node-selector KEY=VALUE with your cluster's own label)")
