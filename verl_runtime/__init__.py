"""verl_runtime: the single-controller RL trainer that runs inside verl-deploy containers."""

__version__ = "0.1.0"

