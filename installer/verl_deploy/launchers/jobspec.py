"""JobSpec: what to run, built once from the user's config and flags; every launcher translates it.

Paths inside the container are fixed here, so local, Docker and Kubernetes runs all look alike to the runtime.
"""

from __future__ import annotations

import os
import re
import secrets as _secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from verl_deploy import assets, compat, gpu_types, runs, runtimes, sizes
from verl_deploy.world import check_world, derive_world, verl_world, world_size
from verl_deploy.launchers import verl_command
from verl_deploy.sizes import Gpus, parse_gpus
from verl_runtime.secrets import SECRET_ENV, SECRETS_DIR  # noqa: F401 (the launchers read them from here)

RUN_ID_LABEL = "verl-deploy.run-id"
MANAGED_LABEL = "verl-deploy.managed"

# Inside every container.
CONFIG_DIR = "/etc/verl-deploy"
CONFIG_FILE = f"{CONFIG_DIR}/config.yaml"
TOOL_CONFIG_NAME = "tool_config.yaml"  # rollout.multi_turn.tool_config_path's file, beside the config in a container
RUNS_DIR = "/workspace/runs"
CACHE_DIR = "/cache/huggingface"
RUNTIME_CACHE_DIR = f"{CACHE_DIR}/verl_runtime"  # verl_runtime.models.cache_root in the container
DATA_DIR = "/data"


# Hub settings that travel from the caller's environment into the run (not secrets): a mirror, offline mode.
HUB_ENV = ("HF_ENDPOINT", "HF_HUB_OFFLINE")
# trainer.logger's trackers' settings (not secrets: those are SECRET_ENV), read by their own clients in the run.
TRACKER_ENV = ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_BASE_URL", "WANDB_RUN_GROUP", "WANDB_TAGS",
               "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_INSECURE_TLS",
               "SWANLAB_MODE", "SWANLAB_WORKSPACE", "SWANLAB_LOG_DIR")
# The run's id in its container: a stopped trainer says `verl-deploy run --resume RUN` (verl_runtime/trainer.py).
RUN_ID_ENV = "VERL_DEPLOY_RUN_ID"
PLAN_ENV = "VERL_DEPLOY_PLAN"  # run's pre-flight plan, compact JSON, for the trainer's out-of-memory line (docs/plan.md)

# The config of a run given no CONFIG file, only overrides (verl's way): our defaults, then the overrides.
NO_CONFIG = assets.package_dir("verl_runtime") / "main_ppo.yaml"
# PyTorch data loaders and NCCL need far more than Docker's 64 MB default. On Docker /dev/shm is a tmpfs ceiling
# that costs nothing until used; on a cluster it counts against the pod's memory, so Kubernetes sizes it from the
# GPUs (sizes.pod_size) unless --shm-size says.
DEFAULT_SHM = 16 * sizes.GiB
# Seconds a trainer gets after SIGTERM to write its checkpoint before SIGKILL: `docker stop`'s timeout and a pod's
# terminationGracePeriodSeconds (Kubernetes' own default, 30 s, is too short to save a large model).
STOP_GRACE_S = 120
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
# A Kubernetes label: an optional DNS-subdomain prefix and '/', a name; a value is a name or empty.
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # a DNS subdomain: what a PVC or storage class is called


class LaunchError(Exception):
    """A one-line, user-facing launch error: what went wrong and what to do."""


def launch_fault(exc: OSError, run_dir: Path | None = None) -> LaunchError:
    """A host write that failed (the runs directory read-only or not ours, a full disk) as one line that names
    the path (the file's, else run_dir: a failed write() names none) and what to do: the runtime's words for machine
    faults, with the host's option to move the runs."""
    from verl_runtime.errors import machine_fault

    path = exc.filename or run_dir or "the run directory"
    fault = machine_fault(exc, path, elsewhere="point --runs-dir (or VERL_DEPLOY_RUNS) at")
    return LaunchError(str(fault) if fault else f"cannot write {path}: {exc.strerror or exc}")


def remove_run_dir(run_id: str, run_dir: Path, busy: bool, confirm=None, busy_as: str = "still running") -> list[str]:
    """`runs rm` of a run kept in its run directory alone (local, direct, Slurm): refused while `busy` (`stop`
    checkpoints it first); `confirm(items)` sees what will go first, and raises to keep it."""
    import shutil

    if busy:
        raise LaunchError(f"run {run_id} is {busy_as}: `verl-deploy stop {run_id}` first")
    items = [f"run directory {run_dir}"]
    if confirm is not None:
        confirm(items)
    shutil.rmtree(run_dir)
    return items


@contextmanager
def sizes_checked():
    """A value sizes.py refuses (a size, a CPU or GPU count, a node count), as a LaunchError: the same one line on
    every target."""
    try:
        yield
    except sizes.SizeError as exc:
        raise LaunchError(str(exc)) from None


@dataclass(frozen=True)
class Mount:
    source: str  # a host path
    target: str  # the path in the container
    read_only: bool = False


@dataclass(frozen=True)
class ClusterOptions:
    """Where and how a run's pods are scheduled on Kubernetes (the other targets do not read it)."""

    node_selector: tuple[tuple[str, str], ...] = ()  # --node-selector KEY=VALUE, as given
    gpu_type: str | None = None  # a name of gpu_types.yaml (checked)
    priority_class: str | None = None
    service_account: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    image_preloaded: bool = False  # the nodes hold this engine's images (kind load, minikube image load)
    grace_period_s: int = STOP_GRACE_S


@dataclass(frozen=True)
class Command:
    """What trains a run, as each launcher needs it; built once, by command_of (build_spec)."""

    # The trainer's arguments, container paths: after `python -m verl_runtime`, or after upstream verl's main_ppo.
    args: tuple[str, ...] = ()
    # The trainer's arguments with host paths (a local run, Slurm without a container).
    host_args: tuple[str, ...] = ()
    # What follows the image's entrypoint (a container's arguments): ours is `python -m verl_runtime`; verl's image
    # loads the secret files, then runs its trainer, which these name.
    entry_args: tuple[str, ...] = ()
    # The whole command line, for a shell to run (a Ray head, a RayJob's entrypoint, a Slurm step, launch.json).
    shell: tuple[str, ...] = ()
    # What a Ray node's command runs under to have the secret files: upstream verl's loader (its image's
    # entrypoint); () for our runtime, which loads them itself.
    secrets_loader: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobSpec:
    """One training run, independent of where it runs."""

    run_id: str
    image: str
    config_path: Path | None  # on the host (None: upstream verl, whose config is its overrides)
    config_text: str
    runtime: str = compat.DEFAULT_RUNTIME  # what trains: verl-deploy's runtime, or upstream verl (verl_command.py)
    variant: str | None = None  # the image variant (docker/variants.yaml), when known
    overrides: tuple[str, ...] = ()
    run_dir: Path = Path("runs")  # on the host (local and Docker); Kubernetes keeps it on a PVC
    gpus: Gpus = Gpus()
    cpus: float | None = None
    memory: int | None = None  # bytes (sizes.parse_memory); None: the target's default
    shm_size: int | None = None  # bytes; None: the target's default (DEFAULT_SHM, or sized from the GPUs)
    ipc_host: bool = False
    nodes: int = 1
    preflight: bool = True  # several nodes: the pre-flight across them first (launchers/preflight.py; --no-preflight)
    world_size: int | None = None  # trainer workers, one per GPU: --gpus x --nodes (None: the runtime decides)
    # trainer.mode=separate_async on GPUs: the rollout's own pool beside the trainer's (--gpus is the trainer's):
    # rollout.n_gpus_per_node GPUs on each of rollout.nnodes nodes; on one node, beside the trainer's GPUs
    rollout_pool: tuple[int, int] = (0, 0)  # (nodes, GPUs per node)
    hf_cache: Path | None = None
    data_dir: Path | None = None
    reward_file: Path | None = None  # reward.function's file on the host, read-only beside the config in the container
    reward_name: str = ""  # the function in it ("": verl's default, compute_score)
    tool_config: Path | None = None  # rollout.multi_turn.tool_config_path on the host, beside the config in a container
    # Kubernetes: PersistentVolumeClaims for the data (read-only at /data) and the Hugging Face cache (None: the
    # run's own, which the launcher creates), and the storage class of the claims it creates.
    data_claim: str | None = None
    data_size: int | None = None  # bytes; set: the launcher creates the data claim with this size (else it must exist)
    cache_claim: str | None = None
    storage_class: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()  # names only; values come from the environment at launch time
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str = "default"
    user: str = "1000:1000"
    cluster: ClusterOptions = ClusterOptions()
    command: Command = Command()  # build_spec's (command_of); empty for a Job that does not train (an export)
    launch_flags: dict = field(default_factory=dict)  # the flags `--resume` restores, as given (runplan.RESUMED_FLAGS)
    # Upstream verl: the trainer's command when not the runtime's main_ppo (--entry: a recipe module, a script of a
    # --verl-source), and that source's labels (path or URL, commit, dirty), which launch.json and `status` keep.
    trainer: tuple[str, ...] = ()
    verl_source: dict = field(default_factory=dict)
    # The image the launcher found for the services where the config names none (docker and k8s: the services
    # image, or the run's own when the services image could not be had); None: service_image's default.
    services_image: str | None = None
    # The config as build_spec loaded and checked it (ours; None for upstream verl's): the checks before launch and
    # the memory plan read it instead of loading it again. Not recorded: launch.json keeps the path and overrides.
    loaded: object = field(default=None, compare=False, repr=False)

    def launch(self, target: str, **given) -> runs.Launch:
        """What launch.json keeps of the spec, so that `--resume` starts the run again as it was (secrets by
        name only; no config text: the config file's path); `given`: what the target adds (its command, claim)."""
        return runs.Launch(
            run_id=self.run_id, target=target, config=str(self.config_path) if self.config_path else None,
            runtime=self.runtime, overrides=tuple(self.overrides), gpus=str(self.gpus) if self.gpus.wanted else None,
            nodes=self.nodes, image=self.image, variant=self.variant, namespace=self.namespace,
            secrets=tuple(self.secrets), owner=f"{os.getuid()}:{os.getgid()}",
            started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), flags=dict(self.launch_flags),
            trainer=tuple(self.trainer), verl_source=dict(self.verl_source), **given,
        )

    @property
    def rollout_gpus(self) -> int:
        """The rollout pool's GPUs (0: it shares the trainer's, or the run has none)."""
        return self.rollout_pool[0] * self.rollout_pool[1]

    def gpus_of(self, pod: str) -> int:
        """GPUs one container or pod of the run asks for: "trainer" (the one node: the trainer's and the rollout
        pool's), "ray-head" / "ray-worker" (the trainer's per node), "rollout" (the rollout pool's per node)."""
        trainer = self.gpus.number or 0
        if pod == "rollout":
            return self.rollout_pool[1]
        return trainer + (self.rollout_gpus if pod == "trainer" else 0)

    @property
    def service_image_given(self) -> str | None:
        """services.image, where the config names one."""
        return self.loaded.services.image if self.loaded else None

    @property
    def service_image(self) -> str:
        """The image the service containers run: services.image, else the services image beside the run's (same
        registry and version; images/context.services_tag), else, for an image of another name, the run's."""
        from verl_deploy.images.context import services_tag

        return self.service_image_given or self.services_image or services_tag(self.image) or self.image

    @property
    def services(self) -> list:
        """The services of config.services that the launcher runs beside the trainer (registry.Service): those
        declared without a url of their own. Upstream verl's config declares none."""
        if self.loaded is None:
            return []
        from verl_runtime.services.registry import declared

        return [service for service in declared(self.loaded) if not getattr(self.loaded.services, service.name).url]

    @property
    def container_run_dir(self) -> str:
        return f"{RUNS_DIR}/{self.run_id}"

    @property
    def upstream(self) -> bool:
        """Upstream verl trains (its main_ppo), not verl-deploy's runtime."""
        return not runtimes.trainer(self.runtime).own

    @property
    def working_dir(self) -> str | None:
        """The trainer's working directory in the container (None: the image's). Upstream verl's is its run
        directory: Hydra writes its outputs/ there (the image's root file system is read-only)."""
        return self.container_run_dir if self.upstream else None

    @property
    def container_reward_file(self) -> str:
        return f"{CONFIG_DIR}/{self.reward_file.name}"  # one file: what it imports must be in the image

    @property
    def container_env(self) -> dict[str, str]:
        """Non-secret environment for the container (secrets are added by name by each launcher)."""
        upstream_env = verl_command.environment(self.container_run_dir) if self.upstream else {}
        # the built-in models are built beside the Hugging Face cache, so a mounted cache keeps them between runs
        # (builtin:tiny-tools' lesson is taught once, not per run)
        return {"HF_HOME": CACHE_DIR, "VERL_RUNTIME_CACHE": RUNTIME_CACHE_DIR, "HOME": "/tmp", "PYTHONUNBUFFERED": "1",
                RUN_ID_ENV: self.run_id, **upstream_env, **self.env}

    @property
    def mounts(self) -> list[Mount]:
        mounts = [Mount(str(self.config_path), CONFIG_FILE, read_only=True)] if self.config_path else []
        mounts.append(Mount(str(self.run_dir), self.container_run_dir))
        if self.hf_cache:
            mounts.append(Mount(str(self.hf_cache), CACHE_DIR))
        if self.data_dir:
            mounts.append(Mount(str(self.data_dir), DATA_DIR, read_only=True))
        if self.reward_file:
            mounts.append(Mount(str(self.reward_file), self.container_reward_file, read_only=True))
        if self.tool_config:
            mounts.append(Mount(str(self.tool_config), f"{CONFIG_DIR}/{TOOL_CONFIG_NAME}", read_only=True))
        return mounts


def new_run_id(config_path: Path) -> str:
    """`<config stem>-<UTC time>-<4 hex>`: sortable, unique, a valid DNS label (Kubernetes names)."""
    stem = re.sub(r"[^a-z0-9-]+", "-", config_path.stem.lower()).strip("-")[:30] or "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{_secrets.token_hex(2)}"


def check_run_id(run_id: str) -> str:
    if len(run_id) > 52 or not _DNS_LABEL.match(run_id):
        raise LaunchError(
            f"run id {run_id!r} is not usable: lower-case letters, digits and '-', at most 52 characters"
        )
    return run_id


def check_namespace(namespace: str) -> str:
    if len(namespace) > 63 or not _DNS_LABEL.match(namespace):
        raise LaunchError(f"namespace {namespace!r} is not a valid Kubernetes namespace name (a DNS label)")
    return namespace


def host_user() -> str:
    """The caller's uid:gid, so files in the run directory are theirs; never root inside a container."""
    uid, gid = os.getuid(), os.getgid()
    return "1000:1000" if uid == 0 else f"{uid}:{gid}"


def parse_env(items) -> dict[str, str]:
    """--env KEY=VALUE items as a mapping; secrets are not passed this way (see SECRET_ENV)."""
    for item in items:
        if "=" not in item:
            hint = " (secrets pass from your environment by name)" if item in SECRET_ENV else ""
            raise LaunchError(f"--env {item!r} needs the form KEY=VALUE{hint}")
    return dict(item.split("=", 1) for item in items)


def config_file(config: str | Path | None) -> Path:
    """The config file given (it must exist), or NO_CONFIG for none."""
    if config is None:
        return NO_CONFIG
    path = Path(config).expanduser()
    if not path.is_file():
        raise LaunchError(f"config file {str(config)!r} does not exist: pass a YAML file such as examples/quickstart.yaml")
    refuse_empty(path)
    return path


def refuse_empty(path: Path) -> None:
    """LaunchError (one line) for a CONFIG file with no settings (empty, comments only, `null`): it would train on
    the defaults without a word, where the user meant to give a config."""
    import yaml

    try:
        empty = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace")) is None
    except yaml.YAMLError:
        return  # not YAML: the config's loader says where
    if empty:
        raise LaunchError(f"CONFIG {path} is empty: give it the run's settings (examples/quickstart.yaml is one), or "
                          "leave CONFIG out for the defaults with overrides after -- (`-- KEY=VALUE ...`)")


def check_overrides(overrides, runtime: str = compat.DEFAULT_RUNTIME) -> tuple[str, ...]:
    """The overrides as the runtime's trainer takes them (runtimes.Trainer.check_overrides: ours reads verl's
    `+key=value` as `key=value`); LaunchError (one line) for one it does not take."""
    try:
        return runtimes.trainer(runtime).check_overrides(overrides)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None


def load_checked(path: Path | None, overrides: tuple[str, ...], warn: bool = True):
    """The config as the trainer will load it (NO_CONFIG for none); its one-line error as a LaunchError.
    verl_runtime.config needs only PyYAML: no torch on the host path."""
    from verl_runtime.config import load_config
    from verl_runtime.errors import UserError

    try:
        return load_config(config_file(path), overrides, warn=warn)
    except UserError as exc:
        raise LaunchError(str(exc)) from None


def gpus_of(text: str | None) -> Gpus | None:
    """--gpus parsed (sizes.parse_gpus; None: not given), its mistake as a LaunchError: the one parse of a run's
    --gpus is the run plan's (runplan.plan_run); everything after it takes the typed value."""
    if text is None:
        return None
    with sizes_checked():
        return parse_gpus(text)


def host_locator(spec: JobSpec, target: str):
    """Where a path of the config (a verl_runtime.local_paths.LocalPath) is on this host, or None where the host
    cannot see it: on local, every one; on docker, those under /data in the --data directory, and the reward file,
    which the launcher mounts from the host; on k8s and slurm only the reward file, which travels with the run. The
    rest is the image's (or a claim's, or the nodes'): the trainer checks it when it starts."""
    from verl_runtime.local_paths import REWARD_FILE

    def locate(item) -> Path | None:
        path = Path(item.path).expanduser()
        in_data = path.is_absolute() and path.is_relative_to(DATA_DIR)
        if target == "local" or (item.kind == REWARD_FILE and not in_data):
            return path
        if target != "docker" or not in_data or spec.data_dir is None:
            return None
        return spec.data_dir / path.relative_to(DATA_DIR)

    return locate


def check_paths(spec: JobSpec, target: str, config=None) -> None:
    """The config's data, reward and model paths (verl_runtime.local_paths), checked on this host before anything
    is launched, as far as the host sees them (host_locator). Upstream verl checks its own config. config: the
    loaded config (load_checked), when the caller has it."""
    if spec.upstream:
        return
    from verl_runtime.errors import UserError
    from verl_runtime.local_paths import check_local_paths

    try:
        config = config or load_checked(spec.config_path, spec.overrides, warn=False)
        check_local_paths(config, host_locator(spec, target))
    except UserError as exc:
        raise LaunchError(str(exc)) from None


# --- before launch: what this host can know of the run, where the trainer would find out later (#38) -----------

# Rows of a split whose prompts check_prompt_lengths tokenizes at most (the trainer's own way, row by row: about
# 2,500 rows a second on one loaded core); a larger split is left to the trainer, which tokenizes it when it starts.
PROMPT_CHECK_ROWS = 20_000
PROMPT_CHECK_TIMEOUT_S = 60  # a tokenizer that hangs (a network it should not ask) never holds a launch longer


def check_before_launch(spec: JobSpec, target: str, container: str | None = None,
                        catalog_variant: str | None = None) -> None:
    """What the host can know of a run before anything starts, each refusal a LaunchError of one line: the config's
    paths (check_paths); vLLM for rollout.name=vllm and the trackers of trainer.logger where the trainer runs
    (check_installed); prompts longer than data.max_prompt_length under data.truncation=error (check_prompt_lengths).
    container: Slurm's --container; catalog_variant: the variant whose catalog tag the run's image is (None: an
    image named with --image). Upstream verl checks its own config."""
    if spec.upstream:
        return
    config = spec.loaded if spec.loaded is not None else load_checked(spec.config_path, spec.overrides, warn=False)
    check_paths(spec, target, config)
    check_installed(spec, config, target, container, catalog_variant)
    check_prompt_lengths(spec, config, target)


@dataclass(frozen=True)
class TrainerHome:
    """Where the trainer runs, as far as this host knows what is installed there."""

    name: str  # in words: "/path/to/python (...)" or "image X (variant cpu)"
    installed: dict  # module -> bool; a module not in it is not known here
    in_image: bool


def trainer_home(spec: JobSpec, target: str, container: str | None = None,
                 catalog_variant: str | None = None, modules=()) -> TrainerHome | None:
    """Where the trainer of `spec` runs and which of `modules` are installed there; None where this host cannot
    know. The host's Python for --target local and Slurm's --container none (the Python the launchers start:
    sys.executable), asked without importing anything; an image of the catalog's tag from the catalog; on docker an
    image named with --image from its labels, where this host's engine has it (images/contents.py)."""
    import sys

    if target == "local" or (target == "slurm" and (container or "none") == "none"):
        who = "--target local" if target == "local" else "the Slurm nodes' Python, --container none"
        return TrainerHome(f"{sys.executable} (the Python that runs the trainer: {who})",
                           {module: _importable(module) for module in modules}, in_image=False)
    from verl_deploy.images import contents

    if catalog_variant:
        from verl_deploy.images.context import ImageError, variant

        try:
            known = contents.of_variant(variant(catalog_variant, spec.runtime))
        except ImageError:
            return None
        return TrainerHome(f"image {spec.image} (variant {catalog_variant})", known, in_image=True)
    if target == "docker":
        from verl_deploy.images.stale import local_labels

        known = contents.of_labels(local_labels(spec.image))
        if known is not None:
            return TrainerHome(f"image {spec.image}", known, in_image=True)
    return None


def _importable(module: str) -> bool:
    """The module is installed in this Python (found on its path; nothing is imported)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that fails, a module whose __spec__ is None
        return False


def check_installed(spec: JobSpec, config, target: str, container: str | None = None,
                    catalog_variant: str | None = None) -> None:
    """rollout.name=vllm without vLLM, and a tracker of trainer.logger without its client, where the trainer runs
    (trainer_home): a LaunchError of one line. The trainer would find vLLM missing after loading the model, and run
    on without a tracker with a warning in its log. Where the host cannot know, the trainer checks when it starts."""
    from verl_deploy.images.contents import VLLM

    vllm = config.rollout.name == "vllm"
    trackers = list(dict.fromkeys(config.trainer.trackers))
    if not vllm and not trackers:
        return
    home = trainer_home(spec, target, container, catalog_variant, ([VLLM] if vllm else []) + trackers)
    if home is None:
        return
    if vllm and home.installed.get(VLLM) is False:
        if home.in_image:
            from verl_deploy.images.contents import with_vllm

            fix = (f"set rollout.name=builtin (or hf), or give the run GPUs (--gpus N): the "
                   f"{' and '.join(with_vllm(spec.runtime))} images have vLLM")
        else:
            fix = "install the vllm extra there (pip install 'verl-deploy[vllm]'), or set rollout.name=builtin (or hf)"
        raise LaunchError(f"rollout.name=vllm needs vLLM, which {home.name} does not have: {fix}")
    missing = [name for name in trackers if home.installed.get(name) is False]
    if missing:
        from verl_runtime.trackers import PIP_EXTRA

        key, names = _trackers_key(spec), " and ".join(missing)
        fix = ("run an image `verl-deploy images build` made (every variant has the trackers extra)" if home.in_image
               else f"install the trackers extra there ({PIP_EXTRA})")
        raise LaunchError(f"{key} names {names}, which {home.name} does not have: {fix}, or leave "
                          f"{'it' if len(missing) == 1 else 'them'} out of {key}")


def _trackers_key(spec: JobSpec) -> str:
    """The key the run names its trackers with: verl's trainer.logger, or ours, trainer.trackers (the last given)."""
    import yaml

    for override in reversed(spec.overrides):
        key = override.split("=", 1)[0]
        if key in ("trainer.logger", "trainer.trackers"):
            return key
    try:
        doc = yaml.safe_load(spec.config_text) if spec.config_text else None
    except yaml.YAMLError:
        doc = None
    trainer = doc.get("trainer") if isinstance(doc, dict) else None
    if (isinstance(trainer, dict) and "logger" in trainer) or (isinstance(doc, dict) and "trainer.logger" in doc):
        return "trainer.logger"
    return "trainer.trackers"


def check_prompt_lengths(spec: JobSpec, config, target: str) -> None:
    """Under data.truncation=error (data.filter_overlong_prompts off) the trainer stops at a prompt longer than
    data.max_prompt_length, once its model is loaded: here that is one line before anything starts, where the data
    files and the model's tokenizer are on this host (host_locator; a Hub id from the Hugging Face cache the run
    uses, offline). The prompts are tokenized by the trainer's own code (verl_runtime.data: load_rows, make_toy_rows
    for a toy: entry beside a file, encode_prompts), in a Python of its own where torch is not imported (a tokenizer
    needs none, and importing torch takes the host seconds): prompt_check_child. A split no file of which the host
    sees, one over PROMPT_CHECK_ROWS rows, a tokenizer that is not here or a child that fails: left to the trainer."""
    import json
    import subprocess
    import sys

    from verl_runtime.data import TOY_PREFIX
    from verl_runtime.hub import is_hub_id
    from verl_runtime.local_paths import DATA_FILE, MODEL_DIR, LocalPath

    data = config.data
    if data.truncation != "error" or data.filter_overlong_prompts:
        return
    locate = host_locator(spec, target)
    splits = []
    for key in ("data.train_files", "data.val_files"):
        located = []
        for name in getattr(data, key.split(".")[1]):
            where = name if name.startswith(TOY_PREFIX) else locate(LocalPath(key, name, DATA_FILE))
            if where is None:
                break
            located.append(str(where))
        else:
            if any(not name.startswith(TOY_PREFIX) for name in located):
                splits.append((key, located))
    if not splits:
        return
    model = str(config.model.path)
    folder = hub = None
    if model.startswith("builtin:"):
        from verl_deploy.plan.shape import BUILTIN_CACHES, TINY_CACHE_NAME, _runtime_cache_root

        built = _runtime_cache_root() / TINY_CACHE_NAME  # every built-in model's tokenizer (built offline)
        folder = built if model in BUILTIN_CACHES and (built / "config.json").is_file() else None
    else:
        where = locate(LocalPath("model.path", model, MODEL_DIR))
        if where is not None and where.is_dir():
            folder = where
        elif is_hub_id(model) and not Path(model).expanduser().exists():
            hub = model
    if folder is None and hub is None:
        return
    request = {"splits": splits, "folder": str(folder) if folder else None, "hub": hub,
               "max_prompt_length": data.max_prompt_length, "apply_chat_template": data.apply_chat_template,
               "toy_size": data.toy_size, "seed": config.trainer.seed, "max_rows": PROMPT_CHECK_ROWS}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    if spec.hf_cache is not None:  # the run's cache (docker mounts it as HF_HOME; local passes it so)
        env["HF_HOME"] = str(spec.hf_cache)
    code = "import sys; sys.modules['torch'] = None; from verl_deploy.launchers.jobspec import prompt_check_child; " \
           "prompt_check_child()"
    try:
        done = subprocess.run([sys.executable, "-c", code], input=json.dumps(request), capture_output=True, text=True,
                              env=env, timeout=PROMPT_CHECK_TIMEOUT_S)
        answer = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return  # the check could not run: the trainer's own check stands
    if answer.get("refuse"):
        raise LaunchError(answer["refuse"])


def prompt_check_child() -> None:
    """check_prompt_lengths' child: its request as JSON on stdin; prints {"refuse": line} (the trainer's own error,
    naming the split), {"skip": why} or {}."""
    import json
    import sys

    print(json.dumps(overlong_prompts(json.load(sys.stdin))), flush=True)


def overlong_prompts(request: dict) -> dict:
    """The trainer's prompt loading (Trainer.load_prompts) over the splits of `request`, with the model's tokenizer
    read offline; {"refuse": line} for the first split the trainer would stop at."""
    from verl_runtime.data import TOY_PREFIX, encode_prompts, load_rows, make_toy_rows
    from verl_runtime.errors import UserError
    from verl_runtime.hub import HUB_ID

    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging
    except ImportError:
        return {"skip": "transformers is not installed here"}
    logging.set_verbosity_error()
    try:
        if request.get("folder"):
            tokenizer = AutoTokenizer.from_pretrained(request["folder"])
        else:
            match = HUB_ID.match(request["hub"])
            tokenizer = AutoTokenizer.from_pretrained(match["repo"], revision=match["revision"], local_files_only=True)
    except Exception as exc:  # no tokenizer files there, not in the cache, one transformers cannot read
        return {"skip": f"the model's tokenizer is not readable here ({type(exc).__name__})"}
    for key, files in request["splits"]:
        train = key == "data.train_files"
        rows = []
        try:
            for name in files:
                if name.startswith(TOY_PREFIX):
                    size = request["toy_size"] if train else max(request["toy_size"] // 4, 1)
                    rows += make_toy_rows(name.removeprefix(TOY_PREFIX), size, request["seed"] + (not train))
                else:
                    rows += load_rows(name)
            if len(rows) > request["max_rows"]:
                return {"skip": f"{key}: {len(rows):,} rows, more than {request['max_rows']:,}"}
            encode_prompts(rows, tokenizer, request["max_prompt_length"], "error", request["apply_chat_template"])
        except UserError as exc:
            return {"refuse": f"{key}: {exc}"}
    return {}


def cluster_options(node_selector=(), gpu_type: str | None = None, priority_class: str | None = None,
                    service_account: str | None = None, image_pull_secrets=(), image_preloaded: bool = False,
                    grace_period_s: int | None = None) -> ClusterOptions:
    """The Kubernetes scheduling flags, checked (LaunchError, one line, for a malformed one)."""
    pairs = []
    for item in node_selector:
        key, sep, value = item.partition("=")
        if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise LaunchError(f"--node-selector {item!r} needs the form KEY=VALUE with a Kubernetes label key and "
                              "value, e.g. cloud.google.com/gke-accelerator=nvidia-h100-80gb")
        pairs.append((key, value))
    for option, names in (("--priority-class", [priority_class]), ("--service-account", [service_account]),
                          ("--image-pull-secret", list(image_pull_secrets))):
        for name in names:
            if name is not None and (len(name) > 253 or not _DNS_NAME.match(name)):
                raise LaunchError(f"{option} {name!r} is not a Kubernetes object name (lower-case letters, digits, "
                                  "'-' and '.')")
    if grace_period_s is not None and grace_period_s < 1:
        raise LaunchError(f"--grace-period {grace_period_s} must be at least 1 second (the default, {STOP_GRACE_S}, "
                          "leaves time for a checkpoint)")
    try:
        gpu = gpu_types.lookup(gpu_type).name if gpu_type else None
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    return ClusterOptions(node_selector=tuple(pairs), gpu_type=gpu, priority_class=priority_class,
                          service_account=service_account, image_pull_secrets=tuple(image_pull_secrets),
                          image_preloaded=image_preloaded, grace_period_s=grace_period_s or STOP_GRACE_S)


def host_reward_file(function: str | None) -> tuple[Path | None, str]:
    """The host file of reward.function ("path/to/file.py[:name]") when it is one, and the function's name: a
    container sees it only if it is mounted (the launchers put it beside the config, at container_reward_file)."""
    if not function:
        return None, ""
    path, sep, name = function.rpartition(":")
    if not sep or not path.endswith(".py"):
        path, name = function, ""
    file = Path(path).expanduser()
    return (file.resolve(), name) if path.endswith(".py") and file.is_file() else (None, "")


def host_tool_config(config) -> Path | None:
    """rollout.multi_turn.tool_config_path's file on this host, which a container sees only mounted beside the
    config (TOOL_CONFIG_NAME); LaunchError for one that is not there."""
    multi_turn = config.rollout.multi_turn
    if not multi_turn.enable or not multi_turn.tool_config_path:
        return None
    path = Path(multi_turn.tool_config_path).expanduser()
    if not path.is_file():
        raise LaunchError(f"rollout.multi_turn.tool_config_path {multi_turn.tool_config_path}: no such file on this "
                          "host (the launcher sends it with the run)")
    return path.resolve()


def command_of(spec: JobSpec) -> Command:
    """The run's Command. Our runtime's: `train` with the config file and the run directory (the container's, or
    the host's), `trainer.resume=auto` always (a fresh run directory starts from scratch, a reused one continues),
    the world size, the overrides, and in a container reward.function where the mounts put its file. Upstream
    verl's: its trainer with main_ppo's arguments (verl_command), run under its secret-file loader."""
    if spec.upstream:
        def main_ppo(run_dir: str) -> tuple[str, ...]:
            return tuple(verl_command.trainer_args(spec.overrides, spec.gpus.number or 0, spec.nodes, run_dir))

        args = main_ppo(spec.container_run_dir)
        entry_args = (*(spec.trainer or compat.load_runtimes()[spec.runtime].trainer), *args)
        loader = verl_command.SECRETS_ENTRY
        return Command(args=args, host_args=main_ppo(str(spec.run_dir)), entry_args=entry_args,
                       shell=(*loader, *entry_args), secrets_loader=loader)

    def train(config: str, run_dir: str) -> tuple[str, ...]:
        args = ["train", config, "--set", f"trainer.run_dir={run_dir}", "--set", "trainer.resume=auto"]
        if spec.world_size:
            args += ["--set", f"trainer.n_workers={spec.world_size}"]
        for override in spec.overrides:
            args += ["--set", override]
        return tuple(args)

    reward = ()
    if spec.reward_file:
        reward = ("--set", f"reward.function={spec.container_reward_file}" + f":{spec.reward_name}" * bool(spec.reward_name))
    if spec.tool_config:
        reward += ("--set", f"rollout.multi_turn.tool_config_path={CONFIG_DIR}/{TOOL_CONFIG_NAME}")
    args = (*train(CONFIG_FILE, spec.container_run_dir), *reward)
    return Command(args=args, host_args=train(str(spec.config_path), str(spec.run_dir)), entry_args=args,
                   shell=("python", "-m", "verl_runtime", *args))


def build_spec(
    config: str | Path | None,
    *,
    image: str,
    runs_root: Path,
    variant: str | None = None,
    run_id: str | None = None,
    overrides: tuple[str, ...] = (),
    gpus: Gpus | None = None,
    cpus: float | str | None = None,
    memory: str | int | None = None,
    shm_size: str | int | None = None,
    ipc_host: bool = False,
    nodes: int | None = 1,
    hf_cache: Path | None = None,
    data_dir: Path | None = None,
    data_claim: str | None = None,
    data_size: str | int | None = None,
    cache_claim: str | None = None,
    storage_class: str | None = None,
    env: dict[str, str] | None = None,
    namespace: str = "default",
    environ: dict[str, str] | None = None,
    runtime: str = compat.DEFAULT_RUNTIME,
    cluster: ClusterOptions | None = None,
) -> JobSpec:
    """Check the user's input and assemble the spec; no side effects. No config: our defaults and the overrides
    (verl's way: NO_CONFIG). Overrides are `key=value` (verl's `+key=value` too); gpus is --gpus parsed (gpus_of; None: not given);
    --gpus/--nodes not given come from verl's trainer.n_gpus_per_node/trainer.nnodes (derive_world). The world
    size is resolved here, once: JobSpec.world_size."""
    memory_given = memory
    with sizes_checked():  # the same one-line errors on every target: the values are parsed once, here
        nodes = sizes.parse_nodes(nodes)
        cpus, memory = sizes.parse_cpus(cpus), sizes.parse_memory(memory)
        shm_size = sizes.parse_size("--shm-size", shm_size, "16g")
        data_size = sizes.parse_size("--data-size", data_size, "100g")
    if ipc_host and shm_size is not None:
        raise LaunchError(f"--ipc-host and --shm-size {sizes.docker_size(shm_size)} contradict: --ipc-host shares the "
                          "host's /dev/shm (the host's size), --shm-size gives the run one of its own: keep "
                          f"--shm-size {sizes.docker_size(shm_size)} (a /dev/shm of that size, the run's alone), or "
                          "--ipc-host alone where its containers must share the host's memory")
    trainer = runtimes.trainer(runtime)
    try:  # the trainer's rules, then the world size, resolved once (world.py)
        trainer.check_config(config)
        overrides = trainer.check_overrides(overrides)
        if not trainer.takes_config:  # verl's overrides are its whole config, the world size among them
            config_path, loaded = None, None  # verl checks its own config, in its image
            gpus, nodes = verl_world(overrides, gpus, nodes)
            reward_file, reward_name, tool_config = None, "", None
        else:
            config_path = config_file(config)
            loaded = load_checked(config_path, overrides)  # its warnings (verl keys without effect here) shown once
            gpus, nodes = derive_world(loaded.trainer, gpus, nodes)
            reward_file, reward_name = host_reward_file(check_world(loaded, gpus, nodes).reward.function)
            tool_config = host_tool_config(loaded)
        rollout_pool = rollout_pool_of(loaded, gpus, nodes)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    with sizes_checked():  # the GPUs are known now: --gpus, or the config's
        sizes.check_gpu_memory(memory_given, memory, gpus)
    if data_dir is not None and not Path(data_dir).is_dir():
        raise LaunchError(f"data directory {str(data_dir)!r} does not exist")
    instead = {"--data": "copy the data into a claim and pass its name (`kubectl get pvc`)",
               "--hf-cache": "pass a claim's name (`kubectl get pvc`; ReadWriteMany shares it between runs), or leave "
                             "it out for the launcher's cache claim",
               "--storage-class": "pass a storage class's name (`kubectl get storageclass`)"}
    for option, claim in (("--data", data_claim), ("--hf-cache", cache_claim), ("--storage-class", storage_class)):
        if claim is not None and (len(claim) > 253 or not _DNS_NAME.match(claim)):
            what = "a storage class" if option == "--storage-class" else "a PersistentVolumeClaim"
            raise LaunchError(f"{option} {claim!r}: on Kubernetes it names {what}, not a folder: {instead[option]}")
    run_id = check_run_id(run_id or new_run_id(config_path or Path(runtime)))
    environ = os.environ if environ is None else environ
    env = {**{name: environ[name] for name in (*HUB_ENV, *TRACKER_ENV) if environ.get(name)}, **(env or {})}
    leaked = sorted(set(env) & set(SECRET_ENV))
    if leaked:
        raise LaunchError(f"{', '.join(leaked)} must come from the environment, not --env (it would be written down)")
    spec = JobSpec(
        run_id=run_id,
        image=image,
        variant=variant,
        config_path=config_path.resolve() if config_path else None,
        config_text=config_path.read_text() if config_path else "",
        runtime=runtime,
        overrides=tuple(overrides),
        run_dir=(Path(runs_root) / run_id).resolve(),
        gpus=gpus,
        cpus=cpus,
        memory=memory,
        shm_size=shm_size,
        ipc_host=ipc_host,
        nodes=nodes,
        world_size=world_size(gpus, nodes),
        rollout_pool=rollout_pool,
        loaded=loaded,
        reward_file=reward_file,
        reward_name=reward_name,
        tool_config=tool_config,
        hf_cache=Path(hf_cache).expanduser().resolve() if hf_cache else None,
        data_dir=Path(data_dir).resolve() if data_dir else None,
        data_claim=data_claim or (f"{run_id}-data" if data_size else None),
        data_size=data_size,
        cache_claim=cache_claim,
        storage_class=storage_class,
        env=env,
        secrets=tuple(name for name in SECRET_ENV if environ.get(name)),
        labels={RUN_ID_LABEL: run_id, MANAGED_LABEL: "true"},
        namespace=check_namespace(namespace),
        user=host_user(),
        cluster=cluster or ClusterOptions(),
    )
    return replace(spec, command=command_of(spec))  # built once, from the spec's final values


def rollout_pool_of(loaded, gpus: Gpus, nodes: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of the rollout's own pool: trainer.mode=separate_async on GPUs; (0, 0) otherwise (it
    shares the trainer's GPUs, or the run trains on the CPU, where the cores are shared out). On one node the pool
    sits beside the trainer's GPUs; on several it is a group of nodes of its own (a Ray cluster places it)."""
    if loaded is None or loaded.trainer.mode != "separate_async" or not gpus.wanted or loaded.trainer.device == "cpu":
        return 0, 0
    per_node, rollout_nodes = loaded.rollout.n_gpus_per_node or 1, loaded.rollout.nnodes or 1
    if nodes == 1 and rollout_nodes > 1:
        raise ValueError(f"rollout.nnodes={rollout_nodes} on a one-node run: the rollout's pool sits beside the "
                         "trainer's GPUs there; set rollout.nnodes=1 (and rollout.n_gpus_per_node), or --nodes")
    return rollout_nodes, per_node


def pools_line(spec: JobSpec) -> str | None:
    """What the dry runs print of a run whose rollout has a pool of its own (trainer.mode=separate_async)."""
    if spec.loaded is None or spec.loaded.trainer.mode != "separate_async":
        return None
    trainer = f"{spec.gpus.number} GPU(s) x {spec.nodes} node(s)" if spec.gpus.wanted else "its share of the CPUs"
    if spec.rollout_gpus:
        rollout = f"{spec.rollout_pool[1]} GPU(s) x {spec.rollout_pool[0]} node(s)"
        where = " beside the trainer's" if spec.nodes == 1 else " of its own"
    else:
        rollout, where = f"{spec.loaded.rollout.n_gpus_per_node or 1} worker(s), each its share of the CPUs", ""
    return (f"pools (trainer.mode=separate_async): trainer {trainer}; rollout {rollout}{where}, one batch ahead "
            f"(num_warmup_batches={spec.loaded.trainer.separate_async.num_warmup_batches})")


def with_plan(spec: JobSpec, plan_json: str) -> JobSpec:
    """The spec with the pre-flight's plan in the trainer's environment (PLAN_ENV): every target passes spec.env."""
    return replace(spec, env={**spec.env, PLAN_ENV: plan_json})
