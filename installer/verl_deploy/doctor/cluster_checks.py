"""The multi-node pre-flight's verdicts on the nodes' facts (node_facts.gather, one dict per node that joined):
pure functions, so each finding is tested on hand-made facts as well as on real namespaces.

Each finding names the node it is about ("rank 1 (node-b, 10.0.0.2)") and a one-line remedy naming the variable or
the command that fixes it."""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from typing import Any

from verl_deploy.doctor.core import Finding

AREA = "cluster"
GIB = 2**30
# NCCL keeps its buffers in /dev/shm; Docker's 64 MiB default breaks it (nccl #342). The runs' own need is larger.
MIN_SHM_BYTES = 1 * GIB
CLOCK_SKEW_S = 1.0
# A difference here breaks collectives or pickled objects between nodes: fail. The others: warn.
MUST_MATCH = ("torch", "cuda", "nccl", "ray", "verl_runtime", "image", "python")
SHOULD_MATCH = ("driver",)
IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
LOOPBACK = "lo"

Facts = dict[str, Any]


def label(facts: Facts) -> str:
    rank = facts["rank"] if facts.get("rank") is not None else "auto"
    return f"rank {rank} ({facts.get('hostname') or '?'}, {facts.get('address') or 'no route'})"


def check_all(nodes: list[Facts], master_host: str) -> list[Finding]:
    findings = versions(nodes) + variables(nodes)
    for facts in nodes:
        findings += names_and_route(facts, master_host) + socket_ifnames(facts) + host_settings(facts)
    findings += mtu(nodes) + clocks(nodes)
    return findings


def _groups(nodes: list[Facts], value) -> dict[Any, list[Facts]]:
    groups: dict[Any, list[Facts]] = defaultdict(list)
    for facts in nodes:
        groups[value(facts)].append(facts)
    return groups


def _differ(what: str, nodes: list[Facts], value, status: str, remedy: str) -> list[Finding]:
    """One finding for a value that is not the same on every node, naming the nodes outside the largest group."""
    groups = _groups(nodes, value)
    if len(groups) <= 1:
        return []
    common = max(groups, key=lambda key: len(groups[key]))
    said = "; ".join(f"{key if key is not None else 'none'} on {', '.join(label(f) for f in group)}"
                     for key, group in groups.items())
    odd = [f for key, group in groups.items() if key != common for f in group]
    return [Finding(AREA, what, status, f"{what} differs between nodes: {said}", remedy.format(common=common),
                    node=", ".join(label(f) for f in odd))]


def versions(nodes: list[Facts]) -> list[Finding]:
    findings = []
    for key in MUST_MATCH + SHOULD_MATCH:
        remedy = (f"run the same image on every node, or install {key} {{common}} on each"
                  if key != "driver" else "install the same NVIDIA driver ({common}) on every node")
        findings += _differ(key, nodes, lambda f, k=key: f["versions"].get(k), "fail" if key in MUST_MATCH else "warn",
                            remedy)
    if not findings:
        shown = ", ".join(f"{k} {v}" for k, v in nodes[0]["versions"].items() if v)
        findings.append(Finding(AREA, "versions", "ok", f"the same on every node: {shown}"))
    return findings


def variables(nodes: list[Facts]) -> list[Finding]:
    """NCCL_* / GLOO_* set alike everywhere (the interface names are judged per node, where they may differ)."""
    keys = sorted({key for facts in nodes for key in facts["env"]} - set(IFNAME_VARIABLES))
    findings = []
    for key in keys:
        findings += _differ(key, nodes, lambda f, k=key: f["env"].get(k), "warn",
                            f"set {key}={{common}} on every node (or on none): the nodes' collectives must agree")
    return findings


def names_and_route(facts: Facts, master_host: str) -> list[Finding]:
    node, findings = label(facts), []
    resolved, hostname = facts.get("resolved"), facts.get("hostname")
    if resolved is None:
        findings.append(Finding(AREA, "hostname", "warn", f"{hostname} does not resolve on its own node",
                                f"add `{facts.get('address')} {hostname}` to /etc/hosts", node=node))
    elif ipaddress.ip_address(resolved).is_loopback and facts.get("interface") != LOOPBACK:
        iface = facts.get("interface") or "IFACE"
        findings.append(Finding(
            AREA, "hostname", "fail",
            f"{hostname} resolves to {resolved}: gloo and Ray would advertise a loopback address to the other nodes",
            f"map {hostname} to {facts.get('address')} in /etc/hosts (not {resolved}), or set "
            f"GLOO_SOCKET_IFNAME={iface} NCCL_SOCKET_IFNAME={iface}", node=node))
    if facts.get("master_ip") is None:
        findings.append(Finding(AREA, "master address", "fail",
                                f"{master_host} does not resolve here: {facts.get('master_error')}",
                                f"give --master as an IP address, or add {master_host} to this node's /etc/hosts",
                                node=node))
    elif facts["rank"] == 0 and facts.get("interface") != LOOPBACK and facts.get("address") != facts["master_ip"]:
        findings.append(Finding(AREA, "master address", "fail",
                                f"--master {master_host} is {facts['master_ip']}, not an address of this node (rank 0)",
                                f"run rank 0 on {master_host}, or give --master this node's address "
                                f"{facts.get('address')}", node=node))
    elif facts.get("interface") is None:
        findings.append(Finding(AREA, "route", "fail", f"no route to the master {facts['master_ip']}",
                                f"check `ip route get {facts['master_ip']}` on this node", node=node))
    elif not findings:
        findings.append(Finding(AREA, "route", "ok", f"to the master through {facts['interface']} "
                                f"({facts.get('subnet')}, MTU {facts.get('mtu')})", node=node))
    return findings


def ifname_matches(value: str, interface: str) -> bool:
    """NCCL_SOCKET_IFNAME's grammar (NCCL's docs, Environment Variables): a comma list of prefixes, `=` for exact
    names, a leading `^` to exclude. GLOO_SOCKET_IFNAME is a comma list of exact names, which this also reads."""
    exclude = value.startswith("^")
    items = [item for item in value.lstrip("^").split(",") if item]
    hit = any(interface == item[1:] if item.startswith("=") else interface.startswith(item) for item in items)
    return hit != exclude


def socket_ifnames(facts: Facts) -> list[Finding]:
    node, findings = label(facts), []
    present = facts.get("interfaces", {})
    route = facts.get("interface")
    for variable in IFNAME_VARIABLES:
        value = facts["env"].get(variable)
        if not value:
            continue
        exact = variable == "GLOO_SOCKET_IFNAME"
        chosen = [name for name in present if (name in value.split(",") if exact else ifname_matches(value, name))]
        fix = f"set {variable}={route} (the interface that reaches the master) or unset it"
        if not chosen:
            findings.append(Finding(AREA, variable, "fail",
                                    f"{variable}={value} names no interface here (there are: {', '.join(present)})",
                                    fix, node=node))
        elif all(name == LOOPBACK for name in chosen) and route != LOOPBACK:
            findings.append(Finding(AREA, variable, "fail", f"{variable}={value} is the loopback interface: the "
                                    "other nodes cannot reach it", fix, node=node))
        elif route and route not in chosen:
            findings.append(Finding(AREA, variable, "warn", f"{variable}={value} picks {', '.join(chosen)}, but the "
                                    f"master is reached through {route}", fix, node=node))
    return findings


def decided_interface(facts: Facts) -> str | None:
    """The interface the collectives should use on this node: the one its route to the master takes."""
    return facts.get("interface")


def mtu(nodes: list[Facts]) -> list[Finding]:
    """Every node's interface towards the master must carry the same MTU: a smaller one on one side drops the large
    frames of a collective silently (nccl #1524)."""
    routed = [facts for facts in nodes if facts.get("mtu")]
    return _differ("MTU", routed, lambda f: f["mtu"], "fail",
                   "on those nodes: `ip link set dev IFACE mtu {common}` on the interface that reaches the master "
                   "(see the route lines), and the same along the path")


def host_settings(facts: Facts) -> list[Finding]:
    node, findings = label(facts), []
    shm = facts.get("shm_bytes")
    if shm is not None and shm < MIN_SHM_BYTES:
        findings.append(Finding(
            AREA, "/dev/shm", "fail", f"{shm / 2**20:.0f} MiB: NCCL and the data loaders need more",
            "give it >= 1 GiB: docker run --shm-size=16g; k8s: an emptyDir of medium Memory on /dev/shm; "
            "a host: mount -o remount,size=16G /dev/shm", node=node))
    if facts.get("gpus") and facts.get("memlock") not in (-1, None):
        findings.append(Finding(AREA, "ulimit -l", "warn", f"{facts['memlock'] // 1024} KiB locked memory: NCCL over "
                                "InfiniBand/RDMA needs unlimited", "ulimit -l unlimited (docker: --ulimit memlock=-1)",
                                node=node))
    findings += infiniband(facts)
    return findings


def infiniband(facts: Facts) -> list[Finding]:
    node, findings = label(facts), []
    gid_index = facts["env"].get("NCCL_IB_GID_INDEX")
    for port in facts.get("ib_ports", []):
        name = f"{port['device']}:{port['port']}"
        if port.get("state") and "ACTIVE" not in port["state"]:
            findings.append(Finding(AREA, "infiniband", "fail", f"{name} is {port['state']}",
                                    f"bring the port up (`ibstat {port['device']}`), or leave it out with "
                                    "NCCL_IB_HCA", node=node))
        if gid_index and gid_index.isdigit():
            gids = port.get("gids", [])
            gid = gids[int(gid_index)] if int(gid_index) < len(gids) else None
            if not gid or set(gid.replace(":", "")) <= {"0"}:
                findings.append(Finding(AREA, "infiniband", "fail", f"NCCL_IB_GID_INDEX={gid_index}: {name} has no "
                                        "GID there", "pick a set GID (`show_gids`), usually 3 for RoCEv2", node=node))
    return findings


def clocks(nodes: list[Facts]) -> list[Finding]:
    """Each node's clock against the master's, taken as the master received its facts (a LAN's latency is far
    below the 1 s that matters). A warning: skewed clocks confuse logs and tokens' expiry, not the collectives."""
    findings = []
    for facts in nodes:
        skew = facts.get("clock_skew_s")
        if skew is not None and abs(skew) > CLOCK_SKEW_S:
            findings.append(Finding(AREA, "clock", "warn", f"{skew:+.1f} s from the master's clock",
                                    "run time synchronisation on every node (chrony or systemd-timesyncd)",
                                    node=label(facts)))
    return findings
