"""Experiment trackers (verl's trainer.logger: wandb, mlflow, swanlab) through their own client libraries.

One small class per tracker behind one interface: log(metrics, step), finish(), and log_generations(samples, step)
where the tracker shows validation samples (W&B's table, MLflow's artifact: trainer.log_val_generations; SwanLab's
are not sent). MetricsWriter (metrics.py) feeds them the very records it writes to metrics.jsonl, so each tracker
gets every scalar under the same name and step.
A tracker is a view of the run, never a reason to fail it: one that is not installed, cannot start, or raises
mid-run is said in one line and left out (metrics.jsonl holds everything). `verl-deploy run` refuses, before
anything starts, a tracker whose client is not installed where the trainer runs, where the host can know it
(verl_deploy.launchers.jobspec.check_installed): each tracker's module is its name in TRACKERS.

As verl 0.9.1 spells them (verl/utils/tracking.py, Tracking.__init__, lines 76-151): trainer.project_name is W&B's and
SwanLab's project and MLflow's experiment, trainer.experiment_name the run's name; W&B reads WANDB_* from the
environment (WANDB_API_KEY through the secret files: verl_runtime/secrets.py), MLflow MLFLOW_TRACKING_URI, SwanLab
SWANLAB_MODE / SWANLAB_API_KEY. Unlike verl, a resumed run continues the same W&B and MLflow run: their run ids are
kept in the run directory (rundir.WANDB_RUN_ID_FILE, rundir.MLFLOW_RUN_ID_FILE). Torch-free; each client is imported
only when its tracker is asked for.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path

from verl_runtime import rundir

TRACKERS = ("wandb", "mlflow", "swanlab")  # verl's names for them in trainer.logger
PIP_EXTRA = "pip install 'verl-deploy[trackers]'"


def _scalars(metrics: dict) -> dict[str, float]:
    return {name: value for name, value in metrics.items()
            if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}


def _kept_id(run_dir: Path, name: str) -> str | None:
    try:
        return (run_dir / name).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


class WandbTracker:
    name = "wandb"

    def __init__(self, run_dir: Path, project: str, experiment: str, config: dict):
        import wandb

        run_id = _kept_id(run_dir, rundir.WANDB_RUN_ID_FILE) or secrets.token_hex(4)  # W&B's ids: 8 of [a-z0-9]
        (run_dir / rundir.WANDB_DIR).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=experiment, entity=os.environ.get("WANDB_ENTITY"), config=config,
                              id=run_id, resume="allow", dir=str(run_dir), reinit="finish_previous")
        rundir.replace_text(run_dir / rundir.WANDB_RUN_ID_FILE, run_id)
        self.generations: list[list] = []  # val/generations' rows so far: W&B shows a table logged whole each time

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(_scalars(metrics), step=step)

    def log_generations(self, samples: list[tuple], step: int) -> None:
        """verl's table (verl/utils/tracking.py, ValidationGenerationsLogger.log_generations_to_wandb): a row per
        validation, step then input_i, output_i, score_i of each sample."""
        import wandb

        columns = ["step"] + [f"{name}_{i + 1}" for i in range(len(samples)) for name in ("input", "output", "score")]
        self.generations.append([step, *(value for sample in samples for value in sample)])
        rows = [row for row in self.generations if len(row) == len(columns)]  # a validation set that changed size
        self.run.log({"val/generations": wandb.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        self.run.finish()


# MLflow's metric names: slashes, alphanumerics, underscores, periods, dashes, colons and spaces only; '@' becomes
# '_at_' (verl 0.9.1, verl/utils/tracking.py, _MlflowLoggingAdapter._sanitize_key, lines 582-596).
_MLFLOW_INVALID = re.compile(r"[^/\w.\- :]")


def mlflow_key(name: str) -> str:
    return _MLFLOW_INVALID.sub("_", re.sub(r"/+", "/", name.replace("@", "_at_")))


class MlflowTracker:
    name = "mlflow"

    def __init__(self, run_dir: Path, project: str, experiment: str, config: dict):
        # A server that stops answering must not hold each step for minutes (MLflow's default: 7 retries, 120 s).
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # a local store in the run directory: MLflow's file store (the sqlite one needs the full mlflow)
            uri = (run_dir / rundir.MLFLOW_DIR).resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps it, "in maintenance mode"
        self.client = MlflowClient(tracking_uri=uri)
        self.run_id = _kept_id(run_dir, rundir.MLFLOW_RUN_ID_FILE)
        if self.run_id is not None:
            self.client.update_run(self.run_id, status="RUNNING")  # a resume: the same run goes on
        else:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or project
            found = self.client.get_experiment_by_name(name)
            experiment_id = found.experiment_id if found else self.client.create_experiment(name)
            self.run_id = self.client.create_run(experiment_id, run_name=experiment).info.run_id
            rundir.replace_text(run_dir / rundir.MLFLOW_RUN_ID_FILE, self.run_id)
        print(f"[INFO] MLflow: run {self.run_id} at {uri}", flush=True)

    def log_generations(self, samples: list[tuple], step: int) -> None:
        """An artifact val_step<N>.json of {input, output, score} rows, as verl's (ValidationGenerationsLogger.
        log_generations_to_mlflow)."""
        rows = [{"input": text, "output": output, "score": score} for text, output, score in samples]
        self.client.log_text(self.run_id, json.dumps(rows), f"val_step{step}.json")

    def log(self, metrics: dict, step: int) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(mlflow_key(k), float(v), now, step) for k, v in _scalars(metrics).items()]
        for start in range(0, len(batch), 1000):  # MLflow's log_batch takes at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=batch[start:start + 1000])

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)


class SwanlabTracker:
    name = "swanlab"

    def __init__(self, run_dir: Path, project: str, experiment: str, config: dict):
        import swanlab

        if os.environ.get("SWANLAB_API_KEY"):
            swanlab.login(os.environ["SWANLAB_API_KEY"])
        logdir = os.environ.get("SWANLAB_LOG_DIR") or str(run_dir / rundir.SWANLAB_DIR)
        self.run = swanlab.init(project=project, experiment_name=experiment, config={"FRAMEWORK": "verl-deploy", **config},
                                logdir=logdir, mode=os.environ.get("SWANLAB_MODE", "cloud"))

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(_scalars(metrics), step=step)

    def finish(self) -> None:
        self.run.finish()


_CLASSES = {"wandb": WandbTracker, "mlflow": MlflowTracker, "swanlab": SwanlabTracker}


def open_trackers(names, run_dir, project: str, experiment: str, config: dict | None = None) -> list:
    """The trackers of `names` that start; each one that does not is said in one line (a missing client names the
    pip extra) and left out."""
    started = []
    for name in dict.fromkeys(names):
        try:
            started.append(_CLASSES[name](Path(run_dir), project, experiment, config or {}))
        except ImportError as exc:
            print(f"[WARN] trainer.logger: {name} is not installed ({exc.name or exc}): {PIP_EXTRA}; metrics still go "
                  f"to {rundir.METRICS_FILE}", flush=True)
        except Exception as exc:  # the tracker's own failure (a server that does not answer, a bad key)
            print(f"[WARN] trainer.logger: {name} did not start ({type(exc).__name__}: {_first_line(exc)}); metrics "
                  f"still go to {rundir.METRICS_FILE}", flush=True)
    return started


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""
