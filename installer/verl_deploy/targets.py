"""Where a run can go (`run --target`), and which targets are clusters: their nodes are not this host, so its GPUs
and driver say nothing of them. Read by the launchers, the run plan and the memory planner alike."""

TARGETS = ("local", "docker", "k8s", "slurm")
CLUSTER_TARGETS = ("k8s", "slurm")
