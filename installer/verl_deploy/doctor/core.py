"""What a check returns (findings), what it is given (the host's facts), and how checks are run."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal

from verl_deploy.host_facts import HostFacts

Status = Literal["ok", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail", "skip")

# Every probe runs under a timeout, so a hung daemon or an unreachable cluster cannot hang doctor.
PROBE_TIMEOUT_S = 5.0
BUG_REMEDY = "this is a bug in verl-deploy doctor; please report it with this output"


@dataclass(frozen=True)
class Finding:
    """One line of the report. `remedy` says what to do when the status is not ok."""

    area: str
    name: str
    status: Status
    message: str
    remedy: str | None = None
    node: str | None = None  # multi-node pre-flight: "rank 1 (host, address)", the node the finding is about

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")


@dataclass
class Context:
    """What the checks look at: the options given and the NVML reading taken once for all of them."""

    nvml: dict[str, Any]
    k8s: bool = False
    gpu_smoke: bool = False
    timeout_s: float = PROBE_TIMEOUT_S

    @property
    def facts(self) -> HostFacts:
        return HostFacts(self.nvml)

    @property
    def driver(self) -> str | None:
        return self.facts.driver

    @property
    def gpus(self) -> list[dict[str, Any]]:
        return self.facts.gpus

    @property
    def capabilities(self) -> list[str]:
        return self.facts.capabilities


Check = Callable[[Context], list[Finding]]


def run_checks(checks: dict[str, Check], ctx: Context, timeout_s: float) -> list[Finding]:
    """Run the area checks side by side, all within about `timeout_s` (each probe inside an area has its own,
    shorter timeout: this is the safety net); a crash or a timeout becomes a fail finding."""
    slots: dict[str, list[Finding]] = {}

    def run_one(area: str, check: Check) -> None:
        try:
            slots[area] = check(ctx)
        except Exception as exc:
            slots[area] = [Finding(area, "check", "fail", f"the {area} check failed: {exc}", BUG_REMEDY)]

    threads = {
        area: threading.Thread(target=run_one, args=(area, check), daemon=True) for area, check in checks.items()
    }
    deadline = time.monotonic() + timeout_s
    for thread in threads.values():
        thread.start()
    findings: list[Finding] = []
    for area, thread in threads.items():
        thread.join(max(0.0, deadline - time.monotonic()))
        if area in slots:
            findings.extend(slots[area])
        else:
            findings.append(
                Finding(area, "check", "fail", f"the {area} check gave no answer within {timeout_s:g} s",
                        "something it probes is hanging; rerun with that service fixed or stopped")
            )
    return findings


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception: client libraries wrap a refused connection in several layers."""
    seen = {id(exc)}
    while (inner := exc.__cause__ or exc.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        exc = inner
    return exc


def describe_error(exc: BaseException) -> str:
    """One short line for an error: 'connection refused' rather than three wrapped reprs."""
    exc = root_cause(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text or type(exc).__name__


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.status == "fail" for f in findings) else 0
