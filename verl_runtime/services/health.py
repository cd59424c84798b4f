"""`python -m verl_runtime.services.health URL`: exit 0 when GET URL answers 200, else 1 (a container's
healthcheck; the runtime's own wait on a service asks the same)."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(0 if len(sys.argv) == 2 and healthy(sys.argv[1]) else 1)
