"""A run's services (config.services, issue #40): declared in the config, started before the trainer, health-checked,
their URLs given to the tools, shown by `status`, and stopped with the run however it ends: processes beside the
trainer (local, Slurm's head node), containers on a network with no way out (docker), a Deployment, Service and
NetworkPolicy each (Kubernetes)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, require
from launch_support import assert_logged, cli, containers, metrics_steps, wait_for

from verl_deploy.launchers.docker import run_options, services_network
from verl_deploy.launchers.jobspec import build_spec
from verl_deploy.launchers.k8s import manifests
from verl_deploy.launchers.slurm import SlurmOptions, batch_script
from verl_runtime.services.client import post_json
from verl_runtime.services.registry import NICE_BESIDE_TRAINER

EXAMPLE = REPO / "examples" / "tool-sandbox.yaml"
TOOLS = REPO / "examples" / "tools" / "sandbox_fusion_tool_config.yaml"
TOOL_PATH = ["--set", f"rollout.multi_turn.tool_config_path={TOOLS}"]
STARTED = re.compile(r"service sandbox: started on (http://127\.0\.0\.1:\d+) \(pid (\d+);")


def needs_namespaces():
    """The sandbox run beside a local trainer gives each program a network namespace of its own."""
    from verl_runtime.services import sandbox

    try:
        sandbox.check_isolation("namespace")
    except ValueError as exc:
        require(False, str(exc))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z"


def test_a_local_run_starts_its_sandbox_shows_it_and_stops_it_with_the_run(tmp_path):
    needs_namespaces()
    runs = tmp_path / "runs"
    started = cli("run", EXAMPLE, "--target", "local", "--runs-dir", runs, "--run-id", "svc", "--detach", *TOOL_PATH,
                  "--set", "trainer.total_training_steps=500", "--set", "trainer.save_freq=1")
    assert started.exit_code == 0, started.output
    run_dir = runs / "svc"
    assert wait_for(lambda: metrics_steps(run_dir))
    log = (run_dir / "train.log").read_text()
    url, pid = STARTED.search(log).groups()
    # verl's own tool config names a placeholder URL: the run's sandbox replaces it
    assert f"sandbox_fusion_url is the run's sandbox service, {url}/run_code" in log
    # beside the trainer, whose CPU its runs share, they are only slightly below it (registry.NICE_BESIDE_TRAINER)
    ran = post_json(f"{url}/run_code", {"code": "import os; print(os.nice(0))"}, timeout=30)
    assert ran["run_result"]["stdout"] == f"{max(NICE_BESIDE_TRAINER, os.nice(0))}\n"
    status = cli("status", "svc", "--runs-dir", runs)
    assert f"  services: sandbox {url}\n" in status.output, status.output
    assert json.loads(cli("status", "svc", "--runs-dir", runs, "--json").output)["services"] == {"sandbox": url}

    assert cli("stop", "svc", "--runs-dir", runs).exit_code == 0
    assert wait_for(lambda: not alive(int(pid)), 60), "the sandbox stops with the run"
    assert wait_for(lambda: "stopped" in cli("status", "svc", "--runs-dir", runs).output, 60)
    assert not (run_dir / "services.json").exists()
    assert "services:" not in cli("status", "svc", "--runs-dir", runs).output


def test_a_trainer_killed_outright_takes_its_services_with_it(tmp_path):
    """SIGKILL leaves the trainer no chance to stop anything: the kernel ends its services (PR_SET_PDEATHSIG)."""
    needs_namespaces()
    run_dir = tmp_path / "run"
    trainer = subprocess.Popen(
        [sys.executable, "-m", "verl_runtime", "train", str(EXAMPLE), *TOOL_PATH, "--set", f"trainer.run_dir={run_dir}",
         "--set", "trainer.total_training_steps=500"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: (run_dir / "services.json").exists(), 120)
        pid = int(STARTED.search((run_dir / "train.log").read_text()).group(2))
        assert alive(pid)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        assert wait_for(lambda: not alive(pid), 30), "no service outlives its trainer"
    finally:
        trainer.kill()


@pytest.mark.slow
def test_a_search_agent_run_gets_the_retriever_with_verls_search_tool_config_unchanged(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # as a user runs the example, from the checkout's root
    runs = tmp_path / "runs"
    done = cli("run", REPO / "examples" / "tool-search.yaml", "--target", "local", "--runs-dir", runs, "--run-id", "s")
    assert done.exit_code == 0, done.output
    log = (runs / "s" / "train.log").read_text()
    url = re.search(r"service retriever: started on (http://127\.0\.0\.1:\d+)", log).group(1)
    assert "Training finished at step 4" in log and not (runs / "s" / "services.json").exists()
    from verl_runtime.agent.tools import load_tools  # the tool as the run built it: pointed at the run's retriever

    tools = load_tools(REPO / "examples" / "tools" / "search_tool_config.yaml", {"retriever": url})
    assert tools["search"].url == f"{url}/retrieve"


def test_a_service_that_does_not_start_is_one_line_with_its_last_log_line(tmp_path):
    torn = tmp_path / "corpus.jsonl"
    torn.write_text('{"id": "0", "contents": "\\"A\\"\\ntext"}\n{"id": 1\n')
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "verl_runtime", "train", str(EXAMPLE), *TOOL_PATH, "--set", f"trainer.run_dir={run_dir}",
         "--set", "services.sandbox.enable=false", "--set", "services.retriever.enable=true",
         "--set", f"services.retriever.corpus={torn}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: service retriever exited with code 2 before it became healthy: error: "), line
    assert str(torn) in line and f"(its log: {run_dir / 'services' / 'retriever.log'})" in line

    given = subprocess.run(
        [sys.executable, "-m", "verl_runtime", "train", str(EXAMPLE), *TOOL_PATH, "--set", f"trainer.run_dir={run_dir}",
         "--set", "services.health_timeout=1", "--set", "services.sandbox.url=http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=120)
    assert given.returncode == 2
    assert given.stderr.strip().splitlines()[-1] == (
        "error: service sandbox at http://127.0.0.1:9 did not become healthy in 1 s (services.health_timeout)")


def spec_of(*overrides, **given):
    return build_spec(EXAMPLE, image="registry.example/verl-deploy:cpu", runs_root=given.pop("runs_root", "/tmp/r"),
                      run_id="agent", overrides=(f"rollout.multi_turn.tool_config_path={TOOLS}", *overrides), **given)


def test_docker_runs_each_service_in_a_hardened_container_on_a_network_with_no_way_out(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "never-in-a-service")
    spec = spec_of("services.retriever.enable=true", "services.retriever.corpus=/data/corpus.jsonl",
                   data_dir=REPO / "tests" / "fixtures" / "data")
    sandbox, retriever, trainer = run_options(spec)
    for service in (sandbox, retriever):
        assert service["user"] == "1000:1000" and service["cap_drop"] == ["ALL"] and service["read_only"]
        assert service["network"] == services_network(spec) == "agent-services"
        assert service["environment"] == {"HOME": "/tmp", "PYTHONUNBUFFERED": "1"}  # no token, no run settings
        assert not any(m["Target"] == "/run/secrets" for m in service["mounts"])
    assert sandbox["command"][-2:] == ["--network-isolation", "external"]  # the container's network has no way out
    assert retriever["command"][-2:] == ["--corpus", "/data/corpus.jsonl"]
    assert [m["Target"] for m in retriever["mounts"]] == ["/data"] and retriever["mounts"][0]["ReadOnly"]
    assert trainer["networks"] == ["agent-services"]
    assert trainer["environment"]["VERL_DEPLOY_SANDBOX_URL"] == "http://agent-sandbox:8080"
    assert trainer["environment"]["VERL_DEPLOY_RETRIEVER_URL"] == "http://agent-retriever:8000"

    shown = cli("run", EXAMPLE, "--target", "docker", "--image", "verl-deploy:cpu", "--run-id", "agent", "--dry-run",
                *TOOL_PATH).output.splitlines()
    assert shown[0] == "docker network create --internal agent-services"
    assert shown[1].startswith("docker run --detach --name agent-sandbox ")
    assert "--health-cmd 'python -m verl_runtime.services.health http://127.0.0.1:8080/health'" in shown[1]
    assert shown[2].startswith("docker create --name agent ")
    assert shown[3:] == ["docker network connect agent-services agent", "docker start --attach agent"]


def test_kubernetes_runs_each_service_behind_a_policy_that_admits_only_the_trainer():
    from test_k8s import validate

    objects = manifests(spec_of())
    for obj in objects:
        validate(obj)
    kinds = {(obj["kind"], obj["metadata"]["name"]) for obj in objects}
    assert {("Deployment", "agent-sandbox"), ("Service", "agent-sandbox"), ("NetworkPolicy", "agent-sandbox")} <= kinds
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "agent-sandbox")
    assert policy["spec"]["egress"] == [] and policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {"verl-deploy.run-id": "agent"}}}]
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]
    assert "verl-deploy.run-id" not in pod["metadata"]["labels"]  # the run's pods are its trainer's
    assert pod["spec"]["automountServiceAccountToken"] is False
    service = pod["spec"]["containers"][0]
    assert service["securityContext"]["runAsNonRoot"] and service["securityContext"]["readOnlyRootFilesystem"]
    assert "--network-isolation" in service["args"] and service["readinessProbe"]["httpGet"]["path"] == "/health"
    assert not any(m["name"] == "secrets" for m in service["volumeMounts"])
    job = next(o for o in objects if o["kind"] == "Job")
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "VERL_DEPLOY_SANDBOX_URL", "value": "http://agent-sandbox:8080"} in trainer["env"]
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    assert yaml.safe_load(config["data"]["tool_config.yaml"]) == yaml.safe_load(TOOLS.read_text())


def test_the_services_run_the_image_the_config_names_or_the_runs():
    """A GPU run's services need no CUDA: services.image names a smaller image (the catalog's cpu variant) for them."""
    spec = spec_of()
    assert run_options(spec)[0]["image"] == spec.image == "registry.example/verl-deploy:cpu"
    assert next(o for o in manifests(spec) if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0][
        "image"] == spec.image

    spec = spec_of("services.image=registry.example/verl-deploy:0.1.0-cpu@sha256:" + "a" * 64)
    sandbox, trainer = run_options(spec)
    assert (sandbox["image"], trainer["image"]) == (spec.service_image, "registry.example/verl-deploy:cpu")
    objects = manifests(spec)
    service = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert (service["image"], service["imagePullPolicy"]) == (spec.service_image, "IfNotPresent")  # a digest
    job = next(o for o in objects if o["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0]
    assert (job["image"], job["imagePullPolicy"]) == ("registry.example/verl-deploy:cpu", "Always")

    shown = cli("run", EXAMPLE, "--target", "docker", "--image", "verl-deploy:cu130", "--run-id", "agent", "--dry-run",
                *TOOL_PATH, "--set", "services.image=verl-deploy:cpu").output.splitlines()
    assert shown[1].startswith("docker run --detach --name agent-sandbox ") and shown[1].endswith(
        " verl-deploy:cpu -m verl_runtime.services.sandbox --host 0.0.0.0 --port 8080 --memory-mb 256 --run-timeout 5.0"
        " --network-isolation external")
    assert " verl-deploy:cu130" in shown[2]


def test_by_default_the_services_run_the_services_image_beside_the_runs_and_replicas_share_one_address():
    """A run image of the catalog has a services image (no torch, no CUDA) beside it in the same registry: the
    services run that; services.sandbox.replicas puts several sandboxes behind the address the trainer is given."""
    from test_k8s import validate

    from verl_deploy.images import image_tag

    image, services = image_tag("cu130", "registry.example"), image_tag("services", "registry.example")
    spec = build_spec(EXAMPLE, image=image, runs_root="/tmp/r", run_id="agent",
                      overrides=(f"rollout.multi_turn.tool_config_path={TOOLS}", "services.sandbox.replicas=3",
                                 "services.sandbox.concurrency=4"))
    *sandboxes, trainer = run_options(spec)
    assert [s["name"] for s in sandboxes] == ["agent-sandbox-1", "agent-sandbox-2", "agent-sandbox-3"]
    for sandbox in sandboxes:
        assert sandbox["image"] == services and sandbox["networking_config"] == {
            "agent-services": {"Aliases": ["agent-sandbox"]}}  # Docker's DNS answers the name with all three
        assert sandbox["command"][sandbox["command"].index("--concurrency") + 1] == "4"
    assert trainer["image"] == image and trainer["environment"]["VERL_DEPLOY_SANDBOX_URL"] == "http://agent-sandbox:8080"

    objects = manifests(spec)
    for obj in objects:
        validate(obj)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 3  # behind the one Service, agent-sandbox
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == services

    shown = cli("run", EXAMPLE, "--target", "docker", "--image", image, "--run-id", "agent", "--dry-run", *TOOL_PATH,
                "--set", "services.sandbox.replicas=2").output.splitlines()
    assert [line.split(" --name ")[1].split()[0] for line in shown[1:3]] == ["agent-sandbox-1", "agent-sandbox-2"]
    assert all("--network-alias agent-sandbox " in line and f" {services} -m verl_runtime.services.sandbox" in line
               for line in shown[1:3])
    # On k8s the nodes pull the services image from the registry, which must have it (a registry that has it:
    # test_images_registry.py); this one cannot be reached, so the services run the run's image, said so.
    shown = cli("run", EXAMPLE, "--target", "k8s", "--image", image, "--run-id", "agent", "--dry-run", *TOOL_PATH,
                "--set", "services.sandbox.replicas=2").output
    assert "  replicas: 2\n" in shown and f"image: {services}\n" not in shown
    assert (f"note: the services image {services} cannot be had (its registry does not have it: `verl-deploy images "
            f"push --variant services --registry registry.example`): the services run the run's image {image}") in shown


def test_slurm_says_the_services_run_beside_the_trainer_on_the_head_node(tmp_path):
    script = batch_script(spec_of(runs_root=tmp_path), SlurmOptions())
    assert "# The run's services (sandbox) run on this (the head) node beside the trainer" in script
    assert "VERL_DEPLOY_SANDBOX_URL" not in script  # the trainer starts it: nothing else runs it


def test_a_tool_config_that_is_not_there_is_one_line():
    result = cli("run", EXAMPLE, "--target", "docker", "--image", "verl-deploy:cpu", "--dry-run",
                 "--set", "rollout.multi_turn.tool_config_path=/nowhere/tools.yaml")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].endswith(
        "rollout.multi_turn.tool_config_path /nowhere/tools.yaml: no such file on this host (the launcher sends it "
        "with the run)")


@pytest.mark.docker
def test_docker_runs_the_sandbox_as_a_container_and_leaves_nothing_after(tmp_path, cpu_image, services_image,
                                                                         docker_client, leftovers):
    runs = tmp_path / "runs"
    leftovers.append("dock-svc")
    started = cli("run", EXAMPLE, "--target", "docker", "--image", cpu_image, "--runs-dir", runs, "--run-id",
                  "dock-svc", "--detach", "--shm-size", "1g", *TOOL_PATH, "--set", "trainer.total_training_steps=2000",
                  "--set", "trainer.num_epochs=200",  # still running when the test asks its sandbox
                  "--set", "services.sandbox.replicas=2")
    assert started.exit_code == 0, started.output
    run_dir = runs / "dock-svc"
    assert wait_for(lambda: metrics_steps(run_dir))
    for name in ("dock-svc-sandbox-1", "dock-svc-sandbox-2"):  # two sandboxes behind one name, from the services image
        sandbox = docker_client.containers.get(name)
        assert sandbox.attrs["State"]["Health"]["Status"] == "healthy"
        assert sandbox.image.tags == [services_image]
        assert set(sandbox.attrs["NetworkSettings"]["Networks"]) == {"dock-svc-services"}
        assert "dock-svc-sandbox" in sandbox.attrs["NetworkSettings"]["Networks"]["dock-svc-services"]["Aliases"]
    assert docker_client.networks.get("dock-svc-services").attrs["Internal"] is True  # no route out of it
    trainer = docker_client.containers.get("dock-svc")
    assert_logged(run_dir, "service sandbox: http://dock-svc-sandbox:8080 is healthy", trainer)
    status = cli("status", "dock-svc", "--runs-dir", runs).output
    assert "  services: sandbox http://dock-svc-sandbox:8080\n" in status, status
    # The trainer reaches the sandbox, which runs code as asked, with no network for the program
    asked = docker_client.containers.get("dock-svc").exec_run(["python", "-c", (
        "import json, urllib.request; print(urllib.request.urlopen(urllib.request.Request("
        "'http://dock-svc-sandbox:8080/run_code', json.dumps({'code': 'import socket\\n"
        "socket.create_connection((\"1.1.1.1\", 53), 3)'}).encode())).read().decode())")])
    assert asked.exit_code == 0, asked.output.decode()
    reply = json.loads(asked.output)
    assert reply["run_result"]["return_code"] != 0 and "Error" in reply["run_result"]["stderr"]

    assert cli("stop", "dock-svc", "--runs-dir", runs).exit_code == 0
    assert not containers(docker_client, "dock-svc"), "the trainer's and the sandbox's containers are gone"
    assert not docker_client.networks.list(names=["dock-svc-services"])
    assert cli("status", "dock-svc", "--runs-dir", runs).output.startswith("dock-svc  docker  stopped")

    # A detached run's sandbox outlives its trainer until its end is recorded; it does not keep --resume out
    last = metrics_steps(run_dir)[-1]
    resumed = cli("run", "--resume", "dock-svc", "--detach", "--runs-dir", runs, "--shm-size", "1g",
                  "--set", f"trainer.total_training_steps={last + 1}")
    assert resumed.exit_code == 0, resumed.output
    trainer = docker_client.containers.get("dock-svc")
    assert trainer.wait(timeout=180)["StatusCode"] == 0
    assert docker_client.containers.get("dock-svc-sandbox-1").status == "running"
    again = cli("run", "--resume", "dock-svc", "--runs-dir", runs, "--shm-size", "1g",
                "--set", f"trainer.total_training_steps={last + 1}")
    assert again.exit_code == 0 and "nothing to do" in again.output, again.output
    assert not containers(docker_client, "dock-svc") and not docker_client.networks.list(names=["dock-svc-services"])

