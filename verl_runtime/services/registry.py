"""The services a run may declare (config `services.<name>`), in one table: what runs each, where its tools send
requests, and how a launcher runs it. The runtime starts them as processes beside the trainer (local, Slurm's head
node: services/running.py); the Docker and Kubernetes launchers run the same command in containers of their own
and hand the trainer the URL in `url_env(name)`."""

from __future__ import annotations

from dataclasses import dataclass

# The sandbox's runs beside a trainer (local, Slurm) share the trainer's CPU and session: at the sandbox's own
# default (nice 10, for a container of its own) they got a tenth of a core and the agentic quickstart's step took
# four times as long (services/confined.py).
NICE_BESIDE_TRAINER = 2


@dataclass(frozen=True)
class Service:
    name: str
    module: str  # `python -m <module>` serves it
    port: int  # where it listens in a container of its own (a process beside the trainer takes a free one)
    endpoint: str  # the path its tools POST to
    url_key: str  # the key of a verl tool config that holds that URL (SandboxFusionTool, SearchTool)
    # The code it runs is untrusted: in a container, no route out (a Docker network without one, a NetworkPolicy
    # with no egress), and it is told so (--network-isolation external) instead of making namespaces of its own.
    untrusted: bool = False
    health: str = "/health"

    def args(self, settings, port: int, host: str = "127.0.0.1", in_container: bool = False) -> list[str]:
        """The service's command line after `python -m`, from its config section (config.services.<name>)."""
        args = ["-m", self.module, "--host", host, "--port", str(port)]
        if self.name == "sandbox":
            args += ["--memory-mb", str(settings.memory_mb), "--run-timeout", str(settings.run_timeout)]
            if settings.concurrency:
                args += ["--concurrency", str(settings.concurrency)]
            if in_container:
                args += ["--network-isolation", "external"]
            else:
                args += ["--nice", str(NICE_BESIDE_TRAINER)]
        if self.name == "retriever" and settings.corpus:
            args += ["--corpus", str(settings.corpus)]
        return args

    def url(self, base: str) -> str:
        """The URL its tools use, from where it serves (`http://host:port`)."""
        return base.rstrip("/") + self.endpoint

    def health_url(self, base: str) -> str:
        return base.rstrip("/") + self.health

    def replicas(self, settings) -> int:
        """How many of it serve behind its one address (services.<name>.replicas where the service has them)."""
        return getattr(settings, "replicas", 1)

    def probe(self) -> list[str]:
        """A container's healthcheck command (exec form): its /health, asked from inside the container."""
        return ["python", "-m", "verl_runtime.services.health", self.health_url(f"http://127.0.0.1:{self.port}")]


SERVICES = {
    "sandbox": Service("sandbox", "verl_runtime.services.sandbox", 8080, "/run_code", "sandbox_fusion_url",
                       untrusted=True),
    "retriever": Service("retriever", "verl_runtime.services.retriever", 8000, "/retrieve", "retrieval_service_url"),
}


def url_env(name: str) -> str:
    """The environment variable in which a launcher that runs the service gives the trainer its base URL."""
    return f"VERL_DEPLOY_{name.upper()}_URL"


def declared(config) -> list[Service]:
    """The services config.services enables, in the table's order."""
    return [service for name, service in SERVICES.items() if getattr(config.services, name).enable]
