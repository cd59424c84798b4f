"""Where verl keeps its helpers; ``verl_runtime.utils.config`` is where the tutorial imports get_default_config."""
