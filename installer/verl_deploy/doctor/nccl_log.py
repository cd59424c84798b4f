"""NCCL_DEBUG=INFO's lines, read for the pre-flight: the network NCCL chose, the interface it bootstraps on, the
transport of each channel; and the verdicts on them and on the all_reduce's bus bandwidth.

The line formats are NCCL's own INFO() format strings (github.com/NVIDIA/nccl, 2.18-2.2x):
src/bootstrap.cc "Bootstrap : Using %s", src/transport/net_socket.cc "NET/Socket : Using %s",
src/init.cc "Using network %s", src/transport/net.cc "Channel %02d/%d : %d[%d] -> %d[%d] [%s] via NET/%s/%d%s",
src/transport/p2p.cc "... via P2P/%s", src/transport/shm.cc "... via SHM/%s", and the "NCCL version" banner.
tests/fixtures/nccl/ holds output written from those formats (recorded output of a 2-node job would be better;
none was at hand)."""

from __future__ import annotations

import re
from typing import Any

from verl_deploy.doctor.core import Finding

AREA = "cluster"
# Bus bandwidth nccl-tests' published runs reach (its doc/PERFORMANCE.md and NVIDIA's DGX H100 figures): per
# NIC 400 Gb/s ~46-48 GB/s, 100 Gb/s ~12 GB/s, i.e. ~94 % of the line rate. (8 H100s over NVLink reach ~476 GB/s;
# the pre-flight runs one rank per node, so it judges the network between nodes only.)
LINE_RATE_EFFICIENCY = 0.94
FAR_BELOW = 0.5  # a warning under half of what the fabric should give
# Interfaces that never carry traffic between nodes (nccl #697: NCCL picking docker0 or a veth).
NOT_A_FABRIC = re.compile(r"^(lo|docker\d*|veth|br-|virbr|cni|flannel|cali)")

_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
_BOOTSTRAP = re.compile(r"NCCL INFO Bootstrap : Using (\S+?):(\S+?)<")
_SOCKET_IF = re.compile(r"NCCL INFO NET/Socket : Using \[0\](\S+?):")
_CHANNEL = re.compile(r"NCCL INFO Channel \d+(?:/\d+)? : \d+\[\w+\] -> \d+\[\w+\] (?:\[\w+\] )?via (\S+)")
_VERSION = re.compile(r"NCCL version (\S+)")


def info_lines(output: str) -> str:
    return "\n".join(line for line in output.splitlines() if "NCCL INFO" in line or "NCCL version" in line)


def parse(log: str) -> dict[str, Any]:
    """What NCCL said it chose: version, network (IB or Socket), bootstrap and socket interfaces, transports."""
    transports = sorted({match.split("/")[0] + ("/" + match.split("/")[1] if match.startswith("NET/") else "")
                         for match in _CHANNEL.findall(log)})
    first = lambda pattern: (pattern.findall(log) or [None])[0]  # noqa: E731
    return {
        "version": first(_VERSION),
        "network": first(_NETWORK),
        "bootstrap_interface": first(_BOOTSTRAP),
        "socket_interface": first(_SOCKET_IF),
        "transports": transports,
        "gdr": "GDRDMA" in log,
    }


def expected_busbw(facts: dict[str, Any], parsed: dict[str, Any]) -> float | None:
    """What the fabric between the nodes should give (GB/s): the line rate of the interface NCCL uses."""
    interface = parsed.get("socket_interface") or facts.get("interface")
    speed = facts.get("interfaces", {}).get(interface or "", {}).get("speed_mbps")
    return speed / 8000 * LINE_RATE_EFFICIENCY if speed else None


def verdicts(result: dict[str, Any], log: str, facts: dict[str, Any], node: str) -> list[Finding]:
    if not result.get("ok"):
        return [Finding(AREA, "nccl", "fail", f"all_reduce failed: {result.get('error', 'no result')}",
                        "rerun with NCCL_DEBUG=INFO and read the last NET lines; set NCCL_SOCKET_IFNAME to the "
                        "interface that reaches the master", node=node)]
    parsed = parse(log)
    findings = []
    interface = parsed["socket_interface"] or (parsed["bootstrap_interface"][0] if parsed["bootstrap_interface"]
                                              else None)
    if interface and NOT_A_FABRIC.match(interface) and facts.get("interface") != interface:
        findings.append(Finding(AREA, "nccl interface", "fail",
                                f"NCCL chose {interface}, which does not carry traffic between nodes",
                                f"set NCCL_SOCKET_IFNAME={facts.get('interface')} (the interface that reaches the "
                                "master)", node=node))
    if parsed["network"] == "Socket" and facts.get("ib_ports"):
        findings.append(Finding(AREA, "nccl transport", "warn", "NCCL uses sockets although this node has "
                                "InfiniBand/RoCE devices", "check NCCL_IB_HCA, NCCL_IB_DISABLE and "
                                "NCCL_IB_GID_INDEX; `ibstat` must show the ports ACTIVE", node=node))
    busbw, expected = result.get("busbw_gbps"), expected_busbw(facts, parsed)
    if busbw and expected and busbw < FAR_BELOW * expected:
        findings.append(Finding(AREA, "nccl bandwidth", "warn", f"bus bandwidth {busbw:g} GB/s, far below the "
                                f"~{expected:.0f} GB/s its {interface} line rate should give",
                                "check the transport above (IB vs Socket), NCCL_IB_HCA and the NIC's link speed",
                                node=node))
    if not findings:
        said = ", ".join(parsed["transports"]) or "no inter-rank transport (one rank)"
        findings.append(Finding(AREA, "nccl", "ok", f"all_reduce ok{f', bus bandwidth {busbw:g} GB/s' if busbw else ''}"
                                f"; network {parsed['network'] or '?'}, via {said}", node=node))
    return findings
