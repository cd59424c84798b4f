"""The pre-flight's verdicts on the nodes' facts and on NCCL's INFO lines (tests/fixtures/nccl/), without a
cluster: what each node reported in, what the master says back."""

import json
from pathlib import Path

import pytest
from conftest import free_port
from launch_support import cli

from verl_deploy.doctor import cluster_checks, multinode, nccl_log

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"


def node(rank, **changes):
    facts = {
        "rank": rank, "hostname": f"gpu-{rank}", "address": f"10.0.0.{rank + 1}", "resolved": f"10.0.0.{rank + 1}",
        "master_ip": "10.0.0.1", "interface": "eth0", "subnet": "10.0.0.0/24", "mtu": 9000,
        "interfaces": {"lo": {"mtu": 65536}, "eth0": {"mtu": 9000, "speed_mbps": 400000},
                       "docker0": {"mtu": 1500}},
        "versions": {"torch": "2.14.0", "nccl": "2.27.3", "ray": "2.60.0", "verl_runtime": "0.1.0"},
        "env": {}, "shm_bytes": 64 * 2**30, "memlock": -1, "ib_ports": [], "gpus": 8, "clock_skew_s": 0.0,
    }
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(facts.get(key), dict):
            facts[key] = {**facts[key], **value}
        else:
            facts[key] = value
    return facts


def failing(findings):
    return [f for f in findings if f.status == "fail"]


def test_a_healthy_cluster_has_no_fail_and_says_its_route():
    findings = cluster_checks.check_all([node(0), node(1)], "10.0.0.1")
    assert not [f for f in findings if f.status != "ok"]
    assert any(f.name == "route" and "through eth0 (10.0.0.0/24, MTU 9000)" in f.message for f in findings)


def test_a_different_torch_on_one_node_names_that_node():
    findings = failing(cluster_checks.check_all([node(0), node(1), node(2, versions={"torch": "2.13.0"})], "x"))
    assert [(f.name, f.node) for f in findings] == [("torch", "rank 2 (gpu-2, 10.0.0.3)")]
    assert "install torch 2.14.0 on each" in findings[0].remedy


def test_nccl_variables_that_differ_warn():
    findings = cluster_checks.check_all([node(0, env={"NCCL_IB_HCA": "mlx5"}), node(1)], "10.0.0.1")
    assert [(f.name, f.status) for f in findings if f.status != "ok"] == [("NCCL_IB_HCA", "warn")]


def test_nccl_socket_ifname_grammar():
    assert cluster_checks.ifname_matches("eth", "eth0")
    assert not cluster_checks.ifname_matches("^docker,lo", "docker0")
    assert cluster_checks.ifname_matches("^docker,lo", "eth0")
    assert not cluster_checks.ifname_matches("=eth", "eth0")


def test_an_ifname_on_loopback_or_elsewhere():
    lo = failing(cluster_checks.socket_ifnames(node(1, env={"NCCL_SOCKET_IFNAME": "lo"})))
    assert "is the loopback interface" in lo[0].message and "NCCL_SOCKET_IFNAME=eth0" in lo[0].remedy
    other = cluster_checks.socket_ifnames(node(1, env={"GLOO_SOCKET_IFNAME": "docker0"}))
    assert other[0].status == "warn" and "reached through eth0" in other[0].message


def test_infiniband_port_down_and_an_empty_gid():
    port = {"device": "mlx5_0", "port": "1", "state": "1: DOWN", "gids": ["fe80:0000:0000:0000:0000:0000:0000:0001",
                                                                           "0000:0000:0000:0000:0000:0000:0000:0000"]}
    findings = cluster_checks.infiniband(node(1, ib_ports=[port], env={"NCCL_IB_GID_INDEX": "1"}))
    assert ["mlx5_0:1 is 1: DOWN", "NCCL_IB_GID_INDEX=1: mlx5_0:1 has no GID there"] == [f.message for f in findings]


def test_a_skewed_clock_warns():
    findings = cluster_checks.clocks([node(0), node(1, clock_skew_s=3.2)])
    assert [(f.status, f.message) for f in findings] == [("warn", "+3.2 s from the master's clock")]


def test_bad_master_is_refused_in_one_line():
    for text in ("10.0.0.1", ":29400", "host:http", "host:70000"):
        try:
            multinode.parse_master(text)
        except ValueError as exc:
            assert "give ADDR:PORT" in str(exc)
        else:
            raise AssertionError(text)


def test_nccl_on_the_docker_bridge_is_a_fail():
    log = (FIXTURES / "socket_on_docker0.log").read_text()
    assert nccl_log.parse(log) == {"version": "2.21.5+cuda12.4", "network": "Socket",
                                   "bootstrap_interface": ("docker0", "172.17.0.1"), "socket_interface": "docker0",
                                   "transports": ["NET/Socket"], "gdr": False}
    findings = nccl_log.verdicts({"ok": True, "busbw_gbps": 1.1}, log, node(0), "rank 0")
    assert findings[0].status == "fail" and "NCCL chose docker0" in findings[0].message
    assert findings[0].remedy.startswith("set NCCL_SOCKET_IFNAME=eth0")


def test_nccl_over_infiniband_at_line_rate_passes_and_far_below_warns():
    log = (FIXTURES / "ib_gdr.log").read_text()
    parsed = nccl_log.parse(log)
    assert parsed["network"] == "IB" and parsed["transports"] == ["NET/IB"] and parsed["gdr"]
    ok = nccl_log.verdicts({"ok": True, "busbw_gbps": 46.5}, log, node(0), "rank 0")
    assert [(f.status, f.message) for f in ok] == [("ok", "all_reduce ok, bus bandwidth 46.5 GB/s; network IB, "
                                                    "via NET/IB")]
    slow = nccl_log.verdicts({"ok": True, "busbw_gbps": 9.0}, log, node(0), "rank 0")
    assert slow[0].status == "warn" and "far below the ~47 GB/s" in slow[0].message


def test_sockets_beside_infiniband_devices_warn_and_a_failed_all_reduce_fails():
    log = (FIXTURES / "socket_on_docker0.log").read_text().replace("docker0", "eth0")
    ib = node(0, ib_ports=[{"device": "mlx5_0", "port": "1", "state": "4: ACTIVE", "gids": []}])
    assert nccl_log.verdicts({"ok": True}, log, ib, "rank 0")[0].name == "nccl transport"
    failed = nccl_log.verdicts({"ok": False, "error": "DistBackendError: NCCL timeout"}, "", node(0), "rank 0")
    assert failed[0].status == "fail" and "NCCL timeout" in failed[0].message


def test_rank_0_away_from_the_master_address_is_named():
    away = node(0, address="10.0.0.9", resolved="10.0.0.9")
    [finding] = failing(cluster_checks.names_and_route(away, "10.0.0.1"))
    assert finding.message == "--master 10.0.0.1 is 10.0.0.1, not an address of this node (rank 0)"


@pytest.mark.parametrize("flags, says", [
    (["--nodes", "2"], "needs both --nodes N and --master ADDR:PORT"),
    (["--nodes", "2", "--master", "10.0.0.1"], "--master '10.0.0.1': give ADDR:PORT"),
    (["--nodes", "2", "--node-rank", "2", "--master", "127.0.0.1:29400"], "--node-rank 2: give 0 to 1"),
    (["--nodes", "0", "--master", "127.0.0.1:29400"], "--nodes 0: give the number of nodes"),
    (["--nodes", "2", "--node-rank", "first", "--master", "127.0.0.1:29400"], "give a number (0 on the master) or auto"),
])
def test_bad_input_is_one_line_and_exit_2(flags, says):
    result = cli("doctor", *flags)
    assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output


def test_one_node_on_loopback_passes_with_the_gloo_check(tmp_path):
    result = cli("doctor", "--nodes", "1", "--master", f"127.0.0.1:{free_port()}", "--json", "--env-file", tmp_path / "env")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["ok"] and document["joined"] == [0] and document["interface"] == "lo"
    assert any(f["name"] == "gloo" and f["status"] == "ok" for f in document["findings"])
    assert (tmp_path / "env").read_text().startswith("GLOO_SOCKET_IFNAME=lo\n")
