"""Credentials: which environment variables carry them, and how a run receives them without their values ever
being written into a container's configuration (`docker inspect`), a Kubernetes spec, a log or the run directory.

Every launcher puts one file per secret, named after its variable, in SECRETS_DIR inside the container (a 0600 file
bind-mounted read-only by `run --target docker`, compose's `secrets:`, a Kubernetes Secret volume). The runtime
reads them at start (load_secret_files). Torch-free: the host CLI imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

# Environment variables that carry credentials: passed by name only, never written into a spec, a label or a log.
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "NEPTUNE_API_TOKEN", "MLFLOW_TRACKING_PASSWORD",
              "MLFLOW_TRACKING_TOKEN", "SWANLAB_API_KEY")

SECRETS_DIR = "/run/secrets"  # inside the container; VERL_DEPLOY_SECRETS_DIR moves it (tests, a local run)
SECRETS_DIR_ENV = "VERL_DEPLOY_SECRETS_DIR"

# huggingface_hub reads its token from the file HF_TOKEN_PATH names: the value need not enter the environment.
_HF_TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def load_secret_files(environ=None) -> list[str]:
    """Make the secret files of SECRETS_DIR available to the libraries that read them: HF_TOKEN_PATH for the
    Hugging Face token, the environment for the others (W&B, Neptune and MLflow read only that). A variable
    already set wins. Returns the names found."""
    environ = os.environ if environ is None else environ
    directory = Path(environ.get(SECRETS_DIR_ENV) or SECRETS_DIR)
    found = []
    for name in SECRET_ENV:
        path = directory / name
        try:
            if not path.is_file():
                continue
            value = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue  # unreadable (another uid's, not text): the library then goes without, as with no secret at all
        if not value:
            continue
        found.append(name)
        if name in environ:
            continue
        if name in _HF_TOKENS:
            environ.setdefault("HF_TOKEN_PATH", str(path))
        else:
            environ[name] = value
    return found


def exec_with_secrets(argv: list[str]) -> None:
    """Load the secret files, then become `argv`: the entrypoint of images whose trainer is not verl_runtime
    (upstream verl's), so that its libraries find the credentials as verl_runtime's do."""
    if not argv:
        raise SystemExit("usage: secrets.py COMMAND [ARG...]")
    load_secret_files()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    import sys

    exec_with_secrets(sys.argv[1:])
