"""``python -m verl_runtime.main_ppo KEY=VALUE ...``: verl's command line (``python3 -m verl.trainer.main_ppo``).

    python -m verl_runtime.main_ppo data.train_files=train.parquet actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B ...
    python -m verl_runtime.main_ppo --config-path examples --config-name quickstart trainer.total_training_steps=2

The overrides are verl's (Hydra's): bare ``key=value`` with YAML values (``[a,b]``, ``'quoted'``, ``True``,
``null``), ``+key=value`` to add, ``~key`` to drop. They apply on top of our default config, or of one of our YAML
files named by ``--config-path``/``--config-name`` (ours: verl's own Hydra files with a defaults list are not read
here; its keys are, as overrides). What each verl key does here: docs/verl.md. Errors as ``python -m verl_runtime``:
one ``error:`` line and exit 2 (``--debug``: the traceback).
"""

from __future__ import annotations

import sys
from pathlib import Path

from verl_runtime.errors import ConfigError, UserError
from verl_runtime.secrets import load_secret_files


def parse_args(argv: list[str]) -> tuple[str | None, list[str], bool]:
    """(config file or None, overrides, debug) from verl's command line."""
    config_path = config_name = None
    overrides, debug = [], False
    args = list(argv)
    while args:
        arg = args.pop(0)
        option, sep, value = arg.partition("=")
        if option in ("--config-path", "--config-name", "-cp", "-cn"):
            if not sep:
                if not args:
                    raise ConfigError(f"{option} needs a value")
                value = args.pop(0)
            if option in ("--config-path", "-cp"):
                config_path = value
            else:
                config_name = value
        elif arg == "--debug":
            debug = True
        elif arg.startswith("-"):
            raise ConfigError(f"unknown option {arg!r}: verl's command line takes KEY=VALUE overrides "
                              "(and --config-path/--config-name)")
        else:
            overrides.append(arg)
    if config_name is None:
        if config_path is not None:
            raise ConfigError("--config-path needs --config-name (the YAML file's name in it)")
        return None, overrides, debug
    name = config_name if config_name.endswith((".yaml", ".yml")) else f"{config_name}.yaml"
    return str(Path(config_path or ".") / name), overrides, debug


def main(argv: list[str] | None = None) -> int:
    from verl_runtime.__main__ import train

    load_secret_files()
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        config, overrides, debug = parse_args(argv)
        return train(config, overrides)
    except UserError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
