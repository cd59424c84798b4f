"""The benchmark's reward: the share of the letter "a" in a completion (the toy letter task).

Both trainers score with the same rule; only the calling conventions differ.
"""

LETTER = "a"


def letter_share(text: str) -> float:
    return text.count(LETTER) / len(text) if text else 0.0


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """verl's reward signature, loaded by verl_runtime as `bench/_reward.py:compute_score`."""
    return letter_share(solution_str)


def trl_reward(prompts, completions, **kwargs) -> list[float]:
    """TRL's reward signature; conversational completions arrive as lists of messages."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [letter_share(t) for t in texts]
