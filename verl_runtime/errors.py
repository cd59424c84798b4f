"""Errors the user can fix: each carries one line that says what went wrong and what to do.

The entrypoint prints ``error: <message>`` and exits 2, without a traceback (unless --debug).
"""


# The exit code of a UserError: the same input fails the same way again, so a scheduler should not retry it
# (the Kubernetes Job's podFailurePolicy fails the Job at once on it).
EXIT_USER_ERROR = 2


class UserError(Exception):
    """A one-line, user-facing error."""


class DataError(UserError):
    """A data file is missing, unreadable or not in verl's row layout."""


class RewardFunctionError(UserError):
    """A custom reward function cannot be loaded."""


class ConfigError(UserError):
    """The configuration is invalid."""


class ModelError(UserError):
    """A model directory is missing or cannot be loaded."""


class TrainingError(UserError):
    """Training cannot go on: a NaN loss, or out of memory (the message names the knob to turn)."""
