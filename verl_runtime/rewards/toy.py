"""Scorers of the toy tasks (rows from ``verl_runtime.data.make_toy_rows``)."""

import re

_NUMBER = re.compile(r"-?\d+")


def letter_score(solution_str: str, ground_truth: str) -> float:
    """Fraction of the response's non-whitespace characters that are the target letter (any case).

    Whitespace is ignored because some tokenizers' decode puts spaces between tokens; an empty
    response scores 0.
    """
    chars = [c for c in solution_str.lower() if not c.isspace()]
    if not chars:
        return 0.0
    return chars.count(str(ground_truth).lower()) / len(chars)


def calculator_score(solution_str: str, ground_truth: str) -> float:
    """1 when the response's last number is the product, else 0. The response holds the tool's replies too (as in
    verl, the reward reads the whole decoded response), so an answer after the tool's reply is the one that counts;
    an episode that stops at the reply is judged by the reply, that is by whether the call was right."""
    numbers = _NUMBER.findall(solution_str)
    return float(bool(numbers) and numbers[-1] == str(ground_truth).strip())


SCORERS = {"toy/letter": letter_score, "toy/calculator": calculator_score}
