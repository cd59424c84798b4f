"""What a build step is doing now, from its output lines: pip's download progress as package, size and speed.

pip runs in the build with PIP_PROGRESS_BAR=raw, so a download prints `Downloading NAME (SIZE)` and then
`Progress DONE of TOTAL` lines (four a second at most). A terminal shows `status` under the step bar; a log gets
`log_lines`: every line but the progress ones, and a progress line per download at most every LOG_EVERY_S.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

DOWNLOADING = re.compile(r"^\s*Downloading (\S+)(?: \(([^)]*)\))?")
PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")
LOG_EVERY_S = 15.0
SPEED_WINDOW_S = 3.0
QUIET_S = 30.0  # a plain log says what is still running after this long without a line


def megabytes(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 1e6 else f"{n / 1e3:,.0f} kB"


@dataclass
class StepStatus:
    """Folds one step's output lines into a one-line status."""

    clock: Callable[[], float] = time.monotonic
    status: str = ""
    package: str | None = None  # the file being downloaded, while its progress lines come
    samples: list[tuple[float, int]] = field(default_factory=list)
    last_logged: float = float("-inf")

    def feed(self, line: str) -> list[str]:
        """Take one output line; return what a plain log should print for it (maybe nothing)."""
        now = self.clock()
        if match := PROGRESS.match(line.strip()):
            done, total = int(match[1]), int(match[2])
            self.status = self._progress(now, done, total)
            finished = bool(total) and done >= total
            if finished:
                self.package = None  # later progress lines are pip's install progress
            if (finished and total > 1e6) or now - self.last_logged >= LOG_EVERY_S:
                self.last_logged = now
                return [self.status]
            return []
        if not line.strip():
            return []
        if match := DOWNLOADING.match(line):
            self.package, self.samples, self.last_logged = match[1], [], now
        self.status = line.strip()
        return [line.rstrip()]

    def _progress(self, now: float, done: int, total: int) -> str:
        """`torch-2.14.0-...whl: 312 MB of 915 MB, 41 MB/s` (pip's install progress counts packages instead)."""
        self.samples = [s for s in self.samples if now - s[0] <= SPEED_WINDOW_S] + [(now, done)]
        if self.package is None:
            return f"installing: {done} of {total} packages" if total else self.status
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        speed = f", {megabytes(int((b1 - b0) / (t1 - t0)))}/s" if t1 > t0 else ""
        size = f"{megabytes(done)} of {megabytes(total)}" if total else megabytes(done)
        return f"{self.package}: {size}{speed}"


class Heartbeat:
    """For a plain log: while a step prints nothing (pip unpacking GBs, a layer being copied), a line every
    QUIET_S saying which step is still running and for how long."""

    def __init__(
        self, say: Callable[[str], None], quiet_s: float = QUIET_S, clock: Callable[[], float] = time.monotonic
    ):
        self.say, self.quiet_s, self.clock = say, quiet_s, clock
        self.what, self.since, self.last = "", clock(), clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def beat(self, what: str | None = None) -> None:
        """Something was printed; `what`: the step now running, when it changed."""
        now = self.clock()
        if what is not None and what != self.what:
            self.what, self.since = what, now
        self.last = now

    def _run(self) -> None:
        while not self._stop.wait(min(self.quiet_s, 5.0)):
            now = self.clock()
            if self.what and now - self.last >= self.quiet_s:
                self.say(f"    … {self.what}: still running ({now - self.since:.0f} s)")
                self.last = now

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
