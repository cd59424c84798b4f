"""Several "nodes" on one machine for the multi-node tests: each a network namespace with a veth into one bridge,
its own address (in 10.231.0.0/16, only inside namespaces made here), hostname (`unshare --uts`) and /etc/hosts
(`/etc/netns/NAME/hosts`, which `ip netns exec` mounts over /etc/hosts). Docker's FORWARD policy drops bridged
traffic, so one ACCEPT rule for this bridge is added and removed with it. Everything is removed in `close`, which
the tests' fixtures call even when a test fails."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

NETNS_ETC = Path("/etc/netns")
_MADE = itertools.count()  # each cluster of a test session gets names of its own (a closed one's may linger)


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def usable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (ip netns, iptables)"
    missing = [tool for tool in ("ip", "iptables", "unshare") if shutil.which(tool) is None]
    return f"needs {', '.join(missing)} (apt-get install iproute2 iptables util-linux)" if missing else None


def started(tag: str, size: int):
    """A fixture's body: a cluster of `size` namespaces, opened, yielded and closed (even after a failed test); the
    test skips (outside CI) or fails (CI=true) where namespaces cannot be made here."""
    from conftest import require

    reason = usable()
    require(reason is None, f"network namespaces: {reason}")
    made = Cluster(tag=f"{tag}{os.getpid() % 1000}", size=size)
    try:
        yield made.open()
    finally:
        made.close()


@dataclass
class Node:
    rank: int
    namespace: str
    hostname: str
    address: str
    veth: str  # the node's end, inside its namespace


@dataclass
class Cluster:
    tag: str
    size: int
    bridge: str = ""
    nodes: list[Node] = field(default_factory=list)
    hosts_lines: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        subnet = 10 + os.getpid() % 200  # a distinct /24 per test process, so that parallel sessions never meet
        self.tag = f"{self.tag}{next(_MADE)}"
        self.bridge = f"vdbr{self.tag}"
        for rank in range(self.size):
            self.nodes.append(Node(rank, f"vd{self.tag}n{rank}", f"node{rank}", f"10.231.{subnet}.{rank + 1}", "eth0"))

    def open(self) -> "Cluster":
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "link", "set", self.bridge, "up")
        sh("iptables", "-I", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT")
        for node in self.nodes:
            outside = f"vd{self.tag}h{node.rank}"
            sh("ip", "netns", "add", node.namespace)
            sh("ip", "link", "add", outside, "type", "veth", "peer", "name", node.veth, "netns", node.namespace)
            sh("ip", "link", "set", outside, "master", self.bridge, "up")
            self.inside(node, "ip", "addr", "add", f"{node.address}/24", "dev", node.veth)
            self.inside(node, "ip", "link", "set", node.veth, "up")
            self.inside(node, "ip", "link", "set", "lo", "up")
            self.write_hosts(node)
        return self

    def write_hosts(self, node: Node, own_address: str | None = None) -> None:
        """The node's /etc/hosts: every node by name, its own name at `own_address` when given (a fault)."""
        lines = ["127.0.0.1 localhost"]
        for other in self.nodes:
            address = own_address if (other is node and own_address) else other.address
            lines.append(f"{address} {other.hostname}")
        folder = NETNS_ETC / node.namespace
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text("\n".join(lines) + "\n")

    def inside(self, node: Node, *argv: str) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", node.namespace, *argv)

    def command(self, node: Node, argv: list[str], shm: str | None = None) -> list[str]:
        """argv run as `node`: in its namespace, under its own hostname, with a small /dev/shm of its own when
        `shm` (a tmpfs size) is given."""
        script = f"hostname {node.hostname}"
        if shm:
            script += f" && mount -t tmpfs -o size={shm} tmpfs /dev/shm"
        return ["ip", "netns", "exec", node.namespace, "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", script + ' && exec "$@"', "node", *argv]

    def close(self) -> None:
        for node in self.nodes:
            for pid in sh("ip", "netns", "pids", node.namespace, check=False).stdout.split():
                sh("kill", "-9", pid, check=False)
            sh("ip", "link", "del", f"vd{self.tag}h{node.rank}", check=False)  # both ends, even while it dies
            sh("ip", "netns", "del", node.namespace, check=False)
            shutil.rmtree(NETNS_ETC / node.namespace, ignore_errors=True)
        sh("ip", "link", "del", self.bridge, check=False)
        sh("iptables", "-D", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT", check=False)
