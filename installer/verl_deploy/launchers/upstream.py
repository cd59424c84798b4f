"""Upstream verl's own check of a run's overrides (`verl-deploy run --runtime verl`): its config composed and
validated by verl itself inside its image, before anything starts; Hydra's or verl's message as one line.
"""

from __future__ import annotations

import re

from verl_deploy.launchers.jobspec import LaunchError


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
# VERL_DEPLOY_ENTRY (JSON, a --verl-source run's --entry: `-m recipe.X.main_Y` or a script of the source) is
# composed in place of main_ppo, by its own Hydra config; verl's validation is main_ppo's, so it follows only that.
CHECK = """
import json, os, subprocess, sys
entry = json.loads(os.environ.get("VERL_DEPLOY_ENTRY") or '["-m", "verl.trainer.main_ppo"]')
composed = subprocess.run([sys.executable, *entry, *sys.argv[1:], "--cfg", "job"], capture_output=True, text=True)
sys.stdout.write(composed.stdout)
if composed.returncode:
    sys.stderr.write(composed.stderr)
    sys.exit(2)
if entry != ["-m", "verl.trainer.main_ppo"]:
    sys.exit(0)
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


CHECK_TIMEOUT_S = 300  # about 20 s on two CPU cores


def check_in_image(engine, image: str, args: list[str], entry: tuple[str, ...] = ()) -> str:
    """Compose and validate verl's config with these main_ppo arguments in its image (CHECK; no network, nothing
    mounted, no GPU); the composed config's text, or LaunchError with Hydra's or verl's message as one line.
    entry: the trainer's command after python3 (--entry of a --verl-source run; (): main_ppo)."""
    import json

    import docker
    import requests

    from verl_deploy.launchers.docker import ROLE_LABEL, TMPFS, discard

    try:
        container = engine.containers.run(
            image, ["python3", "-c", CHECK, *args], detach=True, network_disabled=True, user="1000:1000",
            cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True, working_dir="/tmp", tmpfs=TMPFS,
            environment={"HOME": "/tmp", "HF_HUB_OFFLINE": "1", **({"VERL_DEPLOY_ENTRY": json.dumps(list(entry))} if entry else {})},
            labels={ROLE_LABEL: "config-check"},
        )
    except docker.errors.ImageNotFound:
        raise LaunchError(f"{image} is not on this host: build it first, verl-deploy images build --runtime verl") from None
    except docker.errors.APIError as exc:
        raise LaunchError(f"could not start {image} to check the overrides: {exc.explanation or exc}") from None
    try:
        code = container.wait(timeout=CHECK_TIMEOUT_S).get("StatusCode", 1)
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
        err = container.logs(stdout=False, stderr=True).decode(errors="replace")
    except requests.exceptions.RequestException:  # the wait's timeout, or the engine gone
        raise LaunchError(f"verl's config check in {image} gave no answer within {CHECK_TIMEOUT_S} s: is this host "
                          "busy? Try again") from None
    finally:
        discard(container)
    return verdict(code, out, err)


def check_on_host(python: str, env: dict[str, str], args: list[str], entry: tuple[str, ...] = ()) -> str:
    """CHECK with this host's Python (a run of verl in it: launchers/host_verl.py), in a scratch directory with the
    run's environment; the composed config, or LaunchError as check_in_image's."""
    import json
    import os
    import subprocess
    import tempfile

    extra = {"HF_HUB_OFFLINE": "1", **({"VERL_DEPLOY_ENTRY": json.dumps(list(entry))} if entry else {})}
    with tempfile.TemporaryDirectory(prefix="verl-check-") as scratch:
        try:
            done = subprocess.run([python, "-c", CHECK, *args], capture_output=True, text=True, cwd=scratch,
                                  env={**os.environ, **env, **extra}, timeout=CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"verl's config check with {python} gave no answer within {CHECK_TIMEOUT_S} s: is this "
                              "host busy? Try again") from None
    return verdict(done.returncode, done.stdout, done.stderr)


def verdict(code: int, out: str, err: str) -> str:
    """CHECK's outcome: the composed config (exit 0), or LaunchError: Hydra's message (2), verl's validation's
    exception (3), or the last line of whatever else stopped it."""
    if code == 2:
        raise LaunchError(f"verl's config rejects the overrides: {composition_error(err)}")
    if code != 0:
        lines = [line.strip() for line in err.splitlines() if line.strip()]
        raise LaunchError(f"verl's config check fails: {lines[-1] if lines else f'exit code {code}'}")
    return out
