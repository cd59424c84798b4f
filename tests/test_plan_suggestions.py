"""`verl-deploy plan`'s suggestions when a run does not fit (#37), in cost order: settings on the GPUs asked for
first, then the fewest GPUs on the node, then the fewest nodes; every line shown, applied as a user would apply it
(its --set values and its flags), is planned again and fits. Model shapes: tests/fixtures/models (config.json only)."""

import json
import re

import pytest
from conftest import FIXTURES, REPO
from typer.testing import CliRunner

from verl_deploy.cli import app
from verl_deploy.plan import plan
from verl_deploy.plan.suggest import MAX_NODES, suggest
from verl_deploy.sizes import GiB, parse_gpus

MODELS = FIXTURES / "models"
GRPO = REPO / "examples" / "gsm8k-grpo.yaml"
# verl's GRPO example (examples/grpo_trainer/run_qwen2-7b.sh at volcengine/verl@b178a3c) without its GPU count and
# with the rollout on one GPU: the count is the flags', the model each test's
VERL_GRPO = [
    "algorithm.adv_estimator=grpo", "data.train_batch_size=1024", "data.max_prompt_length=512",
    "data.max_response_length=1024", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
]


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("VERL_DEPLOY_CACHE", str(tmp_path_factory.getbasetemp() / "plan-cache"))
    monkeypatch.setenv("VERL_DEPLOY_NVML_READING", str(FIXTURES / "nvml" / "no-driver.json"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def plan_json(flags: dict, settings: list[str], runtime: str = "verl-deploy"):
    """`verl-deploy plan --json` with these flags and settings (--set for our runtime, after -- for verl)."""
    args = ["plan", "--json", "--runtime", runtime, *[str(x) for pair in flags.items() for x in pair]]
    if runtime == "verl":
        args += ["--", *settings]
    else:
        args += [str(GRPO), *[x for s in settings for x in ("--set", s)]]
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


def read_line(line: str) -> tuple[list[str], dict]:
    """A suggestion as a user reads it: its key=value settings and its flags (--gpus N --nodes M)."""
    what = re.sub(r" \([^)]*\)$", "", line.split(": peak ")[0].removeprefix("together: "))  # less the why
    settings, flags = [], {}
    for part in what.split(", "):
        if part.startswith("--"):
            words = part.split()
            flags.update(zip(words[::2], words[1::2]))
        else:
            settings.append(part)
    return settings, flags


def assert_each_line_fits_when_applied(flags: dict, settings: list[str], lines: list[str], runtime="verl-deploy"):
    assert lines
    for line in lines:
        extra, more = read_line(line)
        code, doc = plan_json({**flags, **more}, [*settings, *extra], runtime)
        assert code == 0 and doc["verdict"] in ("fits", "tight"), f"{line}: {doc['reason']}"
        assert line.endswith(doc["verdict"])  # the verdict it promised
        assert doc["gpus"] == int(more.get("--gpus", flags["--gpus"])) * int(more.get("--nodes", 1))


def test_a_half_billion_grpo_run_on_one_40gb_gpu_is_told_settings_for_that_gpu_not_32_gpus():
    """The run of #37: Qwen2.5-0.5B, GRPO (the gsm8k example), one 40 GB GPU. It was told `actor.strategy=fsdp,
    --gpus 8 --nodes 4`; offloading and a token budget make it fit on the GPU it has."""
    flags, settings = {"--gpus": 1, "--gpu-memory": "40g"}, [f"model.path={MODELS / 'Qwen2.5-0.5B-Instruct'}"]
    code, doc = plan_json(flags, settings)
    assert code == 1 and doc["verdict"] == "does not fit"
    lines = doc["suggestions"]
    assert not [line for line in lines if "--gpus" in line or "--nodes" in line or "strategy" in line], lines
    assert doc["cheapest_fix"] and "--gpus" not in doc["cheapest_fix"]
    assert_each_line_fits_when_applied(flags, settings, lines)


def test_a_run_that_needs_more_gpus_is_told_the_fewest_on_one_node():
    """Qwen2.5-3B on one 40 GB GPU (was: --gpus 8 --nodes 4): no setting fits on one GPU; sharded over two it does.
    The same settings on the one GPU do not fit: the second GPU is needed, and no more than it."""
    flags, settings = {"--gpus": 1, "--gpu-memory": "40g"}, [f"model.path={MODELS / 'Qwen2.5-3B-Instruct'}"]
    code, doc = plan_json(flags, settings)
    assert code == 1
    [line] = doc["suggestions"]
    extra, more = read_line(line)
    assert more == {"--gpus": "2"} and "actor.strategy=fsdp" in extra  # sharding is what the second GPU is for
    assert_each_line_fits_when_applied(flags, settings, [line])
    _, alone = plan_json(flags, [*settings, *extra])
    assert alone["verdict"] == "does not fit"


def test_verl_is_told_the_fewest_gpus_with_its_rollout_split_over_them():
    """Upstream verl, Qwen2.5-32B on one A100-40GB: vLLM cannot hold the model's weights on one GPU; tensor
    parallelism over 2 GPUs (with the memory share that then fits) does, in verl's keys."""
    flags = {"--gpus": 1, "--gpu-type": "A100-40GB"}
    settings = [*VERL_GRPO, f"actor_rollout_ref.model.path={MODELS / 'Qwen2.5-32B-Instruct'}"]
    code, doc = plan_json(flags, settings, "verl")
    assert code == 1
    [line] = doc["suggestions"]
    extra, more = read_line(line)
    assert more == {"--gpus": "2"} and "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in extra
    assert all(s.startswith("actor_rollout_ref.") for s in extra)
    assert_each_line_fits_when_applied(flags, settings, [line], "verl")


def test_verl_settings_that_fit_on_its_gpu_come_without_more_gpus():
    flags = {"--gpus": 1, "--gpu-type": "H100"}
    settings = [*VERL_GRPO, f"actor_rollout_ref.model.path={MODELS / 'Qwen2.5-14B-Instruct'}"]
    code, doc = plan_json(flags, settings, "verl")
    assert code == 1 and not [line for line in doc["suggestions"] if "--gpus" in line or "--nodes" in line]
    assert_each_line_fits_when_applied(flags, settings, doc["suggestions"], "verl")


# --- the search itself, with a stand-in for the memory plan --------------------------------------------------------


@pytest.fixture(scope="module")
def work():
    """The 0.5B GRPO run's workload on one GPU (mini-batch 64 prompts x 8 samples = 512 sequences)."""
    return plan(GRPO, [f"model.path={MODELS / 'Qwen2.5-0.5B-Instruct'}"], gpus=parse_gpus("1"), gpu_memory="40g",
                read_data=False, with_suggestions=False).workload


OVER = {"rollout", "reference log-probs", "old log-probs", "actor update"}  # every phase of the run


def fits_when(condition):
    """A plan that fits exactly when condition(workload) holds, whatever else changes; else every phase is over."""
    def evaluate(candidate):
        if condition(candidate):
            return "fits", 30 * GiB, "actor update", set()
        return "does not fit", 50 * GiB, "actor update", OVER
    return evaluate


def suggestions(work, condition):
    return suggest(work, fits_when(condition), OVER, 40 * GiB)


@pytest.mark.parametrize("gpus, line", [(2, "--gpus 2"), (3, "--gpus 4"), (4, "--gpus 4"), (8, "--gpus 8"),
                                        (9, "--gpus 8 --nodes 2"), (17, "--gpus 8 --nodes 4")])
def test_the_fewest_gpus_that_fit_a_node_before_nodes_and_the_fewest_nodes(work, gpus, line):
    """8 per node with 3 nodes (24) would not split 512 sequences evenly: 4 nodes follow 2."""
    assert suggestions(work, lambda w: w.world >= gpus) == [f"{line}: peak 30.0 of 40.0 GiB, fits"]


def test_three_nodes_where_the_mini_batch_splits_over_24_gpus(work):
    even = work.with_(batch_prompts=96, mini_batch_prompts=48)  # 384 sequences a mini-batch: 24 x 16
    assert suggestions(even, lambda w: w.world >= 17) == ["--gpus 8 --nodes 3: peak 30.0 of 40.0 GiB, fits"]


def test_a_setting_that_fits_on_these_gpus_comes_and_more_gpus_do_not(work):
    lines = suggestions(work, lambda w: w.param_offload or w.world >= 2)
    assert lines == ["actor.param_offload=true, actor.optimizer_offload=true, ref.param_offload=true (parameters and "
                     "optimizer in host memory outside the phases that use them): peak 30.0 of 40.0 GiB, fits"]


def test_settings_that_fit_only_together_come_before_more_gpus_and_only_those_needed(work):
    lines = suggestions(work, lambda w: (w.param_offload and w.rollout == "vllm") or w.world >= 2)
    [line] = lines
    assert line.startswith("together: ") and "--gpus" not in line
    extra, _ = read_line(line)
    assert "actor.param_offload=true" in extra and "rollout.name=vllm" in extra
    assert not [s for s in extra if "entropy" in s or "offload_policy" in s]  # stacked, then dropped: not needed


def test_more_gpus_with_a_setting_when_neither_alone_fits(work):
    [line] = suggestions(work, lambda w: w.actor_sharded and w.world >= 4)
    assert line == "actor.strategy=fsdp, --gpus 4: peak 30.0 of 40.0 GiB, fits"


def test_when_nothing_fits_it_says_so_and_how_far_it_looked(work):
    [line] = suggestions(work, lambda w: False)
    assert line.startswith("no change tried here makes it fit") and f"up to {8 * MAX_NODES} GPUs" in line
    assert line.endswith("a larger GPU or a smaller model")


def test_a_tight_run_is_offered_settings_only(work):
    """The worst case does not fit: settings remove the risk; a run that fits needs no more GPUs."""
    evaluate = fits_when(lambda w: w.world >= 2)
    assert suggest(work, evaluate, OVER, 40 * GiB, goal=("fits",), settings_only=True) == []
