"""``python -m verl_runtime.main_ppo KEY=VALUE ...``: verl's command line (``python3 -m verl.trainer.main_ppo``).

    python -m verl_runtime.main_ppo data.train_files=train.parquet actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B ...
    python -m verl_runtime.main_ppo --config-path examples --config-name quickstart trainer.total_training_steps=2

The overrides are verl's (Hydra's): bare ``key=value`` with YAML values (``[a,b]``, ``'quoted'``, ``True``,
``null``), ``+key=value`` to add, ``~key`` to drop. They apply on top of our default config, or of one of our YAML
files named by ``--config-path``/``--config-name`` (ours: verl's own Hydra files with a defaults list are not read
here; its keys are, as overrides; ``--config-name ppo_trainer``, verl's default, is our defaults). What each verl key
does here: docs/verl.md. Every refusal names the way out: the key verl renamed it to, ``verl-deploy run --runtime
verl`` (verl's own trainer) or, for a key or value no verl release has, ``--verl-source`` (the user's fork). Errors as ``python -m verl_runtime``: one ``error:`` line and exit 2 (``--debug``: the
traceback).

``--cfg job`` (Hydra's: also ``--cfg=job``, ``-c job``, and ``all``, the same here) composes the config exactly as a
run would, every check included, prints it as YAML and exits 0, loading no model or data and creating no run
directory: will verl's command line run here, and as what?
"""

from __future__ import annotations

import sys
from pathlib import Path

from verl_runtime import verl_keys
from verl_runtime.errors import ConfigError, UserError
from verl_runtime.secrets import load_secret_files


CFG_CHOICES = ("job", "all")  # Hydra's --cfg values; both print the one composed config here


def cfg_requested(argv: list[str]) -> tuple[bool, list[str]]:
    """(whether --cfg job|all was given, the other arguments)."""
    args, rest, wanted = list(argv), [], False
    while args:
        arg = args.pop(0)
        option, sep, value = arg.partition("=")
        if option in ("--cfg", "-c"):
            if not sep:
                value = args.pop(0) if args else ""
            if value not in CFG_CHOICES:
                raise ConfigError(f"{option} takes {' or '.join(CFG_CHOICES)} (print the composed config), got {value!r}")
            wanted = True
        else:
            rest.append(arg)
    return wanted, rest


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
    path = Path(config_path or ".") / name
    if not path.is_file():
        stem = Path(name).stem
        if stem in verl_keys.VERL_CONFIG_NAMES and verl_keys.VERL_CONFIG_NAMES[stem] is None:
            return None, overrides, debug  # verl's default config: our defaults are its counterpart
        what = verl_keys.VERL_CONFIG_NAMES.get(stem)
        if what is None:  # no verl release has it: a recipe's or a fork's, which their own verl composes
            raise ConfigError(f"config file {path} not found (--config-name {config_name}): a Hydra config of a "
                              f"recipe or a fork (verl's own is ppo_trainer), composed by their verl: run it with "
                              f"{verl_keys.RUN_FORK}")
        raise ConfigError(f"config file {path} not found (--config-name {config_name}): {verl_keys.out_of_scope(what)}")
    return str(path), overrides, debug


def main(argv: list[str] | None = None) -> int:
    from verl_runtime.__main__ import train

    load_secret_files()
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        show, argv = cfg_requested(argv)
        config, overrides, debug = parse_args(argv)
        if show:
            return print_config(config, overrides)
        return train(config, overrides)
    except UserError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130


def print_config(config_file: str | None, overrides: list[str]) -> int:
    """Compose the config as train() does (all its checks, warnings on stderr) and print it as YAML: no model, data
    or run directory is touched."""
    from verl_runtime.config import load_config, to_yaml

    sys.stdout.write(to_yaml(load_config(config_file, overrides)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
