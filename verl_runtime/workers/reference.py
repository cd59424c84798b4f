"""The reference policy: a frozen copy of the initial model, for the KL term (loss or reward)."""

from __future__ import annotations

import torch

from verl_runtime import offload
from verl_runtime.config import Config
from verl_runtime.controller import DP_SPLIT, register
from verl_runtime.models import load_causal_lm
from verl_runtime.rollout.base import logit_temperature
from verl_runtime.workers.actor import disable_dropout, log_probs, ref_memory, ref_micro_batching


class ReferenceWorker:
    def __init__(self, config: Config, device: torch.device):
        self.config = config
        self.model = load_causal_lm(config.model.path, config.model.dtype, device)
        disable_dropout(self.model)
        self.model.eval().requires_grad_(False)
        # ref.param_offload: the weights in host memory, on the device only for the log-prob pass
        self.offload = offload.Offload(torch.device(device), params=config.ref.param_offload)
        self.offload.release({"model": self.model})

    def offload_parts(self, phase: str) -> tuple[dict, None]:
        return {"model": self.model}, None

    @register(DP_SPLIT)
    @offload.phase(offload.FORWARD)
    def compute_ref_log_prob(self, batch: dict) -> torch.Tensor:
        """Log-probs [B, R] of the responses under the reference policy."""
        return log_probs(self.model, batch, ref_micro_batching(self.config),
                         logit_temperature(self.config.rollout.temperature), ref_memory(self.config))
