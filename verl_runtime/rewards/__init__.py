"""Rewards: rule-based scorers chosen by data_source (as verl's ``default_compute_score``), custom
functions from ``path/to/file.py:fn``, and an optional reward model.

Every scorer has verl's signature ``(data_source, solution_str, ground_truth, extra_info) -> float``.
"""

from typing import Callable

from verl_runtime.errors import RewardFunctionError
from verl_runtime.rewards import gsm8k, math_reward, toy
from verl_runtime.rewards.custom import load_custom_function
from verl_runtime.rewards.reward_model import RewardModelScorer

GSM8K_SOURCES = ("openai/gsm8k",)
# verl sends "math" to its DAPO scorer; here it means the \boxed{} scorer, the one rule this runtime ships
MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math")
KNOWN_SOURCES = (*GSM8K_SOURCES, *MATH_SOURCES, *toy.SCORERS)

RewardFn = Callable[[str, str, object, "dict | None"], float]


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """The built-in scorer for a row's data_source."""
    if data_source in GSM8K_SOURCES:
        return gsm8k.compute_score(solution_str, ground_truth)
    if data_source in MATH_SOURCES:
        return math_reward.compute_score(solution_str, ground_truth)
    if data_source in toy.SCORERS:
        return toy.SCORERS[data_source](solution_str, ground_truth)
    raise RewardFunctionError(
        f"no built-in reward for data_source '{data_source}' (built in: {', '.join(KNOWN_SOURCES)}): "
        "set reward.function=path/to/file.py:function_name"
    )


def load_reward_fn(spec: str | None) -> RewardFn:
    """None -> default_compute_score; "path/to/file.py:fn" -> that function (name defaults to compute_score)."""
    if not spec:
        return default_compute_score
    return load_custom_function(spec)


__all__ = ["RewardModelScorer", "default_compute_score", "load_reward_fn", "RewardFunctionError"]
