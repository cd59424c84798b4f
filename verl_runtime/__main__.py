"""``python -m verl_runtime``: the container entrypoint.

    python -m verl_runtime train CONFIG.yaml [--set key=value ...] [--debug]
    python -m verl_runtime prepare gsm8k --input FILE --output DIR
    python -m verl_runtime export RUN_DIR [--out DIR] [--step N] [--dtype D]

A problem the user can fix prints ``error: <one line>`` and exits 2 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
from pathlib import Path

from verl_runtime.errors import EXIT_USER_ERROR, UserError, machine_fault, machine_faults
from verl_runtime.secrets import load_secret_files


def main(argv: list[str] | None = None) -> int:
    load_secret_files()  # before anything reads a token (a model download, a tracker)
    args = _parser().parse_args(argv)
    try:
        if args.command == "train":
            return train(args.config, args.overrides)
        if args.command == "fetch":
            return fetch(args.config, args.overrides)
        if args.command == "export":
            return export(args.run_dir, args.out, args.step, args.dtype, args.max_shard_size, args.form)
        return prepare(args.dataset, args.input, args.output, tools=args.tools)
    except UserError as exc:
        if args.debug:
            raise
        try:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # no console left to tell: train.log has it
            _discard(sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


def train(config_path: str, overrides: list[str]) -> int:
    """Load and validate the config, then run fit() with the console mirrored to <run_dir>/train.log.

    The run directory is locked for the whole run, before anything is written into it: a second trainer on it
    fails with one line (RunDirBusy) and leaves the first one's log, metrics and config alone."""
    from verl_runtime import oom
    from verl_runtime.config import load_config
    from verl_runtime.local_paths import check_local_paths
    from verl_runtime.rundir import TRAIN_LOG, locked

    _refuse_empty(config_path)
    config = load_config(config_path, overrides)
    check_local_paths(config)  # data, reward and model paths: before the run directory and the model load
    threading.excepthook = _thread_fault  # TensorBoard's writer thread meets a full disk too
    with machine_faults(), locked(config.run_dir):
        log_path = config.run_dir / TRAIN_LOG
        try:
            with _tee_console(log_path), oom.translated(config):  # running out of memory: one line, also at start-up
                from verl_runtime.services.running import running
                from verl_runtime.trainer import SingleControllerTrainer

                with running(config) as services:  # the tools' services, healthy before the model loads
                    SingleControllerTrainer(config, services).fit()
        except (UserError, OSError, RuntimeError) as exc:
            fault = exc if isinstance(exc, UserError) else machine_fault(exc)
            if fault is not None:
                with contextlib.suppress(OSError), open(log_path, "a", encoding="utf-8") as log:
                    log.write(f"error: {fault}\n")  # main() prints it to the console; a full disk may lose it
            raise
    return 0


def _refuse_empty(config_path: str) -> None:
    """UserError for a CONFIG file with no settings (empty, comments only, `null`): it would train on the defaults
    without a word, where a config was meant."""
    import yaml

    if config_path is None:  # verl's command line (main_ppo): no file, its keys alone
        return
    path = Path(config_path)
    try:
        empty = path.is_file() and yaml.safe_load(path.read_text(encoding="utf-8", errors="replace")) is None
    except yaml.YAMLError:
        return  # not YAML: load_config says where
    if empty:
        raise UserError(f"CONFIG {config_path} is empty: give it the run's settings (examples/quickstart.yaml is one)")


def _thread_fault(args) -> None:
    """A machine fault in a background thread is one line (the main thread meets it at its next write and ends the
    run); any other error gets Python's traceback."""
    fault = machine_fault(args.exc_value) if args.exc_value is not None else None
    if fault is None:
        threading.__excepthook__(args)
        return
    with contextlib.suppress(OSError, ValueError):
        print(f"[WARN] {args.thread.name if args.thread else 'a thread'} stopped: {fault}", file=sys.stderr, flush=True)


def fetch(config_path: str, overrides: list[str]) -> int:
    """Put the config's models (actor, critic, reward model) into the Hugging Face cache, then exit: run once
    before N workers start (the Kubernetes init container), so that they read the cache instead of N downloads."""
    from verl_runtime.config import load_config
    from verl_runtime.models import resolve_model_path

    config = load_config(config_path, overrides)
    models = dict.fromkeys(m for m in (config.model.path, config.critic.model_path, config.reward.model_path) if m)
    for model in models:
        print(f"[INFO] {model}: {resolve_model_path(model)}", flush=True)
    return 0


def export(run_dir: str, out: str | None, step: int | None, dtype: str | None, max_shard_size: str, form: str = "merged") -> int:
    """A checkpoint of a run as a Hugging Face model directory (verl_runtime.export)."""
    from verl_runtime.export import export_checkpoint

    step, path = export_checkpoint(run_dir, out, step=step, dtype=dtype, max_shard_size=max_shard_size, form=form)
    print(f"exported step {step} of {run_dir} to {path}", flush=True)
    return 0


def prepare(dataset: str, input_path: str, output_dir: str, tools: bool = False) -> int:
    from verl_runtime.prepare import prepare_gsm8k

    for split, path in prepare_gsm8k(input_path, output_dir, tools=tools).items():
        print(f"{split}: {path}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m verl_runtime", description="verl_runtime: single-controller RL trainer")
    commands = parser.add_subparsers(dest="command", required=True)

    train_cmd = commands.add_parser("train", help="train with a YAML config (the container entrypoint)")
    train_cmd.add_argument("config", help="YAML config file, e.g. examples/quickstart.yaml")
    train_cmd.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config value, e.g. --set data.batch_size=16 (repeatable)",
    )
    train_cmd.add_argument("--debug", action="store_true", help="show tracebacks")

    fetch_cmd = commands.add_parser("fetch", help="put the config's models into the Hugging Face cache, then exit")
    fetch_cmd.add_argument("config", help="YAML config file")
    fetch_cmd.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                           help="override a config value (repeatable)")
    fetch_cmd.add_argument("--debug", action="store_true", help="show tracebacks")

    export_cmd = commands.add_parser("export", help="write a checkpoint of a run as a Hugging Face model directory")
    export_cmd.add_argument("run_dir", help="the run directory, e.g. runs/quickstart")
    export_cmd.add_argument("--out", default=None, help="the model directory to write (new or empty; default: the "
                                                        "run's own hf/step_<N>, rewritten)")
    export_cmd.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the newest usable)")
    export_cmd.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: the base model's)")
    export_cmd.add_argument("--max-shard-size", default=None, help="largest safetensors shard, e.g. 2GB (default: 5GB)")
    from verl_runtime.export import FORMS  # light: no torch

    export_cmd.add_argument("--form", default=FORMS[0], choices=FORMS,
                            help="a LoRA run: merged (the adapters folded into a whole model, the default) or adapter "
                                 "(peft's adapter_model.safetensors + adapter_config.json)")
    export_cmd.add_argument("--debug", action="store_true", help="show tracebacks")

    prepare_cmd = commands.add_parser("prepare", help="turn a raw data set into verl's parquet layout")
    prepare_cmd.add_argument("dataset", choices=["gsm8k"])
    prepare_cmd.add_argument("--input", required=True, help="GSM8K rows {question, answer}: .jsonl/.parquet or a directory")
    prepare_cmd.add_argument("--output", required=True, help="directory for train.parquet / test.parquet")
    prepare_cmd.add_argument("--tools", action="store_true",
                             help="verl's multi-turn tool rows (gsm8k_multiturn_w_tool.py): the episodes call the "
                                  "GSM8K answer tool (examples/tools/gsm8k_tool_config.yaml)")
    prepare_cmd.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


class _Tee:
    """A console stream that also writes to the run's log; everything else (fileno, encoding, ...) is the console's.

    The console may go away under a long run (a closed pipe, a terminal hung up: BrokenPipeError, EIO): the
    training goes on, the log keeps everything, and the console is dropped. The log may fail too (a full disk): the
    console then goes on alone, with one warning, and the log loses what follows; the run's own writes (metrics,
    checkpoints) meet the fault and end it with one line."""

    def __init__(self, console, log, log_state: dict | None = None):
        self.console, self.log = console, log
        self.console_gone = False
        self._log_state = {"gone": False} if log_state is None else log_state  # shared by stdout's and stderr's

    def __getattr__(self, name):
        return getattr(self.console, name)

    def write(self, text: str) -> int:
        self._to_log(self.log.write, text)
        self._to_console(self.console.write, text)
        return len(text)

    def flush(self) -> None:
        self._to_log(self.log.flush)
        self._to_console(self.console.flush)

    def _to_log(self, method, *args) -> None:
        if self._log_state["gone"]:
            return
        try:
            method(*args)
        except ValueError:  # closed under a thread that checked "gone" just before _tee_console detached the log
            return
        except OSError as exc:
            self._log_state["gone"] = True
            self._to_console(self.console.write, f"[WARN] cannot write {getattr(self.log, 'name', 'the log')} "
                                                 f"({exc.strerror or exc}): the console goes on without it\n")

    def _to_console(self, method, *args) -> None:
        if self.console_gone:
            return
        try:
            method(*args)
        except (OSError, ValueError):  # any failure to write the console means it is gone (ValueError: closed)
            self.console_gone = True
            _discard(self.console)


def _discard(stream) -> None:
    """Point a broken console's file descriptor at /dev/null, so that what it still buffers and Python's own flush
    at exit go nowhere instead of failing (exit code 120 and 'Exception ignored' lines)."""
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):
        return
    os.dup2(devnull, fd)
    os.close(devnull)


@contextlib.contextmanager
def _tee_console(log_path: Path):
    """Everything printed to stdout/stderr also goes to log_path (appended, so a resumed run keeps its history)."""
    log = open(log_path, "a", encoding="utf-8")
    saved = sys.stdout, sys.stderr
    log_state = {"gone": False}
    sys.stdout, sys.stderr = _Tee(saved[0], log, log_state), _Tee(saved[1], log, log_state)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        # A stream kept past the run (a logging handler made during it, Python's flush at exit) still writes: to
        # the console alone, as the log is detached before it is closed.
        log_state["gone"] = True
        with contextlib.suppress(OSError):  # what a full disk left in its buffer is lost, as the warning said
            log.close()


if __name__ == "__main__":
    sys.exit(main())
