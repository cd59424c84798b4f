"""Against the field: verl's published minimum-resource configurations must be judged to fit on the hardware they
ran on, and configurations that cannot fit by plain arithmetic must be judged not to (tests/fixtures/plan/
verl_min_resources.yaml: the rows, the scripts behind them, and where each figure comes from)."""

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
MODELS = FIXTURES / "models"


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("VERL_DEPLOY_CACHE", str(tmp_path_factory.getbasetemp() / "plan-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def overrides_of(case: dict) -> list[str]:
    base = PUBLISHED[case["base"]]["overrides"] if "base" in case else case["overrides"]
    return [*base, *case.get("set", []), f"actor_rollout_ref.model.path={MODELS / case['model']}"]


def plan_case(case: dict, **lengths):
    return plan(None, overrides_of(case), runtime="verl", gpus=parse_gpus(str(case["gpus"])), nodes=case["nodes"],
                gpu_type=case["gpu_type"], read_data=False, **lengths)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_a_published_minimum_configuration_fits_on_its_hardware(name):
    case = PUBLISHED[name]
    result = plan_case(case, prompt_length=CASES["lengths"]["prompt"], response_length=CASES["lengths"]["response"])
    assert result.verdict in ("fits", "tight"), f"{name}: {result.reason}"
    assert result.workload.world == case["gpus"] * case["nodes"]
    assert result.memory.vllm_fails is None


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_at_the_limits_a_micro_batch_whose_logits_alone_exceed_the_gpu_is_judged_not_to_fit(name):
    """Every response at max_response_length: where the bf16 logits of one micro-batch (tokens x vocabulary x 2
    bytes) alone exceed the GPU, the run could not have run at the limits, and the plan says so."""
    case = PUBLISHED[name]
    result = plan_case(case)
    work = result.workload
    if work.dynamic_tokens_update:
        tokens = min(work.dynamic_tokens_update, work.mini_rows_per_gpu * result.lengths.total // work.sp)
    else:
        tokens = min(work.micro_update, work.mini_rows_per_gpu) * result.lengths.total // work.sp
    if 2 * tokens * result.model.vocab > result.gpu_memory_bytes:
        assert result.verdict == "does not fit", name
    assert result.lengths.response == work.max_response_length


@pytest.mark.parametrize("case", CASES["impossible"], ids=[case["name"] for case in CASES["impossible"]])
def test_a_run_that_cannot_fit_by_arithmetic_is_judged_not_to(case):
    if case.get("runtime") == "verl-deploy":
        result = plan(REPO / case["config"], [f"model.path={MODELS / case['model']}", *case["set"]],
                      gpus=parse_gpus(str(case["gpus"])), gpu_type=case["gpu_type"], read_data=False)
    else:
        result = plan_case(case, prompt_length=CASES["lengths"]["prompt"],
                           response_length=CASES["lengths"]["response"])
    assert result.verdict == "does not fit", case["why"]
    assert result.suggestions  # what would make it fit, or that nothing tried does


def test_the_cli_exits_1_for_one_and_0_for_the_other():
    fits = PUBLISHED["7B MIN GRPO 2*H800"]
    args = ["plan", "--json", "--runtime", "verl", "--gpu-type", fits["gpu_type"], "--prompt-length", "105",
            "--response-length", "239", "--", *overrides_of(fits)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0 and json.loads(result.stdout)["fits"] is True
    no = CASES["impossible"][0]
    result = CliRunner().invoke(app, ["plan", "--json", "--runtime", "verl", "--gpu-type", no["gpu_type"], "--",
                                      *overrides_of(no)])
    assert result.exit_code == 1 and json.loads(result.stdout)["fits"] is False


def test_the_fixture_names_its_source():
    assert "b178a3cd56f58b2d502255daba591e92833930a7" in CASES["lengths"]["source"]
    for case in CASES["published"]:
        assert case["script"].startswith("examples/tuning/") and (MODELS / case["model"] / "config.json").is_file()
