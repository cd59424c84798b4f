"""What one GPU could train: the largest dense model (the Qwen2.5 family of reference_models.yaml) for which
full-parameter GRPO fits on it alone, without offload and with FSDP2's CPU offload. Pure arithmetic (no torch), so
`verl-deploy doctor` can say it for every GPU it sees.

The workload: upstream verl 0.9.1 (the runtime with offload), one GPU, GRPO with 5 samples per prompt, prompts of
up to 512 and responses of up to 1024 tokens, micro-batches of 4 sequences, gradient checkpointing, vLLM with tensor
parallelism 1 at the memory share that fits best (0.1 to 0.9); a model "fits" when `verl-deploy plan` would say fits
or tight (lengths.py: the typical lengths fit). "With offload" keeps
parameters, gradients and AdamW in host memory (actor_rollout_ref.actor.strategy=fsdp2, fsdp_config.offload_policy=
True), which needs 16 bytes per parameter of host memory (plus 4 for the reference model): the host's memory caps it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources

from verl_deploy.plan.gpu import Device
from verl_deploy.plan.lengths import assume
from verl_deploy.plan.shape import ModelShape, _count_by_arithmetic

PROMPT, RESPONSE, MICRO = 512, 1024, 4
SHARES = [round(u / 100, 2) for u in range(90, 5, -5)]
WORKLOAD = [
    "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    f"data.max_prompt_length={PROMPT}", f"data.max_response_length={RESPONSE}", "data.train_batch_size=64",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16", f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
    f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO}", "actor_rollout_ref.model.path=reference",
]
DESCRIPTION = (f"full-parameter GRPO on this GPU alone (verl FSDP + vLLM, up to {PROMPT}+{RESPONSE}-token sequences, "
               f"micro-batches of {MICRO}, gradient checkpointing; fits or tight as `plan` judges it)")


@lru_cache(maxsize=1)
def reference_models() -> dict[str, ModelShape]:
    import yaml

    data = yaml.safe_load(resources.files("verl_deploy.plan").joinpath("reference_models.yaml").read_text())
    return {name: _count_by_arithmetic(config, config, missing="") for name, config in data.items()}


@dataclass(frozen=True)
class Capacity:
    without_offload: str | None  # the largest reference model that fits, by name
    with_offload: str | None  # ... with FSDP2's CPU offload, as far as the GPU goes
    offload_host_bytes: int  # the host memory that one needs
    within_host: str | None  # the largest that fits with offload in `host_bytes` of host memory


def capacity(device: Device, host_bytes: int) -> Capacity:
    from verl_deploy.plan.core import _judge
    from verl_deploy.plan.workload import from_verl

    base = from_verl(WORKLOAD, 1, 1)
    cases = assume(base.padding_free, PROMPT, RESPONSE, None)  # the plan's typical and worst lengths
    device = replace(device, source="capacity")  # the host's memory is weighed here, not by the plan

    def fits(shape: ModelShape, offload: bool) -> bool:
        work = base.with_(param_offload=offload, optimizer_offload=offload, offload_policy=offload)
        for share in SHARES:
            result = _judge(work.with_(gpu_memory_utilization=share), shape, None, cases, device)
            if result.fits:  # fits or tight: the verdict `plan` and `run` give
                return True
        return False

    plain = offload = within = None
    need = 0
    for name, shape in reference_models().items():
        if fits(shape, False):
            plain = name
        if fits(shape, True):
            offload, need = name, host_need(shape)
            if need <= host_bytes:
                within = name
    return Capacity(plain, offload, need, within)


def host_need(shape: ModelShape) -> int:
    """Host memory of FSDP2's CPU offload on one GPU: fp32 parameters, gradients, AdamW's moments, and the reference
    model's fp32 weights, which verl keeps in host memory too."""
    return 20 * shape.params
