"""Every verl command line gets the right way out: a key verl renamed names the new key and the release that renamed
it (verl_runtime/verl_key_history.json, made from verl's 16 PyPI releases by
tests/fixtures/verl-key-history/make_history.py), a key or value no verl release has names --verl-source, an
out-of-scope feature is refused before anything else, and the batch-size checks are verl 0.9.1's.

Over verl's own scripts (tests/fixtures/verl-scripts) and research repositories' command lines
(tests/fixtures/verl-research), every refusal is one line that names its way out."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, REPO
from test_verl_scripts import compose, corpus, way_out
from verl_deploy.cli import app
from verl_runtime import verl_keys
from verl_runtime.config import load_config
from verl_runtime.errors import ConfigError
from verl_wheel import unavailable

RESEARCH = FIXTURES / "verl-research" / "lines.jsonl"
MAKER = FIXTURES / "verl-key-history" / "make_history.py"


def research() -> list[dict]:
    return [json.loads(line) for line in RESEARCH.read_text().splitlines() if line.strip()]


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, list(overrides))
    return str(info.value)


# --- the table ------------------------------------------------------------------------------------------------------
def test_the_table_covers_every_release_on_pypi():
    history = verl_keys.history()
    assert history["releases"][0] == "0.1" and history["releases"][-1] == verl_keys.VERL_VERSION
    assert len(history["releases"]) == 16
    assert set(verl_keys.verl_keys()) <= {k for k, (_, last) in history["keys"].items() if last == "0.9.1"}


def test_the_table_ships_in_the_wheel():
    # pyproject's package-data takes *.json of every package: the table sits next to verl_keys.py
    assert verl_keys.HISTORY_FILE.parent == REPO / "verl_runtime"
    assert '"*" = ["*.json"' in (REPO / "pyproject.toml").read_text()


@pytest.mark.slow
def test_the_committed_table_is_what_the_tool_makes_from_the_wheels(request, tmp_path_factory):
    spec = importlib.util.spec_from_file_location("make_history", MAKER)
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    cached = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    cache = cached.mkdir("verl-releases") if cached else tmp_path_factory.mktemp("w")
    try:
        maker.download(verl_keys.history()["releases"], cache)
    except (subprocess.SubprocessError, OSError) as error:
        unavailable(RuntimeError(f"pip download of verl's releases failed: {error}"))
    assert maker.history(cache) == verl_keys.history()


# --- renamed, removed, a fork's --------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, new, release", [
    ("ray_init.num_cpus", "ray_kwargs.ray_init.num_cpus", "0.6.0"),
    ("algorithm.rollout_is_threshold", "algorithm.rollout_correction.rollout_is_threshold", "0.6.1"),
    ("reward_manager.name", "reward.reward_manager.name", "0.7.1"),
    ("actor_rollout_ref.rollout.update_weights_bucket_megabytes",
     "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes", "0.7.1"),
])
def test_a_renamed_key_names_the_new_key_and_the_release(key, new, release):
    assert refusal(f"{key}=1") == (f"unknown config key {key!r} on the command line: verl {release} renamed it "
                                   f"{new!r}: set that")


def test_a_key_verl_removed_names_the_last_release_that_had_it():
    message = refusal("trainer.use_legacy_worker_impl=auto")
    assert "verl's key in 0.5.0-0.7.1, removed in 0.8.0" in message
    assert "--runtime verl --verl-source verl==0.7.1" in message


def test_val_temperature_is_in_no_release():
    # verl's releases went from no validation sampling (0.2.0.post2) to rollout.val_kwargs.* (0.3.0.post0): no
    # release on PyPI has rollout.val_temperature, whatever forks of the time spelled
    assert "actor_rollout_ref.rollout.val_temperature" not in verl_keys.history()["keys"]
    assert verl_keys.history()["keys"]["actor_rollout_ref.rollout.val_kwargs.temperature"][0] == "0.3.0.post0"
    message = refusal("actor_rollout_ref.rollout.val_temperature=0.6")
    assert "in no verl release (0.1-0.9.1)" in message and verl_keys.RUN_FORK in message
    # not the nearest spelling (rollout.temperature samples the training responses): the key with its words
    assert "did you mean 'actor_rollout_ref.rollout.val_kwargs.temperature'?" in message


@pytest.mark.parametrize("override", ["actor_rollout_ref.actor.adaptive_entropy.enabled=true", "retriever.topk=3",
                                      "max_turns=2", "algorithm.adv_estimator=grpo_adaptive",
                                      "reward_model.reward_manager=length_penalty"])
def test_a_fork_key_or_value_names_verl_source(override):
    message = refusal(override)
    assert "in no verl release (0.1-0.9.1)" in message and verl_keys.RUN_FORK in message and "\n" not in message


def test_a_misspelling_of_ours_still_names_the_key_meant():
    assert "did you mean 'trainer.total_training_steps'?" in refusal("trainer.total_steps=3")
    assert refusal("actor.learnin_rate=1").count("--verl-source") == 0  # our own section: no fork


def test_a_verl_value_we_lack_is_verls_own_trainer():
    message = refusal("algorithm.adv_estimator=gdpo")
    assert "verl's 'gdpo' (verl 0.7.1-0.9.1)" in message and message.endswith(verl_keys.RUN_WITH_VERL)


# --- out of scope first ----------------------------------------------------------------------------------------------
def test_an_out_of_scope_key_is_refused_before_a_fork_key():
    message = refusal("retriever.topk=3", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2")
    assert "Megatron" in message and message.endswith(verl_keys.RUN_WITH_VERL)


def test_fapo_is_refused_for_its_sglang_reward_model_first():
    row = next(row for row in corpus() if row["path"] == "fapo/run_fapo_7b.sh")
    code, _, error = compose(row["argv"])
    assert code == 2 and error.startswith("error: reward_model.rollout.name='sglang' on the command line is refused")
    assert error.endswith(verl_keys.RUN_WITH_VERL)


# --- wording ---------------------------------------------------------------------------------------------------------
def test_main_ppo_and_run_say_on_the_command_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "verl_runtime.main_ppo", "--cfg", "job", "retriever.topk=3"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: unknown config key 'retriever.topk' on the command line:")
    result = CliRunner().invoke(app, ["run", "--target", "k8s", "--dry-run", "--image", "reg.io/i", "--runs-dir",
                                      str(tmp_path), "--", "trainer.critic_warmup=1"])
    assert result.exit_code == 2 and "trainer.critic_warmup=1 on the command line is refused" in result.output
    assert "in --set" not in result.output and verl_keys.RUN_WITH_VERL in result.output


def test_run_gives_a_fork_line_its_way_out_in_one_line(tmp_path):
    row = next(row for row in research() if row["repo"] == "PeterGriffinJin/Search-R1")
    result = CliRunner().invoke(app, ["run", "--target", "docker", "--dry-run", "--image", "i", "--runs-dir",
                                      str(tmp_path), "--", *row["argv"]])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and verl_keys.RUN_FORK in lines[0], result.output


# --- batch sizes: verl 0.9.1's checks --------------------------------------------------------------------------------
def test_a_batch_that_is_not_a_multiple_of_the_mini_batch_composes():
    config = load_config(None, ["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=4"])
    assert config.data.batch_size == 6  # verl trains a last, smaller mini-batch


def test_a_batch_smaller_than_the_mini_batch_is_refused_unless_dynamic():
    sizes = ["data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]
    assert "data.batch_size (2) must be >= actor.ppo_mini_batch_size (4)" in refusal(*sizes)
    assert load_config(None, [*sizes, "actor_rollout_ref.actor.use_dynamic_bsz=true"]).actor.use_dynamic_bsz


def test_the_batch_splits_evenly_over_the_workers_unless_dynamic():
    sizes = ["data.train_batch_size=3", "actor_rollout_ref.rollout.n=1", "trainer.n_gpus_per_node=2",
             "actor_rollout_ref.actor.ppo_mini_batch_size=2"]  # below the batch (verl's default is 256)
    assert "must be divisible by trainer.n_workers (2)" in refusal(*sizes)
    load_config(None, [*sizes, "actor_rollout_ref.actor.use_dynamic_bsz=true"])


# --- the corpora -----------------------------------------------------------------------------------------------------
def test_every_refusal_of_a_research_line_is_one_line_naming_its_way_out():
    outcomes = {}
    for row in research():
        code, _, error = compose(row["argv"])
        assert code in (0, 2) and (code == 0 or error.count("\n") == 0), (row["repo"], error)
        outcomes[row["repo"], tuple(row["argv"])] = way_out(error) if code else "composes"
        assert code == 0 or way_out(error) or "as in verl" in error, (row["repo"], error)  # a size verl refuses too
    kinds = list(outcomes.values())
    assert kinds.count("--verl-source") >= 10 and kinds.count("renamed") == 3 and kinds.count("composes") == 3


def test_every_refusal_of_verls_own_scripts_names_its_way_out():
    for row in corpus():
        if row["argv"] is not None:
            code, _, error = compose(row["argv"])
            assert code == 0 or (code == 2 and way_out(error)), (row["path"], error)


# --- docs/verl.md: what each research line meets ---------------------------------------------------------------------
BEGIN, END = "<!-- verl-research table -->", "<!-- end verl-research table -->"
WAYS = {"composes": "composes here", "--verl-source": "refused: run the fork (`--verl-source`)",
        "--runtime verl": "refused: verl's own trainer (`--runtime verl`)",
        "renamed": "refused: the key verl renamed it to, and the release", None: "refused: its sizes (as in verl)"}


def research_table() -> str:
    counts = {way: 0 for way in WAYS}
    for row in research():
        code, _, error = compose(row["argv"])
        counts["composes" if code == 0 else way_out(error)] += 1
    lines = ["| held-out research command lines | count |", "|---|---|"]
    lines += [f"| {WAYS[way]} | {count} |" for way, count in counts.items() if count]
    return "\n".join(lines)


def test_docs_hold_what_the_research_lines_meet():
    import os

    docs = REPO / "docs" / "verl.md"
    text, new = docs.read_text(), research_table()
    assert BEGIN in text and END in text, f"docs/verl.md lacks the {BEGIN} ... {END} block"
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    if text[start:end].strip() != new:
        if os.environ.get("UPDATE_DOCS") == "1":
            docs.write_text(text[:start] + "\n" + new + "\n" + text[end:])
        pytest.fail(f"docs/verl.md's verl-research table is stale (UPDATE_DOCS=1 rewrites it); now:\n{new}")
