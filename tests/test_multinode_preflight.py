"""`verl-deploy doctor --nodes N`: the pre-flight across nodes, on real network stacks. Each node is a network
namespace on a bridge with its own address, hostname and /etc/hosts (tests/netns_cluster.py); one fault at a time
is injected the way it happens on a real cluster, and the master's verdict must name the node and the cause,
exit 1, within 60 s, without a traceback. A healthy 3-node cluster passes within 30 s."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from netns_cluster import Cluster, started

pytestmark = pytest.mark.slow  # seconds each, as root; the verdicts' fast tests: tests/test_preflight_verdicts.py
PORT = 29400
JOIN_TIMEOUT_S = 10  # a missing node or a blocked port is named after this


@pytest.fixture
def cluster(request):
    yield from started("", 3)


def doctor(cluster: Cluster, ranks=None, env=None, shm=None, timeout=JOIN_TIMEOUT_S, auto=False) -> tuple[dict, float]:
    """Run the pre-flight on the given ranks (default: all), each in its node; (rank -> (exit code, output), s)."""
    master = cluster.nodes[0]
    started, procs = time.monotonic(), {}
    for node in cluster.nodes:
        if ranks is not None and node.rank not in ranks:
            continue
        rank = "auto" if auto and node.rank else str(node.rank)
        argv = [sys.executable, "-m", "verl_deploy", "doctor", "--nodes", str(cluster.size), "--node-rank", rank, "--master", f"{master.address}:{PORT}", "--timeout", str(timeout)]
        node_env = {**os.environ, **(env or {}).get(node.rank, {})}
        procs[node.rank] = subprocess.Popen(
            cluster.command(node, argv, shm=(shm or {}).get(node.rank)), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=node_env)
    results = {rank: (proc.wait(timeout=120), proc.stdout.read()) for rank, proc in procs.items()}
    elapsed = time.monotonic() - started
    for code, output in results.values():
        assert "Traceback" not in output, output
    return results, elapsed


def fails(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("FAIL")]


def test_a_healthy_three_node_cluster_passes_within_30_s(cluster):
    results, elapsed = doctor(cluster)
    code, output = results[0]
    assert code == 0, output
    assert "3 of 3 nodes joined" in output
    assert "OK   gloo: all_reduce and monitored barrier across 3 node(s)" in output
    assert "rank 2 (node2, 10.231." in output and "through eth0" in output
    assert "the cluster is ready" in output
    assert all(code == 0 for code, _ in results.values()), results
    assert elapsed < 30, f"{elapsed:.1f} s"


def test_workers_numbered_by_the_master_as_in_a_kubernetes_worker_group(cluster):
    results, _ = doctor(cluster, auto=True)
    assert [code for code, _ in results.values()] == [0, 0, 0], results
    assert "3 of 3 nodes joined" in results[0][1]
    assert {"rank 1 (node", "rank 2 (node"} <= {line[line.index("rank"):][:12] for line in results[0][1].splitlines()
                                                 if "route: rank" in line}


def test_the_master_port_blocked_for_one_node_is_named(cluster):
    node = cluster.nodes[1]
    cluster.inside(node, "iptables", "-A", "OUTPUT", "-p", "tcp", "--dport", str(PORT), "-j", "DROP")
    results, elapsed = doctor(cluster)
    code, output = results[0]
    assert code == 1 and elapsed < 60
    assert any("rank 1: did not reach the master" in line for line in fails(output)), output
    node_code, node_output = results[1]
    assert node_code == 1
    assert "rank 1 (node1, 10.231." in node_output and "timed out" in node_output, node_output


def test_a_hostname_resolving_to_127_0_1_1_is_named(cluster):
    cluster.write_hosts(cluster.nodes[2], own_address="127.0.1.1")
    results, elapsed = doctor(cluster)
    code, output = results[0]
    assert code == 1 and elapsed < 60
    line = next(line for line in fails(output) if "hostname" in line)
    assert "rank 2 (node2, 10.231." in line and "node2 resolves to 127.0.1.1" in line
    assert "GLOO_SOCKET_IFNAME=eth0" in line


def test_a_node_that_never_starts_is_named_at_the_timeout(cluster):
    results, elapsed = doctor(cluster, ranks=[0, 1])
    code, output = results[0]
    assert code == 1 and elapsed < 60
    assert any("rank 2: did not reach the master" in line and f"within {JOIN_TIMEOUT_S} s" in line
               for line in fails(output)), output
    assert results[1][0] == 1  # the others get the same verdict


def test_a_wrong_gloo_socket_ifname_is_named(cluster):
    results, elapsed = doctor(cluster, env={1: {"GLOO_SOCKET_IFNAME": "ib0"}})
    code, output = results[0]
    assert code == 1 and elapsed < 60
    line = next(line for line in fails(output) if "GLOO_SOCKET_IFNAME" in line)
    assert "rank 1 (node1, 10.231." in line and "GLOO_SOCKET_IFNAME=ib0 names no interface" in line
    assert "set GLOO_SOCKET_IFNAME=eth0" in line


def test_an_mtu_mismatch_is_named(cluster):
    node = cluster.nodes[2]
    cluster.inside(node, "ip", "link", "set", node.veth, "mtu", "1400")
    results, elapsed = doctor(cluster)
    code, output = results[0]
    assert code == 1 and elapsed < 60
    line = next(line for line in fails(output) if line.startswith("FAIL MTU"))
    assert "1400 on rank 2 (node2, 10.231." in line and "ip link set dev IFACE mtu 1500" in line


def test_a_small_dev_shm_is_named(cluster):
    results, elapsed = doctor(cluster, shm={1: "64m"})
    code, output = results[0]
    assert code == 1 and elapsed < 60
    line = next(line for line in fails(output) if "/dev/shm" in line)
    assert "rank 1 (node1, 10.231." in line and "64 MiB" in line and "--shm-size" in line


def test_a_blocked_port_of_the_master_besides_the_rendezvous_is_named(cluster):
    cluster.inside(cluster.nodes[2], "iptables", "-A", "OUTPUT", "-p", "tcp", "--dport", "6379", "-j", "DROP")
    results, elapsed = doctor(cluster)
    code, output = results[0]
    assert code == 1 and elapsed < 60
    line = next(line for line in fails(output) if line.startswith("FAIL ports"))
    assert "rank 2 (node2, 10.231." in line and "port 6379 (Ray's GCS): timed out" in line


def test_a_node_whose_collective_ports_are_dropped_fails_the_gloo_check_within_its_timeout(cluster):
    """Everything before passes (the master's ports are open), but no node can connect to node 1's own listening
    ports, where gloo's full mesh meets it: the all_reduce ends at its timeout of seconds, named, not a hang."""
    low, high = (cluster.inside(cluster.nodes[1], "cat", "/proc/sys/net/ipv4/ip_local_port_range").stdout.split())
    # new connections only (--syn): its own connections out, whose replies come back to such ports, still work
    cluster.inside(cluster.nodes[1], "iptables", "-A", "INPUT", "-p", "tcp", "--syn", "--dport", f"{low}:{high}",
                   "-j", "DROP")
    results, elapsed = doctor(cluster)
    code, output = results[0]
    assert code == 1 and elapsed < 60, (elapsed, output)
    assert "OK   ports" in output
    assert any(line.startswith("FAIL gloo: rank") and "all_reduce/barrier failed" in line for line in fails(output)), output
