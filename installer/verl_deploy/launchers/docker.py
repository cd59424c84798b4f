"""JobSpec -> Docker containers, through the docker SDK. The dry run prints the `docker run` lines of the very
option dicts the launcher passes to `client.containers.create` (container_options -> docker_run_args).

The run directory is the run's memory: launch.json says what was launched and, once the trainer's container has
exited, how it ended; then the run's containers, network and secrets go. The engine is asked only for live state.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from verl_deploy import runs
from verl_deploy.launchers import preflight
from verl_deploy.launchers.jobspec import (
    DATA_DIR, DEFAULT_SHM, MANAGED_LABEL, RUN_ID_LABEL, RUNS_DIR, SECRETS_DIR, STOP_GRACE_S, JobSpec, LaunchError,
    launch_fault, pools_line,
)
from verl_deploy.sizes import docker_size
from verl_deploy.runs import RunStatus
from verl_runtime.rundir import TRAIN_LOG
from verl_runtime.services.registry import SERVICES, url_env

# NVIDIA's recommendation for PyTorch containers: pinned memory without limit, a 64 MB stack.
ULIMITS = {"memlock": (-1, -1), "stack": (67108864, 67108864)}
# The limit counts threads, not processes: torch starts one per core per pool, Ray a worker process per CPU plus
# its raylet/GCS threads, vLLM engine processes dozens each; on a 100+ core node that is thousands. 16384 leaves
# room for all of it and still stops a runaway fork loop long before it starves the host.
PIDS_LIMIT = 16384
# A read-only root: the trainer writes only to its mounts and to /tmp (HOME=/tmp). exec: Triton and inductor
# compile .so files there and dlopen them.
TMPFS = {"/tmp": "rw,exec,nosuid,nodev,mode=1777"}
CREATED_GRACE_S = 120  # a container still `created` after this was left by an interrupted launch, not starting
LIVE_STATES = ("running", "restarting", "paused")  # Docker's states of a container whose process has not ended

ROLE_LABEL = "verl-deploy.role"  # set by this launcher only: what it may record and remove (compose's are not)
TRAINER_ROLES = ("trainer", "ray-head")  # the container that trains; the others (ray-worker, service) serve it
RAY_PORT = 6379
# A service's container (config.services): its process and what it starts (the sandbox's runs, each limited by
# itself) need far fewer than a trainer; a fork bomb in untrusted code stops here.
SERVICE_PIDS_LIMIT = 512
HEALTH_INTERVAL_NS = 1_000_000_000


class LaunchInterrupted(LaunchError):
    """Ctrl-C before the run started; everything the launch had made is removed. The CLI exits with exit_code."""

    exit_code = 130


@dataclass(frozen=True)
class Plan:
    """One container of a run: the trainer, or for several nodes a Ray head (which runs the trainer) or worker."""

    name: str
    role: str  # trainer | ray-head | ray-worker | service
    command: list[str]
    shell: bool = False  # run `command` through /bin/sh -c instead of the image's entrypoint
    service: str | None = None  # a service's name (verl_runtime/services/registry.py)
    alias: str | None = None  # the address a service's replicas share on the services network


def network_name(spec: JobSpec) -> str:
    return f"{spec.run_id}-net"


def services_network(spec: JobSpec) -> str:
    """The run's services and its trainer meet on a network with no route out: untrusted code in the sandbox
    reaches nothing but them."""
    return f"{spec.run_id}-services"


def service_url(spec: JobSpec, service) -> str:
    return f"http://{spec.run_id}-{service.name}:{service.port}"  # a container's name resolves on its network


def plans(spec: JobSpec) -> list[Plan]:
    """Containers in start order: the run's services first (healthy before the trainer starts). Several nodes: a
    Ray head and workers on one network, the way a KubeRay RayJob runs; the trainer runs on the head and joins its
    cluster through RAY_ADDRESS."""
    services = [plan for service in spec.services for plan in _service_plans(spec, service)]
    return [*services, *_trainer_plans(spec)]


def _service_plans(spec: JobSpec, service) -> list[Plan]:
    """A service's containers: one named as its address, or its replicas (<name>-1, -2, ...) sharing that address
    as a network alias, which Docker's DNS answers with all of them."""
    address = f"{spec.run_id}-{service.name}"
    count = service.replicas(getattr(spec.loaded.services, service.name))
    if count == 1:
        return [Plan(address, "service", [], service=service.name)]
    return [Plan(f"{address}-{i}", "service", [], service=service.name, alias=address) for i in range(1, count + 1)]


def _trainer_plans(spec: JobSpec) -> list[Plan]:
    if spec.nodes == 1:
        return [Plan(spec.run_id, "trainer", list(spec.command.entry_args))]
    head = spec.run_id  # the head keeps the run's name: status, logs and stop follow it
    # Wait for the head, then serve it; `--block` returns once the head is gone, so workers end with the run.
    # Upstream verl's Ray processes start with the secret files loaded (secrets_loader), as its trainer does.
    join = (
        f"until ray health-check --address={head}:{RAY_PORT} 2>/dev/null; do sleep 1; done; "
        f"exec {shlex.join([*spec.command.secrets_loader, 'ray', 'start', f'--address={head}:{RAY_PORT}', '--block'])}"
    )
    workers = [Plan(f"{spec.run_id}-worker-{i}", "ray-worker", [join], shell=True) for i in range(1, spec.nodes)]
    train = shlex.join(spec.command.shell)
    checked = preflight.ray_step(spec)  # the pre-flight across the nodes, once the workers have joined
    start_head = (
        f"{shlex.join([*spec.command.secrets_loader, 'ray', 'start', '--head', f'--port={RAY_PORT}', '--disable-usage-stats'])} && "
        + (f"{checked} && " if checked else "") + f"exec env RAY_ADDRESS=127.0.0.1:{RAY_PORT} {train}"
    )
    return [*workers, Plan(head, "ray-head", [start_head], shell=True)]


# --- secrets: one file each, on the host outside the run directory, mounted read-only at SECRETS_DIR --------------

def secrets_dir(run_id: str, environ=None) -> Path:
    """Where a run's secret files live on the host: a pure function of the run id and the environment, so that the
    dry run shows the same mount. $XDG_RUNTIME_DIR is a per-user tmpfs (the values never reach a disk)."""
    environ = os.environ if environ is None else environ
    if environ.get("XDG_RUNTIME_DIR"):
        base = Path(environ["XDG_RUNTIME_DIR"])
    else:
        base = Path(environ.get("HOME") or Path.home()) / ".cache"
    return base / "verl-deploy" / "secrets" / run_id


def _container_ids(spec: JobSpec) -> tuple[int, int]:
    uid, gid = (int(part) for part in spec.user.split(":"))
    return uid, gid


def write_secrets(spec: JobSpec, environ=None) -> Path | None:
    """One 0600 file per secret of the caller's environment, in a 0700 directory the container's user owns."""
    if not spec.secrets:
        return None
    environ = os.environ if environ is None else environ
    directory = secrets_dir(spec.run_id, environ)
    shutil.rmtree(directory, ignore_errors=True)  # no stale value from an earlier launch
    directory.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(directory.parent, 0o700)  # the caller's alone (the container sees only its own directory)
    directory.mkdir(mode=0o700)
    owner = _container_ids(spec) if os.getuid() == 0 else None  # a non-root caller is the container's user
    for name in spec.secrets:
        if name not in environ:
            continue
        path = directory / name
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
            handle.write(environ[name])
        if owner:
            os.chown(path, *owner)
    if owner:
        os.chown(directory, *owner)
    return directory


def _remove_secrets(directories) -> None:
    for directory in directories:
        # Only a directory of ours: a mount source comes from the engine, never rmtree something else.
        if Path(directory).parent.name == "secrets" and Path(directory).parent.parent.name == "verl-deploy":
            shutil.rmtree(directory, ignore_errors=True)


# --- the options: one dict per container, the SDK's keywords; the dry run translates it -------------------------

def container_options(spec: JobSpec, plan: Plan | None = None, environ=None) -> dict:
    """Keyword arguments for `client.containers.create`, the single description of a container: launch() creates
    it, docker_run_args() prints it. No secret values: those are files (see secrets_dir)."""
    from docker.types import DeviceRequest, Mount, Ulimit

    plan = plan or plans(spec)[-1]
    if plan.role == "service":
        return service_options(spec, plan)
    mounts = [Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in spec.mounts]
    if spec.secrets:
        mounts.append(Mount(SECRETS_DIR, str(secrets_dir(spec.run_id, environ)), type="bind", read_only=True))
    tmpfs = dict(TMPFS)
    if spec.hf_cache is None:  # no host cache: a scratch one, as the root file system is read-only
        tmpfs[spec.container_env["HF_HOME"]] = TMPFS["/tmp"]
    options: dict = {
        "name": plan.name,
        "init": True,  # tini as PID 1 forwards SIGTERM to the trainer and reaps Ray's children
        "labels": {**spec.labels, ROLE_LABEL: plan.role},
        "user": spec.user,  # never root
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": PIDS_LIMIT,
        "read_only": True,
        "tmpfs": tmpfs,
        "ulimits": [Ulimit(name=name, soft=soft, hard=hard) for name, (soft, hard) in ULIMITS.items()],
    }
    if spec.nodes > 1:
        options["network"] = network_name(spec)
    if spec.gpus.wanted:
        if spec.gpus.device_ids and spec.rollout_gpus:
            raise LaunchError(f"--gpus {spec.gpus} with trainer.mode=separate_async: give a count (--gpus N, the "
                              f"trainer's; the rollout's {spec.rollout_gpus} come beside them)")
        if spec.gpus.device_ids:
            request = DeviceRequest(device_ids=list(spec.gpus.device_ids), capabilities=[["gpu"]])
        elif spec.rollout_gpus and plan.role in ("trainer", "ray-head"):  # the rollout's pool beside the trainer's
            request = DeviceRequest(count=spec.gpus_of("trainer"), capabilities=[["gpu"]])
        else:
            request = DeviceRequest(count=spec.gpus.count, capabilities=[["gpu"]])
        options["device_requests"] = [request]
    if spec.ipc_host:
        options["ipc_mode"] = "host"
    else:
        options["shm_size"] = docker_size(spec.shm_size or DEFAULT_SHM)
    if spec.cpus:
        options["nano_cpus"] = int(spec.cpus * 1e9)
    if spec.memory:
        options["mem_limit"] = docker_size(spec.memory)
        options["memswap_limit"] = docker_size(spec.memory)  # no swap: a run out of memory is OOMKilled, not slowed to a crawl
    options["mounts"] = mounts
    options["environment"] = {**spec.container_env, **{url_env(service.name): service_url(spec, service)
                                                       for service in spec.services}}
    if spec.services and plan.role in TRAINER_ROLES:
        options["networks"] = [services_network(spec)]  # joined after create, before start (one network at create)
    if spec.working_dir:
        options["working_dir"] = spec.working_dir
    if plan.shell:
        options["entrypoint"] = ["/bin/sh", "-c"]
    options["image"] = spec.image
    options["command"] = plan.command
    return options


def service_options(spec: JobSpec, plan: Plan) -> dict:
    """A service's container: the run's image (or services.image), hardened as the trainer's, on the services
    network only, with nothing of the run's environment (no tokens reach untrusted code) and the data directory
    read-only (a retriever's corpus); its health is Docker's healthcheck on the service's /health."""
    from docker.types import Mount

    service = SERVICES[plan.service]
    settings = getattr(spec.loaded.services, service.name)
    mounts = [Mount(DATA_DIR, str(spec.data_dir), type="bind", read_only=True)] if spec.data_dir else []
    return {
        "name": plan.name,
        "init": True,
        "labels": {**spec.labels, ROLE_LABEL: plan.role},
        "user": spec.user,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": SERVICE_PIDS_LIMIT,
        "read_only": True,
        "tmpfs": dict(TMPFS),
        "network": services_network(spec),
        **({"networking_config": {services_network(spec): {"Aliases": [plan.alias]}}} if plan.alias else {}),
        "mounts": mounts,
        "environment": {"HOME": "/tmp", "PYTHONUNBUFFERED": "1"},
        "healthcheck": {"test": ["CMD", *service.probe()], "interval": HEALTH_INTERVAL_NS,
                        "timeout": 3 * HEALTH_INTERVAL_NS, "retries": 3},
        "entrypoint": ["python"],
        "image": spec.service_image,
        "command": service.args(settings, service.port, host="0.0.0.0", in_container=True),
    }


def without_ulimits(options: dict) -> dict:
    """The options for an engine that cannot raise memlock/stack (rootless, nested): its own limits."""
    return {key: value for key, value in options.items() if key != "ulimits"}


def _gpus_flag(requests) -> list[str]:
    request = requests[0]
    if request["DeviceIDs"]:
        value = "device=" + ",".join(request["DeviceIDs"])
        return ["--gpus", f'"{value}"' if "," in value else value]  # docker's own quoting of a list
    return ["--gpus", "all" if request["Count"] < 0 else str(request["Count"])]


def _ulimit(limit) -> str:
    soft, hard = limit["Soft"], limit["Hard"]
    return f"{limit['Name']}={soft}" if soft == hard else f"{limit['Name']}={soft}:{hard}"


def _volume(mount) -> str:
    return f"{mount['Source']}:{mount['Target']}" + (":ro" if mount["ReadOnly"] else "")


def _each(flag: str, values) -> list[str]:
    return [part for value in values for part in (flag, value)]


# container_options key -> its `docker run` flags. A key missing here fails the dry run (KeyError), so the
# printed line cannot silently drift from what launch() creates.
RUN_FLAGS = {
    "name": lambda v: ["--name", v],
    "init": lambda v: ["--init"] if v else [],
    "labels": lambda v: _each("--label", [f"{key}={value}" for key, value in v.items()]),
    "user": lambda v: ["--user", v],
    "cap_drop": lambda v: _each("--cap-drop", v),
    "security_opt": lambda v: _each("--security-opt", v),
    "pids_limit": lambda v: ["--pids-limit", str(v)],
    "read_only": lambda v: ["--read-only"] if v else [],
    "tmpfs": lambda v: _each("--tmpfs", [f"{path}:{opts}" for path, opts in v.items()]),
    "ulimits": lambda v: _each("--ulimit", [_ulimit(limit) for limit in v]),
    "network": lambda v: ["--network", v],
    "networking_config": lambda v: _each("--network-alias", [alias for end in v.values() for alias in end["Aliases"]]),
    "network_mode": lambda v: ["--network", v],  # none: `export`'s container
    "device_requests": _gpus_flag,
    "ipc_mode": lambda v: ["--ipc", v],
    "shm_size": lambda v: ["--shm-size", v],
    "nano_cpus": lambda v: ["--cpus", f"{v / 1e9:g}"],
    "mem_limit": lambda v: ["--memory", v],
    "memswap_limit": lambda v: ["--memory-swap", v],
    "mounts": lambda v: _each("-v", [_volume(mount) for mount in v]),
    "environment": lambda v: _each("-e", [f"{key}={value}" for key, value in v.items()]),
    "working_dir": lambda v: ["--workdir", v],
    "entrypoint": lambda v: ["--entrypoint", v[0]],  # the rest of it goes after the image (below)
    "healthcheck": lambda v: ["--health-cmd", shlex.join(v["test"][1:]), "--health-interval", f"{v['interval'] // 10**9}s",
                              "--health-timeout", f"{v['timeout'] // 10**9}s", "--health-retries", str(v["retries"])],
}


def docker_run_args(options: dict, detach: bool = False, verb: str = "run") -> list[str]:
    """The `docker run` command line of container_options(...) (`docker create`: verb)."""
    args = ["docker", verb] + (["--detach"] if detach else [])
    for key, value in options.items():
        if key not in ("image", "command", "networks"):
            args += RUN_FLAGS[key](value)
    return args + [options["image"], *options.get("entrypoint", [])[1:], *options["command"]]


def docker_lines(options: dict, detach: bool = False) -> list[str]:
    """The command lines that make and start one container: `docker run`, or for a container on a second network
    (options["networks"]: a trainer with services) create, connect, start, as launch() does it."""
    if not options.get("networks"):
        return [shlex.join(docker_run_args(options, detach))]
    name = options["name"]
    return [shlex.join(docker_run_args(options, verb="create")),
            *(shlex.join(["docker", "network", "connect", network, name]) for network in options["networks"]),
            shlex.join(["docker", "start"] + ([] if detach else ["--attach"]) + [name])]


def run_options(spec: JobSpec) -> list[dict]:
    """container_options for every container of the run, in start order."""
    return [container_options(spec, plan) for plan in plans(spec)]


# --- the engine -----------------------------------------------------------------------------------------------

def _connect():
    import docker

    engine = docker.from_env(timeout=30)
    engine.ping()
    return engine


def client():
    """A docker SDK client, or a one-line LaunchError when no engine answers."""
    try:
        return _connect()
    except Exception as exc:  # any failure means: no usable engine
        raise LaunchError(
            f"no Docker engine reachable ({type(exc).__name__}): start dockerd or set DOCKER_HOST; "
            "`verl-deploy doctor` checks it"
        ) from None


REMOVAL_WAIT_S = 60  # a container the engine is already removing: how long to wait for it to be gone


def discard(thing) -> None:
    """Remove a container (forced) or a network. One already gone (404), or whose removal something else started
    (409 "removal ... is already in progress": a `docker rm`, a `runs rm`, the engine), is what was asked: not an
    error. Such a container is waited for, so that the network it sat on can go after it. The one place the
    launchers, `export` and the config check remove what they made."""
    import docker.errors
    from docker.models.containers import Container

    try:
        thing.remove(force=True) if isinstance(thing, Container) else thing.remove()
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        if exc.status_code != 409 or "in progress" not in str(exc.explanation or exc):
            raise
        with contextlib.suppress(Exception):  # gone meanwhile (404), or the engine slow: nothing more to do
            thing.wait(condition="removed", timeout=REMOVAL_WAIT_S)


def ensure_image(engine, image: str) -> None:
    """The image exists locally, or is pulled; otherwise say how to get one."""
    import docker.errors

    try:
        engine.images.get(image)
        return
    except docker.errors.ImageNotFound:
        pass
    try:
        engine.images.pull(image)
    except docker.errors.APIError as exc:
        reason = (exc.explanation or str(exc)).splitlines()[0][:200]
        raise LaunchError(
            f"image {image!r} is not here and cannot be pulled ({reason}): "
            "build one with `verl-deploy images build` or pass --image"
        ) from None


def with_service_image(engine, spec: JobSpec) -> JobSpec:
    """The spec with an image for its services that this engine has: services.image (pulled, or LaunchError as for
    the run's), else the services image (here, pulled, or built: it is small), else the run's own, said so."""
    from dataclasses import replace

    from verl_deploy import images

    if spec.service_image_given or spec.service_image == spec.image:
        ensure_image(engine, spec.service_image)
        return spec
    try:
        ensure_image(engine, spec.service_image)
        return spec
    except LaunchError:
        pass
    if spec.service_image == images.image_tag(images.SERVICES):  # ours, of this version: build it
        try:
            images.ensure(images.SERVICES)
            return spec
        except Exception as exc:  # noqa: BLE001 - any failure to build leaves the run's image, which works too
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    else:
        why = "not here and not pulled"
    print(f"note: the services image {spec.service_image} could not be had ({why}): the services run the run's "
          f"image {spec.image}", file=sys.stderr)
    return replace(spec, services_image=spec.image)


def _gpu_error(exc) -> bool:
    text = str(getattr(exc, "explanation", "") or exc)
    return "capabilities: [[gpu]]" in text or "nvidia-container" in text


def _start_error(spec: JobSpec, exc) -> LaunchError:
    if spec.gpus.wanted and _gpu_error(exc):
        return LaunchError(
            "Docker on this host has no GPU support (NVIDIA container toolkit not set up): install "
            "nvidia-container-toolkit and restart dockerd, or run without --gpus"
        )
    return LaunchError(f"container did not start: {(exc.explanation or str(exc)).splitlines()[0]}")


# --- run directory ownership: the container's user while it runs, the caller's once it ended ---------------------

def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.lchown(root, uid, gid)
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lchown(os.path.join(parent, name), uid, gid)


def _prepare_run_dir(spec: JobSpec) -> None:
    """Create the host directories before Docker would (as root). A root caller hands the run directory to the
    container's non-root user, a resumed one too (it was handed back when the last launch ended); an existing
    cache is left as it is."""
    root_caller = os.getuid() == 0
    if root_caller and spec.run_dir.exists():
        _chown_tree(spec.run_dir, *_container_ids(spec))
    for directory in (spec.run_dir, spec.hf_cache):
        if directory is None or directory.exists():
            continue
        directory.mkdir(parents=True)
        if root_caller:
            os.chown(directory, *_container_ids(spec))


def _give_back(run_dir: Path) -> None:
    """The run directory back to whoever launched the run (recorded as owner), when we may chown."""
    launch = runs.read_launch(run_dir)
    owner = launch and launch.owner
    if os.getuid() != 0 or not owner or not run_dir.is_dir():
        return
    uid, gid = (int(part) for part in owner.split(":"))
    _chown_tree(run_dir, uid, gid)


def _ending(state: dict, memory: str | None) -> str:
    """Why a container ended, when Docker knows more than the exit code."""
    if state.get("OOMKilled"):
        now = f"now {memory}" if memory else "no --memory limit: the host ran short"
        return f"out of memory (OOMKilled): raise --memory ({now})"
    return (state.get("Error") or "")[:200]


def _reloaded(container) -> bool:
    """The container's state brought up to date; False where it is gone."""
    import docker.errors

    try:
        container.reload()
    except docker.errors.NotFound:
        return False
    return True


def _exit_code(container, run_dir: Path) -> int:
    """How the container ended: the engine's word, or, where another command (status, runs, stop) recorded its end
    and removed it first, that record's."""
    import docker.errors

    try:
        return int(container.wait()["StatusCode"])
    except docker.errors.NotFound:
        code = runs.read_record(run_dir).get("exit_code")
        if code is None:
            print(f"warning: {container.name} was removed before its end was recorded (a `docker rm` from outside?)",
                  file=sys.stderr)
            return 1
        return int(code)


def _keep_console(run_dir: Path, container) -> bool:
    """The trainer's console as the run's train.log, where the trainer kept none (upstream verl does not tee it as
    our runtime does), so that `logs` has it once the container is gone: written whole, then renamed. False (and a
    warning) when it cannot be written: the container, which still has it, is kept."""
    import docker.errors

    tmp = run_dir / f".{TRAIN_LOG}.{os.getpid()}.tmp"
    try:
        tmp.write_bytes(container.logs())
        os.replace(tmp, run_dir / TRAIN_LOG)
    except docker.errors.NotFound:  # another command's finish removed it, having kept its console first
        return True
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        print(f"warning: cannot keep the console of {container.name} in {run_dir} ({exc.strerror}): "
              "its containers are kept", file=sys.stderr)
        return False
    return True


def wait_healthy(containers: list, timeout: float) -> None:
    """Until Docker's healthcheck says each service container is healthy; LaunchError (one line, with its log's
    last line) for one that exits or is not healthy in time."""
    import time

    deadline = time.monotonic() + timeout
    for container in containers:
        while True:
            container.reload()
            health = (container.attrs["State"].get("Health") or {}).get("Status")
            if health == "healthy":
                break
            if container.status in ("exited", "dead") or health == "unhealthy" or time.monotonic() > deadline:
                lines = container.logs(tail=5).decode(errors="replace").strip().splitlines() or ["(no log)"]
                why = (f"exited with code {container.attrs['State'].get('ExitCode')}" if container.status in ("exited", "dead")
                       else f"did not become healthy in {timeout:g} s (services.health_timeout)")
                raise LaunchError(f"service container {container.name} {why}: {lines[-1]}")
            time.sleep(0.5)


def _age_s(container) -> float:
    """Seconds since the container was created (the engine says when, in UTC, to the nanosecond)."""
    created = datetime.strptime(container.attrs["Created"][:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - created).total_seconds()


class DockerLauncher:
    target = "docker"

    def __init__(self, runs_root: Path, engine=None):
        self.runs_root = Path(runs_root)
        self._engine = engine  # a docker client; None: connect on first use
        self._warned = False

    # --- the engine, asked once per command --------------------------------------------------------------------

    def engine(self):
        if self._engine is None:
            self._engine = client()
        return self._engine

    def _live_engine(self, quiet: bool = False):
        """The engine, or None when it does not answer (said once, unless quiet: a run this root has no record of
        is then said not to exist, in one line): status and runs then show the record."""
        if self._engine is None and not self._warned:
            try:
                self._engine = _connect()
            except Exception as exc:  # any failure means: no usable engine
                self._warned = True
                if not quiet:
                    print(f"warning: Docker engine not reachable ({type(exc).__name__}): docker runs shown as last "
                          "recorded", file=sys.stderr)
        return self._engine

    def _not_found(self, run_id: str) -> LaunchError:
        """A run neither recorded under the runs root as a Docker run nor with a container on this engine."""
        beside = ", nor a container of it on this Docker engine" if self._engine is not None else ""
        return LaunchError(runs.not_found(run_id, self.runs_root, self.target, beside))

    def _run_containers(self, engine, run_id: str) -> list:
        """The containers this launcher made for the run (compose's carry the run-id label too: never touched)."""
        return engine.containers.list(all=True, filters={"label": [f"{RUN_ID_LABEL}={run_id}", ROLE_LABEL]},
                                      ignore_removed=True)  # one another command removes meanwhile is not an error

    def _trainer(self, engine, run_id: str):
        """The run's trainer container (for several nodes: the Ray head, which runs the trainer), or None."""
        found = [c for c in self._run_containers(engine, run_id) if c.labels.get(ROLE_LABEL) in TRAINER_ROLES]
        return found[0] if found else None

    def _run_dir(self, run_id: str, container=None) -> Path:
        """The host run directory: the one the container mounts, else the one under the runs root."""
        for mount in (container.attrs.get("Mounts", []) if container is not None else []):
            if mount["Destination"] == f"{RUNS_DIR}/{run_id}":
                return Path(mount["Source"])
        return self.runs_root / run_id

    def _recorded(self, run_id: str) -> bool:
        return runs.target_of(self.runs_root / run_id) == self.target

    # --- launch ------------------------------------------------------------------------------------------------

    def dry_run(self, spec: JobSpec) -> str:
        lines = [line for options in run_options(spec)
                 for line in docker_lines(options, detach=options["labels"][ROLE_LABEL] not in TRAINER_ROLES)]
        if pools := pools_line(spec):
            lines.insert(0, f"# {pools}")
        if spec.services:
            lines.insert(0, shlex.join(["docker", "network", "create", "--internal", services_network(spec)]))
        if spec.nodes > 1:
            lines.insert(0, shlex.join(["docker", "network", "create", network_name(spec)]))
        return "\n".join(lines)

    def launch(self, spec: JobSpec, detach: bool = False) -> int:
        import docker.errors

        if busy := runs.in_use(spec.run_id, spec.run_dir):  # a local trainer, or one in a container we do not label
            raise LaunchError(busy)
        fresh = not spec.run_dir.exists()
        previous = None  # the record before this launch changed it (a resumed run)
        try:
            engine = self.engine()
            ensure_image(engine, spec.image)
            if spec.services:
                spec = with_service_image(engine, spec)
            self._clear_finished(engine, spec.run_id)  # --resume starts new containers on the same run dir
            previous = runs.read_record(spec.run_dir)
            _prepare_run_dir(spec)
            runs.record_launch(
                spec.run_dir, spec.launch(self.target, command=tuple(spec.command.shell)),
                memory=docker_size(spec.memory) if spec.memory else None,
                exit_code=None, detail="", finished_at=None, stop_asked_at=None,
            )
            write_secrets(spec)
            container = self._start(engine, spec)
        except KeyboardInterrupt:
            self._abandon(spec, fresh, previous)
            raise LaunchInterrupted("interrupted before the run started: nothing was left behind") from None
        except docker.errors.APIError as exc:
            self._abandon(spec, fresh, previous)
            raise _start_error(spec, exc) from None
        except LaunchError:  # a service that did not become healthy
            self._abandon(spec, fresh, previous)
            raise
        except OSError as exc:  # the host's runs directory: read-only, not ours, or a full disk
            self._abandon(spec, fresh, previous)
            raise launch_fault(exc, spec.run_dir) from None
        if detach:
            return 0  # status, runs, stop or the next launch record its end once the container has exited
        code = self._follow(container, spec.run_dir)  # the last one started: the trainer (or the Ray head running it)
        self._stop_workers(engine, spec.run_id)
        if not _reloaded(container):  # another command (status, runs, stop) recorded its end and removed it first
            return code
        self._finish(engine, spec.run_id, container)
        if container.attrs["State"].get("OOMKilled"):
            limit = f"--memory {docker_size(spec.memory)}" if spec.memory else "no --memory limit"
            print(f"run {spec.run_id} was killed for lack of memory (OOMKilled, {limit}): raise --memory",
                  file=sys.stderr)
        return code

    def _start(self, engine, spec: JobSpec):
        """Create and start the run's containers in order; the last one is the trainer."""
        import docker.errors

        options = run_options(spec)
        try:
            return self._create_and_start(engine, spec, options)
        except docker.errors.APIError as exc:
            if "rlimit" not in str(exc):
                raise
            print("warning: this Docker engine cannot raise the memlock/stack ulimits; using its defaults",
                  file=sys.stderr)
            self._remove_containers(engine, spec.run_id)
            return self._create_and_start(engine, spec, [without_ulimits(o) for o in options])

    def _create_and_start(self, engine, spec: JobSpec, options: list[dict]):
        if spec.nodes > 1:
            engine.networks.create(network_name(spec), driver="bridge", labels=dict(spec.labels))
        if spec.services:
            engine.networks.create(services_network(spec), driver="bridge", internal=True, labels=dict(spec.labels))
        services = []
        for one in options:
            if one["labels"][ROLE_LABEL] in TRAINER_ROLES and services:
                wait_healthy(services, spec.loaded.services.health_timeout)
            container = engine.containers.create(**{key: value for key, value in one.items() if key != "networks"})
            for network in one.get("networks", ()):
                engine.networks.get(network).connect(container)
            container.start()
            if one["labels"][ROLE_LABEL] == "service":
                services.append(container)
        return container

    def _abandon(self, spec: JobSpec, fresh: bool, previous: dict | None) -> None:
        """Undo a launch that did not start: its containers, network and secrets; a fresh run directory, or the
        earlier record of a resumed one (handed back to its owner)."""
        if self._engine is not None:
            self._remove_all(self._engine, spec.run_id)
        _remove_secrets([secrets_dir(spec.run_id)])
        if fresh:
            shutil.rmtree(spec.run_dir, ignore_errors=True)
            return
        if previous:
            with contextlib.suppress(OSError):  # the disk that refused this launch's record kept the old one
                runs.write_record(spec.run_dir, previous)
        with contextlib.suppress(OSError):
            _give_back(spec.run_dir)

    def _clear_finished(self, engine, run_id: str) -> None:
        # The trainer decides: a detached run's services (and Ray workers) outlive it until its end is recorded.
        trainer = self._trainer(engine, run_id)
        if trainer is not None and trainer.status in LIVE_STATES:
            raise LaunchError(f"run {run_id} is still running: `verl-deploy stop {run_id}` first")
        if trainer is not None and trainer.status in ("exited", "dead"):
            self._finish(engine, run_id, trainer)  # a detached run's end, kept before its container goes
        self._remove_all(engine, run_id)

    def _finish(self, engine, run_id: str, container) -> bool:
        """Record how the trainer's container ended, then remove the run's containers, network and secrets and
        hand the run directory back to its owner. A record we cannot write keeps the containers (and the truth):
        False."""
        run_dir = self._run_dir(run_id, container)
        state = container.attrs["State"]
        try:
            runs.record_finished(run_dir, state.get("ExitCode"), _ending(state, runs.read_record(run_dir).get("memory")))
        except OSError as exc:
            print(f"warning: cannot record the end of run {run_id} in {run_dir} ({exc.strerror}): "
                  "its containers are kept", file=sys.stderr)
            return False
        if not (run_dir / TRAIN_LOG).exists() and not _keep_console(run_dir, container):
            return False
        self._remove_all(engine, run_id)
        _give_back(run_dir)
        return True

    def _remove_containers(self, engine, run_id: str) -> list[str]:
        """Remove the run's containers and network; the secrets directories they mounted."""
        import docker.errors

        mounted = []
        for container in self._run_containers(engine, run_id):
            mounted += [m["Source"] for m in container.attrs.get("Mounts", []) if m["Destination"] == SECRETS_DIR]
            discard(container)
        for network in self._run_networks(engine, run_id):
            try:
                discard(network)
            except docker.errors.APIError:
                pass  # still in use by something else: leave it
        return mounted

    def _run_networks(self, engine, run_id: str) -> list:
        """The network a run of several nodes made (compose's are not labelled managed: never touched)."""
        return engine.networks.list(filters={"label": [f"{RUN_ID_LABEL}={run_id}", f"{MANAGED_LABEL}=true"]})

    def _remove_all(self, engine, run_id: str) -> None:
        mounted = self._remove_containers(engine, run_id)
        _remove_secrets({*mounted, str(secrets_dir(run_id))})

    def _follow(self, container, run_dir: Path) -> int:
        """Stream the logs until the container ends; its exit code. Ctrl-C sends SIGTERM (the runtime checkpoints,
        we keep streaming); a second Ctrl-C stops it for good."""
        interrupts = 0

        def on_sigint(signum, frame):
            nonlocal interrupts
            interrupts += 1
            if interrupts == 1:
                print("\nstopping: SIGTERM sent, the run writes a checkpoint (Ctrl-C again to kill)", file=sys.stderr)
                container.kill(signal="SIGTERM")
            else:
                container.kill()

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            for chunk in container.logs(stream=True, follow=True):
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            return _exit_code(container, run_dir)
        finally:
            signal.signal(signal.SIGINT, previous)

    # --- status, runs: the run directory, with the engine for what is live ----------------------------------------

    def _observe(self, engine, run_id: str, container) -> RunStatus:
        """A run whose trainer container exists: the engine's state wins over the record."""
        run_dir = self._run_dir(run_id, container)
        if container.status in LIVE_STATES:
            return runs.run_status(run_dir, self.target, "running", exit_code=None, detail="")
        if container.status == "created":
            if _age_s(container) < CREATED_GRACE_S:
                return runs.run_status(run_dir, self.target, "pending", exit_code=None, detail="")
            return runs.run_status(run_dir, self.target, "failed", exit_code=None,
                                   detail="its container was created but never started (an interrupted launch): "
                                          f"`verl-deploy run --resume {run_id}` starts it again")
        if not self._finish(engine, run_id, container):  # exited or dead, but not recorded: what the engine says
            state = container.attrs["State"]
            code = state.get("ExitCode")
            return runs.run_status(run_dir, self.target, runs.state_of(code), exit_code=code, detail=_ending(state, None))
        return self._from_record(run_dir)

    def _from_record(self, run_dir: Path, unreachable: bool = False) -> RunStatus:
        """A run as its run directory recorded it (no container, or no engine to ask)."""
        record = runs.read_record(run_dir)
        ended = bool(record.get("finished_at"))
        if unreachable:
            last = runs.state_of(record.get("exit_code")) if ended else "not recorded as ended"
            return runs.run_status(run_dir, self.target, "unknown",
                                   detail=f"the Docker engine is unreachable; last recorded: {last}")
        if not ended:
            return runs.run_status(run_dir, self.target, "unknown", detail="its container is gone and how it ended "
                                   "was not recorded (removed outside verl-deploy?)")
        return runs.run_status(run_dir, self.target,
                               runs.state_of(record.get("exit_code"), bool(record.get("stop_asked_at"))))

    def status(self, run_id: str) -> RunStatus:
        recorded = self._recorded(run_id)
        engine = self._live_engine(quiet=not recorded)
        container = self._trainer(engine, run_id) if engine is not None else None
        if container is not None:
            return self._observe(engine, run_id, container)
        if not recorded:
            raise self._not_found(run_id)
        return self._from_record(self.runs_root / run_id, unreachable=engine is None)

    def list(self) -> list[RunStatus]:
        recorded = runs.local_run_ids(self.runs_root, self.target)
        engine = self._live_engine()
        if engine is None:
            return [self._from_record(self.runs_root / run_id, unreachable=True) for run_id in recorded]
        ours = engine.containers.list(all=True, filters={"label": [RUN_ID_LABEL, ROLE_LABEL]}, ignore_removed=True)
        trainers = {c.labels[RUN_ID_LABEL]: c for c in ours if c.labels[ROLE_LABEL] in TRAINER_ROLES}
        found = [self._observe(engine, run_id, trainers.pop(run_id)) if run_id in trainers
                 else self._from_record(self.runs_root / run_id) for run_id in recorded]
        # Runs with a run directory elsewhere (another --runs-dir) are still live here.
        return found + [self._observe(engine, run_id, container) for run_id, container in trainers.items()]

    # --- logs, stop ----------------------------------------------------------------------------------------------

    def logs(self, run_id: str, follow: bool = False) -> Iterator[str]:
        recorded = self._recorded(run_id)
        engine = self._live_engine(quiet=not recorded)
        container = self._trainer(engine, run_id) if engine is not None else None
        if container is None:  # removed once it ended: the runtime's own copy of its console
            path = self.runs_root / run_id / TRAIN_LOG
            if not recorded:
                raise self._not_found(run_id)
            if not path.is_file():
                raise LaunchError(f"no Docker container and no {TRAIN_LOG} for run {run_id!r}: "
                                  "`verl-deploy runs` lists the runs")
            yield path.read_text(errors="replace")
            return
        if not follow:
            yield container.logs().decode(errors="replace")
            return
        for chunk in container.logs(stream=True, follow=True):
            yield chunk.decode(errors="replace")

    def stop(self, run_id: str) -> str | None:
        """SIGTERM to the trainer first (it checkpoints), then to any Ray workers; then record how it ended."""
        import docker.errors

        if not self._recorded(run_id):  # a container of a run kept under another runs root, or nothing
            engine = self._live_engine(quiet=True)
            if engine is None or self._trainer(engine, run_id) is None:
                raise self._not_found(run_id)
        engine = self.engine()
        container = self._trainer(engine, run_id)
        if container is None:
            ended = self._from_record(self.runs_root / run_id)
            return f"run {run_id} is not running ({ended.state}): nothing to stop"
        if container.status == "running":
            try:
                runs.note_stop(self._run_dir(run_id, container))
            except OSError:
                pass  # the stop matters more than its note
            with contextlib.suppress(docker.errors.NotFound):  # ended and removed by another command meanwhile
                container.stop(timeout=STOP_GRACE_S)
        self._stop_workers(engine, run_id)
        if not _reloaded(container):  # that command recorded its end
            return None
        if container.status == "created":  # never started: nothing ran, nothing to record
            self._remove_all(engine, run_id)
        else:
            self._finish(engine, run_id, container)
        return None

    def _stop_workers(self, engine, run_id: str) -> None:
        """The Ray workers and the services: they keep no state of the run (checkpoints are the trainer's)."""
        import docker.errors

        for worker in self._run_containers(engine, run_id):
            if worker.status == "running" and worker.labels.get(ROLE_LABEL) not in TRAINER_ROLES:
                with contextlib.suppress(docker.errors.NotFound):  # removed meanwhile by another command's finish
                    worker.kill()

    # --- runs rm -------------------------------------------------------------------------------------------------

    def remove(self, run_id: str, confirm=None) -> list[str]:
        """Remove a run that has ended: what it left with the engine (containers, network, secrets: a detached run
        keeps them until its end is recorded) and its run directory. A running one is refused: `stop` checkpoints
        it first. `confirm(items)` sees what will go before anything does, and raises to keep it all."""
        engine = self._live_engine(quiet=not self._recorded(run_id))
        containers = self._run_containers(engine, run_id) if engine is not None else []
        if any(c.status in LIVE_STATES for c in containers):
            raise LaunchError(f"run {run_id} is still running: `verl-deploy stop {run_id}` first")
        run_dir = self._run_dir(run_id, self._trainer(engine, run_id) if containers else None)
        if runs.trainer_holds(run_dir):  # a trainer this engine does not label (or a local one) still writes there
            raise LaunchError(f"run {run_id} is still running: `verl-deploy stop {run_id}` first")
        if not containers and not self._recorded(run_id):
            raise self._not_found(run_id)
        if engine is None and not runs.read_record(run_dir).get("finished_at"):
            raise LaunchError(f"the Docker engine does not answer, so whether run {run_id} still runs is unknown: "
                              "start dockerd, then remove it")
        networks = self._run_networks(engine, run_id) if engine is not None else []
        items = ([f"container {c.name}" for c in containers] + [f"network {n.name}" for n in networks]
                 + ([f"run directory {run_dir}"] if run_dir.is_dir() else []))
        if confirm is not None:
            confirm(items)
        if engine is not None:
            self._remove_all(engine, run_id)
        if run_dir.is_dir():
            shutil.rmtree(run_dir)
        return items
