"""After the run plan (runplan.plan_run), what makes its JobSpec ready for a launcher, for `run`: the memory plan
(a run that cannot fit is refused), a --verl-source's image and an --entry's command, the catalog's image built
where it is missing, upstream verl's own check of its overrides where that verl is at hand, and the stale-image
warning. It may build an image and run verl's short config check; it starts no run. What it tells the user goes
through `say` (the CLI's stderr), one line each.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from verl_deploy import runtimes
from verl_deploy.launchers.jobspec import JobSpec, LaunchError, command_of, with_plan
from verl_deploy.launchers.runplan import RunPlan
from verl_deploy.targets import CLUSTER_TARGETS

Say = Callable[[str], None]


@dataclass(frozen=True)
class Source:
    """--verl-source resolved before the run is planned (the plan names its image), or nothing given."""

    source: object | None = None  # verl_source.VerlSource
    variant: str | None = None  # the catalog variant its pins run on
    image: str | None = None  # the tag of its image (None: it runs in the host's Python)


def verl_source(src: str | None, entry: str | None, *, runtime: str | None, resume: str | None, target: str | None,
                container: str | None, variant: str | None, gpus: str | None) -> Source:
    """--verl-source and --entry checked against the runtime (not on --resume: the record's runtime decides), and
    the source resolved; ValueError (one line) for either."""
    if (src or entry) and not resume:  # before the source is fetched or resolved
        runtimes.trainer(runtime).check_verl_source("--verl-source" if src else "--entry")
    if not src:
        return Source()
    if in_host_python(target, container):  # no image to build or name
        from verl_deploy.verl_source import resolve

        return Source(resolve(src))
    return Source(*_source_image(src, variant, target, gpus))


def prepare(planned: RunPlan, runs_root, *, source: Source, entry: str | None, image_given: bool, dry_run: bool,
            no_plan: bool, say: Say) -> tuple[JobSpec, str | None]:
    """The spec a launcher takes, and the line that says the run could not be planned for memory (None: it was);
    LaunchError (one line) for a run that does not fit or that verl's config refuses."""
    from verl_deploy.launchers import ensure_default_image, get_launcher

    spec, not_planned, resume = planned.spec, None, planned.resumed
    if not no_plan:
        spec, not_planned = _preflight(spec, planned.target, say)
    if source.source is not None or entry or (resume and spec.upstream):
        build = source.source is not None and not image_given and planned.target == "docker" and not dry_run
        spec = _with_verl_source(spec, source.source, source.variant, entry, build, resume)
    if planned.build_image:  # only once the config and flags are known to be good: a build takes minutes
        spec = dataclasses.replace(spec, image=ensure_default_image(planned.variant, spec.runtime))
    if spec.upstream and in_host_python(planned.target, planned.slurm.container if planned.slurm else None):
        if planned.target == "local":  # the host's GPUs first: without them verl cannot train here at all
            get_launcher("local", runs_root).environment(spec)
        _check_host_verl(spec, source.source, planned.target, say)
    elif spec.upstream:
        _check_with_verl(spec, say)
    if planned.target == "docker":
        _warn_if_stale(spec.image, say)
    return spec, not_planned


def _preflight(spec, target: str, say):
    """Plan the run's memory before anything is created (verl_deploy.plan): refuse one that does not fit, in one line
    with the cheapest fix, and warn when it is tight. The spec, with the plan in the trainer's environment, and the
    line that says why the run could not be planned (None when it was): `run` prints it, on stderr, once the
    launcher has taken the run (a run it refuses says only why), so that no run goes unplanned in silence."""
    from verl_deploy.plan import preflight

    check = preflight(spec.config_path, spec.overrides, runtime=spec.runtime, target=target, gpus=spec.gpus,
                      nodes=spec.nodes, gpu_type=spec.cluster.gpu_type, loaded=spec.loaded)
    if check.refuse:
        raise LaunchError(check.message)
    if check.status == "tight":
        say(check.message)
    if check.plan is None:  # not planned: a cluster's unknown GPU, a model not at hand, ...
        return spec, check.message
    return with_plan(spec, check.plan.for_trainer()), None


def _warn_if_stale(image: str, say) -> None:
    """One line when the local image would train other code than this CLI's (images/stale.py)."""
    from verl_deploy.images.stale import local_labels, warning

    labels = local_labels(image)
    if labels and (line := warning(image, labels)):
        say(line)


def _source_image(src: str, variant: str | None, target: str | None, gpus: str | None):
    """--verl-source resolved, with the variant its pins run on (a cluster's GPU nodes: the newest CUDA that runs
    them) and the tag of its image; before the run is planned, so that the plan names that image."""
    from verl_deploy.images.context import source_tag
    from verl_deploy.verl_source import choose_pins, resolve

    source = resolve(src)
    cluster = target in CLUSTER_TARGETS and gpus not in (None, "0")
    name = choose_pins(source, variant or "auto", cluster_gpus=cluster).variant.name
    return source, name, source_tag(source, name)


def _with_verl_source(spec, source, variant: str | None, entry: str | None, build: bool, resumed: bool):
    """The run with --verl-source (its image built from the source first when `build`: docker, no --image, not a
    dry run) and --entry (the trainer's command); a resumed run keeps the ones it was started with (launch.json)."""
    from verl_deploy import images, runs
    from verl_deploy.launchers.verl_command import entry_command

    try:  # a resumed run's runtime is its record's, checked only now
        runtimes.trainer(spec.runtime).check_verl_source("--verl-source" if source is not None else "--entry")
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    launch = (runs.read_launch(spec.run_dir) if resumed else None) or runs.Launch()
    trainer, labels = launch.trainer, dict(launch.verl_source)
    if source is not None:
        labels = {key.removeprefix("verl-deploy."): value for key, value in source.labels().items()}
        # where it is on this host: a run in the host's Python puts it on PYTHONPATH (launchers/host_verl.py)
        labels.update(root=str(source.root), package_parent=source.package_parent)
        spec = dataclasses.replace(spec, variant=variant)
        if build:
            try:
                spec = dataclasses.replace(spec, image=images.ensure_source(source, variant))
            except images.ImageError as exc:
                raise LaunchError(str(exc)) from None
    if entry:
        trainer = entry_command(entry, source.root if source else None)
    spec = dataclasses.replace(spec, trainer=trainer, verl_source=labels)
    return dataclasses.replace(spec, command=command_of(spec))


def in_host_python(target: str | None, container: str | None) -> bool:
    """The trainer runs in a Python of the host, not in an image: local, and Slurm's --container none (its
    default)."""
    return target == "local" or (target == "slurm" and container in (None, "none"))


def _check_host_verl(spec, source, target: str, say) -> None:
    """Upstream verl in the host's python3 (launchers/host_verl.py): it has verl and what the source declares, and
    the overrides compose by that verl's own config there; a Python without Hydra gets a note instead."""
    from verl_deploy.launchers import host_verl, upstream

    python = host_verl.python()
    where = f"--runtime verl --target {target}" + (" --container none" if target == "slurm" else "")
    found = host_verl.check(spec, source, python, where)
    if not found["hydra"]:
        say(f"note: {python} has no hydra-core, so verl's config has not checked the overrides (the trainer "
            "checks them when it starts)")
        return
    say(f"checking the overrides with verl's config in {python} (--cfg job)")
    entry = tuple(host_verl.trainer(spec, python)[1:]) if spec.trainer else ()
    upstream.check_on_host(python, host_verl.environment(spec), list(spec.command.host_args), entry)


def _check_with_verl(spec, say) -> None:
    """The overrides composed by verl's own config in its image (main_ppo --cfg job), when the image is on this
    host; LaunchError with Hydra's message as one line. Where the image is not here (a cluster's, one to pull),
    a note says the check waits for the trainer."""
    import docker

    from verl_deploy.launchers import upstream
    from verl_deploy.launchers.docker import client

    try:
        engine = client()
        engine.images.get(spec.image)
    except (LaunchError, docker.errors.DockerException):  # no engine, or the image is elsewhere (a registry, a cluster)
        say(f"note: {spec.image} is not on this host, so verl's config has not checked the overrides "
            "(the trainer checks them when it starts)")
        return
    say(f"checking the overrides with verl's config in {spec.image} (main_ppo --cfg job, validate_config)")
    upstream.check_in_image(engine, spec.image, list(spec.command.args), spec.trainer[1:])
