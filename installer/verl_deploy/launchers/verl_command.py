"""Upstream verl's command line in a run (`verl-deploy run --runtime verl`): main_ppo with the overrides as given,
after what the launcher sets unless they do: --gpus/--nodes as trainer.n_gpus_per_node/trainer.nnodes, the run
directory's checkpoints and metrics file, where `status`, `logs` and `--resume` find them. Pure; JobSpec reads it.
"""

from __future__ import annotations

import re

from verl_deploy import runtimes
from verl_deploy.runtimes import VERL
from verl_runtime.rundir import METRICS_FILE  # verl's `file` logger writes it too (VERL_FILE_LOGGER_PATH)

# Where docker/verl.Dockerfile puts verl-deploy's secret-file loader, the image's entrypoint: a shell command (a Ray
# head, a RayJob's entrypoint) names it itself.
SECRETS_ENTRY = ("python3", "/opt/verl-deploy/secrets.py")
# The keys the launcher sets unless the overrides do.
GPUS_KEY, NODES_KEY = VERL.world_keys
CHECKPOINTS_KEY, LOGGER_KEY = "trainer.default_local_dir", "trainer.logger"
# (runs.flat_metrics reads its lines)


def trainer_args(overrides, gpus_per_node: int, nodes: int, run_dir: str) -> list[str]:
    """main_ppo's arguments: the world size, the run directory's checkpoints and metrics file unless the overrides
    say otherwise, then the overrides as given."""
    args = []
    for key, value in ((GPUS_KEY, gpus_per_node), (NODES_KEY, nodes), (CHECKPOINTS_KEY, f"{run_dir}/checkpoints"),
                       (LOGGER_KEY, '["console","file"]')):
        if runtimes.given(overrides, key) is None:
            args.append(f"{key}={value}")
    return [*args, *overrides]


def environment(run_dir: str) -> dict[str, str]:
    """What verl's trainer reads from its environment: where its `file` logger writes."""
    return {"VERL_FILE_LOGGER_PATH": f"{run_dir}/{METRICS_FILE}"}


SOURCE_DIR = "/opt/verl-source"  # where docker/verl-source.Dockerfile puts a --verl-source (on PYTHONPATH)
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def entry_command(entry: str, source_root=None) -> tuple[str, ...]:
    """--entry as the trainer's command: `-m recipe.X.main_Y` (or the bare module) runs a module of the image's
    PYTHONPATH; `path/to/main_ppo.py` a script of the --verl-source (source_root: the source on this host, where the
    script must be). ValueError (one line) otherwise."""
    text = entry.strip()
    module = text[2:].strip() if text.startswith("-m ") or text.startswith("-m\t") else text
    if text.endswith(".py"):
        path = text.lstrip("./")
        if source_root is None:
            raise ValueError(f"--entry {entry}: a script runs from your verl source: add --verl-source DIR")
        if path.startswith("/") or ".." in path.split("/") or not (source_root / path).is_file():
            raise ValueError(f"--entry {entry}: no such script in the verl source {source_root} (give its path "
                             "relative to the source's root, e.g. recipe/dapo/main_dapo.py)")
        return ("python3", f"{SOURCE_DIR}/{path}")
    if not _MODULE.match(module):
        raise ValueError(f"--entry {entry}: give a module (-m recipe.dapo.main_dapo) or a script of the source "
                         "(recipe/dapo/main_dapo.py)")
    return ("python3", "-m", module)
