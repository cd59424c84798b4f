"""Scorers of the quickstart's toy tasks (rows from ``verl_runtime.data.make_toy_rows``)."""


def letter_score(solution_str: str, ground_truth: str) -> float:
    """Fraction of the response's non-whitespace characters that are the target letter (any case).

    Whitespace is ignored because some tokenizers' decode puts spaces between tokens; an empty
    response scores 0.
    """
    chars = [c for c in solution_str.lower() if not c.isspace()]
    if not chars:
        return 0.0
    return chars.count(str(ground_truth).lower()) / len(chars)


SCORERS = {"toy/letter": letter_score}
