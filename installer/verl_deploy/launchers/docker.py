"""JobSpec -> one Docker container, through the docker SDK (the dry run prints the equivalent `docker run`)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from verl_deploy import runs
from verl_deploy.launchers.jobspec import RUN_ID_LABEL, JobSpec, LaunchError
from verl_deploy.runs import RunStatus

# NVIDIA's recommendation for PyTorch containers: pinned memory without limit, a 64 MB stack.
ULIMITS = {"memlock": (-1, -1), "stack": (67108864, 67108864)}
STOP_GRACE_S = 120  # time the runtime gets to write its checkpoint after SIGTERM


ROLE_LABEL = "verl-deploy.role"
RAY_PORT = 6379


@dataclass(frozen=True)
class Plan:
    """One container of a run: the trainer, or for several nodes a Ray head (which runs the trainer) or worker."""

    name: str
    role: str  # trainer | ray-head | ray-worker
    command: list[str]
    shell: bool = False  # run `command` through /bin/sh -c instead of the image's entrypoint


def network_name(spec: JobSpec) -> str:
    return f"{spec.run_id}-net"


def plans(spec: JobSpec) -> list[Plan]:
    """Containers in start order. Several nodes: a Ray head and workers on one network, the way a KubeRay
    RayJob runs; the trainer runs on the head and joins its cluster through RAY_ADDRESS."""
    if spec.nodes == 1:
        return [Plan(spec.run_id, "trainer", spec.train_args())]
    head = spec.run_id  # the head keeps the run's name: status, logs and stop follow it
    # Wait for the head, then serve it; `--block` returns once the head is gone, so workers end with the run.
    join = (
        f"until ray health-check --address={head}:{RAY_PORT} 2>/dev/null; do sleep 1; done; "
        f"exec ray start --address={head}:{RAY_PORT} --block"
    )
    workers = [Plan(f"{spec.run_id}-worker-{i}", "ray-worker", [join], shell=True) for i in range(1, spec.nodes)]
    train = shlex.join(["python", "-m", "verl_runtime", *spec.train_args()])
    start_head = (
        f"ray start --head --port={RAY_PORT} --disable-usage-stats && "
        f"exec env RAY_ADDRESS=127.0.0.1:{RAY_PORT} {train}"
    )
    return [*workers, Plan(head, "ray-head", [start_head], shell=True)]


def docker_run_args(spec: JobSpec, plan: Plan | None = None, detach: bool = False) -> list[str]:
    """The `docker run` command line equivalent to what launch() creates. Secrets appear by name only
    (`-e HF_TOKEN` makes docker read the value from the caller's environment)."""
    plan = plan or plans(spec)[-1]
    args = ["docker", "run"] + (["--detach"] if detach else []) + ["--name", plan.name, "--init"]
    for key, value in {**spec.labels, ROLE_LABEL: plan.role}.items():
        args += ["--label", f"{key}={value}"]
    if spec.nodes > 1:
        args += ["--network", network_name(spec)]
    args += ["--user", spec.user]
    if spec.gpus.wanted:
        gpus = str(spec.gpus)
        args += ["--gpus", f'"{gpus}"' if "," in gpus else gpus]
    args += ["--ipc", "host"] if spec.ipc_host else ["--shm-size", spec.shm_size]
    for name, (soft, hard) in ULIMITS.items():
        args += ["--ulimit", f"{name}={soft}" if soft == hard else f"{name}={soft}:{hard}"]
    if spec.cpus:
        args += ["--cpus", str(spec.cpus)]
    if spec.memory:
        args += ["--memory", spec.memory]
    for mount in spec.mounts:
        args += ["-v", f"{mount.source}:{mount.target}" + (":ro" if mount.read_only else "")]
    for key, value in spec.container_env.items():
        args += ["-e", f"{key}={value}"]
    for name in spec.secrets:
        args += ["-e", name]
    if plan.shell:
        args += ["--entrypoint", "/bin/sh"]
    return args + [spec.image] + (["-c", *plan.command] if plan.shell else plan.command)


def container_options(spec: JobSpec, plan: Plan | None = None, environ: dict[str, str] | None = None) -> dict:
    """Keyword arguments for `client.containers.create`: the same translation as docker_run_args."""
    from docker.types import DeviceRequest, Mount, Ulimit

    plan = plan or plans(spec)[-1]
    environ = os.environ if environ is None else environ
    options: dict = {
        "image": spec.image,
        "command": plan.command,
        "name": plan.name,
        "labels": {**spec.labels, ROLE_LABEL: plan.role},
        "user": spec.user,
        "init": True,  # tini as PID 1 forwards SIGTERM to the trainer and reaps Ray's children
        "ulimits": [Ulimit(name=name, soft=soft, hard=hard) for name, (soft, hard) in ULIMITS.items()],
        "mounts": [Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in spec.mounts],
        "environment": {**spec.container_env, **{name: environ[name] for name in spec.secrets if name in environ}},
    }
    if plan.shell:
        options["entrypoint"] = ["/bin/sh", "-c"]
    if spec.nodes > 1:
        options["network"] = network_name(spec)
    if spec.gpus.wanted:
        if spec.gpus.device_ids:
            request = DeviceRequest(device_ids=list(spec.gpus.device_ids), capabilities=[["gpu"]])
        else:
            request = DeviceRequest(count=spec.gpus.count, capabilities=[["gpu"]])
        options["device_requests"] = [request]
    if spec.ipc_host:
        options["ipc_mode"] = "host"
    else:
        options["shm_size"] = spec.shm_size
    if spec.cpus:
        options["nano_cpus"] = int(spec.cpus * 1e9)
    if spec.memory:
        options["mem_limit"] = spec.memory
    return options


def client():
    """A docker SDK client, or a one-line LaunchError when no engine answers."""
    import docker

    try:
        engine = docker.from_env(timeout=30)
        engine.ping()
        return engine
    except Exception as exc:
        raise LaunchError(
            f"no Docker engine reachable ({type(exc).__name__}): start dockerd or set DOCKER_HOST; "
            "`verl-deploy doctor` checks it"
        ) from None


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


def _gpu_error(exc) -> bool:
    text = str(getattr(exc, "explanation", "") or exc)
    return "capabilities: [[gpu]]" in text or "nvidia-container" in text


def _prepare_run_dir(spec: JobSpec) -> None:
    """Create the host directories before Docker would (as root); a root caller hands the ones it creates to the
    container's non-root user. Existing directories are left as they are."""
    for directory in (spec.run_dir, spec.hf_cache):
        if directory is None or directory.exists():
            continue
        directory.mkdir(parents=True)
        if os.getuid() == 0:
            uid, gid = (int(part) for part in spec.user.split(":"))
            os.chown(directory, uid, gid)


class DockerLauncher:
    target = "docker"

    def __init__(self, runs_root: Path):
        self.runs_root = Path(runs_root)

    def dry_run(self, spec: JobSpec) -> str:
        lines = [shlex.join(docker_run_args(spec, plan, detach=plan.role == "ray-worker")) for plan in plans(spec)]
        if spec.nodes > 1:
            lines.insert(0, shlex.join(["docker", "network", "create", network_name(spec)]))
        return "\n".join(lines)

    def launch(self, spec: JobSpec, detach: bool = False) -> int:
        import docker.errors

        engine = client()
        ensure_image(engine, spec.image)
        self._clear_finished(engine, spec.run_id)  # --resume starts new containers on the same run dir
        fresh = not spec.run_dir.exists()
        _prepare_run_dir(spec)
        runs.write_record(spec.run_dir, {"run_id": spec.run_id, "target": self.target, "image": spec.image,
                                         "nodes": spec.nodes, "command": spec.train_args(),
                                         "secrets": list(spec.secrets)})
        try:
            try:
                container = self._start(engine, spec, ulimits=True)
            except docker.errors.APIError as exc:
                if "rlimit" not in str(exc):
                    raise
                # Rootless or nested engines may not raise memlock/stack: run with the engine's own limits.
                print("warning: this Docker engine cannot raise the memlock/stack ulimits; using its defaults",
                      file=sys.stderr)
                self._remove_all(engine, spec.run_id)
                container = self._start(engine, spec, ulimits=False)
        except docker.errors.APIError as exc:
            self._remove_all(engine, spec.run_id)
            if fresh:  # leave no trace of a run that never started
                shutil.rmtree(spec.run_dir, ignore_errors=True)
            if spec.gpus.wanted and _gpu_error(exc):
                raise LaunchError(
                    "Docker on this host has no GPU support (NVIDIA container toolkit not set up): install "
                    "nvidia-container-toolkit and restart dockerd, or run without --gpus"
                ) from None
            raise LaunchError(f"container did not start: {(exc.explanation or str(exc)).splitlines()[0]}") from None
        if detach:
            return 0  # detached Ray workers end on their own about a minute after the head
        code = self._follow(container)  # the last one started: the trainer (or the Ray head running it)
        self._stop_workers(engine, spec.run_id)
        return code

    def _start(self, engine, spec: JobSpec, ulimits: bool):
        """Create and start the run's containers in order; the last one is the trainer."""
        if spec.nodes > 1:
            engine.networks.create(network_name(spec), driver="bridge", labels=dict(spec.labels))
        for plan in plans(spec):
            options = container_options(spec, plan)
            if not ulimits:
                del options["ulimits"]
            container = engine.containers.create(**options)
            container.start()
        return container

    def _run_containers(self, engine, run_id: str) -> list:
        return engine.containers.list(all=True, filters={"label": f"{RUN_ID_LABEL}={run_id}"})

    def _clear_finished(self, engine, run_id: str) -> None:
        found = self._run_containers(engine, run_id)
        if any(c.status == "running" for c in found):
            raise LaunchError(f"run {run_id} is still running: `verl-deploy stop {run_id}` first")
        self._remove_all(engine, run_id)

    def _remove_all(self, engine, run_id: str) -> None:
        import docker.errors

        for container in self._run_containers(engine, run_id):
            container.remove(force=True)
        for network in engine.networks.list(filters={"label": f"{RUN_ID_LABEL}={run_id}"}):
            try:
                network.remove()
            except docker.errors.APIError:
                pass  # still in use by something else: leave it

    def _follow(self, container) -> int:
        """Stream the logs until the container ends. Ctrl-C sends SIGTERM (the runtime checkpoints, we keep
        streaming); a second Ctrl-C stops it for good."""
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
            return int(container.wait()["StatusCode"])
        finally:
            signal.signal(signal.SIGINT, previous)

    def _container(self, run_id: str):
        """The run's trainer container (for several nodes: the Ray head, which runs the trainer)."""
        found = [c for c in self._run_containers(client(), run_id) if c.labels.get(ROLE_LABEL) != "ray-worker"]
        if not found:
            raise LaunchError(f"no Docker container for run {run_id!r}: `verl-deploy runs` lists the runs")
        return found[0]

    def _status(self, container) -> RunStatus:
        run_id = container.labels.get(RUN_ID_LABEL, container.name)
        state = container.attrs["State"]
        code = state.get("ExitCode") if container.status == "exited" else None
        run_dir = next(
            (m["Source"] for m in container.attrs.get("Mounts", []) if m["Destination"].endswith(f"/{run_id}")), ""
        )
        if container.status in ("running", "restarting"):
            verdict = "running"
        elif container.status == "created":
            verdict = "pending"
        elif code == 0:
            verdict = "succeeded"
        elif code in (130, 143):  # ended by SIGINT/SIGTERM (the runtime checkpointed)
            verdict = "stopped"
        else:
            verdict = "failed"
        return RunStatus(
            run_id=run_id,
            target=self.target,
            state=verdict,
            exit_code=code,
            image=container.attrs["Config"]["Image"],
            run_dir=run_dir,
            metrics=runs.last_metrics(run_dir) if run_dir else {},
            checkpoints=runs.checkpoints(run_dir) if run_dir else [],
            detail="out of memory (OOMKilled)" if state.get("OOMKilled") else "",
        )

    def status(self, run_id: str) -> RunStatus:
        return self._status(self._container(run_id))

    def logs(self, run_id: str, follow: bool = False) -> Iterator[str]:
        container = self._container(run_id)
        if not follow:
            yield container.logs().decode(errors="replace")
            return
        for chunk in container.logs(stream=True, follow=True):
            yield chunk.decode(errors="replace")

    def stop(self, run_id: str) -> None:
        """SIGTERM to the trainer first (it checkpoints), then to any Ray workers."""
        container = self._container(run_id)
        if container.status == "running":
            container.stop(timeout=STOP_GRACE_S)
        self._stop_workers(client(), run_id)

    def _stop_workers(self, engine, run_id: str) -> None:
        for worker in self._run_containers(engine, run_id):
            if worker.status == "running" and worker.labels.get(ROLE_LABEL) == "ray-worker":
                worker.kill()  # workers keep no state of the run: checkpoints are the trainer's, on the head

    def list(self) -> list[RunStatus]:
        containers = client().containers.list(all=True, filters={"label": RUN_ID_LABEL})
        return [self._status(c) for c in containers if c.labels.get(ROLE_LABEL) != "ray-worker"]
