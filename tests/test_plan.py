"""`verl-deploy plan`: will a run fit? Run in-process like a user would; the model shapes are real config.json files
(tests/fixtures/models: published values, no weights) and tiny models instantiated for real."""

import json
import subprocess
import sys

import pytest
import yaml
from conftest import FIXTURES, REPO
from typer.testing import CliRunner

from verl_deploy.sizes import parse_gpus
from verl_deploy.cli import app
from verl_deploy.plan import plan, preflight
from verl_deploy.plan.shape import _count_by_arithmetic, model_shape, read_config

MODELS = FIXTURES / "models"
QWEN7B = MODELS / "Qwen2.5-7B-Instruct"
READINGS = FIXTURES / "nvml"
GIB = 2**30
# verl's GRPO example for Qwen2-7B on 8 GPUs (examples/grpo_trainer/run_qwen2-7b.sh at volcengine/verl@b178a3c), as
# `verl-deploy run --runtime verl` takes it; the model is the same widths' fixture.
VERL_7B = [
    "algorithm.adv_estimator=grpo", "data.train_batch_size=1024", "data.max_prompt_length=512",
    "data.max_response_length=1024", f"actor_rollout_ref.model.path={QWEN7B}",
    "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
]


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path_factory):
    """Counts cached in one folder for the session; no host GPU unless a test replays a reading; HF offline."""
    monkeypatch.setenv("VERL_DEPLOY_CACHE", str(tmp_path_factory.getbasetemp() / "plan-cache"))
    monkeypatch.setenv("VERL_DEPLOY_NVML_READING", str(READINGS / "no-driver.json"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def run_plan(*args, env=None):
    result = CliRunner().invoke(app, ["plan", *map(str, args)], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def plan_json(*args, env=None):
    result = run_plan("--json", *args, env=env)
    return result.exit_code, json.loads(result.stdout)


# --- the command -------------------------------------------------------------------------------------------------


def test_the_quickstart_fits_in_this_hosts_memory_with_every_phase_named():
    code, doc = plan_json(REPO / "examples" / "quickstart.yaml")
    assert code == 0 and doc["fits"] is True and doc["verdict"] == "fits"
    assert doc["device"]["kind"] == "cpu" and doc["gpus"] == 0
    assert [p["name"] for p in doc["phases"]] == ["rollout", "actor update"]  # GRPO on-policy: no ref, no old pass
    assert doc["peak_bytes"] == max(p["peak_bytes"] for p in doc["phases"]) < doc["gpu_memory_bytes"]
    from verl_runtime.models import load_causal_lm

    real = load_causal_lm("builtin:tiny", "float32", "cpu")
    assert doc["model"]["parameters"] == sum(p.numel() for p in real.parameters())  # counted on the meta device
    # the toy prompts were tokenized with the model's own tokenizer: the longest is planned (left padding)
    assert doc["lengths"]["prompt"] < 64 and "longest prompt of toy:letter" in doc["lengths"]["prompt_assumed"]
    assert doc["lengths"]["response"] == 16 and doc["suggestions"] == []


def test_qwen25_7b_grpo_on_8_h100_with_verls_example_fits_and_says_why():
    result = run_plan("--runtime", "verl", "--gpu-type", "H100", "--", *VERL_7B)
    assert result.exit_code == 0, result.output
    text = result.stdout
    for phase in ("rollout", "weight sync", "old log-probs", "reference log-probs", "actor update"):
        assert phase in text
    assert "8 x H100" in text and "fits:" in text and "--gpu-type H100: 79 GiB (gpu_types.yaml)" in text
    assert "a typical mean" in text and "worst case: prompt 512, response 1024 tokens" in text  # both cases, and why
    code, doc = plan_json("--runtime", "verl", "--gpu-type", "H100", "--", *VERL_7B)
    assert code == 0 and doc["gpus"] == 8 and doc["model"]["parameters"] == 7_615_616_512
    assert doc["gpu_memory_bytes"] == 79 * GIB
    rollout = next(p for p in doc["phases"] if p["name"] == "rollout")
    assert rollout["components"]["rollout"] == pytest.approx(0.6 * 79 * GIB, rel=1e-6)  # vLLM's share of the board


def test_padding_free_runs_plan_a_typical_length_and_the_worst_case():
    _, default = plan_json("--runtime", "verl", "--gpu-type", "H100", "--", *VERL_7B)
    _, given = plan_json("--runtime", "verl", "--gpu-type", "H100", "--response-length", "300", "--", *VERL_7B)
    assert default["lengths"]["response"] == 256 and "0.25 x data.max_response_length" in default["lengths"]["response_assumed"]
    assert default["lengths"]["prompt"] == 128  # no data file read: a quarter of max_prompt_length
    update = lambda doc: next(p["peak_bytes"] for p in doc["phases"] if p["name"] == "old log-probs")  # noqa: E731
    assert given["lengths"]["response"] == 300 and update(default) < update(given)
    worst = default["worst_case"]
    assert worst["lengths"] == {"prompt": 512, "response": 1024} and worst["peak_bytes"] > given["peak_bytes"]


def test_tight_says_up_to_which_mean_response_it_fits_and_what_removes_the_risk():
    """The published 1.5B GRPO-LoRA run on one H100 (its micro-batch is the whole batch): fits at typical lengths,
    not with every response at the limit. Tight, exit 0, the safe length, settings (not GPUs) that remove the risk."""
    import yaml

    case = next(c for c in yaml.safe_load((FIXTURES / "plan" / "verl_min_resources.yaml").read_text())["published"]
                if c["name"].startswith("1.5B"))
    args = ["--runtime", "verl", "--gpu-type", "H100", "--", *case["overrides"],
            f"actor_rollout_ref.model.path={MODELS / case['model']}"]
    code, doc = plan_json(*args)
    assert code == 0 and doc["verdict"] == "tight" and doc["worst_case"]["verdict"] == "does not fit"
    safe = doc["safe_response_length"]
    assert doc["lengths"]["response"] < safe < 1024 and f"stays under {safe} tokens" in doc["reason"]
    assert doc["phase_response_limits"]["actor update"] == safe  # the phase that stops fitting first
    assert "use_dynamic_bsz=true" in doc["reason"] and "removes the risk" in doc["reason"]
    assert doc["suggestions"] and not [s for s in doc["suggestions"] if "--gpus" in s or "--nodes" in s]
    assert doc["suggestions"][0].startswith(doc["cheapest_fix"] + ": peak ")  # its settings, for the trainer
    # each suggestion, applied, is planned to fit with every response at the limit
    settings = [part.strip() for part in doc["suggestions"][0].split(": peak")[0].split(",")]
    code, fixed = plan_json(*args, *settings)
    assert code == 0 and fixed["verdict"] == "fits" and fixed["worst_case"]["verdict"] == "fits"
    # the mean response the plan calls safe fits; one token more does not
    _, at = plan_json("--response-length", str(safe), *args)
    _, past = plan_json("--response-length", str(safe + 1), *args)
    assert at["peak_bytes"] <= at["gpu_memory_bytes"] < past["peak_bytes"]


def test_verls_entropy_settings_move_the_phases_they_touch():
    """verl 0.9.1: chunked entropy (2048 fp32 rows at a time) shrinks the old log-probs, which have no autograd; in
    an update with an entropy bonus autograd keeps every chunk, so it grows there; dynamic batching caps each
    micro-batch at its token budget (docs/plan.md, the verl table)."""
    def phases(*extra):
        _, doc = plan_json("--runtime", "verl", "--gpu-type", "H100", "--", *VERL_7B, *extra)
        return {p["name"]: p for p in doc["phases"]}

    plain, chunked = phases(), phases("actor_rollout_ref.actor.entropy_from_logits_with_chunking=True")
    vocab, tokens = 152_064, 40 * (128 + 256)
    assert plain["old log-probs"]["components"]["logits"] == 6 * tokens * vocab
    assert chunked["old log-probs"]["components"]["logits"] == 2 * tokens * vocab + 12 * 2048 * vocab
    bonus = "actor_rollout_ref.actor.entropy_coeff=0.001"
    assert phases(bonus)["actor update"]["peak_bytes"] < phases(
        bonus, "actor_rollout_ref.actor.entropy_from_logits_with_chunking=True")["actor update"]["peak_bytes"]
    dynamic = phases("actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096")
    assert "4,096 tokens (dynamic batch" in dynamic["actor update"]["detail"]
    assert dynamic["old log-probs"]["components"]["logits"] == 6 * 4096 * vocab  # the log-prob budget follows


def test_a_run_that_does_not_fit_exits_1_with_suggestions_that_each_fit_when_planned_again():
    too_big = [*VERL_7B, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=160",
               "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=160",
               "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=160"]
    long = ["--prompt-length", "512", "--response-length", "1024"]  # a data set whose answers reach the limit
    code, doc = plan_json("--runtime", "verl", "--gpu-type", "H100", *long, "--", *too_big)
    assert code == 1 and doc["fits"] is False and doc["verdict"] == "does not fit"
    assert doc["peak_bytes"] > doc["gpu_memory_bytes"]
    dynamic, micro = doc["suggestions"][:2]  # the cheapest changes first: settings, the token budget first
    assert dynamic.startswith("actor_rollout_ref.actor.use_dynamic_bsz=true")
    assert micro.startswith("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=")
    assert doc["cheapest_fix"] == "actor_rollout_ref.actor.use_dynamic_bsz=true"
    for line in (dynamic, micro):
        settings = [part.strip() for part in line.split(": peak")[0].split(",")]
        again, fixed = plan_json("--runtime", "verl", "--gpu-type", "H100", *long, "--", *too_big, *settings)
        assert again == 0 and fixed["fits"] is True


def test_our_runtime_that_cannot_fit_says_which_phase_and_refuses():
    code, doc = plan_json(REPO / "examples" / "gsm8k-grpo.yaml", "--set", f"model.path={QWEN7B}", "--gpus", "1",
                          "--gpu-type", "H100")
    assert code == 1 and "does not fit" == doc["verdict"]
    states = next(p for p in doc["phases"] if p["name"] == "actor update")["components"]
    assert states["weights"] >= 4 * 7_615_616_512 and states["optimizer"] == 8 * 7_615_616_512  # fp32 AdamW moments


def test_our_runtime_is_offered_its_memory_settings_first_in_its_own_keys_and_each_fits_when_planned_again():
    """The gsm8k GRPO example with the 0.5B model on one 48 GiB GPU: the update's micro-batch of 32 full-length
    sequences does not fit; our runtime honours verl's settings, so they come first, spelled as --set takes them."""
    args = [REPO / "examples" / "gsm8k-grpo.yaml", "--gpus", "1", "--gpu-memory", "48g"]
    model = f"model.path={MODELS / 'Qwen2.5-0.5B-Instruct'}"
    code, doc = plan_json(*args, "--set", model)
    assert code == 1 and doc["verdict"] == "does not fit"
    assert doc["cheapest_fix"] == "actor.use_dynamic_bsz=true"  # the token budget first, as for verl
    assert doc["suggestions"][0].startswith("actor.use_dynamic_bsz=true: peak ")
    assert any(s.startswith("actor.entropy_from_logits_with_chunking=true") for s in doc["suggestions"])
    assert not [s for s in doc["suggestions"] if "--gpus" in s or "actor_rollout_ref." in s]
    for line in doc["suggestions"]:
        settings = [part.strip() for part in line.split(": peak")[0].split(",")]
        again, fixed = plan_json(*args, "--set", model, *settings)
        assert again == 0 and fixed["verdict"] in ("fits", "tight"), line  # tight: `run` lets it through, warned


def test_our_runtimes_token_budget_is_halved_under_its_own_key():
    """With use_dynamic_bsz already on, the smaller micro-batch is a smaller actor.ppo_max_token_len_per_gpu (vLLM's
    share small enough that the update alone is over)."""
    args = [REPO / "examples" / "gsm8k-grpo.yaml", "--gpus", "1", "--gpu-memory", "48g", "--set",
            f"model.path={MODELS / 'Qwen2.5-1.5B-Instruct'}", "rollout.name=vllm", "rollout.gpu_memory_utilization=0.3",
            "actor.use_dynamic_bsz=true"]
    code, doc = plan_json(*args)
    assert code == 1 and doc["cheapest_fix"].startswith("actor.ppo_max_token_len_per_gpu=")
    again, fixed = plan_json(*args, *doc["cheapest_fix"].split(", "))
    assert again == 0 and fixed["verdict"] == "fits"


def test_gpu_memory_and_gpu_type_and_nodes():
    _, small = plan_json("--runtime", "verl", "--gpu-memory", "40g", "--", *VERL_7B)
    assert small["gpu_memory_bytes"] == 40 * GIB and small["device"]["source"].startswith("--gpu-memory 40g")
    _, two_nodes = plan_json("--runtime", "verl", "--gpu-type", "h100", "--gpus", "8", "--nodes", "2", "--",
                             *[o for o in VERL_7B if not o.startswith("trainer.")])
    assert two_nodes["gpus"] == 16 and two_nodes["nodes"] == 2


def test_the_host_gpu_comes_from_doctors_nvml_reading():
    code, doc = plan_json("--runtime", "verl", "--gpus", "1", "--", *VERL_7B[:-2],
                          "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                          env={"VERL_DEPLOY_NVML_READING": str(READINGS / "h200.json")})
    assert doc["device"]["name"] == "NVIDIA H200"
    assert doc["gpu_memory_bytes"] == 150_754_820_096 - 644_939_776  # total less what other processes use
    assert "this host's GPU 0 (NVML" in doc["device"]["source"]


@pytest.mark.parametrize("args, message", [
    (["--runtime", "verl", "--gpu-type", "H1000", "--", *VERL_7B], "--gpu-type 'H1000' is not a GPU type this tool knows"),
    (["--runtime", "verl", "--gpu-memory", "lots", "--", *VERL_7B], "--gpu-memory 'lots' is not a size"),
    (["--runtime", "verl", "--gpu-type", "H100", "--", *VERL_7B[:4], "actor_rollout_ref.model.path=/no/such/model",
      *VERL_7B[5:]], "model /no/such/model not found"),
    (["--runtime", "verl", "--gpu-type", "H100", "--", "actor_rollout_ref.model.path=Org/not-cached",
      "algorithm.adv_estimator=grpo",
      "trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1"], "HF_HUB_OFFLINE=1"),
    (["--runtime", "verl", "--", *VERL_7B], "this host shows no GPU: name the one to plan for with --gpu-type"),
    (["--runtime", "verl", "--gpu-type", "H100", "--", *VERL_7B, "actor_rollout_ref.actor.ppo_micro_batch_size=8"],
     "You have set both"),
    (["--runtime", "verl", "--gpu-type", "H100", "--", *VERL_7B,
      "actor_rollout_ref.rollout.tensor_model_parallel_size=3"], "is not divisible by"),
    (["--gpu-type", "H100", REPO / "examples" / "quickstart.yaml"], "trainer.device=cpu trains on the CPU"),
    ([REPO / "examples" / "quickstart.yaml", "--set", "actor.lr=fast"], "actor.lr: expected a number"),
    ([REPO / "examples" / "quickstart.yaml", "--response-length", "0"], "--response-length 0 must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = run_plan(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_a_hub_id_is_read_from_the_cache_offline_config_json_only(tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B-Instruct" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((QWEN7B / "config.json").read_text())
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    overrides = [o if not o.startswith("actor_rollout_ref.model.path") else
                 "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct" for o in VERL_7B]
    code, doc = plan_json("--runtime", "verl", "--gpu-type", "H100", "--", *overrides,
                          env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"})
    assert code == 0 and doc["model"]["parameters"] == 7_615_616_512
    assert list(snapshot.iterdir()) == [snapshot / "config.json"]  # nothing but config.json was needed


def test_prompt_lengths_are_read_from_the_data_file(tmp_path):
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "x" * length}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": "1"}} for length in (10, 40, 25)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, doc = plan_json(REPO / "examples" / "quickstart.yaml", "--set", f"data.train_files={data}")
    # builtin:tiny's tokenizer is byte-level: each x is a token, plus its chat template's tokens
    assert code == 0 and "longest prompt of" in doc["lengths"]["prompt_assumed"]
    template = doc["lengths"]["prompt"] - 40
    assert 5 < template < 30
    code, doc = plan_json(REPO / "examples" / "quickstart.yaml", "--set", f"data.train_files={data}",
                          "--prompt-length", "33")
    assert doc["lengths"]["prompt"] == 33 and doc["lengths"]["prompt_assumed"] == "--prompt-length 33"


def test_padding_free_runs_take_the_data_files_mean_prompt_typical_and_its_longest_worst(tmp_path):
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "x" * length}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": "1"}} for length in (10, 40, 25)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    verl = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=builtin:tiny", f"data.train_files={data}",
            "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "trainer.n_gpus_per_node=1"]
    code, doc = plan_json("--runtime", "verl", "--gpu-type", "H100", "--", *verl)
    assert code == 0 and doc["lengths"]["prompt_assumed"].startswith(f"mean prompt of {data}")
    template = doc["worst_case"]["lengths"]["prompt"] - 40  # the longest prompt: 40 x's and the chat template
    assert 5 < template < 30 and doc["lengths"]["prompt"] == 25 + template  # the mean: (10 + 40 + 25) / 3 = 25
    assert doc["worst_case"]["lengths"]["response"] == 512  # verl's default max_response_length


def test_the_table_fits_80_columns_and_names_every_component():
    result = run_plan("--runtime", "verl", "--gpu-type", "H100", "--", *VERL_7B)
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    header = next(line for line in lines if line.startswith("phase"))
    assert header.split() == ["phase", "param", "copy", "grad", "optim", "roll", "act", "logit", "other", "peak"]


def test_the_built_in_models_names_are_the_runtimes():
    from verl_deploy.plan import shape
    from verl_runtime import models

    assert (shape.BUILTIN_TINY, shape.TINY_CACHE_NAME) == (models.BUILTIN_TINY, models.TINY_CACHE_NAME)
    assert shape.BUILTIN_CACHES == models.BUILTIN_CACHES
    assert shape._runtime_cache_root() == models.cache_root()


def test_a_counted_model_is_planned_without_torch():
    """Once counted (the cache), a plan and run's pre-flight need neither torch nor transformers."""
    plan(REPO / "examples" / "quickstart.yaml", [], read_data=False)  # counts builtin:tiny into the cache
    code = ("import sys; from verl_deploy.plan import preflight; "
            f"check = preflight({str(REPO / 'examples' / 'quickstart.yaml')!r}, [], target='local'); "
            "assert check.status == 'fits', check.message; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported'; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_plan_help_does_not_import_torch():
    code = ("import sys; from typer.testing import CliRunner; from verl_deploy.cli import app; "
            "r = CliRunner().invoke(app, ['plan', '--help']); assert r.exit_code == 0, r.output; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


# --- exact: parameters, gradients and AdamW against real models -----------------------------------------------


def _tiny_configs():
    from transformers import GPT2Config, LlamaConfig, Qwen2Config, Qwen3Config

    return {
        "qwen2-tied": Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
        "llama-untied": LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=176, num_hidden_layers=3,
                                    num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False),
        "qwen3": Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False),
        "gpt2": GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=128),
    }


@pytest.mark.parametrize("name", ["qwen2-tied", "llama-untied", "qwen3", "gpt2"])
def test_weights_gradients_and_adamw_bytes_equal_a_real_models(name, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    config = _tiny_configs()[name]
    config.save_pretrained(tmp_path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 300, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    gradients = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    moments = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if t.dim())

    overrides = [f"model.path={tmp_path}", "algorithm.adv_estimator=grpo", "rollout.n=2", "actor.use_kl_loss=false",
                 "data.train_files=toy:letter", "trainer.device=cpu"]
    result = plan(None, overrides, read_data=False)
    update = next(p for p in result.memory.phases if p.name == "actor update").components
    assert (update["weights"], update["gradients"], update["optimizer"]) == (weights, gradients, moments)
    assert result.model.params * 4 == weights


@pytest.mark.parametrize("size", ["0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B"])
def test_published_qwen25_configs_count_as_their_model_cards_say(size):
    shape = model_shape(str(MODELS / f"Qwen2.5-{size}-Instruct"))
    published = {"0.5B": 494_032_768, "1.5B": 1_543_714_304, "3B": 3_085_938_688, "7B": 7_615_616_512,
                 "14B": 14_770_033_664, "32B": 32_763_876_352, "72B": 72_706_203_648}
    assert shape.params == published[size]
    # without transformers, the same count by arithmetic on config.json
    arithmetic = _count_by_arithmetic(read_config(str(MODELS / f"Qwen2.5-{size}-Instruct")).config, {}, "transformers")
    assert (arithmetic.params, arithmetic.layer_params, arithmetic.lora_params(32)) == (
        shape.params, shape.layer_params, shape.lora_params(32))


@pytest.mark.parametrize("name", ["llama-untied", "qwen3"])
def test_arithmetic_counts_equal_the_meta_devices(name, tmp_path):
    config = _tiny_configs()[name]
    config.save_pretrained(tmp_path)
    counted = model_shape(str(tmp_path))
    assert _count_by_arithmetic(json.loads((tmp_path / "config.json").read_text()), {}, "x").params == counted.params


def test_lora_adapters_are_rank_times_in_plus_out_of_every_decoder_linear(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    config = _tiny_configs()["llama-untied"]
    config.save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_config(config)
    layers = model.model.layers
    linears = [m for m in layers.modules() if isinstance(m, torch.nn.Linear)]
    shape = model_shape(str(tmp_path))
    assert shape.lora_params(8) == sum(8 * (m.in_features + m.out_features) for m in linears)
    attention = [m for n, m in layers.named_modules() if n.endswith(("q_proj", "v_proj"))]
    assert shape.lora_params(8, ["q_proj", "v_proj"]) == sum(8 * (m.in_features + m.out_features) for m in attention)


# --- pre-flight for `run` ------------------------------------------------------------------------------------------


def test_preflight_refuses_a_run_that_cannot_fit_in_one_line_with_the_best_change():
    check = preflight(REPO / "examples" / "gsm8k-grpo.yaml", [f"model.path={QWEN7B}"], target="k8s", gpus=parse_gpus("1"),
                      gpu_type="H100")
    assert check.refuse and check.status == "does not fit" and len(check.message.splitlines()) == 1
    assert check.message.startswith("the run does not fit on H100 x 1: the ") and "--no-plan skips this check" in check.message
    assert check.plan.verdict == "does not fit"
    greedy = preflight(None, [*VERL_7B, "actor_rollout_ref.rollout.gpu_memory_utilization=0.95"], runtime="verl",
                       target="k8s", gpu_type="H100")
    assert greedy.refuse and len(greedy.message.splitlines()) == 1
    assert f"; cheapest fix: {greedy.plan.cheapest_fix}: peak " in greedy.message


def test_preflight_is_quiet_when_it_fits_and_warns_when_tight():
    fits = preflight(REPO / "examples" / "quickstart.yaml", [], target="local")
    assert fits.status == "fits" and fits.message is None and not fits.refuse
    tight = preflight(None, [*VERL_7B], runtime="verl", target="k8s", gpu_type="H100")
    assert tight.status in ("fits", "tight")
    squeezed = preflight(None, [*VERL_7B, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=44"],
                         runtime="verl", target="k8s", gpu_type="A100-80GB")
    assert squeezed.status == "tight" and squeezed.message.startswith("warning: the run is tight on A100-80GB x 8")


def test_preflight_skips_what_it_cannot_know_and_never_raises():
    cluster = preflight(None, VERL_7B, runtime="verl", target="k8s")
    assert cluster.status == "skipped" and "--gpu-type" in cluster.message and not cluster.refuse
    offline = preflight(None, [o.replace(str(QWEN7B), "Org/not-cached") for o in VERL_7B], runtime="verl",
                        target="k8s", gpu_type="H100")
    assert offline.status == "skipped" and offline.message.startswith("note: not planned for memory:")


def test_run_refuses_a_run_that_cannot_fit_before_anything_exists_and_no_plan_skips_it(tmp_path):
    """`run` plans first, on every target, dry runs too: one line with the best change, exit 2, no run directory."""
    args = ["run", str(REPO / "examples" / "gsm8k-grpo.yaml"), "--target", "k8s", "--gpus", "1", "--gpu-type", "H100",
            "--image", "registry.example.com/team/verl-deploy:1", "--dry-run", "--run-id", "big",
            "--runs-dir", str(tmp_path / "runs"), "--set", f"model.path={QWEN7B}"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2
    [line] = refused.output.strip().splitlines()
    assert line.startswith("error: the run does not fit on H100 x 1: the ") and line.endswith(
        "(`verl-deploy plan` shows every phase; --no-plan skips this check)")
    assert not (tmp_path / "runs").exists()
    forced = CliRunner().invoke(app, [*args, "--no-plan"])
    assert forced.exit_code == 0 and "kind: Job" in forced.stdout, forced.output


def test_run_warns_when_tight_and_goes_on():
    args = ["run", "--runtime", "verl", "--target", "k8s", "--gpu-type", "A100-80GB", "--dry-run",
            "--image", "registry.example.com/team/verl-deploy:verl-1", "--",
            *VERL_7B, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=44"]
    result = CliRunner().invoke(app, args, env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert result.exit_code == 0, result.output
    assert [line for line in result.stderr.splitlines() if line.startswith("warning: the run is tight on A100-80GB x 8")]


# --- doctor: what each GPU could train ---------------------------------------------------------------------------


@pytest.mark.parametrize("reading, name, without", [
    ("h200", "capacity (gpu 0)", "up to Qwen2.5-7B without offload"),
    ("a100-535", "capacity (gpu 0-7)", "up to Qwen2.5-3B without offload"),
    ("l4-550", "capacity (gpu 0-3)", "up to Qwen2.5-0.5B without offload"),
])
def test_doctor_says_what_each_gpu_could_train(reading, name, without):
    result = CliRunner().invoke(app, ["doctor", "--json", "--nvml-reading", str(READINGS / f"{reading}.json")])
    found = {f["name"]: f for f in json.loads(result.stdout)["findings"] if f["area"] == "nvidia"}
    assert found[name]["status"] == "ok" and without in found[name]["message"]
    assert "with FSDP2 CPU offload, which takes" in found[name]["message"]


def test_doctor_without_gpus_has_no_capacity_line():
    result = CliRunner().invoke(app, ["doctor", "--json", "--nvml-reading", str(READINGS / "no-driver.json")])
    assert not [f for f in json.loads(result.stdout)["findings"] if f["name"].startswith("capacity")]


def test_the_benchmark_cases_are_valid_configs_for_our_trainer():
    from verl_runtime.config import load_config

    sys.path.insert(0, str(REPO / "bench"))
    import plan_accuracy

    for name, spec in {**plan_accuracy.CASES, **plan_accuracy.GPU_CASES}.items():
        common = plan_accuracy.GPU_COMMON if name.startswith("gpu") else plan_accuracy.COMMON
        config = REPO / spec["config"] if "config" in spec else None
        load_config(config, [*common, "model.path=builtin:tiny", *spec["set"]], warn=False)


@pytest.mark.slow
def test_the_cpu_benchmark_is_within_15_percent(tmp_path):
    out = tmp_path / "accuracy.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "plan_accuracy.py"), "--cases",
                           "quickstart,bf16-checkpointing", "--json", str(out)], capture_output=True, text=True,
                          timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["worst_error"] <= 0.15
    assert all(v["measured"] == v["predicted"] for case in figures["cases"] for v in case["static"].values())


def test_the_fixture_models_are_config_json_only():
    for folder in MODELS.iterdir():
        assert [p.name for p in folder.iterdir()] == ["config.json"]
        assert yaml.safe_load((folder / "config.json").read_text())["model_type"] == "qwen2"
