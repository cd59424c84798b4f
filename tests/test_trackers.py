"""trainer.logger's trackers through their own clients: a real MLflow tracking server (SQLite store) started here on
127.0.0.1 receives a quickstart run's metrics, read back through its REST API; a W&B offline run holds them, read
back from its transaction log with wandb's own protobuf records; `--resume` continues the same MLflow and W&B run;
a tracker that fails mid-run warns once and training goes on. Network: loopback only."""

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port, require
from launch_support import QUICKSTART, cli, metrics_steps, wait_for

from verl_runtime import rundir
from verl_runtime.metrics import MetricsWriter, read_metrics
from verl_runtime.trackers import MlflowTracker, mlflow_key, open_trackers

SHORT = ["--set", "data.max_response_length=8", "--set", "trainer.test_freq=-1", "--set", "trainer.val_before_train=false"]
LOGGERS = ["--set", "trainer.logger=['console','mlflow','wandb']"]
# The tests' server is the full mlflow, in a venv of its own (the Makefile's $(MLFLOW)); the trainer uses mlflow-skinny.
MLFLOW = Path(sys.executable).parent.parent / "tools" / "mlflow" / "bin" / "mlflow"


class MlflowServer:
    def __init__(self, tmp_path: Path, backend: str | None = None):
        require(MLFLOW.exists(), f"{MLFLOW} is missing (`make setup` installs it)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # No job runner (its consumer processes are of no use here); the file store of the docker test allowed.
        env = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.process = subprocess.Popen(
            [MLFLOW, "server", "--backend-store-uri", backend or f"sqlite:///{tmp_path}/mlflow.db",
             "--default-artifact-root", str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "mlflow-server.log", "wb"), env=env,
            start_new_session=True)  # its own process group: the server and its workers go together
        assert wait_for(self._healthy, timeout_s=120), (tmp_path / "mlflow-server.log").read_text()[-2000:]

    def _healthy(self) -> bool:
        try:
            return urllib.request.urlopen(f"{self.url}/health", timeout=2).status == 200
        except OSError:
            return False

    def get(self, path: str, **params) -> dict:
        query = "&".join(f"{k}={urllib.parse.quote(str(v))}" for k, v in params.items())
        with urllib.request.urlopen(f"{self.url}/api/2.0/mlflow/{path}?{query}", timeout=10) as answer:
            return json.load(answer)

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        found = self.get("metrics/get-history", run_id=run_id, metric_key=mlflow_key(key))["metrics"]
        return sorted((m["step"], m["value"]) for m in found)

    def stop(self, signum=signal.SIGTERM) -> None:
        os.killpg(self.process.pid, signum)
        self.process.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):  # a worker that outlived it
            os.killpg(self.process.pid, signal.SIGKILL)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)  # as a server that dies: no goodbye to its clients


@pytest.fixture
def mlflow_server(tmp_path):
    server = MlflowServer(tmp_path)
    yield server
    if server.process.poll() is None:
        server.stop()


def wandb_records(run_dir: Path) -> list:
    """Every record of the run's W&B offline transaction logs (run-<id>.wandb), oldest run first, as wandb's own
    protobuf Records. The file is wandb's LevelDB-style log: a 7-byte header, then 32 KiB blocks of chunks
    (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    records = []
    for path in sorted((run_dir / rundir.WANDB_DIR).glob("offline-run-*/run-*.wandb")):
        data, pos, chunk = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B"
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            if left < 7:
                pos += left
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if length == 0 and kind == 0:  # the zero padding of a block's end
                pos += left
                continue
            chunk += data[pos + 7:pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(chunk)
                records.append(record)
                chunk = b""
    return records


def wandb_history(run_dir: Path) -> tuple[set[str], dict[int, dict]]:
    """(the run ids of the offline runs, {step: the step's logged values})."""
    run_ids, steps = set(), {}
    for record in wandb_records(run_dir):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_ids.add(record.run.run_id)
        elif kind == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            steps.setdefault(record.history.step.num, {}).update(items)
    return run_ids, steps


def assert_metrics_landed(run_dir: Path, server: MlflowServer, steps: list[int]) -> None:
    records = {r["step"]: r for r in read_metrics(run_dir)}
    assert sorted(records) == steps
    run_id = (run_dir / rundir.MLFLOW_RUN_ID_FILE).read_text()
    for name in ("actor/pg_loss", "critic/score/mean", "response_length/mean", "timing_s/step"):
        assert server.history(run_id, name) == [(s, pytest.approx(records[s][name])) for s in steps], name
    run = server.get("runs/get", run_id=run_id)["run"]
    assert run["info"]["run_name"] == "quickstart" and run["info"]["status"] == "FINISHED"
    experiment = server.get("experiments/get", experiment_id=run["info"]["experiment_id"])["experiment"]
    assert experiment["name"] == "verl-deploy"  # trainer.project_name, as verl's MLflow experiment

    run_ids, history = wandb_history(run_dir)
    assert run_ids == {(run_dir / rundir.WANDB_RUN_ID_FILE).read_text()}, "a resume continues the same W&B run"
    assert sorted(history) == steps
    for step in steps:
        assert history[step]["actor/pg_loss"] == pytest.approx(records[step]["actor/pg_loss"])
        assert history[step]["critic/score/mean"] == pytest.approx(records[step]["critic/score/mean"])


@pytest.fixture
def tracker_env(monkeypatch, mlflow_server):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    return mlflow_server


@pytest.mark.slow
def test_local_run_lands_in_mlflow_and_wandb_and_resume_continues_both(tmp_path, tracker_env):
    runs = tmp_path / "runs"
    common = ["--target", "local", "--runs-dir", runs, *SHORT, *LOGGERS]
    first = cli("run", QUICKSTART, *common, "--run-id", "trk-local", "--set", "trainer.total_training_steps=2")
    assert first.exit_code == 0, first.output
    assert_metrics_landed(runs / "trk-local", tracker_env, [1, 2])
    mlflow_run = (runs / "trk-local" / rundir.MLFLOW_RUN_ID_FILE).read_text()

    resumed = cli("run", QUICKSTART, *common, "--resume", "trk-local", "--set", "trainer.total_training_steps=3")
    assert resumed.exit_code == 0, resumed.output
    assert (runs / "trk-local" / rundir.MLFLOW_RUN_ID_FILE).read_text() == mlflow_run
    assert_metrics_landed(runs / "trk-local", tracker_env, [1, 2, 3])


@pytest.mark.slow
@pytest.mark.docker
def test_docker_run_lands_in_mlflow_and_wandb_and_resume_continues_both(tmp_path, cpu_image, monkeypatch, leftovers):
    """The container writes MLflow's file store and W&B's offline run into the mounted run directory (no network
    leaves the container); the test's MLflow server on 127.0.0.1 then serves that store through its REST API."""
    runs = tmp_path / "runs"
    leftovers.append("trk-dock")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")  # passed into the container (launchers' TRACKER_ENV)
    key = "0123456789abcdef0123456789abcdef0f1e2d3c"
    monkeypatch.setenv("WANDB_API_KEY", key)  # a secret file in the container, written down nowhere
    common = ["--target", "docker", "--image", cpu_image, "--runs-dir", runs, "--shm-size", "1g", *SHORT, *LOGGERS]
    first = cli("run", QUICKSTART, *common, "--run-id", "trk-dock", "--set", "trainer.total_training_steps=2")
    assert first.exit_code == 0, first.output
    resumed = cli("run", QUICKSTART, *common, "--resume", "trk-dock", "--set", "trainer.total_training_steps=3")
    assert resumed.exit_code == 0, resumed.output
    run_dir = runs / "trk-dock"
    assert not [p for p in run_dir.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    server = MlflowServer(tmp_path, backend=(run_dir / rundir.MLFLOW_DIR).as_uri())
    try:
        assert_metrics_landed(run_dir, server, [1, 2, 3])
    finally:
        server.stop()


@pytest.mark.slow
def test_a_tracker_whose_server_dies_mid_run_warns_once_and_metrics_go_on(tmp_path, mlflow_server, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    tracker = MlflowTracker(tmp_path, "verl-deploy", "dies", {})
    with MetricsWriter(tmp_path, trackers=[tracker]) as writer:
        writer.log(1, {"actor/pg_loss": 0.5})
        mlflow_server.kill()
        writer.log(2, {"actor/pg_loss": 0.25})
        writer.log(3, {"actor/pg_loss": 0.125})
    assert metrics_steps(tmp_path) == [1, 2, 3], "every step still in metrics.jsonl"
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[WARN]")]
    assert len(warnings) == 1 and warnings[0].startswith("[WARN] mlflow is off from step 2 ("), warnings


def test_a_tracker_that_is_not_installed_or_cannot_start_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "swanlab", None)  # as where the trackers extra is not installed
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    assert open_trackers(["swanlab", "mlflow"], tmp_path, "p", "e") == []
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("[WARN] trainer.logger: swanlab is not installed") and "verl-deploy[trackers]" in lines[0]
    assert lines[1].startswith("[WARN] trainer.logger: mlflow did not start (")


def test_trainer_logger_names_the_trackers_as_verl_does(capsys):
    from verl_runtime.config import load_config

    config = load_config(None, ["trainer.logger=['console','wandb','mlflow','swanlab','clearml']",
                                "trainer.project_name=my-project"])
    assert config.trainer.trackers == ["wandb", "mlflow", "swanlab"] and config.trainer.tensorboard is False
    assert config.trainer.project_name == "my-project"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: trainer.logger: clearml not here"), err
    assert mlflow_key("val-core/openai/gsm8k/reward/mean@1") == "val-core/openai/gsm8k/reward/mean_at_1"


@pytest.mark.parametrize("target", ["docker", "k8s", "slurm"])
def test_every_target_passes_the_tracker_settings_and_keeps_the_key_secret(target, monkeypatch, tmp_path):
    key = "0123456789abcdef0123456789abcdef0f1e2d3c"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    monkeypatch.setenv("WANDB_API_KEY", key)
    placed = ["--image", "registry.example/verl-deploy:1"] if target == "k8s" else []
    result = cli("run", QUICKSTART, "--target", target, "--dry-run", "--runs-dir", tmp_path, "--run-id", "trk-dry",
                 *placed, *LOGGERS)
    assert result.exit_code == 0, result.output
    assert "WANDB_MODE" in result.output and "http://mlflow.example:5000" in result.output
    assert key not in result.output, result.output[result.output.find(key) - 300:][:400]
    if target == "k8s":
        assert "WANDB_API_KEY" in result.output  # by name: a key of the run's Secret
    if target == "docker":
        assert ":/run/secrets:ro" in result.output  # its secret files


def test_swanlab_offline_run_holds_the_metric_names(tmp_path, monkeypatch):
    """SwanLab's offline mode (its run file is its own binary log: only that the run and the names landed)."""
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    (tracker,) = open_trackers(["swanlab"], tmp_path, "verl-deploy", "swan", {"seed": 1})
    with MetricsWriter(tmp_path, trackers=[tracker]) as writer:
        writer.log(1, {"actor/pg_loss": 0.5})
        writer.log(2, {"actor/pg_loss": 0.25})
    (run_file,) = (tmp_path / rundir.SWANLAB_DIR).glob("run-*/run-*.swanlab")
    assert b"actor/pg_loss" in run_file.read_bytes()


@pytest.mark.slow
def test_validation_generations_land_as_wandbs_table_and_mlflows_artifact(tmp_path, tracker_env):
    """trainer.log_val_generations=3: each validation's 3 samples (verl's choice: the same prompts every time) as
    W&B's val/generations table, one row per validation, and as MLflow's val_step<N>.json artifact."""
    runs = tmp_path / "runs"
    done = cli("run", QUICKSTART, "--target", "local", "--runs-dir", runs, "--run-id", "trk-val", *LOGGERS,
               "--set", "data.max_response_length=8", "--set", "data.toy_size=16", "--set", "trainer.test_freq=1",
               "--set", "trainer.val_before_train=false", "--set", "trainer.total_training_steps=2",
               "--set", "trainer.log_val_generations=3")
    assert done.exit_code == 0, done.output
    run_dir = runs / "trk-val"

    run_id = (run_dir / rundir.MLFLOW_RUN_ID_FILE).read_text()
    listed = tracker_env.get("artifacts/list", run_id=run_id)["files"]
    assert sorted(f["path"] for f in listed) == ["val_step1.json", "val_step2.json"]
    artifacts = Path(urllib.parse.urlparse(tracker_env.get("runs/get", run_id=run_id)["run"]["info"]["artifact_uri"]).path)
    logged = {step: json.loads((artifacts / f"val_step{step}.json").read_text()) for step in (1, 2)}
    assert [len(rows) for rows in logged.values()] == [3, 3]
    assert [row["input"] for row in logged[1]] == [row["input"] for row in logged[2]]  # the same prompts each time
    assert all(row["input"] and isinstance(row["output"], str) and isinstance(row["score"], float) for row in logged[1])

    _, history = wandb_history(run_dir)
    prefix = "val/generations/"  # W&B's record of a logged table: its fields under the key, flattened
    tables = {step: {k.removeprefix(prefix): v for k, v in history[step].items() if k.startswith(prefix)}
              for step in (1, 2)}
    assert all(table["_type"] == "table-file" and table["ncols"] == 10 for table in tables.values())
    assert [table["nrows"] for table in tables.values()] == [1, 2]  # a row per validation, the table logged whole
    saved = next((run_dir / rundir.WANDB_DIR).glob("offline-run-*/files/" + tables[2]["path"]))
    table = json.loads(saved.read_text())
    assert table["columns"] == ["step", "input_1", "output_1", "score_1", "input_2", "output_2", "score_2",
                                "input_3", "output_3", "score_3"]
    for row, step in zip(table["data"], (1, 2)):
        assert row == [step, *(sample[key] for sample in logged[step] for key in ("input", "output", "score"))]
