"""verl-deploy: the host-side CLI. It never imports torch."""

from verl_runtime import __version__

__all__ = ["__version__"]
