"""One program run in its confinement, as the sandbox (sandbox.py) answers a SandboxFusion `run_code` request: the
request in, SandboxFusion's reply out. The code is untrusted, so the child process is limited by the kernel, not by
the code's good will:
- no network: a network namespace of its own (only a loopback that is down), unless the server is started with
  --network-isolation external, which says the container it runs in has none (`docker run --network none`, a
  Kubernetes NetworkPolicy that denies egress);
- not root: a server running as root drops the child to nobody (65534), in a user namespace or by setuid;
- CPU time, address space (memory_limit_MB), wall time (run_timeout; the child's whole process group is killed),
  output (stdout and stderr are files limited by RLIMIT_FSIZE: a flood ends the child, what it wrote up to the limit
  is returned), processes, and a working directory of its own that is removed afterwards;
- an environment of its own: nothing of the server's (no tokens, no credentials) reaches the code;
- a lower CPU priority than the server's (Limits.nice, as the worker process that starts it: lower_priority), so
  that the server's event loop, which turns requests away and answers health checks, gets a core at once however
  many runs burn CPU: nice 10 where the sandbox has its CPU to itself (a container, a pod, a server of its own);
  nice 2 beside a trainer that shares its CPU (registry.NICE_BESIDE_TRAINER), where a run at nice 10 got a tenth of
  a core and the agentic quickstart's step took four times as long. The child stays in the server's session (a
  process group of its own, not a session): where the kernel groups CPU time by session (autogroup, on by default
  on Debian and Ubuntu hosts), a session of its own would give each run as much CPU as the server and all else.

Only the standard library: the sandbox's worker processes import this and nothing of the server's stack.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
# python: this Python in isolated mode (-I: no PYTHON* variables, no user site), with the packages it has (where
# the sandbox user cannot reach it, e.g. under a root-only home, the system's python3)
LANGUAGES = {"python": ("main.py", ("python", "-I", "main.py")), "bash": ("main.sh", ("bash", "main.sh"))}


@dataclass(frozen=True)
class Limits:
    """What one run may use; a request asks for its time and memory within the server's ceilings."""

    run_timeout_s: float = 10.0  # default wall time of a run
    max_run_timeout_s: float = 60.0
    memory_mb: int = 1024  # default address space (SandboxFusion's memory_limit_MB)
    max_memory_mb: int = 4096
    output_bytes: int = 64 * 1024  # per stream; also the largest file the code may write
    processes: int = 64  # threads and processes of the sandbox user (RLIMIT_NPROC)
    nice: int = 10  # the runs' CPU priority, and their worker processes': below the server's own


class SandboxError(ValueError):
    """A request the sandbox cannot run (SandboxFusion's "SandboxError" status), one line."""


# The confinement is a chain of util-linux's and coreutils' programs, each setting one thing and exec'ing the next
# (Debian's essential packages: in every image and on every host that runs this), not Python between fork and exec:
# preexec_fn is unsafe in a process with threads (the child may deadlock before exec: check_isolation runs in the
# server itself), and its fork holds the caller's GIL until the child execs.
def confinement(limits: Limits, run_timeout: float, memory_mb: int, isolation: str) -> list[str]:
    """The command words that put the program after them in its confinement: the kernel's limits (CPU time, address
    space, file size, processes, no core files), its own network (none), not root, a lower CPU priority."""
    as_root = os.geteuid() == 0
    cpu = math.ceil(run_timeout) + 1
    memory = memory_mb << 20
    words = ["prlimit", f"--cpu={cpu}:{cpu}", f"--as={memory}:{memory}",
             f"--fsize={limits.output_bytes}:{limits.output_bytes}", "--core=0:0"]
    if as_root:  # nobody's processes (as another user, a container's pids limit bounds them)
        words.append(f"--nproc={limits.processes}:{limits.processes}")
    words.append("--")
    if isolation == "namespace":  # a user namespace where the server is not root (nobody inside it)
        words += ["unshare", "--net", "--"] if as_root else ["unshare", "--user", "--net", "--"]
    if as_root:  # never run the code as root
        words += ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    return words + ["nice", "-n", str(max(0, limits.nice - os.nice(0))), "--"]  # from a worker already there


def lower_priority(nice: int) -> None:
    """A sandbox's worker process at its runs' priority: the server's event loop, which turns requests away and
    answers health checks, then wins a core against both."""
    if os.nice(0) < nice:
        os.nice(nice - os.nice(0))


def in_worker(request: dict, limits: Limits = Limits(), isolation: str = "namespace") -> dict:
    """run_code in a sandbox's worker process (one started after the server's own start, too: lower_priority)."""
    lower_priority(limits.nice)
    return run_code(request, limits, isolation)


def _number(request: dict, key: str, default: float, ceiling: float) -> float:
    value = request.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise SandboxError(f"{key} must be a positive number, got {value!r}")
    return min(float(value), ceiling)


def run_code(request: dict, limits: Limits = Limits(), isolation: str = "namespace") -> dict:
    """One SandboxFusion run_code request run to its end or its limits; the reply in SandboxFusion's shape."""
    try:
        language = request.get("language", "python")
        if language not in LANGUAGES:
            raise SandboxError(f"language {language!r} is not run here: {', '.join(LANGUAGES)}")
        code, stdin = request.get("code"), request.get("stdin") or ""
        if not isinstance(code, str) or not isinstance(stdin, str):
            raise SandboxError("code (and stdin, if given) must be strings")
        if request.get("files") or request.get("fetch_files"):
            raise SandboxError("files and fetch_files are not supported here: put the data in the code or stdin")
        run_timeout = _number(request, "run_timeout", limits.run_timeout_s, limits.max_run_timeout_s)
        memory_mb = int(_number(request, "memory_limit_MB", limits.memory_mb, limits.max_memory_mb))
    except SandboxError as exc:
        return reply("SandboxError", str(exc), None)
    workdir = Path(tempfile.mkdtemp(prefix="sandbox-"))
    try:
        return _run(code, stdin, language, run_timeout, memory_mb, limits, isolation, workdir)
    except (OSError, subprocess.SubprocessError) as exc:  # the child could not be confined: it never ran
        return reply("SandboxError", f"the run could not be started in its confinement: {exc}", None)
    except SandboxError as exc:
        return reply("SandboxError", str(exc), None)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _open_to_others(path: str) -> bool:
    """Whether a user with no rights of its own (nobody) may run the file: every folder on its way searchable."""
    real = Path(os.path.realpath(path))
    try:
        if not real.stat().st_mode & stat.S_IXOTH:
            return False
        return all(parent.stat().st_mode & stat.S_IXOTH for parent in real.parents)
    except OSError:
        return False


def _python() -> str:
    """The Python a run uses: this one, or where the sandbox drops to nobody and cannot reach it, the system's."""
    if os.geteuid() != 0 or _open_to_others(sys.executable):
        return sys.executable
    for candidate in ("/usr/local/bin/python3", "/usr/bin/python3"):
        if _open_to_others(candidate):
            return candidate
    raise SandboxError(f"no Python that the sandbox user (nobody) may run: {sys.executable} is under a folder "
                       "closed to others; install python3 in /usr/bin or run the sandbox as a user of its own")


def _run(code, stdin, language, run_timeout, memory_mb, limits, isolation, workdir: Path) -> dict:
    name, command = LANGUAGES[language]
    if command[0] == "python":
        command = (_python(), *command[1:])
    (workdir / name).write_text(code)
    (workdir / "stdin").write_text(stdin)
    if os.geteuid() == 0:  # the run's own folder, closed to everyone else
        os.chown(workdir, NOBODY, NOBODY)
    workdir.chmod(0o700)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(workdir), "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
    started = time.monotonic()
    with open(workdir / "stdin", "rb") as given, open(workdir / ".stdout", "wb+") as out, \
            open(workdir / ".stderr", "wb+") as err:
        # restore_signals: SIGXFSZ back to its default, so that a flood of output ends the child (Python ignores it)
        child = subprocess.Popen([*confinement(limits, run_timeout, memory_mb, isolation), *command], cwd=workdir,
                                 env=env, stdin=given, stdout=out, stderr=err, process_group=0, close_fds=True,
                                 restore_signals=True)
        try:
            returned = child.wait(timeout=run_timeout)
        except subprocess.TimeoutExpired:
            returned = None
        _kill_group(child.pid)  # what the code left behind (a background process) ends with it
        child.wait()
        elapsed = time.monotonic() - started
        flooded = max(os.fstat(out.fileno()).st_size, os.fstat(err.fileno()).st_size) >= limits.output_bytes
        out.seek(0)
        err.seek(0)
        stdout = out.read(limits.output_bytes).decode("utf-8", "replace")
        stderr = err.read(limits.output_bytes).decode("utf-8", "replace")
    if returned is None:
        return reply("Failed", "", _result("TimeLimitExceeded", elapsed, None, stdout, stderr))
    if flooded:
        stderr += f"\n[sandbox] output limit reached ({limits.output_bytes} bytes per stream): stopped"
    elif returned in (-signal.SIGXCPU, -signal.SIGKILL):
        stderr += "\n[sandbox] CPU time limit reached: killed"
    status = "Finished" if returned >= 0 else "Error"
    return reply("Success" if status == "Finished" and returned == 0 else "Failed", "",
                  _result(status, elapsed, returned, stdout, stderr))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _result(status: str, elapsed: float, code: int | None, stdout: str, stderr: str) -> dict:
    return {"status": status, "execution_time": round(elapsed, 3), "return_code": code, "stdout": stdout,
            "stderr": stderr}


def reply(status: str, message: str, run_result: dict | None) -> dict:
    return {"status": status, "message": message, "compile_result": None, "run_result": run_result,
            "executor_pod_name": None, "files": {}}


def kill(answer: dict) -> str | None:
    """Why the sandbox stopped a run (time, cpu, output), if it did: from its reply."""
    run = answer.get("run_result") or {}
    if run.get("status") == "TimeLimitExceeded":
        return "time"
    stderr = run.get("stderr") or ""
    if "[sandbox] output limit reached" in stderr:
        return "output"
    if "[sandbox] CPU time limit reached" in stderr:
        return "cpu"
    return None
