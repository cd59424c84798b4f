"""One run plan: what the user asked (RunRequest, the flags as given) turned into what will run (RunPlan: the
JobSpec, the target, the variant, whether an image must be built), by one pure function, plan_run.

It reads the config file, the run directory of a run to resume and the environment given to it; it starts nothing,
builds nothing and writes nothing (TorchX's submit_dryrun is the model). `run`, `smoke` and every launcher's dry
run and launch read its result; `plan` (the memory planner) shares its reading of the arguments.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from verl_deploy import compat, runs, runtimes
from verl_deploy.launchers.jobspec import (
    JobSpec, LaunchError, build_spec, check_before_launch, check_overrides, cluster_options, gpus_of, parse_env,
    refuse_empty,
)


_KEPT = "kept in launch.json"


def kept(default=None):
    """A launch flag of RunRequest that launch.json keeps ("flags", as given) and `run --resume` restores."""
    return dataclasses.field(default=default, metadata={_KEPT: True})


@dataclass(frozen=True)
class RunRequest:
    """What the user asked for, as given (strings unparsed); None: not given (a default, or on --resume the
    run's recorded value). A launch flag marked kept() is recorded in launch.json and restored by --resume."""

    args: tuple[str, ...] = ()  # [CONFIG] then KEY=VALUE overrides (verl's way)
    settings: tuple[str, ...] = ()  # --set KEY=VALUE
    target: str | None = None
    gpus: str | None = None
    nodes: int | None = None
    image: str | None = None
    variant: str | None = kept()
    runtime: str | None = None
    env: tuple[str, ...] = kept(())
    cpus: str | None = kept()
    memory: str | None = kept()
    shm_size: str | None = kept()
    ipc_host: bool = kept(False)
    data: str | None = kept()
    hf_cache: str | None = kept()
    data_size: str | None = kept()
    storage_class: str | None = kept()
    namespace: str | None = kept()  # None: "default", or on --resume the run's
    node_selector: tuple[str, ...] = kept(())
    gpu_type: str | None = kept()
    priority_class: str | None = kept()
    service_account: str | None = kept()
    image_pull_secrets: tuple[str, ...] = kept(())
    image_preloaded: bool = kept(False)
    grace_period: int | None = kept()
    run_id: str | None = None
    resume: str | None = None
    dry_run: bool = False
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    container: str | None = None


@dataclass(frozen=True)
class RunPlan:
    """What will run, and where: every launcher translates `spec`; the caller builds the image first when
    `build_image` says so (a build takes minutes: only once the plan is known to be good)."""

    spec: JobSpec
    target: str
    variant: str | None  # a catalog name (`auto` chosen by compat.variant_for); None: --image, and none runs here
    build_image: bool
    slurm: object | None = None  # launchers.slurm.SlurmOptions for a slurm run
    resume_changes: tuple[str, ...] = ()  # what --resume changed of the recorded launch, one line each
    resumed: bool = False  # a --resume of a recorded run


# The launch flags a run keeps in launch.json ("flags", as given) so that `run --resume` starts it again as it
# was: its resources, volumes, namespace and scheduling. One given now replaces the recorded one, and is shown.
RESUMED_FLAGS = tuple(f.name for f in dataclasses.fields(RunRequest) if f.metadata.get(_KEPT))
_FLAG_NAMES = {"image_pull_secrets": "--image-pull-secret"}  # the CLI's singular, repeatable option
_EXCLUSIVE = (("ipc_host", "shm_size"), ("shm_size", "ipc_host"))  # (given now, the recorded one it replaces)


def given_flags(request: RunRequest) -> dict:
    """The RESUMED_FLAGS that request gives (not None, empty or False), as launch.json keeps them."""
    given = {}
    for name in RESUMED_FLAGS:
        value = getattr(request, name)
        if value not in (None, (), False):
            given[name] = list(value) if isinstance(value, tuple) else value
    return given


def resumed_request(request: RunRequest, launch: runs.Launch) -> tuple[RunRequest, list[str]]:
    """request with the recorded launch flags it does not give; what it changes of them, one line each."""
    recorded = dict(launch.flags)
    given = given_flags(request)
    changes = [f"{_FLAG_NAMES.get(name, '--' + name.replace('_', '-'))}: {recorded.get(name)} -> {value}"
               for name, value in given.items() if recorded.get(name) != value]
    # One of two flags that exclude each other, given now, replaces the other one recorded (build_spec refuses both).
    replaced = {other for name, other in _EXCLUSIVE if name in given and recorded.get(other) not in (None, False)}
    changes += [f"--{other.replace('_', '-')}: {recorded[other]} -> dropped (--{name.replace('_', '-')} given)"
                for name, other in _EXCLUSIVE if other in replaced and name in given]
    restored = {name: tuple(value) if isinstance(value, list) else value
                for name, value in recorded.items() if name in RESUMED_FLAGS and name not in given.keys() | replaced}
    return dataclasses.replace(request, **restored), changes


def check_runtime(name: str | None) -> str:
    """--runtime checked against the catalog's runtimes (one line naming them otherwise)."""
    from verl_deploy.images.context import ImageError, runtime

    try:
        return runtime(name or compat.DEFAULT_RUNTIME).name
    except ImageError as exc:
        raise LaunchError(str(exc)) from None


def check_variant(name: str | None, runtime: str) -> None:
    """--variant checked against the runtime's catalog (auto or None: chosen later, by compat.variant_for)."""
    from verl_deploy.images.context import ImageError, variant

    if name and name != "auto":
        try:
            variant(name, runtime)
        except ImageError as exc:
            raise LaunchError(f"--variant: {exc}") from None


def config_and_overrides(args, settings, runtime: str = compat.DEFAULT_RUNTIME) -> tuple[Path | None, list[str]]:
    """`run`'s and `plan`'s arguments: an optional CONFIG file first, then KEY=VALUE overrides (verl's: +key=value
    too), which come after the --set ones; LaunchError for one that is not KEY=VALUE. Upstream verl's are kept as
    given (Hydra's +key, ++key and ~key)."""
    args, config = list(args), None
    if args and "=" not in args[0] and not args[0].startswith(("+", "~")):
        config, args = Path(args[0]), args[1:]
        if config.expanduser().is_file():  # a missing one: each reader says so in its words
            refuse_empty(config.expanduser())
    return config, list(check_overrides([*settings, *args], runtime))


def plan_run(request: RunRequest, runs_root: Path, environ: Mapping[str, str] | None = None) -> RunPlan:
    """The plan of one run; LaunchError or ValueError (one line) for input it refuses. `--gpus` is parsed here,
    once; the world size is resolved once (build_spec); the variant and image are chosen once."""
    from verl_deploy.launchers import CLUSTER_TARGETS, default_image

    environ = os.environ if environ is None else environ
    runtime, resume, flag_changes, launch = request.runtime, request.resume, [], runs.Launch()
    if resume and request.run_id not in (None, resume):
        raise LaunchError(f"--resume {resume} continues run {resume} under its own id: drop --run-id "
                          f"{request.run_id} (a new run named {request.run_id}: leave out --resume)")
    if resume:
        launch = runs.read_launch(runs_root / resume) or launch
        request, flag_changes = resumed_request(request, launch)
        runtime = runtime or launch.runtime
    runtime = check_runtime(runtime)
    check_variant(request.variant, runtime)
    config, overrides = config_and_overrides(request.args, request.settings, runtime)
    target, gpus, nodes, image, changes = request.target, request.gpus, request.nodes, request.image, []
    if resume:
        again = runs.plan_resume(runs_root, resume, config=config, target=target, overrides=overrides, gpus=gpus,
                                 nodes=nodes, image=image, needs_config=runtimes.trainer(runtime).takes_config)
        config, target, overrides, gpus, nodes, image, changes = (
            again.config, again.target, again.overrides, again.gpus, again.nodes, again.image,
            again.changes + flag_changes)
    elif config is None and not overrides:
        raise ValueError("which config? `verl-deploy run CONFIG` (e.g. examples/quickstart.yaml), "
                         "`verl-deploy run -- KEY=VALUE ...` (verl's overrides on our defaults), or --resume RUN")
    elif request.run_id and (taken := runs.existing_run(runs_root, request.run_id)):
        raise ValueError(taken)  # the trainer would resume it silently
    target = target or "docker"
    asked_gpus = gpus_of(gpus)  # the one parse of --gpus
    extra_env = parse_env(request.env)
    cluster = cluster_options(request.node_selector, request.gpu_type, request.priority_class,
                              request.service_account, request.image_pull_secrets, request.image_preloaded,
                              request.grace_period)
    hf_cache = request.hf_cache
    if hf_cache is not None and target in ("local", "docker") and not Path(hf_cache).expanduser().is_dir():
        # a typo would become a fresh, empty cache (Docker: a directory created as root): every model downloaded again
        default = environ.get("HF_HOME", "~/.cache/huggingface")
        raise LaunchError(f"--hf-cache {hf_cache!r} is not a directory on this host: point it at your Hugging Face "
                          f"cache (without it: {default}), or create it first (mkdir -p {hf_cache})")
    if hf_cache is None and target == "docker":
        hf_cache = environ.get("HF_HOME", "~/.cache/huggingface")
    # On Kubernetes, --data and --hf-cache name claims; elsewhere they are host directories.
    if target == "k8s":
        volumes = {"data_claim": request.data, "data_size": request.data_size, "cache_claim": hf_cache}
    else:
        volumes = {"data_dir": Path(request.data).expanduser() if request.data else None,
                   "hf_cache": Path(hf_cache).expanduser() if hf_cache else None}
    spec = build_spec(  # the world (GPUs from verl's keys when --gpus is not given) is resolved here, once
        config, image=image or "", runs_root=runs_root, run_id=resume or request.run_id, overrides=tuple(overrides),
        gpus=asked_gpus, cpus=request.cpus, memory=request.memory, shm_size=request.shm_size,
        ipc_host=request.ipc_host, nodes=nodes, **volumes, storage_class=request.storage_class, env=extra_env,
        namespace=request.namespace or "default", runtime=runtime, cluster=cluster, environ=environ,
    )
    in_host_python = spec.upstream and target == "local"  # no image: upstream verl in the host's python3
    try:  # the one choice, so a dry run names the image the run starts
        if in_host_python:
            raise LookupError("no image")
        variant = compat.variant_for(request.variant or "auto", wants_gpus=spec.gpus.wanted,
                                     on_this_host=target not in CLUSTER_TARGETS, runtime=runtime)
    except LookupError as exc:
        if image is None and not in_host_python:
            raise LaunchError(f"{exc}: name one with --variant, or give --image") from None
        variant = None  # --image names what runs: no variant of the catalog has to run here
    build_image = image is None and target == "docker" and not request.dry_run
    flags = given_flags(request)
    if target != "k8s":  # host folders: kept absolute, so a resume from another directory finds them
        flags.update({name: str(Path(flags[name]).expanduser().resolve()) for name in ("data", "hf_cache") if name in flags})
    runs_in = image or ("" if in_host_python else default_image(variant, runtime))
    spec = dataclasses.replace(spec, image=runs_in, variant=variant, launch_flags=flags)
    # Before an image is built or anything started: the data, reward and model files, vLLM and the trackers where
    # the trainer runs (an image of the catalog's tag is known from the catalog), the prompts' lengths.
    catalog_variant = None
    if variant is not None and not spec.upstream and runs_in == default_image(variant, runtime):
        catalog_variant = variant
    container = request.container or launch.slurm.get("container")  # a resume keeps its own
    check_before_launch(spec, target, container, catalog_variant)
    slurm = None
    if target == "slurm":
        from verl_deploy.launchers.slurm import SlurmOptions

        slurm = SlurmOptions(partition=request.partition, account=request.account, time=request.time_limit,
                             container=request.container)
    return RunPlan(spec=spec, target=target, variant=variant, build_image=build_image, slurm=slurm,
                   resume_changes=tuple(changes), resumed=bool(resume))
