"""compose.yaml validates with the Compose on this host (v2 plugin, or Debian's docker-compose v1); the CPU override
runs a short training to completion, leaving metrics and a checkpoint in the host's run directory, in a hardened
container (no capabilities, read-only root, no new privileges, a process limit) that reads its secrets as files in
/run/secrets and has none in its environment; as root with the defaults of .env.example too."""

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml
from conftest import REPO, require

from verl_deploy.launchers.docker import PIDS_LIMIT, SERVICE_PIDS_LIMIT
from verl_runtime.config import ServicesConfig
from verl_runtime.secrets import SECRET_ENV, SECRETS_DIR
from verl_runtime.services.registry import SERVICES, url_env

pytestmark = pytest.mark.docker

CPU = ["-f", "compose.yaml", "-f", "compose.cpu.yaml"]
PROJECT = f"verl-compose-test-{os.getpid()}"  # containers and network of one test session
SECRET = "hf_compose_secret_value_77"
TRAINER_UID = 1000  # .env.example's VERL_UID: what a root user keeps

# Two GRPO steps on the built-in tiny model: what the quickstart does, only smaller.
TINY_CONFIG = """\
data: {train_files: toy:letter, toy_size: 16, batch_size: 2, max_prompt_length: 64, max_response_length: 4}
model: {path: builtin:tiny}
rollout: {name: hf, n: 2}
algorithm: {adv_estimator: grpo}
trainer: {device: cpu, total_training_steps: 2}
"""


def compose_command() -> list[str]:
    """The Compose v2 plugin, else Debian's docker-compose (v1): compose.yaml is written for both."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    require(shutil.which("docker-compose") is not None, "no Docker Compose (.ci/services.sh installs docker-compose)")
    return ["docker-compose"]


def set_env(text: str, **values: str) -> str:
    """.env text with KEY=value set, uncommenting or appending the line, as a user edits .env.example."""
    for key, value in values.items():
        text, found = re.subn(rf"^#? ?{key}=.*$", f"{key}={value}", text, flags=re.M)
        if not found:
            text += f"{key}={value}\n"
    return text


def write_secret(project, name: str, value: str, uid: int) -> None:
    """A secret file as the docs say to write one: 0600, owned by the trainer's uid."""
    path = project / ".secrets" / name
    path.write_text(value)
    path.chmod(0o600)
    os.chown(path, uid, uid)


def copy_checkout(tmp_path, **env: str):
    """The compose files, .secrets/ as shipped, a tiny config and a .env made from .env.example, as a user sets
    them up (the user's edits in env)."""
    for name in ("compose.yaml", "compose.cpu.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / ".secrets", tmp_path / ".secrets", ignore=lambda _, names: [n for n in names if n in SECRET_ENV])
    (tmp_path / "tiny.yaml").write_text(TINY_CONFIG)
    (tmp_path / ".env").write_text(set_env((REPO / ".env.example").read_text(), VERL_CONFIG="./tiny.yaml", **env))
    return tmp_path


@pytest.fixture
def project(tmp_path):
    """A user's checkout; the run directory and the HF cache on temporary host paths owned by the container's user."""
    uid, gid = os.getuid() or 1000, os.getgid() or 1000
    for name in ("runs", "hf-cache", "data"):
        (tmp_path / name).mkdir()
        os.chown(tmp_path / name, uid, gid)
    return copy_checkout(tmp_path, VERL_RUN_ID="compose-cpu", VERL_RUNS=str(tmp_path / "runs"),
                         VERL_HF_CACHE=str(tmp_path / "hf-cache"), VERL_UID=str(uid), VERL_GID=str(gid))


def compose(project, *args, env=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([*compose_command(), "-p", PROJECT, *args], cwd=project,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def config(project, *args) -> dict:
    out = compose(project, *args, "config")
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)["services"]


def test_env_example_names_every_secret_and_sets_none():
    text = (REPO / ".env.example").read_text()
    assert all(name in text for name in SECRET_ENV)
    assert not re.search(rf"^({'|'.join(SECRET_ENV)})=", text, flags=re.M)  # no secret goes through .env
    assert "VERL_SECRETS_DIR=./.secrets" in text
    ignored = subprocess.run(["git", "check-ignore", ".secrets/HF_TOKEN", ".secrets/README.md"], cwd=REPO,
                             capture_output=True, text=True).stdout.split()
    assert ignored == [".secrets/HF_TOKEN"]  # the folder ships (compose needs it), its secrets never do


def test_compose_yaml_reserves_gpus_and_mounts_the_run_volumes(project):
    assert compose(project, "config", "-q").returncode == 0
    trainer = config(project)["trainer"]
    devices = trainer["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
    targets = {v.split(":")[1] if isinstance(v, str) else v["target"] for v in trainer["volumes"]}
    assert {"/etc/verl-deploy/config.yaml", "/workspace/runs", "/cache/huggingface", "/data"} <= targets
    assert trainer["user"] != "0:0" and trainer["command"][0] == "train"
    assert "profiles" not in trainer  # `docker compose up` starts it


def hardened(service: dict) -> None:
    assert service["cap_drop"] == ["ALL"] and service["read_only"] is True
    limit = SERVICE_PIDS_LIMIT if service.get("profiles") == ["tools"] else PIDS_LIMIT  # as `run --target docker`
    assert service["security_opt"] == ["no-new-privileges:true"] and int(service["pids_limit"]) == limit
    assert service["tmpfs"] == ["/tmp:exec,mode=1777"]  # Triton dlopens what it compiles into /tmp


def test_every_service_is_hardened_and_the_trainer_gets_secrets_as_files_only(project):
    services = config(project, "--profile", "gpu", "--profile", "tensorboard", *CPU)
    for service in services.values():
        hardened(service)
    prepare = services.pop("prepare")
    assert prepare["user"] == "0:0" and prepare["network_mode"] == "none"
    assert sorted(prepare["cap_add"]) == ["CHOWN", "DAC_OVERRIDE", "SETGID", "SETUID"]
    for name in ("trainer", "trainer-cpu"):
        trainer = services[name]
        assert "env_file" not in trainer
        environment = trainer["environment"]
        names = list(environment) if isinstance(environment, dict) else [e.split("=")[0] for e in environment]
        assert names and not set(names) & set(SECRET_ENV)
        assert trainer["secrets"] == [{"source": "verl-deploy-secrets", "target": SECRETS_DIR}]
        assert trainer["depends_on"] == {"prepare": {"condition": "service_completed_successfully"}}
        cache = next(v for v in trainer["volumes"] if ":/cache/huggingface" in str(v))
        assert not str(cache).endswith(":ro")  # models are downloaded into it


def test_compose_config_shows_no_secret_value(project):
    """A secret in the shell, in .env (where the old .env.example put it) and in the secrets folder: `config` prints
    the folder's path, never a value."""
    write_secret(project, "HF_TOKEN", SECRET, os.getuid() or 1000)
    (project / ".env").write_text((project / ".env").read_text() + f"HF_TOKEN={SECRET}\nWANDB_API_KEY={SECRET}\n")
    out = compose(project, *CPU, "--profile", "gpu", "config", env={"HF_TOKEN": SECRET})
    assert out.returncode == 0, out.stderr
    assert SECRET not in out.stdout + out.stderr
    assert yaml.safe_load(out.stdout)["secrets"] == {"verl-deploy-secrets": {"file": str(project / ".secrets")}}


def test_cpu_override_swaps_the_gpu_trainer_for_the_same_container_on_the_cpu(project):
    services = config(project, "--profile", "gpu", *CPU)  # v2 leaves services of inactive profiles out
    gpu, cpu = services["trainer"], services["trainer-cpu"]
    assert gpu["profiles"] == ["gpu"] and "profiles" not in cpu  # only trainer-cpu is in the default set
    assert "deploy" not in cpu and cpu["image"].endswith("-cpu") and "memlock" not in cpu["ulimits"]
    different = {"image", "shm_size", "deploy", "profiles", "ulimits"}
    assert {k: v for k, v in cpu.items() if k not in different} == {k: v for k, v in gpu.items() if k not in different}
    assert cpu["ulimits"]["stack"] == gpu["ulimits"]["stack"]


def test_the_tool_services_are_hardened_on_a_network_with_no_way_out(project):
    """compose.yaml's sandbox and retriever run what `run --target docker` runs (the registry's command line with the
    config's defaults), hardened, with nothing of the run, on the internal network `tools`; the trainers find them
    where the registry says."""
    out = compose(project, "--profile", "tools", "--profile", "gpu", *CPU, "config")
    assert out.returncode == 0, out.stderr
    whole = yaml.safe_load(out.stdout)
    assert whole["networks"]["tools"]["internal"] is True
    services, defaults = whole["services"], ServicesConfig()
    for name, service in SERVICES.items():
        container = services[name]
        hardened(container)
        assert container["user"] != "0:0"
        assert set(container["networks"]) == {"tools"} and container["profiles"] == ["tools"]
        assert "secrets" not in container and container["environment"] == {"HOME": "/tmp", "PYTHONUNBUFFERED": "1"}
        assert container["volumes"][0].endswith(":/data:ro") and container["image"].endswith("-services")
        args = service.args(getattr(defaults, name), service.port, host="0.0.0.0", in_container=True)
        assert container["entrypoint"] == ["python"]
        assert [a for a in container["command"] if a] == args + (["--corpus"] if name == "retriever" else [])
        assert container["healthcheck"]["test"] == ["CMD", *service.probe()]
        for trainer in ("trainer", "trainer-cpu"):
            assert services[trainer]["environment"][url_env(name)] == f"http://{name}:{service.port}"
            assert set(services[trainer]["networks"]) == {"default", "tools"}
    assert services["sandbox"]["deploy"]["replicas"] == 1  # VERL_SANDBOX_REPLICAS: more behind the name `sandbox`
    scaled = compose(project, "--profile", "tools", *CPU, "config", env={"VERL_SANDBOX_REPLICAS": "3"})
    assert yaml.safe_load(scaled.stdout)["services"]["sandbox"]["deploy"]["replicas"] == 3, scaled.stderr


def up_trainer(project, env, timeout=300) -> subprocess.CompletedProcess:
    """The documented command: the trainer named, so that the end of the one-shot `prepare` stops nothing."""
    return compose(project, *CPU, "up", "--exit-code-from", "trainer-cpu", "trainer-cpu", env=env, timeout=timeout)


def down(project, env) -> None:
    out = compose(project, *CPU, "down", "-v", "--remove-orphans", env=env)
    assert out.returncode == 0, out.stderr


@pytest.mark.slow
def test_cpu_override_runs_to_completion(project, docker_client, cpu_image):
    env = {"VERL_IMAGE": cpu_image}
    try:
        up = up_trainer(project, env)
    finally:
        down(project, env)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-2000:]
    assert "Training finished at step 2" in up.stdout
    run_dir = project / "runs" / "compose-cpu"
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run_dir / "checkpoints" / "step_2" / "state.pt").is_file()
    assert docker_client.containers.list(all=True, filters={"label": f"com.docker.compose.project={PROJECT}"}) == []


@pytest.mark.slow
def test_root_with_the_defaults_trains_hardened_and_reads_its_secret_from_a_file(tmp_path, docker_client, cpu_image):
    """`docker compose up` by root with .env.example as shipped (VERL_UID 1000, ./runs not there yet): `prepare`
    hands the run directory and the new HF cache to uid 1000, the trainer trains; `docker inspect` shows the hardening
    and no secret; the runtime finds HF_TOKEN as /run/secrets/HF_TOKEN."""
    require(os.getuid() == 0, "needs root: the case of a root user's `docker compose up`")
    project = copy_checkout(tmp_path, VERL_HF_CACHE=str(tmp_path / "hf-cache"))  # not ~root's cache
    write_secret(project, "HF_TOKEN", SECRET, TRAINER_UID)
    env = {"VERL_IMAGE": cpu_image, "HF_TOKEN": SECRET}  # in the caller's shell too: it must stay there
    try:
        up = up_trainer(project, env)
        [container] = docker_client.containers.list(
            all=True, filters={"label": [f"com.docker.compose.project={PROJECT}", "com.docker.compose.service=trainer-cpu"]})
        inspect = container.attrs
        read = compose(project, *CPU, "run", "-T", "--rm", "--no-deps", "--entrypoint", "python", "trainer-cpu", "-c",
                       "import json, os; from verl_runtime.secrets import load_secret_files as load; "
                       "print(json.dumps([load(), os.environ.get('HF_TOKEN_PATH'), 'HF_TOKEN' in os.environ]))",
                       env=env, timeout=120)
    finally:
        down(project, env)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-2000:]
    assert "Training finished at step 2" in up.stdout and SECRET not in up.stdout + up.stderr
    run_dir = project / "runs" / "compose"
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert run_dir.stat().st_uid == TRAINER_UID and (project / "hf-cache").stat().st_uid == TRAINER_UID
    assert SECRET not in json.dumps(inspect["Config"]) and not any(e.split("=")[0] in SECRET_ENV for e in inspect["Config"]["Env"])
    host = inspect["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and host["ReadonlyRootfs"] is True
    assert host["SecurityOpt"] == ["no-new-privileges:true"] and host["PidsLimit"] == PIDS_LIMIT
    assert inspect["Config"]["User"] == f"{TRAINER_UID}:{TRAINER_UID}"
    assert read.returncode == 0, read.stderr[-2000:]
    assert json.loads(read.stdout.strip().splitlines()[-1]) == [["HF_TOKEN"], f"{SECRETS_DIR}/HF_TOKEN", False]


@pytest.mark.slow
def test_a_failed_start_or_a_failed_trainer_is_a_nonzero_exit(project, docker_client, cpu_image):
    """A secret the trainer's uid cannot read (root's 0600 file) stops the start in `prepare`, with the reason in its
    log; a trainer that fails makes `up --exit-code-from` fail."""
    env = {"VERL_IMAGE": cpu_image}
    as_root = os.getuid() == 0
    try:
        if as_root:
            write_secret(project, "WANDB_API_KEY", SECRET, 0)
            unreadable = up_trainer(project, env, timeout=120)
            logs = compose(project, *CPU, "logs", "--no-color", "prepare", env=env)
            (project / ".secrets" / "WANDB_API_KEY").unlink()
        (project / "tiny.yaml").write_text("algorithm: {adv_estimator: no-such-estimator}\n")
        failed = up_trainer(project, env, timeout=180)
    finally:
        down(project, env)
    if as_root:
        assert unreadable.returncode != 0 and "Training" not in unreadable.stdout
        assert "cannot read the secret /run/secrets/WANDB_API_KEY: chown it to" in logs.stdout
    assert failed.returncode != 0, failed.stdout[-2000:]


@pytest.mark.slow
def test_the_sandbox_runs_beside_the_trainer_and_stops_with_it(project, docker_client, cpu_image, services_image):
    """docs/agentic.md's compose command: a multi-turn run with verl's SandboxFusion tool config (in the data folder)
    finds the sandbox container, points the tool at it, trains, and `--exit-code-from` stops the sandbox with it."""
    shutil.copy(REPO / "examples" / "tools" / "sandbox_fusion_tool_config.yaml", project / "data" / "tools.yaml")
    config = yaml.safe_load(TINY_CONFIG)
    config["data"].update(max_prompt_length=128, max_response_length=16)
    config["rollout"]["multi_turn"] = {"enable": True, "tool_config_path": "/data/tools.yaml", "max_assistant_turns": 2}
    config["services"] = {"sandbox": {"enable": True}}
    (project / "tiny.yaml").write_text(yaml.safe_dump(config))
    env = {"VERL_IMAGE": cpu_image, "VERL_SERVICES_IMAGE": services_image}  # the sandbox: the services image
    try:
        up = compose(project, "--profile", "tools", *CPU, "up", "--exit-code-from", "trainer-cpu", "trainer-cpu",
                     "sandbox", env=env, timeout=300)
    finally:
        out = compose(project, "--profile", "tools", *CPU, "down", "-v", "--remove-orphans", env=env)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-2000:]
    assert "service sandbox: http://sandbox:8080 is healthy" in up.stdout
    assert "sandbox_fusion_url is the run's sandbox service, http://sandbox:8080/run_code" in up.stdout
    assert "Training finished at step 2" in up.stdout
    assert out.returncode == 0, out.stderr
    assert docker_client.containers.list(all=True, filters={"label": f"com.docker.compose.project={PROJECT}"}) == []

