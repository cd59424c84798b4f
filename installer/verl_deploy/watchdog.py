"""A call that cannot hang its caller: a probe of a driver, a daemon or a cluster runs under a timeout."""

from __future__ import annotations

import threading
from typing import Any, Callable


def call_with_timeout(fn: Callable[[], Any], timeout_s: float) -> Any:
    """Run fn in a daemon thread; raise TimeoutError when it has not returned in time (the thread is left
    behind, and a daemon thread does not keep the process alive at exit)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    if "error" in result:
        raise result["error"]
    return result.get("value")
