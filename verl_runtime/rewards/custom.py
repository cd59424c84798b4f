"""Load a user's reward function from ``path/to/file.py:function_name``.

The function has verl's signature ``(data_source, solution_str, ground_truth, extra_info) -> float`` (or verl's
``{"score": float, ...}``). As in verl's ``custom_reward_function``, the name defaults to ``compute_score``. What it
raises or returns wrongly while training becomes one line naming the function and the sample's data source.
"""

import hashlib
import importlib.util
import numbers
import reprlib
import sys
import traceback
from pathlib import Path
from typing import Callable

from verl_runtime.errors import RewardFunctionError

DEFAULT_FUNCTION_NAME = "compute_score"


def parse_spec(spec: str) -> tuple[Path, str]:
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        path, name = spec, DEFAULT_FUNCTION_NAME
    if not path.endswith(".py"):
        raise RewardFunctionError(f"reward function '{spec}' must look like path/to/file.py:function_name")
    return Path(path), name or DEFAULT_FUNCTION_NAME


def load_custom_function(spec: str) -> Callable:
    path, name = parse_spec(spec)
    if not path.is_file():
        raise RewardFunctionError(f"reward function file {path} not found")
    module = _import_file(path.resolve())
    fn = getattr(module, name, None)
    if not callable(fn):
        defined = sorted(
            k for k, v in vars(module).items() if callable(v) and getattr(v, "__module__", None) == module.__name__
        )
        hint = f" (it defines: {', '.join(defined)})" if defined else ""
        raise RewardFunctionError(f"reward function file {path} has no function '{name}'{hint}")
    return fn


def _import_file(path: Path):
    module_name = "verl_runtime_reward_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    # Registered only while it runs (dataclasses and the like look themselves up there); afterwards the
    # functions carry their module's globals, and cloudpickle ships them by value to remote workers.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        where = f"{exc.filename or path}, line {exc.lineno}"
        raise RewardFunctionError(f"cannot load reward function: {where}: SyntaxError: {exc.msg}") from None
    except Exception as exc:
        raise RewardFunctionError(
            f"cannot load reward function: {_last_frame_in(path, exc)}: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        sys.modules.pop(module_name, None)
    return module


def _last_frame_in(path: Path, exc: BaseException) -> str:
    """'file, line N' of the innermost traceback frame inside the user's file."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    return f"{path}, line {frames[-1].lineno}" if frames else str(path)


# --- calling it ----------------------------------------------------------------------------------------------


def call_error(spec: str, exc: Exception, data_source) -> RewardFunctionError:
    """One line for an exception a user's reward function raised while scoring: where, what, on which sample."""
    path, name = parse_spec(spec)
    message = " ".join(str(exc).split())[:300]  # one line whatever the exception's text
    return RewardFunctionError(
        f"reward function {path}:{name} raised {type(exc).__name__}: {message} "
        f"({_last_frame_in(path.resolve(), exc)}) on a sample of data_source {data_source}"
    )


def checked_score(spec: str, value, data_source) -> float:
    """A user's reward function's result as a float: a number, or verl's dict with 'score'; else one line."""
    score = value.get("score") if isinstance(value, dict) else value
    if hasattr(score, "item") and getattr(score, "ndim", None) == 0:  # a 0-d tensor or NumPy array
        score = score.item()
    if isinstance(score, numbers.Real):
        return float(score)
    path, name = parse_spec(spec)
    shown = "None" if value is None else f"{reprlib.repr(value)} ({type(value).__name__})"
    raise RewardFunctionError(f"reward function {path}:{name} returned {shown} for a sample of data_source "
                              f"{data_source}: it must return a float (or a dict with 'score')")
