"""`verl-deploy export RUN --out DIR`: a run's checkpoint as a Hugging Face model directory.

The conversion runs where the run's code is: `python -m verl_runtime export` in this interpreter when it has torch
and transformers, else the same command in the run's image (Docker, the run directory read-only, no network, a
non-root user); a `--runtime verl` run goes through verl's own model merger in its image. Either way the model is
written into a fresh directory beside --out and renamed into place at the end, so a failure leaves nothing behind.
plan_export() says what would run as plain data (`--dry-run` prints it); torch is never imported here.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from verl_deploy import runs
from verl_deploy.launchers.jobspec import CACHE_DIR, RUNS_DIR, LaunchError, host_user
from verl_runtime import rundir
from verl_runtime.secrets import load_secret_files

EXPORT_DIR = "/export"  # in the container: the fresh directory beside --out, read-write
MODEL_NAME = "model"  # what the container writes inside it; renamed to --out on the host
VERL_STEP_DIR = re.compile(r"^global_step_(\d+)$")  # upstream verl's checkpoints/global_step_<N>/actor
EXPORT_LABEL = "verl-deploy.export-of"  # the run an export container reads


class ExportError(LaunchError):
    """A run that cannot be exported as asked (one line: what to do)."""


@dataclass(frozen=True)
class ExportPlan:
    """What `export` runs: argv in this interpreter (how="host") or a container (how="docker")."""

    run_dir: Path
    out: Path
    how: str  # host | docker
    argv: list[str]
    container: dict = field(default_factory=dict)  # the docker SDK's keywords for containers.create (docker)

    def describe(self) -> str:
        """The command line a user could run instead (the dry run)."""
        if self.how == "host":
            return shlex.join(self.argv)
        from verl_deploy.launchers.docker import docker_run_args

        work = self.container["mounts"][-1]["Source"]  # the fresh directory beside --out
        return f"{shlex.join(docker_run_args(self.container))} && mv {shlex.quote(f'{work}/{MODEL_NAME}')} " \
               f"{shlex.quote(str(self.out))}"


def host_has_runtime() -> bool:
    """This interpreter can run `python -m verl_runtime export` (torch and transformers importable)."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


def verl_checkpoint(run_dir: Path, step: int | None) -> tuple[int, Path]:
    """An upstream verl run's checkpoints/global_step_<N>/actor (step N, default the newest)."""
    root = run_dir / rundir.CHECKPOINTS_DIR
    found = sorted((int(m.group(1)), p) for p in (root.iterdir() if root.is_dir() else [])
                   if (m := VERL_STEP_DIR.match(p.name)) and (p / "actor").is_dir())
    if not found:
        raise ExportError(f"{run_dir} has no verl checkpoint (checkpoints/global_step_N/actor): train until "
                          "trainer.save_freq saves one")
    if step is None:
        return found[-1][0], found[-1][1] / "actor"
    if step not in dict(found):
        raise ExportError(f"{run_dir} has no checkpoint of step {step}: the steps there are "
                          + ", ".join(str(n) for n, _ in found))
    return step, dict(found)[step] / "actor"


def plan_export(run_dir: Path, out: Path | None, *, step: int | None = None, dtype: str | None = None,
                max_shard_size: str | None = None, image: str | None = None, in_image: bool | None = None,
                environ=None) -> ExportPlan:
    """How to export run_dir to out; ExportError (one line) for what cannot work. in_image None: in the run's
    image only where this interpreter lacks torch (always for a verl run)."""
    from verl_runtime import export as runtime_export  # torch-free at import: its checks serve both sides
    from verl_runtime.errors import UserError

    environ = os.environ if environ is None else environ
    upstream = (runs.read_launch(run_dir) or runs.Launch()).upstream
    if out is None:  # a Kubernetes run's export (launchers/k8s_export.py) writes on its claim instead
        raise ExportError("--out DIR is needed: the model directory to write (new or empty)")
    out = Path(out).expanduser().absolute()
    try:  # what can be told in a second, before torch or a container starts (sizes only: checksums are theirs)
        runtime_export.check_destination(out)
        if not upstream:
            runtime_export.base_model_of(run_dir)
            runtime_export.pick_checkpoint(run_dir, step, deep=False)
    except UserError as exc:
        raise ExportError(str(exc)) from None
    if upstream:
        if dtype or max_shard_size:
            raise ExportError("--dtype and --max-shard-size are for verl-deploy runs: verl's model merger writes "
                              "the checkpoint's own")
        _, actor = verl_checkpoint(run_dir, step)
        argv = ["python3", "-m", "verl.model_merger", "merge", "--backend", "fsdp",
                "--local_dir", _in_container(run_dir, actor), "--target_dir", f"{EXPORT_DIR}/{MODEL_NAME}"]
        return _in_image(run_dir, out, argv, image, environ)
    options = [*(["--step", str(step)] if step is not None else []), *(["--dtype", dtype] if dtype else []),
               *(["--max-shard-size", max_shard_size] if max_shard_size else [])]
    if in_image is None:
        in_image = not host_has_runtime()
    if not in_image:
        argv = [sys.executable, "-m", "verl_runtime", "export", str(run_dir), "--out", str(out), *options]
        return ExportPlan(run_dir, out, "host", argv)
    argv = ["python", "-m", "verl_runtime", "export", _in_container(run_dir, run_dir),
            "--out", f"{EXPORT_DIR}/{MODEL_NAME}", *options]
    return _in_image(run_dir, out, argv, image, environ)


def _in_image(run_dir: Path, out: Path, argv: list[str], image: str | None, environ) -> ExportPlan:
    image = image or (runs.read_launch(run_dir) or runs.Launch()).image
    if not image:
        why = "" if host_has_runtime() else " and this Python has no torch to export with"
        raise ExportError(f"{run_dir} records no image to export in{why}: pass --image (e.g. the one it trained "
                          "in), or install the runtime extra here (pip install 'verl-deploy[runtime]')")
    work = out.parent / f".{out.name}.export"  # made by run_export; named here so the dry run shows the mount
    return ExportPlan(run_dir, out, "docker", argv, container_options(image, run_dir, work, argv, environ))


def _in_container(run_dir: Path, path: Path) -> str:
    """Where path (in run_dir) is in the export container."""
    inside = path.relative_to(run_dir).as_posix()
    return f"{RUNS_DIR}/{run_dir.name}" + ("" if inside == "." else f"/{inside}")


def container_options(image: str, run_dir: Path, work: Path, argv: list[str], environ) -> dict:
    """A container as the docker launcher makes them (non-root, read-only root, no capabilities) and further shut
    off: no network (the model is read from the Hugging Face cache, offline), the run directory read-only."""
    from verl_deploy.launchers.docker import TMPFS

    from docker.types import Mount

    mounts = [Mount(f"{RUNS_DIR}/{run_dir.name}", str(run_dir), type="bind", read_only=True)]
    cache = Path(environ.get("HF_HOME") or Path(environ.get("HOME") or Path.home()) / ".cache" / "huggingface")
    if cache.is_dir():  # the base model's config and tokenizer, as the run downloaded them
        mounts.append(Mount(CACHE_DIR, str(cache), type="bind", read_only=True))
    mounts.append(Mount(EXPORT_DIR, str(work), type="bind"))
    return {
        # Not the run-id label: status and stop would take this container for the run's trainer.
        "labels": {EXPORT_LABEL: run_dir.name},
        "user": host_user(),
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "read_only": True,
        "tmpfs": dict(TMPFS),
        "network_mode": "none",
        "mounts": mounts,
        "environment": {"HOME": "/tmp", "HF_HOME": CACHE_DIR, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                        "VERL_RUNTIME_CACHE": "/tmp/verl_runtime"},  # builtin:tiny is built there, offline
        "entrypoint": argv[:3],
        "image": image,
        "command": argv[3:],
    }


def run_export(plan: ExportPlan, echo=print) -> int:
    """Run the plan; the exit code (0: out is a whole model directory; else nothing is left at out)."""
    if plan.how == "host":
        with subprocess.Popen(plan.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
            for line in process.stdout:  # through echo: the caller decides where the runtime's lines go
                echo(line, end="")
        return process.returncode
    work = Path(plan.container["mounts"][-1]["Source"])
    shutil.rmtree(work, ignore_errors=True)  # an earlier export's, cut short
    try:
        work.mkdir(parents=True)
    except OSError as exc:
        raise ExportError(f"cannot write beside {plan.out} ({exc.strerror}): choose a writable --out") from None
    try:
        uid, gid = (int(part) for part in plan.container["user"].split(":"))
        if os.getuid() == 0:  # the container's non-root user writes there
            os.chown(work, uid, gid)
        code = _run_container(plan.container, echo)
        if code == 0:
            model = work / MODEL_NAME
            if os.getuid() == 0:
                _chown_tree(model, os.getuid(), os.getgid())
            if plan.out.exists():
                plan.out.rmdir()  # empty (plan_export refused a non-empty one)
            os.rename(model, plan.out)
        return code
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_container(options: dict, echo) -> int:
    import docker.errors

    from verl_deploy.launchers.docker import client, discard, ensure_image

    engine = client()
    ensure_image(engine, options["image"])
    container = engine.containers.create(**options)
    try:
        container.start()
        for chunk in container.logs(stream=True, follow=True):
            echo(chunk.decode(errors="replace"), end="")
        return int(container.wait().get("StatusCode", 1))
    except docker.errors.APIError as exc:
        raise ExportError(f"the export container did not run: {(exc.explanation or str(exc)).splitlines()[0]}")
    finally:
        discard(container)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    for parent, dirs, files in os.walk(root):
        os.lchown(parent, uid, gid)
        for name in files:
            os.lchown(os.path.join(parent, name), uid, gid)


# --- the Hub ----------------------------------------------------------------------------------------------------

SECRETS_FOLDER = ".secrets"  # `verl-deploy init`'s folder of secret files (compose's secret)


def hub_token(environ=None) -> str:
    """The Hugging Face token: $HF_TOKEN (or HUGGING_FACE_HUB_TOKEN), else the secret file HF_TOKEN in
    $VERL_DEPLOY_SECRETS_DIR or ./.secrets, else huggingface_hub's login. Never printed."""
    environ = dict(os.environ if environ is None else environ)
    environ.setdefault("VERL_DEPLOY_SECRETS_DIR", SECRETS_FOLDER)
    load_secret_files(environ)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if environ.get(name, "").strip():
            return environ[name].strip()
    if environ.get("HF_TOKEN_PATH"):
        return Path(environ["HF_TOKEN_PATH"]).read_text(encoding="utf-8").strip()
    try:
        from huggingface_hub import get_token

        token = get_token()
    except ImportError:
        token = None
    if not token:
        raise ExportError("no Hugging Face token for --push-to-hub: set HF_TOKEN, or write it to .secrets/HF_TOKEN "
                          "((umask 077; printf %s \"$TOKEN\" > .secrets/HF_TOKEN)), or `hf auth login`")
    return token


def push_to_hub(folder: Path, repo: str, private: bool, environ=None) -> str:
    """Create the model repository (if new) and upload the folder; the repository's URL."""
    token = hub_token(environ)
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError:
        raise ExportError("--push-to-hub needs huggingface_hub: pip install huggingface_hub") from None
    api = HfApi(token=token)
    try:
        url = api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="model",
                          commit_message="Upload model exported by verl-deploy")
    except HfHubHTTPError as exc:
        raise ExportError(f"the Hub refused {repo}: {str(exc).splitlines()[0]}") from None
    except _transport_errors() as exc:
        from huggingface_hub import constants

        raise ExportError(f"cannot reach {constants.ENDPOINT} to push {repo} ({type(exc).__name__}); the model "
                          f"stays in {folder}: push it later (`hf upload {repo} {folder}`)") from None
    return str(url)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """What a Hub client raises when it cannot reach the endpoint (its HTTP library's, whichever is installed)."""
    found: list[type[BaseException]] = [OSError]
    for module, name in (("httpx", "TransportError"), ("httpx2", "TransportError"), ("requests", "ConnectionError")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)
