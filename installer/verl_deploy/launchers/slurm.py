"""JobSpec -> a Slurm batch script, submitted with `sbatch`; followed through squeue (sacct where accounting runs)
and the run directory.

The script is a pure function of the spec and SlurmOptions (batch_script), so the dry run prints exactly what is
submitted. One node: the trainer runs in the batch step. Several: a Ray head on the first node (the batch step's),
workers on the others through `srun`, and the trainer on the head with world size nodes x GPUs, the shape of the
Docker and KubeRay multi-node paths.

Signals. The batch shell forwards a TERM it gets (`stop`: `scancel --signal=TERM --batch`; preemption's warning:
`--signal=B:TERM@120`) to the trainer as HUP, which the runtime also takes as "checkpoint and stop". HUP, not TERM:
a cancel, requeue or time limit sends TERM to every process of the job, the trainer included, and a second TERM
would make the trainer skip its checkpoint; two different signals each ask once. A requeued job runs the script
again and the trainer resumes from its last checkpoint (trainer.resume=auto).

The script writes job-exit.json when its trainer ends: the run's state once the job has left squeue, with no
accounting database needed.

The Hugging Face cache outlives the job. In a container it is a directory on the shared storage every node mounts:
--hf-cache PATH, else CACHE_DIR_NAME under the runs directory (which the nodes share anyway), bind-mounted at the
image's HF_HOME, so a requeue, a resumed run and the next run read the models downloaded before (a container's own
file system, or a tmpfs, would be thrown away with the job). --container none keeps the job's own HF_HOME (the
submit environment's, which sbatch exports; else ~/.cache/huggingface), or --hf-cache PATH.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from verl_deploy import runs, sizes
from verl_deploy.launchers.jobspec import JobSpec, LaunchError, pools_line, remove_run_dir
from verl_deploy.runs import RunStatus
from verl_runtime.rundir import JOB_EXIT, JOB_LOG, JOB_SCRIPT

CONTAINERS = ("none", "docker", "apptainer", "pyxis")  # how a node runs the trainer: the --container choices
RAY_PORT = 6379
# Seconds of warning before the time limit (or a preemption that honours it): the trainer's checkpoint time.
SIGNAL_WARNING_S = 120
# squeue's states: those still to run, and those running; any other is an end (COMPLETED, FAILED, CANCELLED, ...).
PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESIZING"}
# The containers' Hugging Face cache under the runs directory when --hf-cache names none: never a run id (those are
# DNS labels, without '_'), so `runs` never takes it for a run.
CACHE_DIR_NAME = "hf_cache"
PREFLIGHT_DIR = "preflight"  # in the run directory: each node's decisions for its trainer (NODE.env)
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^\d+-\d+$")  # sbatch's --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S


@dataclass(frozen=True)
class SlurmOptions:
    """Where and how a job runs on Slurm (None: the cluster's default, or on --resume the run's recorded one)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    container: str | None = None  # one of CONTAINERS (None: none)
    python: str = sys.executable  # --container none: the venv on shared storage that trains

    @property
    def mode(self) -> str:
        return self.container or "none"


def check_options(options: SlurmOptions) -> SlurmOptions:
    if options.container is not None and options.container not in CONTAINERS:
        raise LaunchError(f"--container {options.container!r}: use one of {', '.join(CONTAINERS)}")
    if options.time is not None and not _TIME.match(options.time):
        raise LaunchError(f"--time {options.time!r}: use Slurm's form, e.g. 30, 4:00:00 or 2-00:00:00 (days-hours)")
    return options


def _gpus_per_node(spec: JobSpec) -> int:
    if spec.gpus.device_ids or spec.gpus.count < 0:
        raise LaunchError(f"--gpus {spec.gpus}: on Slurm give a count per node (e.g. --gpus 8): the scheduler "
                          "picks the devices")
    # trainer.mode=separate_async: the rollout's pool shares the allocation's nodes (Ray places its workers)
    return (spec.gpus.number or 0) + -(-spec.rollout_gpus // spec.nodes)


def job_size(spec: JobSpec) -> sizes.PodSize:
    """A node's share for the job: sized from its GPUs as a Kubernetes pod is (sizes.pod_size)."""
    return sizes.pod_size(_gpus_per_node(spec), spec.cpus, spec.memory, spec.shm_size)


def with_cache(spec: JobSpec, options: SlurmOptions) -> JobSpec:
    """The spec with the host directory a container's Hugging Face cache lives in (see the module's doc): --hf-cache,
    else CACHE_DIR_NAME beside the run directory. --container none is left as it is (the job's own HF_HOME)."""
    if options.mode == "none" or spec.hf_cache is not None:
        return spec
    return dataclasses.replace(spec, hf_cache=spec.run_dir.parent / CACHE_DIR_NAME)


# --- the batch script -------------------------------------------------------------------------------------------

def directives(spec: JobSpec, options: SlurmOptions) -> list[str]:
    """The #SBATCH lines: resources per node (memory counts /dev/shm, as on Kubernetes), output, preemption."""
    size, gpus = job_size(spec), _gpus_per_node(spec)
    lines = [
        f"--job-name={spec.run_id}",
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={math.ceil(size.cpus)}",
        f"--mem={math.ceil(size.memory_limit / sizes.MiB)}M",
    ]
    if gpus:
        lines.append(f"--gres=gpu:{gpus}")
    lines += [f"--{flag}={value}" for flag, value in
              (("partition", options.partition), ("account", options.account), ("time", options.time)) if value]
    lines += [
        f"--output={spec.run_dir / JOB_LOG}",
        "--open-mode=append",  # a requeued start adds to the log
        f"--signal=B:TERM@{SIGNAL_WARNING_S}",
        "--requeue",
    ]
    return [f"#SBATCH {line}" for line in lines]


def _venv_env(spec: JobSpec) -> dict[str, str]:
    if spec.upstream:  # the source first on PYTHONPATH, verl's file logger into the run directory
        from verl_deploy.launchers import host_verl

        return host_verl.environment(spec)
    env = {"PYTHONUNBUFFERED": "1", **spec.env}
    if spec.hf_cache:
        env["HF_HOME"] = str(spec.hf_cache)
    return env


def _container_flags(spec: JobSpec, nodes: int) -> list[str]:
    """`docker run` flags of the run's container (launchers/docker.py's, minus what a batch job does itself):
    host networking where Ray spans nodes; secrets by name from the job's environment, never written down."""
    from verl_deploy.launchers.docker import container_options, docker_run_args, without_ulimits

    # No --ulimit: the job's limits are the cluster's (Slurm propagates them); an engine may refuse to raise them.
    # No services: the trainer starts them beside itself on the head node (a Docker target's containers are not here).
    options = without_ulimits(container_options(dataclasses.replace(spec, secrets=(), loaded=None)))
    options.pop("labels", None)
    options.pop("name", None)
    if nodes > 1:
        options["network"] = "host"
    args = docker_run_args(options)[2:]  # after `docker run`
    return args[: args.index(spec.image)] + [part for name in spec.secrets for part in ("-e", name)]


def _mounts_arg(spec: JobSpec) -> str:
    return ",".join(f"{m.source}:{m.target}" + (":ro" if m.read_only else "") for m in spec.mounts)


def in_container(spec: JobSpec, options: SlurmOptions, argv: list[str], env: dict[str, str], role: str) -> str:
    """The shell line that runs argv on a node the --container way. Pyxis runs only through srun, so there the
    line is a step of its own; the other modes run in the shell that calls them."""
    mode = options.mode
    if mode == "none":
        exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
        return f"env {exports} {shlex.join(argv)}"
    if mode == "docker":
        name = f"{spec.run_id}-{role}-$SLURM_JOB_ID"
        flags = [*_container_flags(spec, spec.nodes), *[p for k, v in env.items() for p in ("-e", f"{k}={v}")]]
        flags.append("--entrypoint=")  # argv is a whole command line (the trainer's, or Ray's)
        return f"docker run --rm --name {name} {shlex.join(flags)} {shlex.quote(spec.image)} {shlex.join(argv)}"
    exports = [f"{key}={value}" for key, value in {**spec.container_env, **env}.items()]
    if mode == "apptainer":
        flags = ["--cleanenv", "--bind", _mounts_arg(spec), *[p for e in exports for p in ("--env", e)]]
        if spec.gpus.wanted:
            flags.append("--nv")
        return f"apptainer exec {shlex.join(flags)} \"$VERL_DEPLOY_IMAGE_URI\" {shlex.join(argv)}"
    flags = [f"--container-image={spec.image}", f"--container-mounts={_mounts_arg(spec)}",
             "--container-writable", "--no-container-mount-home"]
    where = {"worker": _workers_srun(spec), "preflight": _every_node_srun(spec)}.get(
        role, 'srun --overlap --nodes=1 --ntasks=1 -w "$VERL_DEPLOY_HEAD"')
    return f"env {' '.join(shlex.quote(e) for e in exports)} {where} {shlex.join(flags)} {shlex.join(argv)}"


def _workers_srun(spec: JobSpec) -> str:
    """One task on each node but the first (the head's)."""
    others = spec.nodes - 1
    return f'srun --overlap --nodes={others} --ntasks={others} --ntasks-per-node=1 --exclude="$VERL_DEPLOY_HEAD"'


def _every_node_srun(spec: JobSpec) -> str:
    return f"srun --nodes={spec.nodes} --ntasks={spec.nodes} --ntasks-per-node=1"


def _preflight(spec: JobSpec, options: SlurmOptions, env: dict[str, str], exit_record: str) -> list[str]:
    """The pre-flight across the nodes, one task on each, before Ray and the trainer (launchers/preflight.py). In a
    venv (--container none) each node's doctor writes what it decided for its trainer (the interface, where
    GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME are unset) to a file the node's Ray process then reads."""
    from verl_deploy.launchers import preflight

    none = options.mode == "none"
    env_file = f"{spec.run_dir / PREFLIGHT_DIR}/$SLURMD_NODENAME.env" if none else None
    argv = preflight.doctor_argv(options.python if none else "python", spec.nodes, "$SLURM_NODEID",
                                 "$VERL_DEPLOY_HEAD_IP", env_file)
    words = ("$SLURM_NODEID", f"$VERL_DEPLOY_HEAD_IP:{preflight.PORT}", env_file or "")
    if options.mode == "pyxis":  # the container's shell reads each node's own $SLURM_NODEID
        step = in_container(spec, options, ["bash", "-c", _expand(shlex.join(argv), words)], env, "preflight")
    else:
        step = f"{_every_node_srun(spec)} bash -c {shlex.quote(_expand(in_container(spec, options, argv, env, 'preflight'), words))}"
    return [
        "# The pre-flight across the nodes (verl-deploy doctor --nodes, docs/multinode.md), one task per node before",
        "# Ray and the trainer: a failure ends the job here, one line per finding above (run --no-preflight skips it).",
        f"{step} || {{ code=$?; echo \"[verl-deploy] job $SLURM_JOB_ID: the pre-flight across the nodes failed: no "
        f"trainer started\"; {exit_record}; exit $code; }}",
    ]


def _preflight_env(spec: JobSpec) -> str:
    """Reads what this node's pre-flight decided for its trainer (a venv's nodes: see _preflight)."""
    path = f'"{spec.run_dir / PREFLIGHT_DIR}/$SLURMD_NODENAME.env"'
    return f"if [ -f {path} ]; then set -a; . {path}; set +a; fi"


def _python(spec: JobSpec, options: SlurmOptions) -> str:
    """--container none: the venv that trains, on shared storage (upstream verl's: the python3 on PATH, host_verl)."""
    if spec.upstream:
        from verl_deploy.launchers import host_verl

        return host_verl.python()
    return options.python


def _trainer_argv(spec: JobSpec, options: SlurmOptions) -> list[str]:
    if options.mode == "none" and spec.upstream:
        from verl_deploy.launchers import host_verl

        return host_verl.argv(spec, _python(spec, options))
    if options.mode == "none":
        return [options.python, "-m", "verl_runtime", *spec.command.host_args]
    return list(spec.command.shell)


def _ray(spec: JobSpec, options: SlurmOptions) -> str:
    """The `ray` executable: the venv's beside its python, or the image's."""
    return str(Path(_python(spec, options)).parent / "ray") if options.mode == "none" else "ray"


def _loader(spec: JobSpec, options: SlurmOptions) -> list[str]:
    """What a Ray node runs under to have the secret files: the image's loader; none in a venv (the job's
    environment has them)."""
    return list(spec.command.secrets_loader) if options.mode != "none" else []


def ray_head(spec: JobSpec, options: SlurmOptions) -> list[str]:
    return [*_loader(spec, options), _ray(spec, options), "start", "--head", f"--port={RAY_PORT}",
            "--node-ip-address=$VERL_DEPLOY_HEAD_IP", "--disable-usage-stats", "--block"]


def ray_worker(spec: JobSpec, options: SlurmOptions) -> list[str]:
    return [*_loader(spec, options), _ray(spec, options), "start", "--address=$RAY_ADDRESS", "--block"]


def _expand(line: str, words: tuple[str, ...] = ()) -> str:
    """shlex quotes $VARS in single quotes; the node's shell must expand these few (double quotes)."""
    for word in ("--node-ip-address=$VERL_DEPLOY_HEAD_IP", "--address=$RAY_ADDRESS", "RAY_ADDRESS=$RAY_ADDRESS",
                 *filter(None, words)):
        line = line.replace(f"'{word}'", f'"{word}"')
    return line.replace("RAY_ADDRESS='$RAY_ADDRESS'", 'RAY_ADDRESS="$RAY_ADDRESS"')


def batch_script(spec: JobSpec, options: SlurmOptions) -> str:
    """The whole batch script (pure: what `--dry-run` prints is what sbatch gets)."""
    spec = with_cache(spec, options)
    env = _venv_env(spec) if options.mode == "none" else dict(spec.env)
    exit_file = spec.run_dir / JOB_EXIT
    lines = [
        "#!/bin/bash",
        f"# verl-deploy run {spec.run_id}: written by `verl-deploy run --target slurm`; a requeue runs it again.",
        *directives(spec, options),
        "set -u",
        f"rm -f {shlex.quote(str(exit_file))}",
        "echo \"[verl-deploy] job $SLURM_JOB_ID start ${SLURM_RESTART_COUNT:-0} on $(hostname)\"",
        "export VERL_DEPLOY_HEAD=$(hostname -s)",
    ]
    if options.mode == "apptainer":  # a local image when this node's Docker has it, else the registry's
        image = shlex.quote(spec.image)
        lines.append(f"if docker image inspect {image} >/dev/null 2>&1; then export VERL_DEPLOY_IMAGE_URI=docker-daemon://"
                     f"{image}; else export VERL_DEPLOY_IMAGE_URI=docker://{image}; fi")
    if options.mode == "docker":  # a container a killed start left behind (docker run outlives a SIGKILL)
        lines.append(f"docker rm -f $(docker ps -aq --filter name=^{spec.run_id}-) >/dev/null 2>&1 || true")
    exit_record = (f"printf '{{\"job_id\": \"%s\", \"restart\": %s, \"exit_code\": %s}}\\n' \"$SLURM_JOB_ID\" "
                   f"\"${{SLURM_RESTART_COUNT:-0}}\" \"$code\" > {shlex.quote(str(exit_file))}.tmp && "
                   f"mv {shlex.quote(str(exit_file))}.tmp {shlex.quote(str(exit_file))}")
    if spec.nodes > 1:
        lines.append("export VERL_DEPLOY_HEAD_IP=$(hostname --ip-address | awk '{print $1}')")
        checked = spec.preflight and not (spec.upstream and options.mode != "none")  # verl's image lacks the doctor
        if checked:
            lines += _preflight(spec, options, env, exit_record)
        worker_line = in_container(spec, options, ray_worker(spec, options), env, "worker")
        if checked and options.mode == "none":
            lines.append(_preflight_env(spec))
            worker_line = f"{_preflight_env(spec)}; {worker_line}"
        head, worker = _expand(in_container(spec, options, ray_head(spec, options), env, "head")), _expand(worker_line)
        lines += [
            "# A Ray head here (the first node), workers on the other nodes; the trainer joins through RAY_ADDRESS.",
            f"export RAY_ADDRESS=$VERL_DEPLOY_HEAD_IP:{RAY_PORT}",
            f"{head} &",
            "ray_head=$!",
            f"until (exec 3<>/dev/tcp/$VERL_DEPLOY_HEAD_IP/{RAY_PORT}) 2>/dev/null; do",
            "  kill -0 $ray_head 2>/dev/null || { echo '[verl-deploy] the Ray head did not start'; exit 1; }",
            "  sleep 1",
            "done",
            # pyxis' line is the workers' srun itself; the others run in a shell on each worker node
            f"{worker} &" if options.mode == "pyxis" else f"{_workers_srun(spec)} bash -c {shlex.quote(worker)} &",
            "ray_workers=$!",
        ]
        env = {**env, "RAY_ADDRESS": "$RAY_ADDRESS"}
    trainer = _expand(in_container(spec, options, _trainer_argv(spec, options), env, "trainer"))
    if spec.services:
        names = ", ".join(service.name for service in spec.services)
        lines.append(f"# The run's services ({names}) run on this (the head) node beside the trainer, which starts "
                     "and health-checks them and stops them with itself; their logs are in the run directory's "
                     "services/.")
    lines += [
        f"{trainer} &",
        "trainer=$!",
        "# TERM to this shell (stop, preemption warning) asks the trainer once, as HUP: see launchers/slurm.py.",
        "forwarded=0",
        "trap '[ $forwarded = 0 ] && forwarded=1 && kill -HUP $trainer 2>/dev/null' TERM",
        "wait $trainer; code=$?",
        "while kill -0 $trainer 2>/dev/null; do wait $trainer; code=$?; done  # a trap ends a wait early",
    ]
    if spec.nodes > 1:
        lines.append("kill $ray_workers $ray_head 2>/dev/null; wait $ray_workers $ray_head 2>/dev/null")
    lines += [
        "echo \"[verl-deploy] job $SLURM_JOB_ID: the trainer exited with code $code\"",
        exit_record,
        "exit $code",
    ]
    return "\n".join(lines) + "\n"


# --- asking the controller --------------------------------------------------------------------------------------

def _slurm(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise LaunchError(f"{argv[0]} not found: this host is no Slurm submit host (run from a login node, or install "
                          "Slurm's client); `verl-deploy run --target slurm --dry-run` prints the batch script")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise LaunchError(f"{argv[0]} failed: {said[-1] if said else f'exit code {done.returncode}'}")
    return done


def partition_gpus(gres: str) -> int:
    """The most GPUs one node of a partition offers, from sinfo's %G ("gpu:8", "gpu:h100:4(S:0-1),nic:1",
    "(null)")."""
    best = 0
    for item in gres.replace(" ", ",").split(","):
        parts = re.sub(r"\(.*\)", "", item).split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            best = max(best, int(parts[-1]))
    return best


def check_cluster(spec: JobSpec, options: SlurmOptions) -> None:
    """What the controller can refuse in one line before anything is submitted: the partition, its GPUs."""
    listed = _slurm("sinfo", "-h", "-o", "%P").stdout.split()
    names = [name.rstrip("*") for name in listed]
    partition = options.partition or next((n.rstrip("*") for n in listed if n.endswith("*")), None)
    if options.partition and options.partition not in names:
        raise LaunchError(f"--partition {options.partition}: this cluster has no such partition "
                          f"(it has: {', '.join(names) or 'none'}; `sinfo` lists them)")
    gpus = _gpus_per_node(spec)
    if gpus and partition:
        gres = _slurm("sinfo", "-h", "-p", partition, "-o", "%G").stdout.split()
        have = max((partition_gpus(g) for g in gres), default=0)
        if have < gpus:
            offers = f"its nodes have at most {have}" if have else "its nodes have none (sinfo -o %G)"
            raise LaunchError(f"--gpus {gpus}: partition {partition} cannot give a node {gpus} GPUs: {offers}; "
                              "ask for fewer, or pick a GPU partition with --partition")


def job_state(job_id: str) -> str | None:
    """The job's state as squeue says it, else sacct (where accounting runs); None: the controller forgot it."""
    done = _slurm("squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T", check=False)
    state = done.stdout.strip().split("\n")[0] if done.returncode == 0 else ""
    if state:
        return state
    if shutil.which("sacct"):
        done = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True,
                              text=True, timeout=60)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.split()[0].split()[0]
    return None


def _job_exit(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / JOB_EXIT).read_text())
    except (OSError, ValueError):
        return {}


class SlurmLauncher:
    target = "slurm"

    def __init__(self, runs_root: Path, options: SlurmOptions | None = None):
        self.runs_root = Path(runs_root)
        self.options = check_options(options or SlurmOptions())

    def _options(self, spec: JobSpec) -> SlurmOptions:
        """The options given now, over those the run recorded (a --resume keeps its partition and container)."""
        recorded = (runs.read_launch(spec.run_dir) or runs.Launch()).slurm
        given = dataclasses.asdict(self.options)
        return SlurmOptions(**{key: given[key] if given[key] is not None else recorded.get(key) for key in given})

    def dry_run(self, spec: JobSpec) -> str:
        script = batch_script(spec, self._options(spec))
        if pools := pools_line(spec):  # after the #! line and the #SBATCH block's start
            first, _, rest = script.partition("\n")
            script = f"{first}\n# {pools}\n{rest}"
        return script

    def launch(self, spec: JobSpec, detach: bool = False) -> int:
        options = self._options(spec)
        spec = with_cache(spec, options)
        script = batch_script(spec, options)
        record = runs.read_record(spec.run_dir)
        if record.get("job_id") and job_state(record["job_id"]) in PENDING_STATES | RUNNING_STATES:
            raise LaunchError(f"run {spec.run_id} is still queued or running as job {record['job_id']}: "
                              f"`verl-deploy stop {spec.run_id}` first")
        check_cluster(spec, options)
        if options.mode == "docker":  # the container's user (never root) must own the run directory
            from verl_deploy.launchers.docker import _prepare_run_dir

            _prepare_run_dir(spec)  # the cache directory too, where it is new
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        if spec.hf_cache is not None and options.mode != "none":  # a bind mount's source must exist
            spec.hf_cache.mkdir(parents=True, exist_ok=True)
        (spec.run_dir / JOB_EXIT).unlink(missing_ok=True)
        path = spec.run_dir / JOB_SCRIPT
        path.write_text(script)
        job_id = _slurm("sbatch", "--parsable", str(path)).stdout.strip().split(";")[0]
        runs.record_launch(spec.run_dir, spec.launch(self.target, slurm=dataclasses.asdict(options)),
                           job_id=job_id, exit_code=None, detail="", stop_asked_at=None)
        print(f"submitted batch job {job_id}", file=sys.stderr, flush=True)
        if detach:
            return 0
        for text in self.logs(spec.run_id, follow=True):
            sys.stdout.write(text)
            sys.stdout.flush()
        return self.status(spec.run_id).exit_code or 0

    def _run_dir(self, run_id: str) -> Path:
        run_dir = self.runs_root / run_id
        if runs.target_of(run_dir) != self.target:
            raise LaunchError(f"no Slurm run {run_id!r} under {self.runs_root}: `verl-deploy runs --target slurm` "
                              "lists them")
        return run_dir

    def _status(self, run_dir: Path) -> RunStatus:
        record = runs.read_record(run_dir)
        job = record.get("job_id", "")
        state = job_state(job) if job else None
        detail = f"Slurm job {job}: {state or 'no longer known to the controller'}"
        if state in PENDING_STATES:
            return runs.run_status(run_dir, self.target, "pending", exit_code=None, detail=detail)
        if state in RUNNING_STATES:
            return runs.run_status(run_dir, self.target, "running", exit_code=None, detail=detail)
        ended = _job_exit(run_dir)
        if ended.get("job_id") == job:
            code = int(ended["exit_code"])
            if code:  # the trainer's own last line says why, where it said one (train.log in the run directory)
                detail = runs.last_error(run_dir) or detail
            if record.get("exit_code") != code:
                runs.record_finished(run_dir, code, detail)
            return runs.run_status(run_dir, self.target, runs.state_of(code, bool(record.get("stop_asked_at"))),
                                   exit_code=code, detail=detail)
        if state == "CANCELLED":  # cancelled before its trainer started, or killed without a checkpoint
            return runs.run_status(run_dir, self.target, "stopped", detail=detail)
        failed = state and state != "COMPLETED"
        return runs.run_status(run_dir, self.target, "failed" if failed else "unknown", detail=detail)

    def status(self, run_id: str) -> RunStatus:
        return self._status(self._run_dir(run_id))

    def _active(self, run_dir: Path) -> bool:
        return self._status(run_dir).state in ("pending", "running")

    def logs(self, run_id: str, follow: bool = False) -> Iterator[str]:
        run_dir = self._run_dir(run_id)
        log_path = run_dir / JOB_LOG
        while follow and not log_path.exists() and self._active(run_dir):
            time.sleep(1)  # pending: Slurm creates the log when the job starts
        if not log_path.exists():
            return
        with open(log_path, errors="replace") as log:
            yield from runs.follow_log(log, lambda: follow and self._active(run_dir), poll_s=1)

    def stop(self, run_id: str) -> str:
        """TERM to the batch shell only, which asks the trainer to checkpoint and stop; the job then ends. A job
        still pending is cancelled outright (nothing trains yet)."""
        run_dir = self._run_dir(run_id)
        found = self._status(run_dir)
        job = runs.read_record(run_dir).get("job_id")
        if found.state == "pending":
            runs.note_stop(run_dir)
            _slurm("scancel", job)
            return f"cancelled {run_id}: Slurm job {job} had not started"
        if found.state != "running":
            return f"run {run_id} is not running: it {found.state}; nothing to stop"
        runs.note_stop(run_dir)
        _slurm("scancel", "--signal=TERM", "--batch", job)
        return f"stopping {run_id}: SIGTERM sent to Slurm job {job}, it writes a checkpoint"

    def list(self) -> list[RunStatus]:
        return [self._status(self.runs_root / run_id) for run_id in runs.local_run_ids(self.runs_root, self.target)]

    def remove(self, run_id: str, confirm=None) -> list[str]:
        run_dir = self._run_dir(run_id)
        return remove_run_dir(run_id, run_dir, self._active(run_dir), confirm, busy_as="still queued or running")


__all__ = ["CONTAINERS", "SlurmLauncher", "SlurmOptions", "batch_script"]
