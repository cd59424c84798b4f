"""``from verl_runtime.utils.config import get_default_config``: the tutorial's import path."""

from verl_runtime.config import Config, get_default_config, load_config

__all__ = ["Config", "get_default_config", "load_config"]
