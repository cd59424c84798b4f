"""verl's reward managers: how a scorer's result becomes a sample's reward and its extra information.

The choices are config.REWARD_MANAGERS (``reward.manager``):

- ``naive``: the score is the result (a float, or the ``score`` of verl's dict, whose items are all kept as extra
  information: DAPO's scorer gives ``score``, ``acc`` and ``pred``);
- ``dapo``: verl 0.9.1's DAPORewardManager (verl/experimental/reward_loop/reward_manager/dapo.py, ``run_single``):
  as naive, a float result is also kept as ``acc``; with ``reward.overlong_buffer.enable`` a response longer than
  ``max_resp_len - len`` tokens loses up to ``penalty_factor``, linearly over the buffer's ``len`` tokens, and with
  ``log`` the penalty is kept as ``overlong_reward`` and ``overlong`` (penalized or not).

Validation reports every extra item per data source (val-aux/...; ``acc`` becomes the core metric, as in verl).
Unlike verl 0.9.1's naive reward-loop manager, naive keeps no ``acc`` for a float result, so that validation's core
metric stays ``reward`` (val-core/<data_source>/reward/mean@N) for a scorer that returns a float.
"""

from __future__ import annotations

import torch

from verl_runtime.config import RewardConfig


def overlong_penalty(response_length: int, max_resp_len: int, buffer_len: int, penalty_factor: float) -> torch.Tensor:
    """DAPO's overlong reward (<= 0) of a response of response_length tokens (EOS included), as verl computes it:
    ``min(-(length - (max_resp_len - len)) / len * penalty_factor, 0)`` on an integer tensor, so in float32."""
    expected_len = max_resp_len - buffer_len
    exceed_len = torch.tensor(response_length) - expected_len
    return torch.clamp(-exceed_len / buffer_len * penalty_factor, max=0.0)


def managed_reward(config: RewardConfig, result: float | dict, response_length: int) -> tuple[float, dict]:
    """(the sample's reward, its extra information) for a scorer's result, by reward.manager."""
    if isinstance(result, dict):
        score, info = result["score"], dict(result)
    else:
        score, info = result, ({"acc": result} if config.manager == "dapo" else {})
    buffer = config.overlong_buffer
    if config.manager != "dapo" or not buffer.enable:
        return float(score), info
    penalty = overlong_penalty(response_length, config.max_resp_len, buffer.len, buffer.penalty_factor)
    if buffer.log:
        info["overlong_reward"] = float(penalty)
        info["overlong"] = bool(penalty < 0)
    return float(score + penalty), info  # a Python float plus a float32 tensor: float32, as verl adds them
