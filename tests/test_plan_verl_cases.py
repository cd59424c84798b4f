"""Against the field: verl's published minimum-resource configurations must be judged to fit (fits or tight) on the
hardware they ran on, with the planner's default lengths and with GSM8K's, and `run`'s pre-flight must let them
through; configurations that cannot fit by plain arithmetic must be judged not to (tests/fixtures/plan/
verl_min_resources.yaml: the rows, the scripts behind them, where each figure comes from, and each row's verdict)."""

import json

import pytest
import yaml
from conftest import FIXTURES, REPO
from typer.testing import CliRunner

from verl_deploy.sizes import parse_gpus
from verl_deploy.cli import app
from verl_deploy.plan import plan

CASES = yaml.safe_load((FIXTURES / "plan" / "verl_min_resources.yaml").read_text())
PUBLISHED = {case["name"]: case for case in CASES["published"]}
GSM8K = {"prompt_length": CASES["lengths"]["prompt"], "response_length": CASES["lengths"]["response"]}
MODELS = FIXTURES / "models"
IMAGE = "registry.example.com/team/verl-deploy:verl-1"


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("VERL_DEPLOY_CACHE", str(tmp_path_factory.getbasetemp() / "plan-cache"))
    monkeypatch.setenv("VERL_DEPLOY_NVML_READING", str(FIXTURES / "nvml" / "no-driver.json"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def overrides_of(case: dict) -> list[str]:
    base = PUBLISHED[case["base"]]["overrides"] if "base" in case else case["overrides"]
    return [*base, *case.get("set", []), f"actor_rollout_ref.model.path={MODELS / case['model']}"]


def plan_case(case: dict, **lengths):
    return plan(None, overrides_of(case), runtime="verl", gpus=parse_gpus(str(case["gpus"])), nodes=case["nodes"],
                gpu_type=case["gpu_type"], read_data=False, **lengths)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_a_published_minimum_configuration_fits_on_its_hardware_with_the_default_lengths(name):
    case = PUBLISHED[name]
    result = plan_case(case)
    assert result.verdict in ("fits", "tight"), f"{name}: {result.reason}"
    assert result.verdict == case["verdict"], f"{name}: the verdict moved: {result.reason}"
    assert result.exit_code == 0 and result.workload.world == case["gpus"] * case["nodes"]
    assert result.memory.vllm_fails is None
    assert not [line for line in result.suggestions if "--gpus" in line or "--nodes" in line]  # it fits: no GPUs


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_a_published_minimum_configuration_fits_at_gsm8ks_lengths(name):
    result = plan_case(PUBLISHED[name], **GSM8K)
    assert result.verdict in ("fits", "tight"), f"{name}: {result.reason}"


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_at_the_limits_a_micro_batch_whose_logits_alone_exceed_the_gpu_is_judged_not_to_fit(name):
    """Every prompt and response at its limit: where the bf16 logits of one micro-batch (tokens x vocabulary x 2
    bytes) alone exceed the GPU, the run could not have run there; the plan says so, and with the default lengths
    the same run is tight (not fits): its worst case does not fit."""
    case = PUBLISHED[name]
    longest = {"prompt_length": 10**6, "response_length": 10**6}  # capped at the limits
    result = plan_case(case, **longest)
    work = result.workload
    assert result.lengths.response == work.max_response_length and result.lengths.prompt == work.max_prompt_length
    if work.dynamic_tokens_update:
        tokens = min(work.dynamic_tokens_update, work.mini_rows_per_gpu * result.lengths.total // work.sp)
    else:
        tokens = min(work.micro_update, work.mini_rows_per_gpu) * result.lengths.total // work.sp
    if 2 * tokens * result.model.vocab > result.gpu_memory_bytes:
        assert result.verdict == "does not fit", name
        default = plan_case(case)
        assert default.verdict == "tight" and default.worst.verdict == "does not fit"
        assert 0 < default.safe_response_length < work.max_response_length


@pytest.mark.parametrize("case", CASES["impossible"], ids=[case["name"] for case in CASES["impossible"]])
def test_a_run_that_cannot_fit_by_arithmetic_is_judged_not_to(case):
    if case.get("runtime") == "verl-deploy":
        results = [plan(REPO / case["config"], [f"model.path={MODELS / case['model']}", *case["set"]],
                        gpus=parse_gpus(str(case["gpus"])), gpu_type=case["gpu_type"], read_data=False)]
    else:
        results = [plan_case(case), plan_case(case, **GSM8K)]
    for result in results:
        assert result.verdict == "does not fit", case["why"]
        assert result.suggestions  # what would make it fit, or that nothing tried does


def test_suggested_gpus_never_exceed_what_the_batch_can_use():
    """The 1.5B LoRA row with the whole batch in one micro-batch and the logits of every response at the limit
    (--response-length): it does not fit; settings come first and no line asks for more nodes."""
    case = PUBLISHED["1.5B MIN GRPO-LoRA 1*H100 MaxBatch 128"]
    result = plan_case(case, prompt_length=512, response_length=1024)
    assert result.verdict == "does not fit"
    assert result.suggestions[0].startswith("actor_rollout_ref.actor.use_dynamic_bsz=true")
    assert not [line for line in result.suggestions if "--nodes" in line]
    for line in result.suggestions:
        if "--gpus" in line:
            gpus = int(line.split("--gpus ")[1].split()[0].rstrip(":"))
            assert gpus <= result.workload.mini_batch_prompts * result.workload.n


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_run_lets_every_published_configuration_through_with_its_plan_for_the_trainer(name, tmp_path):
    """`run --runtime verl --target k8s --gpu-type H100 --dry-run` plans first: a tight run warns in one line and
    goes on; the trainer gets the plan as VERL_DEPLOY_PLAN (compact JSON, docs/plan.md)."""
    case = PUBLISHED[name]
    args = ["run", "--runtime", "verl", "--target", "k8s", "--gpus", str(case["gpus"]), "--nodes", str(case["nodes"]),
            "--gpu-type", "H100", "--dry-run", "--image", IMAGE, "--runs-dir", str(tmp_path / "runs"), "--",
            *overrides_of(case)]
    result = CliRunner().invoke(app, args, env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: the run is tight on H100")]
    assert len(warnings) == 1 and "`verl-deploy plan` shows every phase" in warnings[0]
    assert "with every response at" in warnings[0]  # the worst case is what makes it tight
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    values = [env["value"] for doc in docs for env in _env_entries(doc) if env.get("name") == "VERL_DEPLOY_PLAN"]
    assert values and len(set(values)) == 1 and len(values[0]) < 2048
    sent = json.loads(values[0])
    assert sent["verdict"] == "tight" and sent["gpu_memory_bytes"] == 79 * 2**30
    assert isinstance(sent["safe_response_length"], int) and isinstance(sent["cheapest_fix"], (str, type(None)))
    assert {"rollout", "old log-probs", "actor update"} <= set(sent["phases"])
    assert all(set(p) == {"peak_bytes", "detail"} for p in sent["phases"].values())


def _env_entries(node):
    """Every container env entry of a manifest, wherever it sits."""
    if isinstance(node, dict):
        if isinstance(node.get("env"), list):
            yield from (e for e in node["env"] if isinstance(e, dict))
        for value in node.values():
            yield from _env_entries(value)
    elif isinstance(node, list):
        for value in node:
            yield from _env_entries(value)


def test_the_cli_exits_0_for_tight_and_1_for_does_not_fit():
    tight = PUBLISHED["7B MIN GRPO 2*H800"]
    args = ["plan", "--json", "--runtime", "verl", "--gpu-type", tight["gpu_type"], "--", *overrides_of(tight)]
    result = CliRunner().invoke(app, args)
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and doc["fits"] is True and doc["verdict"] == "tight"
    no = CASES["impossible"][0]
    result = CliRunner().invoke(app, ["plan", "--json", "--runtime", "verl", "--gpu-type", no["gpu_type"], "--",
                                      *overrides_of(no)])
    assert result.exit_code == 1 and json.loads(result.stdout)["verdict"] == "does not fit"


def test_the_fixture_names_its_source():
    assert "b178a3cd56f58b2d502255daba591e92833930a7" in CASES["lengths"]["source"]
    for case in CASES["published"]:
        assert case["script"].startswith("examples/tuning/") and (MODELS / case["model"] / "config.json").is_file()
