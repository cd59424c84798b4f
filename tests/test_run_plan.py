"""One run plan (launchers/runplan.py): what `verl-deploy run` was asked becomes one JobSpec, --gpus parsed once and
the world size resolved once for every target; the runtime has one rule for its world size too."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import yaml

from verl_deploy import runs, sizes
from verl_deploy.cli import app
from verl_deploy.launchers import TARGETS, jobspec
from verl_deploy.launchers.runplan import RunRequest, plan_run
from verl_deploy.sizes import Gpus
from verl_runtime.config import ConfigError, world_size

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart.yaml"


@pytest.fixture
def count_gpu_parses(monkeypatch):
    """sizes.parse_gpus wrapped by a counter, wherever it is read from."""
    calls = []
    real = sizes.parse_gpus

    def counting(text):
        calls.append(text)
        return real(text)

    monkeypatch.setattr(sizes, "parse_gpus", counting)
    monkeypatch.setattr(jobspec, "parse_gpus", counting)
    return calls


@pytest.mark.parametrize("target", TARGETS)
def test_gpus_are_parsed_once_per_run_on_every_target(target, tmp_path, count_gpu_parses):
    # A local run with GPUs needs them and a CUDA torch on this host, which has neither: it asks for none.
    gpus = "0" if target == "local" else "2"
    result = CliRunner().invoke(app, ["run", str(QUICKSTART), "--target", target, "--gpus", gpus, "--dry-run",
                                      "--image", "verl-deploy:test", "--image-preloaded", "--run-id", "counted",
                                      "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert count_gpu_parses == [gpus]
    if gpus == "2":  # the world the plan resolved reaches the trainer's command
        assert "trainer.n_workers=2" in result.stdout
    assert not (tmp_path / "runs").exists(), "a dry run has no side effects"


@pytest.mark.parametrize("target", TARGETS)
def test_the_config_is_read_once_per_run_on_every_target(target, tmp_path, monkeypatch):
    """build_spec loads and checks it; the checks before launch and the memory plan read that one (JobSpec.loaded)."""
    import verl_runtime.config

    loads = []
    real = verl_runtime.config.load_config
    monkeypatch.setattr(verl_runtime.config, "load_config", lambda *a, **k: loads.append(a) or real(*a, **k))
    result = CliRunner().invoke(app, ["run", str(QUICKSTART), "--target", target, "--dry-run", "--image",
                                      "verl-deploy:test", "--image-preloaded", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert len(loads) == 1


def test_the_plan_is_pure_and_resolves_the_world_from_verl_s_keys(tmp_path):
    request = RunRequest(args=(str(QUICKSTART), "trainer.n_gpus_per_node=2", "trainer.nnodes=2",
                               "trainer.device=cuda"), target="k8s", run_id="planned")
    planned = plan_run(request, tmp_path / "runs", environ={})
    assert (planned.target, planned.spec.gpus, planned.spec.nodes, planned.spec.world_size) == ("k8s", Gpus(count=2), 2, 4)
    assert planned.variant == "cu128" and not planned.build_image  # a cluster's auto; nothing to build for it
    assert not (tmp_path / "runs").exists()


def test_a_docker_run_plans_an_image_build_only_when_it_will_run(tmp_path):
    asked = RunRequest(args=(str(QUICKSTART),), target="docker", run_id="built")
    assert plan_run(asked, tmp_path, environ={}).build_image
    assert plan_run(RunRequest(args=(str(QUICKSTART),), target="docker", dry_run=True), tmp_path, environ={}).variant == "cpu"
    assert not plan_run(RunRequest(args=(str(QUICKSTART),), target="docker", image="mine:1"), tmp_path,
                        environ={}).build_image


def test_the_plan_refuses_what_run_refuses_in_one_line(tmp_path):
    with pytest.raises(jobspec.LaunchError, match="--gpus 'two' is not understood"):
        plan_run(RunRequest(args=(str(QUICKSTART),), gpus="two"), tmp_path, environ={})
    with pytest.raises(jobspec.LaunchError, match="trainer.n_gpus_per_node=4 but --gpus 2"):
        plan_run(RunRequest(args=(str(QUICKSTART), "trainer.n_gpus_per_node=4"), gpus="2"), tmp_path, environ={})
    with pytest.raises(ValueError, match="which config"):
        plan_run(RunRequest(), tmp_path, environ={})


def trainer(n_workers=None, n_gpus_per_node=None, nnodes=None):
    return SimpleNamespace(n_workers=n_workers, n_gpus_per_node=n_gpus_per_node, nnodes=nnodes)


@pytest.mark.parametrize("target", TARGETS)
def test_an_unknown_variant_is_one_line_on_every_target_before_anything_is_read(target, tmp_path):
    result = CliRunner().invoke(app, ["run", str(tmp_path / "missing.yaml"), "--target", target, "--variant", "cu999",
                                      "--dry-run", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output == "error: --variant: unknown variant 'cu999': choose one of cpu, cu128, cu130 or auto\n"


def test_the_runtime_has_one_rule_for_its_world_size():
    assert world_size(trainer(n_gpus_per_node=4, nnodes=2)) == 8
    assert world_size(trainer(n_workers=3)) == 3
    assert world_size(trainer()) is None  # not known until the trainer counts its GPUs
    assert world_size(trainer(), visible_gpus=4) == 4
    assert world_size(trainer(), visible_gpus=0) == 1  # a CPU run: one worker
    assert world_size(trainer(n_workers=2), visible_gpus=8) == 2
    with pytest.raises(ConfigError, match="trainer.n_workers=3 but trainer.n_gpus_per_node x trainer.nnodes"):
        world_size(trainer(n_workers=3, n_gpus_per_node=4))
    with pytest.raises(ConfigError, match="trainer.nnodes needs trainer.n_gpus_per_node"):
        world_size(trainer(nnodes=2))


def launched(plan) -> None:
    """launch.json as a launcher writes it (k8s.py, local.py, slurm.py: the spec's record and the target)."""
    runs.write_record(plan.spec.run_dir, plan.spec.launch(plan.target).to_json())


def test_a_resume_starts_the_run_again_with_the_flags_it_was_launched_with(tmp_path):
    """Its namespace (elsewhere a resume would start a new run in `default`), resources, scheduling and settings."""
    first = plan_run(RunRequest(args=(str(QUICKSTART),), target="k8s", image="reg/verl:1", run_id="r1",
                                namespace="team-a", cpus="8", memory="64g", shm_size="4g", env=("LOG_LEVEL=debug",),
                                node_selector=("pool=a100",), priority_class="high", grace_period=300,
                                hf_cache="team-cache", image_pull_secrets=("regcred",)), tmp_path, environ={})
    launched(first)
    again = plan_run(RunRequest(resume="r1"), tmp_path, environ={})
    assert again.resume_changes == () and again.target == "k8s"
    for field in ("namespace", "cpus", "memory", "shm_size", "env", "cluster", "cache_claim", "image"):
        assert getattr(again.spec, field) == getattr(first.spec, field), field
    assert again.spec.namespace == "team-a" and again.spec.cluster.grace_period_s == 300

    bigger = plan_run(RunRequest(resume="r1", memory="128g"), tmp_path, environ={})
    assert bigger.resume_changes == ("--memory: 64g -> 128g",)
    assert bigger.spec.memory == sizes.parse_memory("128g") and bigger.spec.namespace == "team-a"
    launched(bigger)  # what the resumed launch records is what the next resume starts from
    assert plan_run(RunRequest(resume="r1"), tmp_path, environ={}).spec.memory == bigger.spec.memory


def test_a_resume_finds_the_host_folders_it_was_given_from_another_directory(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    launched(plan_run(RunRequest(args=(str(QUICKSTART),), target="local", run_id="r2", data="data"), tmp_path / "runs",
                      environ={}))
    monkeypatch.chdir(REPO)
    again = plan_run(RunRequest(resume="r2"), tmp_path / "runs", environ={})
    assert again.spec.data_dir == tmp_path / "data" and again.resume_changes == ()


def test_a_run_recorded_before_flags_were_kept_resumes_in_its_namespace(tmp_path):
    first = plan_run(RunRequest(args=(str(QUICKSTART),), target="k8s", image="reg/verl:1", run_id="old",
                                namespace="team-b"), tmp_path, environ={})
    record = first.spec.launch("k8s").to_json()
    del record["flags"]
    runs.write_record(first.spec.run_dir, record)
    assert plan_run(RunRequest(resume="old"), tmp_path, environ={}).spec.namespace == "team-b"


def test_run_resume_dry_run_prints_the_recorded_namespace_and_the_changes_it_makes(tmp_path):
    launched(plan_run(RunRequest(args=(str(QUICKSTART),), target="k8s", image="registry.local/verl:1", run_id="r3",
                                 namespace="team-a", cpus="8"), tmp_path, environ={}))
    result = CliRunner().invoke(app, ["run", "--resume", "r3", "--cpus", "16", "--dry-run", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "resume r3: --cpus: 8 -> 16" in result.stderr
    workload = [doc for doc in yaml.safe_load_all(result.stdout) if doc][-1]
    assert workload["metadata"]["namespace"] == "team-a"
    assert workload["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "16"


def test_every_kept_launch_flag_goes_through_launch_json_and_back():
    """A field of RunRequest marked kept() needs no other code to be recorded and restored by --resume: given a value
    of its own type, it comes back from the record (as launch.json holds it, through JSON) unchanged."""
    import dataclasses
    import json

    from verl_deploy.launchers.runplan import RESUMED_FLAGS, given_flags, resumed_request

    samples = {bool: True, int: 300}
    asked = {}
    for item in dataclasses.fields(RunRequest):
        if item.name in RESUMED_FLAGS:
            default = item.default
            asked[item.name] = samples.get(type(default)) if default is not None else f"{item.name}-value"
            if isinstance(default, tuple):
                asked[item.name] = (f"{item.name}=a", f"{item.name}=b")
            if item.name == "grace_period":
                asked[item.name] = 300
    assert set(asked) == set(RESUMED_FLAGS) and "priority_class" in asked
    # through launch.json's text and back, as the type --resume reads
    launch = runs.Launch.from_json(json.loads(json.dumps(runs.Launch(flags=given_flags(RunRequest(**asked))).to_json())))
    restored, changes = resumed_request(RunRequest(resume="r1"), launch)
    assert {name: getattr(restored, name) for name in RESUMED_FLAGS} == asked and changes == []


def test_launch_json_reads_back_as_the_launch_that_was_written(tmp_path):
    """launch.json is one typed record: what a launcher writes (JobSpec.launch plus the run's state fields) reads
    back field for field; a record from before flags were kept restores its namespace; state fields are not
    the launch's."""
    import dataclasses

    samples = {str: "x", int: 3, dict: {"k": "v"}, tuple: ("a", "b")}
    launch = runs.Launch(**{f.name: samples[type(f.default) if f.default is not dataclasses.MISSING else dict]
                            for f in dataclasses.fields(runs.Launch) if f.default is not None}, gpus="2", image="i")
    runs.record_launch(tmp_path, launch, pid=123, exit_code=None)
    assert runs.read_launch(tmp_path) == launch
    assert runs.read_record(tmp_path)["pid"] == 123
    old = tmp_path / "old"
    runs.write_record(old, {"run_id": "old", "namespace": "team", "target": "k8s"})
    assert runs.read_launch(old).flags == {"namespace": "team"} and runs.read_launch(old).nodes == 1
    assert runs.read_launch(tmp_path / "none") is None
