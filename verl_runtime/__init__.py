"""verl_runtime: the single-controller RL trainer that runs inside verl-deploy containers.

Importing the package stays light (no torch): ``get_default_config`` is loaded on first use.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "get_default_config":
        from verl_runtime.config import get_default_config

        return get_default_config
    raise AttributeError(f"module 'verl_runtime' has no attribute {name!r}")
