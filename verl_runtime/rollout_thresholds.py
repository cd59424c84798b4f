"""The settings of verl 0.9.1's rollout correction (algorithm.rollout_correction): their choices and verl's parsing
of the thresholds, torch-free so that config loading (host side too) checks them; the maths is in
verl_runtime/rollout_correction.py."""

from __future__ import annotations

# exp(+-20) bounds every exponentiated log-ratio, as in verl
SAFETY_BOUND = 20.0
IS_LEVELS = ("token", "sequence")
LOSS_TYPES = ("ppo_clip", "reinforce")
SUPPORTED_ROLLOUT_RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
                                "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
TOKEN_LEVEL_ROLLOUT_RS_OPTIONS = ("token_k1", "token_k2", "token_k3")


def parse_rollout_is_threshold(threshold_spec: str | float) -> tuple[float, float | None]:
    """(upper, lower): a number or "2.0" truncates at upper (TIS); "lower_upper" zeroes weights outside (IcePop)."""
    if isinstance(threshold_spec, bool) or not isinstance(threshold_spec, (int, float, str)):
        raise TypeError("rollout_is_threshold must be a number or a string such as '2.0' or '0.5_4.0'")
    lower = None
    try:
        if isinstance(threshold_spec, str) and "_" in threshold_spec.strip():
            lower_text, upper_text = threshold_spec.strip().split("_", 1)
            lower, upper = float(lower_text), float(upper_text)
        else:
            upper = float(threshold_spec)
    except ValueError as exc:
        raise ValueError(f"Invalid rollout_is_threshold '{threshold_spec}'.") from exc
    if upper <= 0:
        raise ValueError(f"rollout_is_threshold upper bound must be positive, got {upper}.")
    if lower is not None and lower <= 0:
        raise ValueError(f"rollout_is_threshold lower bound must be positive, got {lower}.")
    if lower is not None and lower > upper:
        raise ValueError("rollout_is_threshold lower bound must be <= upper bound.")
    return upper, lower


def parse_rollout_rs(rollout_rs: str) -> list[str]:
    """The options of a comma-separated rollout_rs, each once, in order; ValueError naming the valid ones."""
    options = list(dict.fromkeys(opt.strip() for opt in str(rollout_rs).split(",") if opt.strip()))
    if not options:
        raise ValueError("rollout_rs must contain at least one valid option.")
    for opt in options:
        if opt not in SUPPORTED_ROLLOUT_RS_OPTIONS:
            raise ValueError(f"Invalid rollout_rs option: {opt}. Must be one of {sorted(SUPPORTED_ROLLOUT_RS_OPTIONS)}.")
    return options


def parse_rollout_rs_thresholds(options: list[str], threshold_spec: str | float | None) -> dict[str, dict]:
    """{option: {"lower", "upper"}}: one threshold for all options or one per option; k1 options take
    "lower_upper" ratio bounds (a single upper u means 1/u_u), the others one upper bound."""
    if threshold_spec is None:
        raise ValueError("rollout_rs_threshold must be provided for rejection sampling.")
    if isinstance(threshold_spec, bool) or not isinstance(threshold_spec, (int, float, str)):
        raise TypeError("rollout_rs_threshold must be a string or numeric value specifying per-option thresholds.")
    specs = [str(threshold_spec)] if not isinstance(threshold_spec, str) else \
        [part.strip() for part in threshold_spec.split(",") if part.strip()]
    if not specs:
        raise ValueError("rollout_rs_threshold must contain at least one threshold value.")
    if len(specs) not in (1, len(options)):
        raise ValueError(f"rollout_rs_threshold expects either one threshold shared by all options or exactly "
                         f"{len(options)} thresholds to match the provided rollout_rs options.")
    specs = specs * len(options) if len(specs) == 1 else specs
    thresholds = {}
    for option, spec in zip(options, specs):
        try:
            if option.endswith("k1"):
                lower_text, upper_text = spec.split("_", 1) if "_" in spec else (str(1.0 / float(spec)), spec)
                lower, upper = float(lower_text), float(upper_text)
            elif "_" in spec:
                raise ValueError(f"rollout_rs_threshold for option '{option}' must provide a single upper bound "
                                 f"without '_'. Received '{spec}'.")
            else:
                lower, upper = None, float(spec)
        except (ValueError, ZeroDivisionError) as exc:
            if "single upper bound" in str(exc):
                raise
            raise ValueError(f"Invalid numeric threshold '{spec}' for option '{option}'.") from exc
        if upper <= 0 or (lower is not None and lower <= 0):
            raise ValueError(f"Thresholds for option '{option}' must be positive, got {spec}.")
        if lower is not None and lower > upper:
            raise ValueError(f"Thresholds for option '{option}' must be lower <= upper, got {spec}.")
        thresholds[option] = {"lower": lower, "upper": upper}
    return thresholds


def check_rollout_correction(rollout_is, rollout_is_threshold, rollout_rs, rollout_rs_threshold) -> None:
    """ValueError for a setting verl's functions would reject at the first step: checked at load instead."""
    if rollout_is is not None:
        if rollout_is not in IS_LEVELS:
            raise ValueError(f"Invalid rollout_is: {rollout_is}. Must be one of {set(IS_LEVELS)}.")
        if rollout_is_threshold is not None:
            parse_rollout_is_threshold(rollout_is_threshold)
    if rollout_rs is not None:
        parse_rollout_rs_thresholds(parse_rollout_rs(rollout_rs), rollout_rs_threshold)
