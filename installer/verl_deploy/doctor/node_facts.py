"""One node's facts for the multi-node pre-flight, as a plain JSON-able dict the nodes send to the master:
versions, NCCL_*/GLOO_* variables, its hostname and what it resolves to, the route to the master (interface,
address, subnet, MTU), /dev/shm, the locked-memory limit, InfiniBand ports and the clock.

Read without torch or iproute2 (images may lack `ip`): the route comes from the kernel through a connected UDP
socket (no packet is sent), interfaces from /sys/class/net and the SIOCGIF* ioctls of netdevice(7)."""

from __future__ import annotations

import fcntl
import importlib.metadata
import ipaddress
import os
import resource
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

from verl_deploy import host_facts
from verl_deploy.doctor.torch_check import installed_torch

SYS_NET = Path("/sys/class/net")
SYS_IB = Path("/sys/class/infiniband")
# netdevice(7): the ioctls that read an interface's IPv4 address and netmask.
SIOCGIFADDR, SIOCGIFNETMASK = 0x8915, 0x891B
ENV_PREFIXES = ("NCCL_", "GLOO_")
# The image's digest, where the launcher or the image says it (the images label it; a pod may pass it down).
IMAGE_ENV = "VERL_DEPLOY_IMAGE_DIGEST"


def gather(rank: int, master_host: str) -> dict[str, Any]:
    hostname = socket.gethostname()
    master_ip, master_error = _resolve(master_host)
    route = route_to(master_ip) if master_ip else {}
    nvml = host_facts.nvml_reading(None)
    return {
        "rank": rank,
        "hostname": hostname,
        "resolved": _resolve(hostname)[0],
        "master_ip": master_ip,
        "master_error": master_error,
        **route,
        "interfaces": interfaces(),
        "versions": versions(nvml),
        "gpus": len(nvml.get("devices") or []),
        "env": {key: value for key, value in sorted(os.environ.items()) if key.startswith(ENV_PREFIXES)},
        "shm_bytes": _shm_bytes(),
        "memlock": _memlock(),
        "ib_ports": ib_ports(),
        "torch": installed_torch() is not None,
        "time": time.time(),
    }


def _resolve(name: str) -> tuple[str | None, str | None]:
    try:
        return socket.gethostbyname(name), None
    except OSError as exc:
        return None, exc.strerror or str(exc)


def route_to(address: str) -> dict[str, Any]:
    """The interface, source address, subnet and MTU the kernel would use to reach `address`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))  # a UDP connect only asks the routing table
            source = probe.getsockname()[0]
        except OSError:
            return {"address": None, "interface": None}
    for name, info in interfaces().items():
        if info.get("address") == source:
            return {"address": source, "interface": name, "subnet": info.get("subnet"), "mtu": info.get("mtu")}
    return {"address": source, "interface": None}


def interfaces() -> dict[str, dict[str, Any]]:
    """Every interface: its IPv4 address and subnet (where it has one), MTU and whether it is up."""
    found = {}
    for path in sorted(SYS_NET.glob("*")):
        name = path.name
        info: dict[str, Any] = {"mtu": _int(path / "mtu"), "up": _text(path / "operstate") in ("up", "unknown")}
        address, netmask = _ioctl_ipv4(name, SIOCGIFADDR), _ioctl_ipv4(name, SIOCGIFNETMASK)
        if address:
            info["address"] = address
            info["subnet"] = str(ipaddress.ip_interface(f"{address}/{netmask}").network) if netmask else None
        speed = _int(path / "speed")
        if speed and speed > 0:
            info["speed_mbps"] = speed
        found[name] = info
    return found


def _ioctl_ipv4(interface: str, request: int) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), request, struct.pack("256s", interface.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def versions(nvml: dict[str, Any]) -> dict[str, str | None]:
    torch = installed_torch()
    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "torch": torch[0] if torch else None,
        "cuda": torch[1] if torch else None,
        "nccl": _distribution("nvidia-nccl-cu13") or _distribution("nvidia-nccl-cu12"),
        "ray": _distribution("ray"),
        "verl_runtime": _distribution("verl-deploy"),
        "driver": nvml.get("driver_version"),
        "image": os.environ.get(IMAGE_ENV),
    }


def _distribution(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _shm_bytes() -> int | None:
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def _memlock() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return -1 if soft == resource.RLIM_INFINITY else soft


def ib_ports() -> list[dict[str, Any]]:
    """InfiniBand/RoCE ports: device, port, state ("4: ACTIVE") and the GIDs NCCL_IB_GID_INDEX picks from."""
    ports = []
    for port in sorted(SYS_IB.glob("*/ports/*")):
        gids = sorted(port.glob("gids/*"), key=lambda p: int(p.name) if p.name.isdigit() else 0)
        ports.append({
            "device": port.parent.parent.name,
            "port": port.name,
            "state": _text(port / "state"),
            "gids": [_text(gid) for gid in gids[:8]],
        })
    return ports


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
