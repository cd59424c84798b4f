"""Rewards: rule-based scorers chosen by data_source (as verl's ``default_compute_score``), custom
functions from ``path/to/file.py:fn``, and an optional reward model.

Every scorer has verl's signature ``(data_source, solution_str, ground_truth, extra_info) -> float``.
"""

from typing import Callable

from verl_runtime.errors import RewardFunctionError
from verl_runtime.rewards import gsm8k, math_dapo, math_reward, toy
from verl_runtime.rewards.custom import load_custom_function
from verl_runtime.rewards.reward_model import RewardModelScorer

# verl 0.9.1's default_compute_score routing, for the scorers that need nothing outside this package
GSM8K_SOURCES = ("openai/gsm8k",)
MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")  # and every source that starts with "aime"
KNOWN_SOURCES = (*GSM8K_SOURCES, *MATH_SOURCES, *DAPO_SOURCES, "aime*", *toy.SCORERS)
# verl routes these to scorers that need a code sandbox or packages this runtime does not ship
ELSEWHERE_IN_VERL = {
    **dict.fromkeys(("numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc",
                     "numina_cn_k12", "numina_olympiads"), "prime_math"),
    **dict.fromkeys(("codecontests", "apps", "codeforces", "taco"), "sandbox_fusion / prime_code"),
    "hiyouga/geometry3k": "geo3k (mathruler)",
    **dict.fromkeys(("searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",
                     "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle"), "search_r1_like_qa_em"),
}

RewardFn = Callable[[str, str, object, "dict | None"], float]


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """The built-in scorer for a row's data_source, routed as verl 0.9.1's default_compute_score.

    DAPO's scorer returns verl's dict (score, acc, pred); its score is the float returned here.
    """
    result = compute_score_result(data_source, solution_str, ground_truth, extra_info)
    return float(result["score"] if isinstance(result, dict) else result)


def compute_score_result(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> "float | dict":
    """default_compute_score's result as verl's returns it: DAPO's scorer's whole dict (score, acc, pred), which a
    reward manager keeps as extra information (validation reports acc as its core metric)."""
    if data_source in GSM8K_SOURCES:
        return float(gsm8k.compute_score(solution_str, ground_truth))
    if data_source in MATH_SOURCES:
        return float(math_reward.compute_score(solution_str, ground_truth))
    if data_source in DAPO_SOURCES or data_source.startswith("aime"):
        return math_dapo.compute_score(solution_str, ground_truth)
    if data_source in toy.SCORERS:
        return toy.SCORERS[data_source](solution_str, ground_truth)
    elsewhere = ""
    if data_source in ELSEWHERE_IN_VERL:
        elsewhere = f" (verl scores it with {ELSEWHERE_IN_VERL[data_source]}, not built in here)"
    raise RewardFunctionError(
        f"no built-in reward for data_source '{data_source}'{elsewhere} (built in: {', '.join(KNOWN_SOURCES)}): "
        "set reward.function=path/to/file.py:function_name"
    )


def load_reward_fn(spec: str | None) -> RewardFn:
    """None -> default_compute_score; "path/to/file.py:fn" -> that function (name defaults to compute_score)."""
    if not spec:
        return default_compute_score
    return load_custom_function(spec)


__all__ = ["RewardModelScorer", "compute_score_result", "default_compute_score", "load_reward_fn", "RewardFunctionError"]
