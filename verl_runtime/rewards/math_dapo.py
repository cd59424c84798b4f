r"""DAPO's math scorer with the behaviour of verl 0.9.1's ``verl/utils/reward_score/math_dapo.py``, number for number.

verl's ``default_compute_score`` sends ``math``, ``math_dapo``, ``math_dapo_reasoning`` and ``aime*`` here. The
answer is the last ``Answer: ...`` line (Minerva normalization), else the last ``\boxed{...}`` in the final 100
characters, compared exactly; only the last 300 characters of a response count. Score 1.0 if correct, else -1.0.
"""

import re

from verl_runtime.rewards.math_reward import balanced_from

_SUBSTITUTIONS = [
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
]
_REMOVED_EXPRESSIONS = [
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
    "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
    "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots",
]
_ANSWER = r"(?i)Answer\s*:\s*([^\n]+)"
INVALID = "[INVALID]"


def last_boxed_only_string(string: str) -> str | None:
    r"""The last ``\boxed{...}`` with balanced braces, or None (no ``\boxed `` or ``\fbox`` forms here)."""
    return balanced_from(string, string.rfind("\\boxed{"))


def remove_boxed(s: str) -> str:
    if not (s.startswith("\\boxed{") and s.endswith("}")):
        raise ValueError(f"box error: {s}")
    return s[len("\\boxed{") : -1]


def normalize_final_answer(final_answer: str) -> str:
    """Minerva's normalization of a final answer (Lewkowycz et al. 2022)."""
    final_answer = final_answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expression in _REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expression, "")
    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)  # \fracab -> \frac{a}{b}
    final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)  # \sqrta -> \sqrt{a}
    final_answer = final_answer.replace("$", "")
    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer.strip()


def is_correct_minerva(solution_str: str, gt: str) -> tuple[bool, str]:
    match = re.findall(_ANSWER, solution_str)
    pred = normalize_final_answer(match[-1] if match else INVALID)
    return pred == normalize_final_answer(gt), pred


def is_correct_strict_box(pred: str, gt: str) -> tuple[bool, str | None]:
    boxed = last_boxed_only_string(pred[-100:])
    extracted = remove_boxed(boxed) if boxed is not None else None
    return extracted == gt, extracted


def verify(solution_str: str, answer: str, strict_box_verify: bool = False) -> tuple[bool, str | None]:
    """Minerva's ``Answer:`` first, the boxed answer when there is none (only the box when strict)."""
    if strict_box_verify:
        return is_correct_strict_box(solution_str, answer)
    correct, pred = is_correct_minerva(solution_str, answer)
    if pred != INVALID:
        return correct, pred
    box_correct, box_pred = is_correct_strict_box(solution_str, answer)
    if box_pred is not None:
        return box_correct, box_pred
    return correct, pred


def compute_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False) -> dict:
    """verl's result dict: score (1.0 or -1.0), acc (bool) and the extracted pred."""
    correct, pred = verify(solution_str[-300:], ground_truth, strict_box_verify)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
