"""This host's facts, read by one module: its NVIDIA driver, CUDA and GPUs (memory, compute capability, MIG, ECC...)
as one NVML reading. doctor, `images`, `plan` and the variant choice (compat.variant_for) all read it here.

The reading is a plain dict (see tests/fixtures/nvml/h200.json), taken live through nvidia-ml-py or replayed from a
file, so everything that reads it runs the same on a real GPU host and on a recorded one: VERL_DEPLOY_NVML_READING
(or doctor's --nvml-reading) names the file. Record this host's reading with
`python -m verl_deploy.host_facts > reading.json`.

The lowest layer of the host package: it imports nothing of verl_deploy but the watchdog, and NVML only when asked.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_deploy.watchdog import call_with_timeout

NVML_READING_ENV = "VERL_DEPLOY_NVML_READING"  # a recorded reading replayed instead of this host's
# A driver without persistence mode can take seconds to initialise every GPU; a hung one must not hang the CLI.
NVML_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class HostFacts:
    """One NVML reading and what is read from it; `nvml` holds `error` when there is no usable driver."""

    nvml: dict[str, Any]

    @property
    def driver(self) -> str | None:
        return self.nvml.get("driver_version")

    @property
    def gpus(self) -> list[dict[str, Any]]:
        return self.nvml.get("devices") or []

    @property
    def capabilities(self) -> list[str]:
        """The compute capability of each GPU, e.g. "9.0"."""
        return [f"{cc[0]}.{cc[1]}" for cc in (gpu.get("compute_capability") for gpu in self.gpus) if cc]

    @property
    def has_gpu(self) -> bool:
        return self.driver is not None and bool(self.capabilities)


def read(recorded: Path | str | None = None) -> HostFacts:
    """This host's facts: from the reading file `recorded`, else the one VERL_DEPLOY_NVML_READING names, else NVML
    live (ValueError, one line, when a named file is not a reading)."""
    return HostFacts(nvml_reading(recorded))


def nvml_reading(recorded: Path | str | None = None) -> dict[str, Any]:
    """The NVML reading `read` takes (see there). A live reading that hangs is recorded as an error."""
    recorded = recorded or os.environ.get(NVML_READING_ENV)
    if recorded:
        return load_reading(Path(recorded))
    try:
        return call_with_timeout(read_nvml, NVML_TIMEOUT_S)
    except TimeoutError as exc:
        return {"error": "init_failed", "message": f"NVML {exc}"}


def load_reading(path: Path) -> dict[str, Any]:
    """A recorded reading; ValueError with a one-line reason when it is not one."""
    try:
        reading = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read NVML reading {path}: {exc}") from exc
    if not isinstance(reading, dict) or not ("error" in reading or "driver_version" in reading):
        raise ValueError(f"{path} is not an NVML reading (needs driver_version or error)")
    return reading


def read_nvml() -> dict[str, Any]:
    """This host's NVML reading. A missing library or a failing init is recorded as `error`, never raised."""
    try:
        import pynvml
    except ImportError as exc:
        return {"error": "library_not_found", "message": f"nvidia-ml-py is not installed ({exc})"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return {"error": "library_not_found", "message": "libnvidia-ml.so.1 not found: no NVIDIA driver"}
    except pynvml.NVMLError as exc:
        return {"error": "init_failed", "message": str(exc)}
    try:
        return _read_devices(pynvml)
    except pynvml.NVMLError as exc:
        return {"error": "query_failed", "message": str(exc)}
    finally:
        pynvml.nvmlShutdown()


def _read_devices(nvml: Any) -> dict[str, Any]:
    count = nvml.nvmlDeviceGetCount()
    reading = {
        "driver_version": _text(nvml.nvmlSystemGetDriverVersion()),
        "cuda_driver_version": nvml.nvmlSystemGetCudaDriverVersion_v2(),
        "nvml_version": _text(nvml.nvmlSystemGetNVMLVersion()),
        "device_count": count,
        "kernel": platform.release(),
        "devices": [],
    }
    for index in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)

        def optional(query: Any, *args: Any) -> Any:
            # Queries a GPU may not support (ECC and MIG on GeForce cards) read as None.
            try:
                return query(handle, *args)
            except nvml.NVMLError:
                return None

        reading["devices"].append(
            {
                "index": index,
                "name": _text(nvml.nvmlDeviceGetName(handle)),
                "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
                "pci_bus_id": _text(nvml.nvmlDeviceGetPciInfo(handle).busId),
                "memory_total": memory.total,
                "memory_used": memory.used,
                "compute_capability": list(nvml.nvmlDeviceGetCudaComputeCapability(handle)),
                "mig_mode": _list(optional(nvml.nvmlDeviceGetMigMode)),
                "persistence_mode": optional(nvml.nvmlDeviceGetPersistenceMode),
                "temperature_c": optional(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
                "power_limit_mw": optional(nvml.nvmlDeviceGetPowerManagementLimit),
                "ecc_mode": _list(optional(nvml.nvmlDeviceGetEccMode)),
                "brand": optional(nvml.nvmlDeviceGetBrand),
                "architecture": optional(nvml.nvmlDeviceGetArchitecture),
                "max_pcie_link_gen": optional(nvml.nvmlDeviceGetMaxPcieLinkGeneration),
                "processes": len(optional(nvml.nvmlDeviceGetComputeRunningProcesses) or []),
            }
        )
    return reading


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _list(value: Any) -> list[int] | None:
    return None if value is None else list(value)


if __name__ == "__main__":
    print(json.dumps(read_nvml(), indent=1))
