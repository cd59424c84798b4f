"""GSM8K scorer with the behaviour of verl's ``verl/utils/reward_score/gsm8k.py``, number for number.

strict: the answer is the last ``#### <number>`` (commas and dollar signs dropped);
flexible: the last number-like run anywhere (kept as written, commas included).
Only the last 300 characters are searched, as in verl.
"""

import re

_TAIL_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_TAIL_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = _NUMBER.findall(tail)
    if not found:
        return None
    # the last match that is more than a lone "." (verl falls back to the first match if all are)
    return next((m for m in reversed(found) if m not in ("", ".")), found[0])


def compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0) -> float:
    """score if the extracted answer equals ground_truth, format_score if an answer was found, else 0."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if answer == ground_truth else float(format_score)
