r"""MATH scorer with the behaviour of verl's math_verify-free ``math`` scorer, number for number.

The answer is the content of the last ``\boxed{...}`` (or ``\boxed ...`` up to a ``$``); it scores 1.0
when it equals the ground truth after the string normalization of EleutherAI's lm-evaluation-harness
(hendrycks_math), else 0.0. As in verl, anything unparsable (an unclosed box, ``\fbox``) scores 0.0.
"""


def compute_score(solution_str: str, ground_truth: str) -> float:
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return 0.0
    try:
        answer = remove_boxed(boxed)
    except ValueError:
        return 0.0
    return 1.0 if is_equiv(answer, ground_truth) else 0.0


def last_boxed_only_string(string: str) -> str | None:
    r"""The last ``\boxed{...}`` (braces balanced) or ``\fbox{...}``; ``\boxed x`` runs up to the next ``$``."""
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    start = string.rfind("\\boxed")
    if start < 0:
        start = string.rfind("\\fbox")
    return balanced_from(string, start)


def balanced_from(string: str, start: int) -> str | None:
    """string from start through the brace that closes its first "{" (None: start < 0, or never closed)."""
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(string)):
        if string[i] == "{":
            depth += 1
        elif string[i] == "}":
            depth -= 1
            if depth == 0:
                return string[start : i + 1]
    return None


def remove_boxed(s: str) -> str:
    if "\\boxed " in s:
        if not s.startswith("\\boxed "):
            raise ValueError(f"not a boxed answer: {s!r}")
        return s[len("\\boxed ") :]
    if not (s.startswith("\\boxed{") and s.endswith("}")):
        raise ValueError(f"not a boxed answer: {s!r}")
    return s[len("\\boxed{") : -1]


def is_equiv(str1, str2) -> bool:
    if str1 is None or str2 is None:
        return str1 is None and str2 is None
    try:
        return strip_string(str1) == strip_string(str2)
    except Exception:  # normalization of odd input may fail; verl then compares the raw strings
        return str1 == str2


def strip_string(string: str) -> str:
    """Normalize a LaTeX answer so that equivalent spellings compare equal."""
    for old, new in (
        ("\n", ""),
        ("\\!", ""),
        ("\\\\", "\\"),
        ("tfrac", "frac"),
        ("dfrac", "frac"),
        ("\\left", ""),
        ("\\right", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\$", ""),
    ):
        string = string.replace(old, new)
    string = _remove_right_units(string)
    string = string.replace("\\\\%", "")  # a literal \\% first, then \%, as verl
    string = string.replace("\\%", "")
    string = string.replace(" .", " 0.").replace("{.", "{0.")
    if not string:
        return string
    if string[0] == ".":
        string = "0" + string
    # drop a short "k = " / "x=" in front
    parts = string.split("=")
    if len(parts) == 2 and len(parts[0]) <= 2:
        string = parts[1]
    string = _fix_sqrt(string)
    string = string.replace(" ", "")
    string = _fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    return _fix_a_slash_b(string)


def _remove_right_units(string: str) -> str:
    # "\text{ " marks units in MATH answers
    if "\\text{ " not in string:
        return string
    parts = string.split("\\text{ ")
    if len(parts) != 2:
        raise ValueError("more than one unit")
    return parts[0]


def _fix_sqrt(string: str) -> str:
    r"""\sqrt3 -> \sqrt{3}"""
    if "\\sqrt" not in string:
        return string
    head, *rest = string.split("\\sqrt")
    out = head
    for part in rest:
        out += "\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:])
    return out


def _fix_fracs(string: str) -> str:
    r"""\frac12 -> \frac{1}{2}, \frac1{72} -> \frac{1}{72}"""
    head, *rest = string.split("\\frac")
    out = head
    for part in rest:
        out += "\\frac"
        if part[0] == "{":
            out += part
        elif len(part) < 2:
            return string
        elif part[1] != "{":
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
        else:
            out += "{" + part[0] + "}" + part[1:]
    return out


def _fix_a_slash_b(string: str) -> str:
    r"""3/4 -> \frac{3}{4} when both sides are plain integers"""
    parts = string.split("/")
    if len(parts) != 2:
        return string
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return string
    if string != f"{a}/{b}":
        return string
    return "\\frac{" + str(a) + "}{" + str(b) + "}"
