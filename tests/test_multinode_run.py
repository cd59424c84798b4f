"""A multi-node run through real network stacks: the Slurm batch script of `run --target slurm --nodes 2` runs in
one network namespace (the head node) and its `srun` steps in the nodes' own namespaces (tests/netns_cluster.py),
so the pre-flight, the Ray cluster and the trainer's workers talk across a bridge between separate addresses, as on
two machines. With a fault injected the job stops at the pre-flight, before any model is loaded; without one it
trains across both nodes. Not proven here: sbatch's allocation of real machines (tests/test_slurm.py runs sbatch
on this host's one-node controller)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from launch_support import QUICKSTART, cli, metrics_steps
from netns_cluster import Cluster, started

from verl_runtime.rundir import JOB_EXIT

pytestmark = [pytest.mark.slow, pytest.mark.ray]

# srun as Slurm runs a step: one task on each node of the step (all of them, or all but --exclude's), each in its
# node's namespace under its hostname, with that node's SLURM_NODEID; the step's exit code is its worst task's.
SRUN_IN_NAMESPACES = """#!/bin/bash
exclude=0
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do case "$1" in --exclude=*) exclude=1;; esac; shift; done
pids=(); rank=0
for node in $NODES; do
  ns=${node%%:*}; name=${node##*:}
  if [ $exclude = 0 ] || [ $rank != 0 ]; then
    SLURMD_NODENAME=$name SLURM_NODEID=$rank ip netns exec $ns unshare --uts sh -c 'hostname "$SLURMD_NODENAME" && exec "$@"' step "$@" &
    pids+=($!)
  fi
  rank=$((rank + 1))
done
code=0
for pid in "${pids[@]}"; do wait $pid || code=$?; done
exit $code
"""


@pytest.fixture
def cluster():
    yield from started("r", 2)


def run_job(cluster: Cluster, tmp_path, run_id: str) -> tuple[int, str]:
    """Render the batch script as `run --dry-run` prints it, then run it on node 0 as the batch step would."""
    runs = tmp_path / "runs"
    rendered = cli("run", QUICKSTART, "--target", "slurm", "--nodes", "2", "--runs-dir", runs, "--run-id", run_id,
                   "--dry-run", "--memory", "2g", "--set", "data.max_response_length=8", "--set", "trainer.test_freq=-1",
                   "--set", "trainer.total_training_steps=1", "--set", "trainer.n_workers=2",
                   "--set", f"trainer.cpus_per_worker={os.cpu_count()}")  # one worker per node
    assert rendered.exit_code == 0, rendered.output
    script, shims = tmp_path / "job.sh", tmp_path / "bin"
    script.write_text(rendered.stdout)
    shims.mkdir()
    (shims / "srun").write_text(SRUN_IN_NAMESPACES)
    (shims / "srun").chmod(0o755)
    (runs / run_id).mkdir(parents=True)
    head = cluster.nodes[0]
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "SLURM_JOB_ID": "77", "SLURM_NODEID": "0",
           "SLURMD_NODENAME": head.hostname, "NODES": " ".join(f"{n.namespace}:{n.hostname}" for n in cluster.nodes),
           "RAY_AUTH_MODE": "disabled"}
    log = tmp_path / "job.log"  # a file, not a pipe: Ray's daemons may hold an inherited pipe open after the job
    with open(log, "w") as out:
        job = subprocess.run(cluster.command(head, ["bash", str(script)]), stdout=out, stderr=subprocess.STDOUT,
                             env=env, timeout=300)
    return job.returncode, log.read_text()


def test_a_fault_stops_the_run_at_the_preflight_before_the_model_loads(cluster, tmp_path):
    node = cluster.nodes[1]
    cluster.inside(node, "ip", "link", "set", node.veth, "mtu", "1400")
    code, output = run_job(cluster, tmp_path, "mn-fault")
    assert code == 1, output[-3000:]
    assert "FAIL MTU: rank 1 (node1, 10.231." in output
    assert "MTU differs between nodes: 1500 on rank 0 (node0, 10.231." in output and "; 1400 on rank 1" in output
    assert "the pre-flight across the nodes failed: no trainer started" in output
    assert "Loading" not in output and "ray start" not in output and "Traceback" not in output
    assert json.loads((tmp_path / "runs" / "mn-fault" / JOB_EXIT).read_text())["exit_code"] == 1


def test_without_a_fault_the_run_trains_across_the_namespaces(cluster, tmp_path):
    code, output = run_job(cluster, tmp_path, "mn-ok")
    assert code == 0, output[-4000:]
    assert "verl-deploy doctor --nodes 2: the cluster is ready" in output
    assert "[INFO] Ray cluster: 2 node(s)" in output, output[-3000:]
    assert "[INFO] 2 Ray worker(s) for actor on 2 node(s), cpu" in output
    assert metrics_steps(tmp_path / "runs" / "mn-ok") == [1]
    # what the pre-flight decided reached each node's trainer processes
    for node in cluster.nodes:
        assert (tmp_path / "runs" / "mn-ok" / "preflight" / f"{node.hostname}.env").read_text() == \
            "GLOO_SOCKET_IFNAME=eth0\nNCCL_SOCKET_IFNAME=eth0\n"


def _ray_node(cluster: Cluster, node, argv: list[str], log) -> subprocess.Popen:
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    return subprocess.Popen(cluster.command(node, [ray_cli, "start", *argv, "--num-cpus=1", "--block"]),
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RAY_AUTH_MODE": "disabled"})


def test_the_preflight_of_a_ray_cluster_runs_a_task_on_each_node(cluster, tmp_path):
    """What the KubeRay RayJob's entrypoint and the Docker target's Ray head run before the trainer
    (verl_runtime.preflight_ray), on a Ray cluster whose head and worker are in different namespaces."""
    head, worker = cluster.nodes
    log = tmp_path / "ray.log"
    with open(log, "w") as out:
        _ray_node(cluster, head, ["--head", "--port=6379", f"--node-ip-address={head.address}",
                                  "--include-dashboard=false", "--disable-usage-stats"], out)
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(1)
        _ray_node(cluster, worker, [f"--address={head.address}:6379"], out)

    def preflight() -> tuple[int, str]:
        done = subprocess.run(cluster.command(head, [sys.executable, "-m", "verl_runtime.preflight_ray", "--nodes",
                                                     "2"]), capture_output=True, text=True, timeout=300,
                              env={**os.environ, "RAY_ADDRESS": f"{head.address}:6379", "RAY_AUTH_MODE": "disabled"})
        return done.returncode, done.stdout + done.stderr

    code, output = preflight()
    assert code == 0, output[-3000:]
    assert "rank 1 (node1, 10.231." in output and "verl-deploy doctor --nodes 2: the cluster is ready" in output
    cluster.inside(worker, "ip", "link", "set", worker.veth, "mtu", "1400")
    code, output = preflight()
    assert code == 1 and "FAIL MTU: rank 1 (node1, 10.231." in output, output[-3000:]
