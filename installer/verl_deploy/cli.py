"""verl-deploy commands: parse, call one function, render. Heavy imports stay inside commands."""

from pathlib import Path

import typer

from verl_deploy.compat import CLUSTER_GPU_VARIANT, DEFAULT_RUNTIME

app = typer.Typer(
    help="Run single-controller RL post-training (PPO, GRPO, ...) on a CPU, a GPU box or Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from verl_deploy.about import version_lines

        typer.echo("\n".join(version_lines()))
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version of the CLI, its runtime and the image catalog."),
) -> None:
    pass


@app.command()
def doctor(
    json_output: bool = typer.Option(False, "--json", help="Print the findings as JSON (schema: docs/doctor.md)."),
    k8s: bool = typer.Option(False, "--k8s", help="Check the Kubernetes cluster even without a kubeconfig."),
    gpu_smoke: bool = typer.Option(False, "--gpu-smoke", help="Run a short container with GPUs to prove the path."),
    nvml_reading: Path = typer.Option(
        None, "--nvml-reading", envvar="VERL_DEPLOY_NVML_READING", hidden=True,
        help="Replay a recorded NVML reading (JSON) instead of asking this host's driver.",
    ),
    nodes: int = typer.Option(None, "--nodes", help="Pre-flight across N nodes (run it on each, as torchrun)."),
    node_rank: str = typer.Option("0", "--node-rank", help="This node's rank with --nodes: 0 on the master; 1..N-1, "
                                  "or auto (the master numbers it), on the others."),
    master: str = typer.Option(None, "--master", help="ADDR:PORT where the nodes meet (rank 0's address)."),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds the nodes wait for each other with --nodes."),
    env_file: Path = typer.Option(None, "--env-file", help="With --nodes: write what the trainer should be given "
                                  "here (GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME where unset) when all passes."),
) -> None:
    """Is this host ready? Driver, CUDA, GPUs, PyTorch, Docker, GPU runtime, cluster. Exit 1 when a check fails.
    With --nodes N --node-rank R --master ADDR:PORT: the pre-flight across the nodes of a run (docs/multinode.md)."""
    from verl_deploy.doctor import diagnose
    from verl_deploy.doctor.render import to_json, to_table

    if nodes is not None or master is not None:
        raise typer.Exit(_preflight(nodes, node_rank, master, timeout, json_output, env_file))
    try:
        report = diagnose(nvml_reading=nvml_reading, k8s=k8s, gpu_smoke=gpu_smoke)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--nvml-reading") from None
    if json_output:
        typer.echo(to_json(report.findings, report.recommended_variant))
    else:
        from rich.console import Console

        Console().print(to_table(report.findings, report.recommended_variant))
    raise typer.Exit(report.exit_code)


def _preflight(nodes: int | None, node_rank: str, master: str | None, timeout: float, json_output: bool,
               env_file: Path | None) -> int:
    from verl_deploy.doctor import multinode
    from verl_deploy.doctor.render import cluster_json, cluster_lines

    if nodes is None or master is None:
        typer.echo("error: the pre-flight needs both --nodes N and --master ADDR:PORT (with --node-rank R)", err=True)
        return 2
    try:
        host, port = multinode.parse_master(master)
        rank = multinode.parse_rank(node_rank)
        report = multinode.run(multinode.Options(nodes, rank, host, port, timeout))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    typer.echo(cluster_json(report) if json_output else cluster_lines(report))
    if env_file is not None and report.exit_code == 0:
        multinode.write_env(report, env_file)
    return report.exit_code


@app.command()
def init(
    folder: Path = typer.Argument(Path("."), help="Where to write them (created if missing; default: here)."),
    force: bool = typer.Option(False, "--force", help="Overwrite files that differ from the starter files."),
) -> None:
    """Write your own starting files: example configs, compose.yaml with .env.example and .secrets/, and the
    kustomize tree k8s/ (the files the repository ships)."""
    from verl_deploy.starter import InitError, write

    try:
        written = write(folder, force=force)
    except InitError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {len(written)} files to {folder}" + ("" if written else " (all there already)"))
    typer.echo(f"  train here:      verl-deploy run {folder / 'examples/quickstart.yaml'} --target local")
    typer.echo(f"  compose:         cd {folder} && cp .env.example .env && docker compose up --exit-code-from trainer trainer")
    typer.echo(f"  kubernetes:      set your image in an overlay of {folder / 'k8s'}, then kubectl apply -k ...")


# --- run, status, logs, stop, runs: launchers (one JobSpec, translated per target) ------------------------------

_RUNS_DIR_OPTION = typer.Option(None, "--runs-dir", envvar="VERL_DEPLOY_RUNS", help="Where run directories live (default: ./runs).")


def _launch_error(exc: Exception) -> typer.Exit:
    """One line and exit 2; an interrupted launch (its exit_code, 130) says what it left, without 'error:'."""
    code = getattr(exc, "exit_code", 2)
    typer.echo(f"error: {exc}" if code == 2 else str(exc), err=True)
    return typer.Exit(code)


def _launcher(target: str | None, run_id: str | None, runs_dir: Path | None, namespace: str | None):
    """The launcher of a run: the one asked for, else the target of its run directory (recorded, or direct for a
    run the trainer's entrypoint started), else docker."""
    from verl_deploy import runs
    from verl_deploy.launchers import get_launcher

    root = runs_dir or runs.default_runs_root()
    launch = (runs.read_launch(root / run_id) if run_id else None) or runs.Launch()
    found = runs.target_of(root / run_id) if run_id else None
    return get_launcher(target or found or "docker", root, namespace or launch.namespace)


@app.command()
def run(
    args: list[str] = typer.Argument(
        None, metavar="[CONFIG] [-- KEY=VALUE ...]",
        help="Training config (YAML), e.g. examples/quickstart.yaml (with --resume: the run's own by default), then "
             "config overrides as verl takes them (after --, e.g. -- trainer.total_epochs=2 "
             "actor_rollout_ref.actor.optim.lr=1e-6); without CONFIG: our defaults and the overrides. See docs/verl.md."),
    target: str = typer.Option(None, "--target", "-t", help="local | docker | k8s | slurm (default: docker; with --resume: the run's)."),
    gpus: str = typer.Option(None, "--gpus", help="all, a count (2), indices (0,1) or UUIDs (GPU-...)."),
    image: str = typer.Option(None, "--image", help="Image to run (default: the variant's local tag)."),
    variant: str = typer.Option(None, "--variant", help=f"Image variant (docker/variants.yaml) (default auto: cpu without --gpus; with them, this host's best for local/docker, {CLUSTER_GPU_VARIANT} for k8s/slurm)."),
    overrides: list[str] = typer.Option([], "--set", help="Config override key=value (repeatable)."),
    env: list[str] = typer.Option([], "--env", "-e", help="Extra environment KEY=VALUE (repeatable; not for secrets)."),
    cpus: str = typer.Option(None, "--cpus", help="CPU limit (Docker) / request (Kubernetes) (default on k8s: 4 per GPU)."),
    memory: str = typer.Option(None, "--memory", help="Memory limit, e.g. 64g or 64Gi (default on k8s: 32g per GPU, plus --shm-size)."),
    shm_size: str = typer.Option(None, "--shm-size", help="Shared memory for PyTorch workers and NCCL (default: 16g; on k8s 2g per GPU, at most 16g, inside the memory limit)."),
    ipc_host: bool = typer.Option(False, "--ipc-host", help="Share the host's IPC namespace instead of --shm-size (Docker)."),
    nodes: int = typer.Option(None, "--nodes", help="Nodes; more than one runs a Ray cluster (Kubernetes: a RayJob) (default: 1)."),
    data: str = typer.Option(None, "--data", help="Data mounted read-only at /data: a host directory; on k8s a PersistentVolumeClaim's name."),
    hf_cache: str = typer.Option(None, "--hf-cache", help="Hugging Face cache: a host directory (default: $HF_HOME or ~/.cache/huggingface); on k8s a claim's name, ReadWriteMany to share it between runs (default: the run's own <run>-hf-cache, created)."),
    data_size: str = typer.Option(None, "--data-size", help="k8s: create the --data claim (default name: <run>-data) with this size, e.g. 100Gi."),
    storage_class: str = typer.Option(None, "--storage-class", help="k8s: the storage class of the claims the launcher creates (default: the cluster's)."),
    namespace: str = typer.Option(None, "--namespace", "-n", help="Kubernetes namespace (default: default)."),
    node_selector: list[str] = typer.Option([], "--node-selector", help="k8s: schedule only on nodes with this label KEY=VALUE (repeatable)."),
    gpu_type: str = typer.Option(None, "--gpu-type", help="k8s: the GPU model, e.g. H100, A100-80GB, L4 (matched to the labels clusters carry: GFD's, GKE's, the instance type)."),
    priority_class: str = typer.Option(None, "--priority-class", help="k8s: the pods' PriorityClass."),
    service_account: str = typer.Option(None, "--service-account", help="k8s: the pods' ServiceAccount (its token is not mounted)."),
    image_pull_secret: list[str] = typer.Option([], "--image-pull-secret", help="k8s: a Secret holding the registry's credentials (repeatable)."),
    image_preloaded: bool = typer.Option(False, "--image-preloaded", help="k8s: the nodes hold this engine's images (kind load, minikube image load): run a local tag without a registry."),
    grace_period: int = typer.Option(None, "--grace-period", help="k8s: seconds a stopped or evicted trainer gets to checkpoint before it is killed (default: 120)."),
    run_id: str = typer.Option(None, "--run-id", help="Name of the run (default: <config>-<time>-<random>)."),
    resume: str = typer.Option(None, "--resume", help="Continue run RUN_ID from its last valid checkpoint, with its recorded config, --set values, target, GPUs, image and launch flags (resources, volumes, namespace, scheduling); flags given now change them, and are shown."),
    runs_dir: Path = _RUNS_DIR_OPTION,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would run (docker run line, Kubernetes YAML); start nothing."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Start and return; follow with `verl-deploy logs -f RUN`."),
    runtime: str = typer.Option(None, "--runtime", help="verl-deploy (this project's trainer, the default) or verl: upstream verl's main_ppo in its image, with the overrides as verl takes them (docs/verl-runtime.md)."),
    no_plan: bool = typer.Option(False, "--no-plan", help="Skip the memory pre-flight (`verl-deploy plan`) that refuses a run which cannot fit."),
    no_preflight: bool = typer.Option(False, "--no-preflight", help="Several nodes: skip the pre-flight across them (`verl-deploy doctor --nodes`, docs/multinode.md) that runs before Ray and the trainer."),
    partition: str = typer.Option(None, "--partition", help="slurm: the partition (default: the cluster's)."),
    account: str = typer.Option(None, "--account", help="slurm: the account the job is charged to."),
    time_limit: str = typer.Option(None, "--time", help="slurm: the job's time limit, e.g. 4:00:00 or 2-00:00:00."),
    container: str = typer.Option(None, "--container", help="slurm: how nodes run the trainer: none (this venv, on shared storage) | docker | apptainer | pyxis (default: none; docs/slurm.md)."),
    verl_source: str = typer.Option(None, "--verl-source", help="With --runtime verl: train your own verl (a fork, a repository vendoring verl/, git+https://...@REV or a pip requirement) in its image, built from it (docs/verl.md)."),
    entry: str = typer.Option(None, "--entry", help="With --runtime verl: what trains instead of -m verl.trainer.main_ppo: a module (-m recipe.dapo.main_dapo) or a script of the --verl-source (recipe/dapo/main_dapo.py)."),
) -> None:
    """Train with CONFIG on this host (local), in a container (docker) or on a cluster (k8s, slurm)."""
    from verl_deploy import runs
    from verl_deploy.launchers import LaunchError, get_launcher, prepare
    from verl_deploy.launchers.runplan import RunRequest, plan_run

    root = runs_dir or runs.default_runs_root()
    try:
        source = prepare.verl_source(verl_source, entry, runtime=runtime, resume=resume, target=target,
                                     container=container, variant=variant, gpus=gpus)
    except (LaunchError, ValueError) as exc:
        raise _launch_error(exc) from None
    request = RunRequest(
        args=tuple(args or ()), settings=tuple(overrides), target=target, gpus=gpus, nodes=nodes,
        image=image or source.image, variant=None if verl_source else variant, runtime=runtime, env=tuple(env), cpus=cpus, memory=memory, shm_size=shm_size,
        ipc_host=ipc_host, data=data, hf_cache=hf_cache, data_size=data_size, storage_class=storage_class,
        namespace=namespace, node_selector=tuple(node_selector), gpu_type=gpu_type, priority_class=priority_class,
        service_account=service_account, image_pull_secrets=tuple(image_pull_secret),
        image_preloaded=image_preloaded, grace_period=grace_period, run_id=run_id, resume=resume, dry_run=dry_run,
        partition=partition, account=account, time_limit=time_limit, container=container,
    )
    say = lambda line: typer.echo(line, err=True)  # noqa: E731 (the user's lines go to stderr)
    try:
        planned = plan_run(request, root)
        for change in planned.resume_changes:
            say(f"resume {resume}: {change}")
        spec, not_planned = prepare.prepare(planned, root, source=source, entry=entry, image_given=image is not None,
                                            dry_run=dry_run, no_plan=no_plan, say=say)
        if no_preflight:
            import dataclasses

            spec = dataclasses.replace(spec, preflight=False)
        launcher = get_launcher(planned.target, root, spec.namespace, slurm=planned.slurm)
        if dry_run:
            text = launcher.dry_run(spec)  # a run the launcher refuses says only why
            if not_planned:
                typer.echo(not_planned, err=True)
            typer.echo(text)
            return
        if resume:
            runs.note_resume(spec.run_dir, list(planned.resume_changes))
        if not_planned:
            typer.echo(not_planned, err=True)
        code = launcher.launch(spec, detach=detach)
        if detach:
            typer.echo(f"run {spec.run_id} started ({planned.target}); follow it: verl-deploy logs -f {spec.run_id}",
                       err=True)
    except (LaunchError, ValueError) as exc:
        raise _launch_error(exc) from None
    except OSError as exc:
        if exc.filename is None:  # not a file of ours (a connection's error): not ours to explain
            raise
        from verl_deploy.launchers.jobspec import launch_fault

        raise _launch_error(launch_fault(exc)) from None  # a host write no launcher explained (note_resume's, ...)
    if not detach:
        typer.echo(f"run {spec.run_id} ended with exit code {code}; run directory: {spec.run_dir}", err=True)
    raise typer.Exit(code)


@app.command()
def plan(
    args: list[str] = typer.Argument(
        None, metavar="[CONFIG] [-- KEY=VALUE ...]",
        help="Training config (YAML) as `run` takes it, then overrides after -- (verl's, with --runtime verl)."),
    runtime: str = typer.Option(DEFAULT_RUNTIME, "--runtime", help="verl-deploy (this project's trainer) or verl (upstream verl 0.9.1's main_ppo)."),
    gpus: str = typer.Option(None, "--gpus", help="GPUs per node: a count (8), all, or indices (default: the config's, else this host's)."),
    nodes: int = typer.Option(None, "--nodes", help="Nodes (default: 1)."),
    gpu_type: str = typer.Option(None, "--gpu-type", help="Plan for this GPU (gpu_types.yaml: H100, H200, A100-80GB, L40S, RTX-4090, ...) instead of this host's."),
    gpu_memory: str = typer.Option(None, "--gpu-memory", help="Plan for a GPU of this memory, e.g. 80g or 24GiB."),
    overrides: list[str] = typer.Option([], "--set", help="Config override key=value (repeatable)."),
    prompt_length: int = typer.Option(None, "--prompt-length", help="Tokens per prompt to plan for (default: the data file's, else a quarter of data.max_prompt_length typical and the limit worst; docs/plan.md)."),
    response_length: int = typer.Option(None, "--response-length", help="Typical mean response tokens, for padding-free micro-batches (default: a quarter of data.max_response_length; the worst case is always the limit)."),
    json_output: bool = typer.Option(False, "--json", help="Print the plan as JSON (docs/plan.md)."),
    verl_source: str = typer.Option(None, "--verl-source", help="With --runtime verl: plan from your verl's own defaults (its verl/trainer/config) where they differ from verl 0.9.1's."),
) -> None:
    """Will it fit? The per-GPU memory of every phase of a step, the verdict, and changes that make it fit.
    Exit 0 when it fits or is tight, 1 when it does not, 2 on bad input. See docs/plan.md."""
    from verl_deploy.launchers import LaunchError
    from verl_deploy.launchers.jobspec import gpus_of
    from verl_deploy.launchers.runplan import check_runtime, config_and_overrides
    from verl_deploy.plan import PlanError, plan as make_plan

    try:  # the arguments read as `run` reads them (launchers/runplan.py)
        runtime = check_runtime(runtime)
        config, overrides = config_and_overrides(args or [], overrides, runtime)
        if verl_source:
            overrides = [*_source_defaults(verl_source, runtime), *overrides]  # the command line's win
        if gpu_type and gpu_memory and (note := _gpu_memory_of_type(gpu_type, gpu_memory)):
            typer.echo(note, err=True)
        result = make_plan(config, overrides, runtime=runtime, gpus=gpus_of(gpus), nodes=nodes, gpu_type=gpu_type,
                           gpu_memory=gpu_memory, prompt_length=prompt_length, response_length=response_length)
    except (PlanError, LaunchError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    from verl_deploy.plan.render import to_json, to_renderables

    if json_output:
        typer.echo(to_json(result))
    else:
        from rich.console import Console

        console = Console(highlight=False)
        for item in to_renderables(result):
            console.print(item)
    raise typer.Exit(result.exit_code)


def _gpu_memory_of_type(gpu_type: str, gpu_memory: str) -> str | None:
    """`plan --gpu-type T --gpu-memory M`: M is planned for, on T's name. Less than T's board holds is a real case (a
    MIG slice, a GPU shared with other work): one note says which memory is used. More than the board holds cannot
    be: LaunchError. None when they agree (within the GiB gpu_types.yaml rounds to), or when either is not
    understood (the planner says so)."""
    from verl_deploy import gpu_types, sizes
    from verl_deploy.launchers import LaunchError

    try:
        gpu, size = gpu_types.lookup(gpu_type), sizes.parse_size("--gpu-memory", gpu_memory, "80g")
    except ValueError:
        return None
    board = gpu.memory_gib * sizes.GiB
    if size > board + sizes.GiB:
        raise LaunchError(f"--gpu-memory {gpu_memory} is more than the {gpu.name}'s {gpu.memory_gib} GiB: drop "
                          f"--gpu-memory to plan for the whole {gpu.name}, or --gpu-type for a GPU of {gpu_memory}")
    if size >= board:
        return None
    return (f"note: planning for --gpu-memory {gpu_memory} ({size / sizes.GiB:.1f} GiB) of the {gpu.name}'s "
            f"{gpu.memory_gib} GiB (a MIG slice, or a GPU shared with other work); --gpu-type alone plans for all of it")


@app.command()
def status(
    run_id: str = typer.Argument(None, help="The run (default: all runs, as `runs`)."),
    target: str = typer.Option(None, "--target", "-t", help="local | docker | k8s (default: as recorded)."),
    namespace: str = typer.Option(None, "--namespace", "-n"),
    runs_dir: Path = _RUNS_DIR_OPTION,
    json_output: bool = typer.Option(False, "--json", help="Print as JSON."),
) -> None:
    """State of a run and its last metrics line (step, reward, throughput)."""
    import json

    from verl_deploy.launchers import LaunchError

    if run_id is None:
        _list_runs(target, namespace, runs_dir, json_output)
        return
    try:
        found = _launcher(target, run_id, runs_dir, namespace).status(run_id)
    except LaunchError as exc:
        raise _launch_error(exc) from None
    if json_output:
        typer.echo(json.dumps(found.to_json(), indent=2))
        return
    code = "" if found.exit_code is None else f" (exit {found.exit_code})"
    typer.echo(f"{found.run_id}  {found.target}  {found.state}{code}  {found.progress}")
    typer.echo(f"  run dir: {found.run_dir}")
    if line := _verl_source_line(found.run_dir):
        typer.echo(f"  {line}")
    if found.services:
        typer.echo(f"  services: {', '.join(f'{name} {url}' for name, url in found.services.items())}")
    if found.checkpoints:
        typer.echo(f"  checkpoints: {', '.join(found.checkpoints)}")
    then = "a resume passes over it" if found.checkpoints else "no checkpoint is left to resume from"
    for name, why in found.unusable_checkpoints.items():
        typer.echo(f"  warning: checkpoint {name} is unusable ({why}): {then}")
    if found.detail:
        typer.echo(f"  {found.detail}")


def _source_defaults(src: str, runtime: str) -> list[str]:
    """The planner's verl keys that the --verl-source's own config sets otherwise, as overrides."""
    from verl_deploy import runtimes
    from verl_deploy.launchers import LaunchError
    from verl_deploy.plan.workload import VERL_DEFAULTS
    from verl_deploy.verl_source import SourceError, default_overrides, resolve

    try:
        runtimes.trainer(runtime).check_verl_source()
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    try:
        return default_overrides(resolve(src), VERL_DEFAULTS)
    except SourceError as exc:
        raise LaunchError(str(exc)) from None


def _verl_source_line(run_dir) -> str | None:
    """What a --verl-source run trains (launch.json): the source, its commit and whether it had uncommitted edits."""
    from verl_deploy import runs

    launch = runs.read_launch(Path(run_dir)) if run_dir else None
    source = launch and launch.verl_source
    if not source:
        return None
    commit = (source.get("verl-source-commit") or "no commit")[:12]
    dirty = ", with uncommitted changes" if source.get("verl-source-dirty") == "true" else ""
    return f"verl source: {source.get('verl-source')} @ {commit}{dirty}"


@app.command()
def logs(
    run_id: str = typer.Argument(..., help="The run."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the run ends."),
    target: str = typer.Option(None, "--target", "-t"),
    namespace: str = typer.Option(None, "--namespace", "-n"),
    runs_dir: Path = _RUNS_DIR_OPTION,
) -> None:
    """The run's output."""
    import sys

    from verl_deploy.launchers import LaunchError

    try:
        for text in _launcher(target, run_id, runs_dir, namespace).logs(run_id, follow=follow):
            sys.stdout.write(text)
            sys.stdout.flush()
    except LaunchError as exc:
        raise _launch_error(exc) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@app.command()
def stop(
    run_id: str = typer.Argument(..., help="The run."),
    target: str = typer.Option(None, "--target", "-t"),
    namespace: str = typer.Option(None, "--namespace", "-n"),
    runs_dir: Path = _RUNS_DIR_OPTION,
) -> None:
    """Stop a run gracefully (SIGTERM: it writes a checkpoint; `run --resume RUN` continues it)."""
    from verl_deploy.launchers import LaunchError

    try:
        said = _launcher(target, run_id, runs_dir, namespace).stop(run_id)
    except LaunchError as exc:
        raise _launch_error(exc) from None
    typer.echo(said or f"stopped {run_id}")


@app.command()
def report(
    run_ids: list[str] = typer.Argument(..., metavar="RUN", help="Run ids under the runs directory, or run directories."),
    out: Path = typer.Option(None, "--out", "-o", help="Where index.html and the PNGs go (default: the run's directory, RUN/report; for several runs the first one's RUN/report-vs-OTHERS)."),
    runs_dir: Path = _RUNS_DIR_OPTION,
) -> None:
    """Chart runs' metrics, overlaid, as one self-contained HTML page and PNGs.

    Score, KL, entropy, length, grad norm, throughput, time per phase, validation (docs/metrics.md)."""
    from verl_deploy import runs
    from verl_deploy.report import ReportError, default_out, find_runs, write_report

    try:
        found = find_runs(run_ids, runs_dir or runs.default_runs_root())
        written = write_report(found, out or default_out(found))
    except ReportError as exc:
        raise _launch_error(exc) from None
    skipped = f" (no data for: {', '.join(written.skipped)})" if written.skipped else ""
    typer.echo(f"wrote {written.page}: {len(written.charts)} charts{skipped}; open it in a browser")


@app.command()
def export(
    run_id: str = typer.Argument(..., help="The run: its id under the runs directory, or a run directory's path."),
    out: Path = typer.Option(None, "--out", "-o", help="The model directory to write (new or empty); a Kubernetes run's goes on its claim (runs/RUN/hf/step_N), not here."),
    step: int = typer.Option(None, "--step", help="The checkpoint's step (default: the newest usable)."),
    dtype: str = typer.Option(None, "--dtype", help="float32 | bfloat16 | float16 (default: the base model's)."),
    max_shard_size: str = typer.Option(None, "--max-shard-size", help="Largest safetensors shard, e.g. 2GB (default: 5GB)."),
    image: str = typer.Option(None, "--image", help="Export in this image (default: the run's, where this Python has no torch)."),
    in_image: bool = typer.Option(None, "--in-image/--on-host", help="Run the export in the run's image, or here (default: here when torch is installed)."),
    push_to_hub: str = typer.Option(None, "--push-to-hub", help="Then upload it to this Hub repository (org/name); the token: $HF_TOKEN or .secrets/HF_TOKEN."),
    private: bool = typer.Option(False, "--private", help="Create the Hub repository private."),
    runs_dir: Path = _RUNS_DIR_OPTION,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the command (a Kubernetes run: the Job) that would export; write nothing."),
    detach: bool = typer.Option(False, "--detach", "-d", help="A Kubernetes run: create the export Job and return without waiting."),
) -> None:
    """Write a run's checkpoint as a Hugging Face model directory (config, safetensors, tokenizer, generation
    config) that transformers, vLLM and the Hub load."""
    from verl_deploy import runs
    from verl_deploy.export import hub_token, plan_export, push_to_hub as push, run_export
    from verl_deploy.launchers import LaunchError, k8s_export
    from verl_deploy.launchers.k8s import Cluster

    try:
        run_dir = runs.run_dir_of(run_id, runs_dir or runs.default_runs_root())
        if k8s_export.on_cluster(run_dir):  # its checkpoints are on its claim: a Job exports them there
            cluster_plan = k8s_export.plan(run_dir, step=step, dtype=dtype, max_shard_size=max_shard_size, out=out,
                                           image=image, push_to_hub=push_to_hub)
            if dry_run:
                typer.echo(cluster_plan.dry_run(), nl=False)
                return
            k8s_export.run(cluster_plan, Cluster(), detach=detach, echo=typer.echo)
            return
        plan = plan_export(run_dir, out, step=step, dtype=dtype, max_shard_size=max_shard_size, image=image,
                           in_image=in_image)
        if dry_run:
            typer.echo(plan.describe())
            return
        if push_to_hub:
            hub_token()  # a missing token is said now, not after the export
        code = run_export(plan, echo=lambda text, end="": typer.echo(text, nl=False, err=True))
        if code:
            raise typer.Exit(code)
        typer.echo(f"model directory {plan.out}: AutoModelForCausalLM.from_pretrained(\"{plan.out}\") or "
                   f"`vllm serve {plan.out}` load it")
        if push_to_hub:
            typer.echo(f"pushed to {push(plan.out, push_to_hub, private)}")
    except (LaunchError, runs.UnknownRun) as exc:
        raise _launch_error(exc) from None


# `runs` lists; `runs rm RUN` removes. A sub-app whose callback lists when no command follows keeps `verl-deploy runs
# [--target ...]` as it was.
runs_app = typer.Typer(help="List runs; `runs rm RUN` removes one.")
app.add_typer(runs_app, name="runs")


@runs_app.callback(invoke_without_command=True)
def runs_(
    ctx: typer.Context,
    target: str = typer.Option(None, "--target", "-t", help="Only this target (default: local, docker and direct: runs `python -m verl_runtime train` started)."),
    namespace: str = typer.Option(None, "--namespace", "-n"),
    runs_dir: Path = _RUNS_DIR_OPTION,
    json_output: bool = typer.Option(False, "--json", help="Print as JSON."),
) -> None:
    """List runs (found by the verl-deploy.run-id label, and in the runs directory); `runs rm RUN` removes one."""
    if ctx.invoked_subcommand is None:
        _list_runs(target, namespace, runs_dir, json_output)


def _list_runs(target: str | None, namespace: str | None, runs_dir: Path | None, json_output: bool) -> None:
    import json

    from verl_deploy.launchers import LaunchError

    from verl_deploy.runs import DIRECT, runs_table

    found = []
    for name in [target] if target else ["local", "docker", "slurm", DIRECT]:
        try:
            found += _launcher(name, None, runs_dir, namespace).list()
        except LaunchError as exc:
            if target:
                raise _launch_error(exc) from None
            typer.echo(f"warning: {name} runs not listed: {exc}", err=True)
    found.sort(key=lambda r: r.started, reverse=True)  # newest first; those of unknown start last
    if json_output:
        typer.echo(json.dumps([r.to_json() for r in found], indent=2))
        return
    typer.echo(runs_table(found) if found else "no runs")


def _interactive() -> bool:
    import sys

    return sys.stdin.isatty()


@runs_app.command("rm")
def runs_rm(
    run_id: str = typer.Argument(..., help="The run."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Remove without asking."),
    target: str = typer.Option(None, "--target", "-t", help="local | docker | k8s (default: as recorded)."),
    namespace: str = typer.Option(None, "--namespace", "-n"),
    runs_dir: Path = _RUNS_DIR_OPTION,
) -> None:
    """Remove a run: its run directory; on Docker the containers and network it left; on Kubernetes its Job or
    RayJob, ConfigMap and run claim (<run>-runs: its checkpoints). The shared cache claim and --data claims stay.
    A local or Docker run that still runs is refused: `stop` it first."""
    from verl_deploy.launchers import LaunchError

    if not yes and not _interactive():  # nobody to ask: never remove checkpoints unasked
        raise _launch_error(LaunchError(f"`runs rm {run_id}` asks before it removes anything, and there is no "
                                        "terminal to ask on: pass --yes"))

    def confirm(items: list[str]) -> None:
        if yes:
            return
        typer.echo(f"removing run {run_id} removes:")
        for item in items:
            typer.echo(f"  {item}")
        if not typer.confirm("remove them?", default=False):
            typer.echo("nothing removed", err=True)
            raise typer.Exit(1)

    try:
        removed = _launcher(target, run_id, runs_dir, namespace).remove(run_id, confirm=confirm)
    except LaunchError as exc:
        raise _launch_error(exc) from None
    except OSError as exc:
        raise _launch_error(LaunchError(f"cannot remove {exc.filename or run_id}: {exc.strerror}")) from None
    typer.echo(f"removed run {run_id}: {', '.join(removed)}")


# --- images: build, pull, push, list the variants of docker/variants.yaml ---------------------------------------

images_app = typer.Typer(
    help="Build, pull, push and list the runtime images (variants: docker/variants.yaml).", no_args_is_help=True
)
app.add_typer(images_app, name="images")
_VARIANT_OPTION = typer.Option("auto", "--variant", help="A variant of docker/variants.yaml (`images list` shows them) or auto: what this host runs best.")
_REGISTRY_OPTION = typer.Option(None, "--registry", help="Registry host[:port] the tag is for, e.g. 127.0.0.1:5000.")
_RUNTIME_OPTION = typer.Option(DEFAULT_RUNTIME, "--runtime", help="What trains in the image: verl-deploy (this project's runtime) or verl (upstream verl and its main_ppo; `images list` shows the versions).")
_VERL_SOURCE_OPTION = typer.Option(None, "--verl-source", help="With --runtime verl: your own verl, a folder (a fork, or a repository vendoring verl/), git+https://HOST/REPO.git@REV or a pip requirement (verl==0.8.0); its declared pins choose the image (docs/verl.md).")


def _verl_source(src: str | None):
    """--verl-source resolved (verl_source.resolve), or None; its one-line refusal as exit 2."""
    if src is None:
        return None
    from verl_deploy.verl_source import SourceError, resolve

    try:
        return resolve(src)
    except SourceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _image_error(exc: Exception, code: int = 1) -> typer.Exit:
    """One line; exit 2 for input refused before the engine is asked (as every command's bad input), 1 for what the
    engine, a registry or a build then fails at."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(code)


def _print_pushed(console, ref: str, runtime: str) -> None:
    """The pushed reference (pinned to its digest) and how a cluster runs it: a node pulls it by that digest."""
    from verl_deploy import runtimes

    flag = runtimes.trainer(runtime).flag
    flags = f" {flag}" if flag else ""
    console.print(f"pushed {ref}", markup=False)  # an IPv6 registry's [::1] is no markup
    console.print(f"run it on Kubernetes: verl-deploy run CONFIG --target k8s{flags} --image {ref}", markup=False)


@images_app.command("build")
def images_build(
    variant: str = _VARIANT_OPTION,
    base_image: str = typer.Option(None, "--base-image", help="Base image (default: the catalog's slim Python image)."),
    tag: str = typer.Option(None, "--tag", help="Image tag (default: REGISTRY/verl-deploy:<version>-<variant>)."),
    registry: str = _REGISTRY_OPTION,
    pip_index_url: str = typer.Option(None, "--pip-index-url", help="Package index, a mirror (default: $PIP_INDEX_URL)."),
    pip_extra_index_url: list[str] = typer.Option([], "--pip-extra-index-url", help="More indexes (repeatable) (default: $PIP_EXTRA_INDEX_URL)."),
    torch_index_url: str = typer.Option(None, "--torch-index-url", help="A torch index (a mirror) for the torch step (default: PyPI; for cpu, PyTorch's CPU index)."),
    wheelhouse: Path = typer.Option(None, "--wheelhouse", help="Folder of wheels pip may install from (torch from it when it holds the pinned one)."),
    ca_bundle: Path = typer.Option(None, "--ca-bundle", help="CA bundle for pip in the build (TLS-intercepting proxy) (default: $PIP_CERT or $REQUESTS_CA_BUNDLE)."),
    keep_ca_bundle: bool = typer.Option(False, "--keep-ca-bundle", help="Keep the CA bundle in the image and trust it there."),
    push: bool = typer.Option(False, "--push", help="Push the image when built."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Rebuild every layer."),
    runtime: str = _RUNTIME_OPTION,
    verl_source: str = _VERL_SOURCE_OPTION,
) -> None:
    """Build a variant's image (the trainer runtime on torch) through the Docker engine."""
    from rich.console import Console

    from verl_deploy import images
    from verl_deploy.images.build import build
    from verl_deploy.images.context import check
    from verl_deploy.images.registry import digest_in, push as push_image
    from verl_deploy.verl_source import SourceError

    console = Console(highlight=False, soft_wrap=True)
    source = _verl_source(verl_source)
    try:
        opts, notes = images.plan_build(
            variant, base_image=base_image, tag=tag, registry=registry, pip_index_url=pip_index_url,
            pip_extra_index_urls=tuple(pip_extra_index_url), torch_index_url=torch_index_url, wheelhouse=wheelhouse,
            ca_bundle=ca_bundle, keep_ca_bundle=keep_ca_bundle, no_cache=no_cache, runtime_name=runtime,
            verl_source=source,
        )
        check(opts)  # --wheelhouse, --ca-bundle: before the engine is asked
    except SourceError as exc:  # no catalogued variant runs its pins: refused before building
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except images.ImageError as exc:
        raise _image_error(exc, 2) from None
    try:
        for note in notes:
            console.print(note, markup=False)
        built = build(opts, console)
        console.print(f"built {built.tag} ({built.size / 1e9:.2f} GB, {built.seconds:.0f} s)")
        if push:
            line = push_image(built.tag, console)
            console.print(line)
            if digest := digest_in(line):
                _print_pushed(console, f"{built.tag}@{digest}", runtime)
    except images.ImageError as exc:
        raise _image_error(exc) from None


@images_app.command("pull")
def images_pull(
    variant: str = _VARIANT_OPTION,
    registry: str = _REGISTRY_OPTION,
    tag: str = typer.Option(None, "--tag", help="Full image reference (default: REGISTRY/verl-deploy:<version>-<variant>)."),
    runtime: str = _RUNTIME_OPTION,
) -> None:
    """Pull a variant's image, with a progress bar per layer (credentials: your Docker config)."""
    from rich.console import Console

    from verl_deploy import images
    from verl_deploy.images.registry import pull

    console = Console(highlight=False, soft_wrap=True)
    try:
        ref = images.pull_ref(variant, registry, tag, runtime)
    except images.ImageError as exc:  # no registry, an unknown variant: nothing asked of the engine yet
        raise _image_error(exc, 2) from None
    try:
        console.print(pull(ref, console))
    except images.ImageError as exc:
        raise _image_error(exc) from None


@images_app.command("push")
def images_push(
    registry: str = typer.Option(None, "--registry", help="Where to push: HOST, HOST:PORT or HOST:PORT/PATH, e.g. registry.example.com:5000/team (credentials: your Docker config, as `docker push`)."),
    variant: str = _VARIANT_OPTION,
    tag: str = typer.Option(None, "--tag", help="A local image to push instead of the variant's, e.g. verl-deploy:0.1.0-cpu (its repository name and tag are kept)."),
    runtime: str = _RUNTIME_OPTION,
) -> None:
    """Push a variant's local image to a registry as REGISTRY/verl-deploy:<tag>, with a bar per layer; prints it
    pinned to the registry's digest, the --image for `run --target k8s`."""
    from rich.console import Console

    from verl_deploy import images, runtimes
    from verl_deploy.images.registry import check_registry, publish

    console = Console(highlight=False, soft_wrap=True)
    try:
        registry = check_registry(registry)
        if tag:
            local, missing = tag, "`docker images` lists the local images"
        else:
            name = images.resolve_variant(variant, runtime)
            flags = f"--variant {name} {runtimes.trainer(runtime).flag}".rstrip()
            local = images.image_tag(name, runtime_name=runtime)
            missing = f"build it first (verl-deploy images build {flags}), or name a local image with --tag"
    except images.ImageError as exc:  # the registry's spelling, an unknown variant: before the engine is asked
        raise _image_error(exc, 2) from None
    try:
        pushed = publish(local, registry, console, missing)
    except images.ImageError as exc:
        raise _image_error(exc) from None
    _print_pushed(console, pushed, runtime)


@images_app.command("list")
def images_list() -> None:
    """Every variant: its local image (tag, size, created) and whether this host can run it, and why not."""
    from rich.console import Console

    from verl_deploy.images.listing import list_variants, table

    Console().print(table(*list_variants()))


@app.command()
def smoke(
    target: str = typer.Option("docker", "--target", "-t", help="local | docker | k8s"),
    image: str = typer.Option(None, "--image", help="Image to prove (default: the variant's local tag)."),
    variant: str = typer.Option(None, "--variant", help=f"Image variant (default auto: cpu without --gpus; with them, this host's best, or {CLUSTER_GPU_VARIANT} on k8s)."),
    gpus: str = typer.Option(None, "--gpus", help="GPUs for the run: all, a count, indices or UUIDs."),
    namespace: str = typer.Option("default", "--namespace", "-n", help="Kubernetes namespace."),
    runs_dir: Path = _RUNS_DIR_OPTION,
    json_path: Path = typer.Option(None, "--json", help="JSON summary (default: <run dir>/smoke.json)."),
    junit_path: Path = typer.Option(None, "--junit", help="JUnit XML (default: <run dir>/smoke-junit.xml)."),
    timeout_s: float = typer.Option(900, "--timeout", help="Seconds before the run counts as failed."),
) -> None:
    """Two training steps of the built-in tiny model in an image: one PASS/FAIL line, JSON and JUnit XML. Exit 0 on pass."""
    import dataclasses

    from verl_deploy import runs, smoke as smoke_test
    from verl_deploy.launchers import LaunchError, ensure_default_image, get_launcher
    from verl_deploy.launchers.jobspec import new_run_id
    from verl_deploy.launchers.runplan import RunRequest, plan_run

    root = runs_dir or runs.default_runs_root()
    run_id = new_run_id(Path("smoke"))
    try:
        with smoke_test.config_written(root, run_id) as config:
            planned = plan_run(RunRequest(args=(str(config),), target=target, gpus=gpus, image=image,
                                          variant=variant, shm_size="1g", namespace=namespace, run_id=run_id), root)
        spec = planned.spec
        if planned.build_image:
            spec = dataclasses.replace(spec, image=ensure_default_image(planned.variant, spec.runtime))
        result = smoke_test.run_smoke(get_launcher(planned.target, root, namespace), spec, timeout_s=timeout_s)
    except (LaunchError, ValueError) as exc:
        raise _launch_error(exc) from None
    smoke_test.write_json(result, json_path or spec.run_dir / "smoke.json")
    smoke_test.write_junit(result, junit_path or spec.run_dir / "smoke-junit.xml")
    if not result.passed and result.log_tail:
        typer.echo(result.log_tail.rstrip()[-2000:], err=True)  # what the run said last, before the verdict
    typer.echo(result.line)
    raise typer.Exit(0 if result.passed else 1)
