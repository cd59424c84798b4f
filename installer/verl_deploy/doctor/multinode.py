"""`verl-deploy doctor --nodes N --node-rank R --master ADDR:PORT`: the pre-flight across the nodes of a run,
started on each node as torchrun is. The nodes meet at the master (rank 0, rendezvous.py), send it their facts
(node_facts.py), reach a sample of its ports, and run a gloo all_reduce and monitored barrier (and on GPUs an NCCL
all_reduce) together; rank 0 judges (cluster_checks.py, nccl_log.py) and sends the one verdict back to every node.

Phases, each with its own deadline so that a missing node or a blocked port is a finding, never a hang:
join (--timeout), ports (rendezvous.PORT_PROBE_S), collectives (COLLECTIVE_TIMEOUT_S, run only when nothing
failed before: a known fault would only make them time out)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from verl_deploy.doctor import cluster_checks, nccl_log, node_facts, rendezvous
from verl_deploy.doctor.core import Finding, exit_code

AREA = cluster_checks.AREA
# The master's ports the nodes must reach besides its rendezvous port: gloo's TCPStore (the next port), Ray's GCS
# (`ray start --head`'s default port) and a sample of the kernel's ephemeral range, from which gloo and NCCL take
# the ports of their own connections (/proc/sys/net/ipv4/ip_local_port_range).
RAY_GCS_PORT = 6379
EPHEMERAL_SAMPLE = 2
COLLECTIVE_TIMEOUT_S = 15.0
# Importing torch (seconds, more on a busy node) comes on top of the collectives' own timeout.
PROBE_STARTUP_S = 30.0
IFNAME_VARIABLES = cluster_checks.IFNAME_VARIABLES


@dataclass(frozen=True)
class Options:
    nodes: int
    rank: int | None  # None: a worker whose rank the master gives (--node-rank auto)
    master_host: str
    master_port: int
    timeout_s: float = 30.0
    nccl: bool | None = None  # None: when every node has a GPU


@dataclass
class ClusterReport:
    findings: list[Finding]
    nodes: int
    joined: list[int]
    rank: int | None = None  # this node's (the master's numbering with --node-rank auto; None: it never joined)
    interface: str | None = None  # this node's: the one its route to the master takes
    env: dict[str, str] = field(default_factory=dict)  # what the trainer should be given on this node

    @property
    def exit_code(self) -> int:
        return exit_code(self.findings)


def parse_master(text: str) -> tuple[str, int]:
    """'ADDR:PORT' -> (ADDR, PORT); ValueError with a one-line reason."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65535:
        raise ValueError(f"--master {text!r}: give ADDR:PORT, e.g. 10.0.0.1:29400 (the rank 0 node's address)")
    return host, int(port)


def parse_rank(text: str) -> int | None:
    if text == "auto":
        return None
    if not text.lstrip("-").isdigit():
        raise ValueError(f"--node-rank {text!r}: give a number (0 on the master) or auto")
    return int(text)


def check_options(options: Options) -> None:
    if options.nodes < 1:
        raise ValueError(f"--nodes {options.nodes}: give the number of nodes, at least 1")
    if options.rank is not None and not 0 <= options.rank < options.nodes:
        raise ValueError(f"--node-rank {options.rank}: give 0 to {options.nodes - 1} (0 on the master), or auto on "
                         "a worker")
    if options.timeout_s <= 0:
        raise ValueError(f"--timeout {options.timeout_s:g}: give seconds, more than 0")


def run(options: Options) -> ClusterReport:
    check_options(options)
    facts = node_facts.gather(options.rank, options.master_host)
    report = _master(options, facts) if options.rank == 0 else _node(options, facts)
    report.interface = facts.get("interface")
    if report.exit_code == 0 and report.interface:
        report.env = {name: report.interface for name in IFNAME_VARIABLES if not os.environ.get(name)}
    return report


# --- rank 0 -----------------------------------------------------------------------------------------------------

def _master(options: Options, own: dict[str, Any]) -> ClusterReport:
    started = time.monotonic()
    try:
        listener = rendezvous.listen(options.master_port)
    except OSError as exc:
        finding = Finding(AREA, "master port", "fail", f"cannot listen on port {options.master_port}: "
                          f"{(exc.strerror or str(exc)).lower()}", "pick a free port for --master (`ss -ltn` lists "
                          "those in use)", node=cluster_checks.label(own))
        return ClusterReport([finding], options.nodes, [0], rank=0)
    peers, facts = _join(listener, options, own)
    listener.close()
    findings = _missing(options, facts)
    if peers:
        findings.append(Finding(AREA, "join", "ok", f"{len(facts)} of {options.nodes} nodes joined in "
                                f"{time.monotonic() - started:.1f} s"))
    findings += _ports(options, peers, facts)
    findings += cluster_checks.check_all(list(facts.values()), options.master_host)
    findings += _collectives(options, peers, facts, findings)
    for rank, channel in peers.items():
        channel.send({"verdict": [asdict(f) for f in findings], "rank": rank})
        channel.close()
    return ClusterReport(findings, options.nodes, sorted(facts), rank=0)


def _join(listener, options: Options, own: dict[str, Any]):
    peers: dict[int, rendezvous.Channel] = {}
    facts: dict[int, dict[str, Any]] = {0: own}
    deadline = time.monotonic() + options.timeout_s
    while len(facts) < options.nodes:
        channel = rendezvous.accept(listener, deadline)
        if channel is None:
            break
        hello = channel.receive(time.monotonic() + rendezvous.PORT_PROBE_S)
        rank = hello.get("facts", {}).get("rank", -1) if hello else -1
        if rank is None:  # --node-rank auto: the highest free rank (give every worker auto, or none)
            rank = max(r for r in range(1, options.nodes) if r not in facts)
            hello["facts"]["rank"] = rank
        if not isinstance(rank, int) or rank in facts or not 0 < rank < options.nodes:
            channel.send({"refused": f"rank {rank} is taken or out of range 1..{options.nodes - 1}"})
            channel.close()
            continue
        hello["facts"]["clock_skew_s"] = hello["facts"]["time"] - time.time()
        facts[rank], peers[rank] = hello["facts"], channel
    return peers, facts


def _missing(options: Options, facts: dict[int, Any]) -> list[Finding]:
    return [
        Finding(AREA, "join", "fail", f"did not reach the master {options.master_host}:"
                f"{options.master_port} within {options.timeout_s:g} s",
                f"start `verl-deploy doctor --nodes {options.nodes} --node-rank {rank} --master "
                f"{options.master_host}:{options.master_port}` there; if it runs, open TCP port {options.master_port} "
                "from it to the master (firewall, security group) and see its own output", node=f"rank {rank}")
        for rank in range(options.nodes) if rank not in facts
    ]


def _probe_listeners(options: Options) -> dict[int, tuple[str, socket.socket | None]]:
    """The ports to try, each with what uses it, held open here while the nodes try them (None: already in use,
    which means something listens there: Ray's head, say)."""
    wanted = {options.master_port + 1: "gloo's TCPStore", RAY_GCS_PORT: "Ray's GCS"}
    held: dict[int, tuple[str, socket.socket | None]] = {}
    for port, purpose in wanted.items():
        try:
            held[port] = (purpose, rendezvous.listen(port))
        except OSError:
            held[port] = (purpose, None)
    for _ in range(EPHEMERAL_SAMPLE):
        sock = rendezvous.listen(0)
        held[sock.getsockname()[1]] = ("the collectives' ephemeral range", sock)
    return held


def _ports(options: Options, peers: dict[int, rendezvous.Channel], facts) -> list[Finding]:
    if not peers:
        return []
    held = _probe_listeners(options)
    for channel in peers.values():  # its own address: a Service in front of it forwards the rendezvous port only
        channel.send({"probe": sorted(held), "host": facts[0].get("address") or options.master_host})
    deadline = time.monotonic() + rendezvous.PORT_PROBE_S + 5
    findings = []
    for rank, channel in peers.items():
        answer = channel.receive(deadline) or {}
        results = answer.get("ports", {})
        for port, (purpose, _) in held.items():
            result = results.get(str(port), "no answer")
            if result != "ok":
                findings.append(Finding(AREA, "ports", "fail", f"cannot reach the master's port {port} ({purpose}): "
                                        f"{result}", f"open TCP from this node to {options.master_host} port {port} "
                                        "and the range in the master's /proc/sys/net/ipv4/ip_local_port_range",
                                        node=cluster_checks.label(facts[rank])))
    for _, sock in held.values():
        if sock is not None:
            sock.close()
    if not findings:
        findings.append(Finding(AREA, "ports", "ok", f"every node reached the master's ports {options.master_port}, "
                                f"{', '.join(map(str, sorted(held)))}"))
    return findings


def _collectives(options: Options, peers, facts: dict[int, Any], before: list[Finding]) -> list[Finding]:
    if len(facts) < options.nodes or any(f.status == "fail" for f in before):
        return [Finding(AREA, "collectives", "skip", "not run: fix the fail lines first (they would only time out)")]
    without = [cluster_checks.label(f) for f in facts.values() if not f.get("torch")]
    if without:
        return [Finding(AREA, "collectives", "skip", "torch is not installed on " + ", ".join(without),
                        "run the pre-flight where the trainer runs (the image, or the runtime's venv: "
                        "installer/install.sh --extras runtime)")]
    nccl = options.nccl if options.nccl is not None else all(f.get("gpus") for f in facts.values())
    order = {"store_port": options.master_port + 1, "nccl": nccl,
             "host": facts[0].get("address") or options.master_host}
    for rank, channel in peers.items():
        channel.send({"collective": order, "rank": rank})
    results = {0: run_probe(options, 0, order)}
    deadline = time.monotonic() + COLLECTIVE_TIMEOUT_S + PROBE_STARTUP_S + 5
    for rank, channel in peers.items():
        results[rank] = (channel.receive(deadline) or {}).get("result") or {
            "gloo": {"ok": False, "error": "no answer from this node's collective check"}}
    return collective_findings(results, facts, nccl)


def collective_findings(results: dict[int, dict], facts: dict[int, Any], nccl: bool) -> list[Finding]:
    findings = []
    for rank, result in sorted(results.items()):
        node = cluster_checks.label(facts[rank])
        gloo = result.get("gloo", {})
        if not gloo.get("ok"):
            findings.append(Finding(AREA, "gloo", "fail", f"all_reduce/barrier failed: {gloo.get('error')}",
                                    "set GLOO_SOCKET_IFNAME to the interface that reaches the master on every node, "
                                    "and open the ephemeral port range between the nodes", node=node))
        if nccl:
            findings += nccl_log.verdicts(result.get("nccl", {}), result.get("log", ""), facts[rank], node)
    if not any(f.status == "fail" for f in findings):
        seconds = max(r.get("gloo", {}).get("seconds", 0) for r in results.values())
        findings.insert(0, Finding(AREA, "gloo", "ok", f"all_reduce and monitored barrier across {len(results)} "
                                   f"node(s) in {seconds:.2f} s"))
    return findings


def run_probe(options: Options, rank: int, order: dict[str, Any]) -> dict[str, Any]:
    """verl_runtime.collective_probe in a subprocess (torch stays out of this process), within a hard limit."""
    argv = [sys.executable, "-m", "verl_runtime.collective_probe", "--master", order["host"], "--port",
            str(order["store_port"]), "--rank", str(rank), "--world", str(options.nodes),
            "--timeout", str(COLLECTIVE_TIMEOUT_S)] + (["--nccl"] if order.get("nccl") else [])
    env = {**os.environ, "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "INFO"),
           "NCCL_DEBUG_SUBSYS": os.environ.get("NCCL_DEBUG_SUBSYS", "INIT,NET")}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env,
                              timeout=COLLECTIVE_TIMEOUT_S + PROBE_STARTUP_S)
    except subprocess.TimeoutExpired:
        return {"gloo": {"ok": False, "error": f"no result within {COLLECTIVE_TIMEOUT_S + PROBE_STARTUP_S:g} s"}}
    output = done.stdout + done.stderr
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("PREFLIGHT_RESULT "):
            return {**json.loads(line.split(" ", 1)[1]), "log": nccl_log.info_lines(output)}
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"gloo": {"ok": False, "error": f"the collective check exited {done.returncode}: {last[:300]}"}}


# --- ranks 1..N-1 -----------------------------------------------------------------------------------------------

def _node(options: Options, own: dict[str, Any]) -> ClusterReport:
    label = cluster_checks.label(own)
    address = own.get("master_ip") or options.master_host
    channel, error = rendezvous.connect(address, options.master_port, time.monotonic() + options.timeout_s)
    if channel is None:
        remedy = (f"start rank 0 there; open TCP port {options.master_port} from this node to it (firewall, "
                  "security group)")
        if own.get("interface") == cluster_checks.LOOPBACK:
            remedy = "--master is a loopback address here: give the master's address on the network the nodes share"
        finding = Finding(AREA, "join", "fail", f"cannot reach the master {options.master_host}:{options.master_port} "
                          f"within {options.timeout_s:g} s: {error}", remedy, node=label)
        return ClusterReport(cluster_checks.names_and_route(own, options.master_host) + [finding], options.nodes, [],
                             rank=options.rank)
    channel.send({"facts": own})
    # The master waits up to --timeout for the others, then probes and runs the collectives.
    deadline = time.monotonic() + options.timeout_s + rendezvous.PORT_PROBE_S + COLLECTIVE_TIMEOUT_S \
        + PROBE_STARTUP_S + 20
    while (message := channel.receive(deadline)) is not None:
        if "probe" in message:
            channel.send({"ports": rendezvous.probe_ports(message["host"], message["probe"])})
        elif "collective" in message:
            channel.send({"result": run_probe(options, message["rank"], message["collective"])})
        elif "verdict" in message:
            channel.close()
            return ClusterReport([Finding(**f) for f in message["verdict"]], options.nodes, [], rank=message["rank"])
        elif "refused" in message:
            break
    channel.close()
    said = (message or {}).get("refused", "it stopped answering")
    return ClusterReport([Finding(AREA, "join", "fail", f"the master gave no verdict: {said}",
                                  "see the master's (rank 0's) output", node=label)], options.nodes, [],
                         rank=options.rank)


def write_env(report: ClusterReport, path: Path) -> None:
    """What the pre-flight decided for this node's trainer, as KEY=VALUE lines (a shell or `docker --env-file`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{key}={value}\n" for key, value in report.env.items()))
