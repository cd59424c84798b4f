"""Calling a service as its tools do: a JSON POST that, when the service is full (503 or 429, serving.py) or refuses
the connection for a moment (a replica restarting), tries again after a backoff, within a deadline. The backoff is
exponential with full jitter (so a burst of turned-away calls does not come back at once), capped by the server's
Retry-After. Past the deadline the last error is raised; nothing is retried that may have run (a timeout, a reply)."""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from typing import Callable

RETRY_CODES = (429, 503)
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 2.0


class Busy(OSError):
    """The service stayed full (or unreachable) until the deadline."""


def backoff(attempt: int, retry_after: float | None) -> float:
    """Seconds to wait before try number attempt + 1 (attempt counts from 0)."""
    cap = min(MAX_BACKOFF_S, retry_after if retry_after else MAX_BACKOFF_S)
    return random.uniform(0, min(cap, FIRST_BACKOFF_S * 2 ** attempt))


def _retry_after(error: urllib.error.HTTPError) -> float | None:
    try:
        return float(error.headers.get("Retry-After"))
    except (TypeError, ValueError):
        return None


def _refused(error: urllib.error.URLError) -> bool:
    return isinstance(error.reason, (ConnectionRefusedError, ConnectionResetError))


def post_json(url: str, body: dict, timeout: float, within: float | None = None,
              on_busy: Callable[[float], None] | None = None) -> dict:
    """The service's JSON reply to a JSON POST. timeout: the longest one try may take; within: the seconds all tries
    may take (default: timeout). on_busy(seconds the refusal took) is called for each try the service turned away."""
    data = json.dumps(body).encode()
    deadline = time.monotonic() + (timeout if within is None else within)
    attempt = 0
    while True:
        started = time.monotonic()
        left = deadline - started
        if left <= 0:
            raise Busy(f"{url} was busy until the deadline ({attempt} tries)")
        request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=min(timeout, left)) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as error:
            if error.code not in RETRY_CODES:
                raise
            if on_busy is not None:
                on_busy(time.monotonic() - started)
            wait = backoff(attempt, _retry_after(error))
        except urllib.error.URLError as error:
            if not _refused(error):
                raise
            wait = backoff(attempt, None)
        if time.monotonic() + wait >= deadline:
            raise Busy(f"{url} was busy until the deadline ({attempt + 1} tries)")
        time.sleep(wait)
        attempt += 1
