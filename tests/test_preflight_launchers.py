"""Every multi-node run does the pre-flight across its nodes first (docs/multinode.md), as each launcher's dry
run shows: Slurm's srun step (tests/test_slurm.py, run for real in tests/test_multinode_run.py), the Ray cluster's
task on each node before the trainer on Docker and in the KubeRay RayJob; `--no-preflight` leaves it out."""

import os
import subprocess

import yaml
from launch_support import QUICKSTART, cli

PREFLIGHT = "python -m verl_runtime.preflight_ray --nodes 2"


def dry_run(tmp_path, target, *flags):
    result = cli("run", QUICKSTART, "--target", target, "--nodes", "2", "--runs-dir", tmp_path, "--dry-run", *flags)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_rayjob_runs_the_preflight_before_the_trainer(tmp_path):
    documents = list(yaml.safe_load_all(dry_run(tmp_path, "k8s", "--image-preloaded")))
    [job] = [d for d in documents if d and d["kind"] == "RayJob"]
    before, trainer = job["spec"]["entrypoint"].split(" && ")
    assert before == PREFLIGHT and trainer.startswith("python -m verl_runtime train ")


def test_the_docker_ray_head_runs_the_preflight_once_ray_is_up_and_before_the_trainer(tmp_path):
    head = next(line for line in dry_run(tmp_path, "docker").splitlines() if "verl-deploy.role=ray-head" in line)
    assert "ray start --head --port=6379 --disable-usage-stats && " + PREFLIGHT + " && exec env RAY_ADDRESS" in head


def test_no_preflight_and_one_node_leave_it_out(tmp_path):
    assert "preflight_ray" not in dry_run(tmp_path, "k8s", "--image-preloaded", "--no-preflight")
    assert "preflight_ray" not in dry_run(tmp_path, "docker", "--no-preflight")
    assert "doctor --nodes" not in dry_run(tmp_path, "slurm", "--no-preflight")
    one = cli("run", QUICKSTART, "--target", "docker", "--runs-dir", tmp_path, "--dry-run")
    assert one.exit_code == 0 and "preflight_ray" not in one.stdout


def test_a_slurm_nodes_decided_interface_reaches_its_ray_processes_unless_set(tmp_path):
    """The line the batch script runs on each node before its Ray process, with the file that node's doctor wrote."""
    line = next(line for line in dry_run(tmp_path, "slurm").splitlines() if line.startswith("if [ -f "))
    env_file = line.split('"')[1].replace("$SLURMD_NODENAME", "node1")
    os.makedirs(os.path.dirname(env_file))
    with open(env_file, "w") as out:
        out.write("GLOO_SOCKET_IFNAME=eth1\nNCCL_SOCKET_IFNAME=eth1\n")
    shown = subprocess.run(["bash", "-c", f"{line}; echo $GLOO_SOCKET_IFNAME $NCCL_SOCKET_IFNAME"], text=True,
                           capture_output=True, env={"PATH": os.environ["PATH"], "SLURMD_NODENAME": "node1"})
    assert shown.stdout.split() == ["eth1", "eth1"]
