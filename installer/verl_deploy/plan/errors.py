"""The planner's one error: bad input (an unknown GPU, a model that cannot be resolved, a config it cannot read),
always one line; `plan` exits 2 on it."""


class PlanError(ValueError):
    """One line saying what is wrong and what to do."""
