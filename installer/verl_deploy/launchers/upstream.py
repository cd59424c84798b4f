"""Upstream verl as a run's runtime (`verl-deploy run --runtime verl`): its command line, its world size, and the
check of the overrides by verl's own config composition and validation inside its image, before anything starts.

verl takes its config as Hydra overrides only (`key=value`, `+key=value` adds one, `++key=value` adds or sets,
`~key` drops one), passed as given. --gpus/--nodes become trainer.n_gpus_per_node/trainer.nnodes; the run's
checkpoints and metrics land in its run directory, where `status`, `logs` and `--resume` find them.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

from verl_deploy.launchers.jobspec import LaunchError, derive_world, parse_gpus

RUNTIME = "verl"
# Where docker/verl.Dockerfile puts verl-deploy's secret-file loader, the image's entrypoint: a shell command (a Ray
# head, a RayJob's entrypoint) names it itself.
SECRETS_ENTRY = ("python3", "/opt/verl-deploy/secrets.py")
# Hydra's override grammar, as far as telling a typo of the form from a key goes.
_OVERRIDE = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][\w.\-\[\]/@]*(=.*)?$", re.S)
# The keys the launcher sets unless the overrides do.
GPUS_KEY, NODES_KEY = "trainer.n_gpus_per_node", "trainer.nnodes"
CHECKPOINTS_KEY, LOGGER_KEY = "trainer.default_local_dir", "trainer.logger"
METRICS_FILE = "metrics.jsonl"  # verl's `file` logger writes here (VERL_FILE_LOGGER_PATH): `status` reads it
# (runs.flat_metrics reads its lines)


def check_overrides(overrides) -> tuple[str, ...]:
    """verl's overrides as given; LaunchError (one line) for one that is not of Hydra's forms."""
    for override in overrides:
        if not _OVERRIDE.match(override) or ("=" not in override and not override.startswith("~")):
            raise LaunchError(f"override {override!r} is not one verl takes: key=value, +key=value (a new key), "
                              "++key=value or ~key (drop one)")
    return tuple(overrides)


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def given(overrides, key: str) -> str | None:
    """The value the overrides give a key (the last one wins, as in Hydra), or None."""
    value = None
    for override in overrides:
        if _key(override) == key and "=" in override:
            value = override.split("=", 1)[1]
    return value


def world(overrides, gpus: str | None, nodes: int | None) -> tuple[str, int]:
    """--gpus and --nodes for a verl run: the flags, else verl's trainer.n_gpus_per_node/trainer.nnodes overrides;
    LaunchError (one line) where they disagree or no GPU count is known (verl trains on GPUs only; its default of
    8 per node would silently ask for GPUs the host may not have)."""
    def number(key: str) -> int | None:
        text = given(overrides, key)
        if text is None:
            return None
        if not text.isdigit():
            raise LaunchError(f"{key}={text} is not a count: give a whole number")
        return int(text)

    trainer = SimpleNamespace(n_gpus_per_node=number(GPUS_KEY), nnodes=number(NODES_KEY), device="cuda")
    gpus, nodes = derive_world(trainer, gpus, nodes)
    if parse_gpus(gpus).number is None or not parse_gpus(gpus).wanted:
        raise LaunchError(f"upstream verl trains on GPUs and needs their count per node: pass --gpus N (or "
                          f"{GPUS_KEY}=N){'; --gpus all is not a count' if gpus == 'all' else ''}")
    return gpus, nodes


def trainer_args(overrides, gpus_per_node: int, nodes: int, run_dir: str) -> list[str]:
    """main_ppo's arguments: the world size, the run directory's checkpoints and metrics file unless the overrides
    say otherwise, then the overrides as given."""
    args = []
    for key, value in ((GPUS_KEY, gpus_per_node), (NODES_KEY, nodes), (CHECKPOINTS_KEY, f"{run_dir}/checkpoints"),
                       (LOGGER_KEY, '["console","file"]')):
        if given(overrides, key) is None:
            args.append(f"{key}={value}")
    return [*args, *overrides]


def environment(run_dir: str) -> dict[str, str]:
    """What verl's trainer reads from its environment: where its `file` logger writes."""
    return {"VERL_FILE_LOGGER_PATH": f"{run_dir}/{METRICS_FILE}"}


# --- the check: verl's own config composition in its image -----------------------------------------------------

def composition_error(stderr: str) -> str:
    """Hydra's error, as one line: what it could not do and why, then its hint ("To append to your config use
    ..."); a traceback's last line. verl's log lines and Hydra's HYDRA_FULL_ERROR advice are left out."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    lines = [line for line in lines if not _NOISE.match(line)]
    if not lines:
        return "verl's trainer exited without saying why"
    if any(line.startswith("Traceback") for line in lines):
        return lines[-1]
    hints = ("To append", "See https://")  # Hydra's advice: how to add a key, where its grammar is
    hint = [line for line in lines if line.startswith(hints)]
    message = " ".join(line for line in lines if not line.startswith(hints))
    return message + (f" ({hint[0][0].lower()}{hint[0][1:]})" if hint else "")


_NOISE = re.compile(r"^((WARNING|INFO|DEBUG):|Set the environment variable HYDRA_FULL_ERROR|full_key:|object_type=|"
                    r"reference_type=)")


# Run in verl's image with the overrides as its arguments: first `main_ppo ... --cfg job` (Hydra composing verl's
# config, then printing it), then the validation main_ppo does before it starts Ray (verl.utils.config's
# validate_config: batch sizes against the GPUs, the micro batch sizes it needs), so that a run that would stop in
# its first seconds stops here. Hydra's and verl's message go to stderr; the exit code says which failed.
CHECK = """
import subprocess, sys
composed = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *sys.argv[1:], "--cfg", "job"],
                          capture_output=True, text=True)
sys.stdout.write(composed.stdout)
if composed.returncode:
    sys.stderr.write(composed.stderr)
    sys.exit(2)
import warnings
warnings.filterwarnings("ignore")  # verl's notes ("Disabled critic as ...") are not the error
from hydra import compose, initialize_config_module
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
try:
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=sys.argv[1:])
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
except Exception as exc:
    cause = exc.__cause__ or exc
    print(f"{type(cause).__name__}: {cause}", file=sys.stderr)
    sys.exit(3)
"""


def check_in_image(engine, image: str, args: list[str]) -> str:
    """Compose and validate verl's config with these main_ppo arguments in its image (CHECK; no network, nothing
    mounted, no GPU); the composed config's text, or LaunchError with Hydra's or verl's message as one line."""
    import docker

    from verl_deploy.launchers.docker import ROLE_LABEL, TMPFS

    try:
        container = engine.containers.run(
            image, ["python3", "-c", CHECK, *args], detach=True, network_disabled=True, user="1000:1000",
            cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True, working_dir="/tmp", tmpfs=TMPFS,
            environment={"HOME": "/tmp", "HF_HUB_OFFLINE": "1"}, labels={ROLE_LABEL: "config-check"},
        )
    except docker.errors.ImageNotFound:
        raise LaunchError(f"{image} is not on this host: build it first, verl-deploy images build --runtime verl") from None
    except docker.errors.APIError as exc:
        raise LaunchError(f"could not start {image} to check the overrides: {exc.explanation or exc}") from None
    try:
        code = container.wait(timeout=300).get("StatusCode", 1)
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
        err = container.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    if code == 2:
        raise LaunchError(f"verl's config rejects the overrides: {composition_error(err)}")
    if code != 0:  # verl's validation: its exception, the last line (3), or the check's own crash
        lines = [line.strip() for line in err.splitlines() if line.strip()]
        raise LaunchError(f"verl's config check fails: {lines[-1] if lines else f'exit code {code}'}")
    return out
