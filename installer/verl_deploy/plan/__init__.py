"""`verl-deploy plan`: will a run fit in GPU memory? The per-GPU peak of every phase of a step, from the model's
config.json, the GPU and the run's config, before anything is allocated (docs/plan.md).

    shape.py     the model's shape from config.json; parameters counted exactly on the meta device
    gpu.py       the GPU: this host's NVML reading, a --gpu-type of gpu_types.yaml, or --gpu-memory
    workload.py  what a run asks for, read from our config (verl_runtime.config) or verl's overrides
    lengths.py   the sequence lengths assumed, or read from the data file
    memory.py    the memory model: phases x components, in bytes (pure arithmetic)
    suggest.py   changes that make it fit, cheapest first, each planned again
    render.py    the table for people, the JSON for programs
    core.py      plan() and preflight(), what the CLI and `run` call

Importing this package is light: torch and transformers are imported only to count parameters (shape.py).
"""

from verl_deploy.plan.core import Plan, PlanError, Preflight, plan, preflight

__all__ = ["Plan", "PlanError", "Preflight", "plan", "preflight"]
