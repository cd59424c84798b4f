"""Sampled validation, as verl 0.9.1 runs it: rollout.val_kwargs (verl's actor_rollout_ref.rollout.val_kwargs.*) says
how many responses per validation prompt and at which temperature; the metrics are verl's process_validation_metrics
(mean@N, std@N, best@n, worst@n, maj@n with its seeded bootstrap) under verl's val-core/ and val-aux/ names, checked
number for number against verl's own functions from its wheel. Greedy validation (the default) keeps writing
val-core/<data_source>/reward/mean@1 alone."""

import ast
import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from verl_runtime import validation
from verl_runtime.config import load_config
from verl_runtime.errors import ConfigError
from verl_runtime.metrics import read_metrics
from verl_wheel import verl  # verl: the fixture

VAL_KWARGS = "actor_rollout_ref.rollout.val_kwargs"


def verl_val_metrics_update(verl):
    """verl's RayPPOTrainer._val_metrics_update (ray_trainer.py), taken out of its class: the val-core/val-aux naming."""
    source = (verl.root / "verl/trainer/ppo/ray_trainer.py").read_text()
    method = next(node for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.FunctionDef) and node.name == "_val_metrics_update")
    namespace = {"np": np, "process_validation_metrics": verl.metric_utils.process_validation_metrics}
    exec(compile(ast.Module(body=[method], type_ignores=[]), "ray_trainer.py", "exec"), namespace)
    return lambda sources, uids, infos: namespace["_val_metrics_update"](None, sources, uids, infos, [])


def samples(seed: int):
    """Validation samples as verl's _validate collects them: a few data sources, prompts with n responses each,
    a reward, and in some cases a scorer's acc (bools), pred (votes with ties) and gaps (None) in an extra key."""
    g = np.random.default_rng(seed)
    n = int(g.choice([1, 2, 3, 4, 5, 8]))
    prompts = int(g.integers(1, 4))
    sources, uids, rewards, acc, pred, extra = [], [], [], [], [], []
    for p in range(prompts):
        source = ["openai/gsm8k", "math_dapo", "toy/letter"][int(g.integers(0, 3))]
        for _ in range(n):
            sources.append(source)
            uids.append(f"uid-{p}")
            correct = bool(g.random() < 0.5)
            rewards.append(float(np.float32(g.normal() if seed % 2 else (1.0 if correct else -1.0))))
            acc.append(correct)
            pred.append(str(int(g.integers(0, 3))))
            extra.append(None if g.random() < 0.2 else float(g.random()))
    infos = {"reward": rewards}
    if seed % 3:
        infos.update(acc=acc, pred=pred)
    if seed % 4 == 0:
        infos["overlong_reward"] = extra
    return np.array(sources, dtype=object), uids, infos


@pytest.mark.parametrize("seed", range(16))
def test_validation_metrics_are_verls_number_for_number(verl, seed):
    sources, uids, infos = samples(seed)
    theirs = verl.metric_utils.process_validation_metrics(sources, uids, infos)
    ours = validation.process_validation_metrics(list(sources), uids, infos)
    assert {s: {v: dict(m) for v, m in vs.items()} for s, vs in theirs.items()} == ours
    named = verl_val_metrics_update(verl)(sources, uids, infos)
    assert validation.validation_metrics(list(sources), uids, infos) == named


def test_bootstrap_leaves_numpys_global_generator_alone():
    np.random.seed(3)
    expected = np.random.random()
    np.random.seed(3)
    validation.process_validation_metrics(["s"] * 4, ["u"] * 4, {"reward": [0.0, 1.0, 1.0, 0.5]})
    assert np.random.random() == expected  # verl seeds the global one; training randomness here is the trainer's


def test_verls_val_kwargs_are_ours(capsys):
    config = load_config(None, [f"{VAL_KWARGS}.n=4", f"{VAL_KWARGS}.temperature=0.6", f"{VAL_KWARGS}.top_p=0.95",
                                f"{VAL_KWARGS}.top_k=20", f"{VAL_KWARGS}.do_sample=True"])
    kwargs = config.rollout.val_kwargs
    assert (kwargs.n, kwargs.temperature, kwargs.top_p, kwargs.top_k) == (4, 0.6, 0.95, 20)
    warning = capsys.readouterr().err.strip()
    assert warning.startswith(f"warning: {VAL_KWARGS}.do_sample has no effect here") and "\n" not in warning
    defaults = load_config().rollout.val_kwargs  # verl 0.9.1's rollout.yaml: greedy, one response
    assert (defaults.n, defaults.temperature, defaults.top_p, defaults.top_k) == (1, 0.0, 1.0, -1)


@pytest.mark.parametrize("override, message", [
    (f"{VAL_KWARGS}.n=0", "must be >= 1"),
    (f"{VAL_KWARGS}.temperature=-1", "must be >= 0"),
    (f"{VAL_KWARGS}.top_p=0", "must be in (0, 1]"),
])
def test_val_kwargs_out_of_range_are_one_line(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert message in str(info.value) and "\n" not in str(info.value)


# --- training runs ------------------------------------------------------------------------------------------------


def main_ppo(run_dir, *overrides):
    """verl's entrypoint as a verl user runs it: 2 steps on the built-in model, on the CPU."""
    command = [sys.executable, "-m", "verl_runtime.main_ppo", "algorithm.adv_estimator=grpo",
               "actor_rollout_ref.model.path=builtin:tiny", "trainer.device=cpu", f"trainer.run_dir={run_dir}",
               "data.train_files=toy:letter", "+data.toy_size=16", "data.train_batch_size=4",
               "actor_rollout_ref.actor.ppo_mini_batch_size=4",
               "data.max_response_length=8", "actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=2",
               "trainer.test_freq=2", "trainer.logger=[console]", *overrides]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def val_records(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if k.startswith("val-")} for r in read_metrics(run_dir)
            if any(k.startswith("val-") for k in r)]


@pytest.fixture(scope="module")
def math_val_file(tmp_path_factory):
    """Validation prompts of DAPO's math data source, whose scorer gives score, acc and pred (verl's dict)."""
    path = tmp_path_factory.mktemp("data") / "math.jsonl"
    rows = [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
             "extra_info": {"index": i}} for i in range(3)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.slow
def test_sampled_validation_writes_verls_metrics(tmp_path, math_val_file):
    done = main_ppo(tmp_path, f"data.val_files=[toy:letter,{math_val_file}]", f"{VAL_KWARGS}.n=4",
                    f"{VAL_KWARGS}.do_sample=True", f"{VAL_KWARGS}.temperature=1.0", f"{VAL_KWARGS}.top_p=0.7")
    before, after = val_records(tmp_path)  # before the first step and at the last
    for record in (before, after):
        for name in ("mean@4", "best@4/mean", "best@4/std"):
            assert f"val-core/toy/letter/reward/{name}" in record
            assert f"val-core/math_dapo/acc/{name}" in record  # acc is the core variable where the scorer gives one
        assert "val-core/math_dapo/acc/maj@4/mean" in record and "val-core/math_dapo/acc/maj@4/std" in record
        for name in ("std@4", "best@2/mean", "worst@2/std", "worst@4/mean"):
            assert f"val-aux/toy/letter/reward/{name}" in record
        assert "val-aux/math_dapo/reward/mean@4" in record and "val-aux/math_dapo/score/maj@2/mean" in record
        assert all(k.startswith("val-core/") or k.startswith("val-aux/") for k in record)
    assert "[VAL] step 0 | val-core/math_dapo/acc/best@4/mean" in done.stdout
    assert "val-aux/" not in done.stdout  # the console shows the core metrics; metrics.jsonl holds them all


@pytest.mark.slow
def test_greedy_validation_keeps_reward_mean_at_1(tmp_path):
    main_ppo(tmp_path, "data.val_files=[toy:letter]")
    before, after = val_records(tmp_path)
    assert set(before) == set(after) == {"val-core/toy/letter/reward/mean@1"}


def verl_log_val_generations(verl, count: int):
    """verl's RayPPOTrainer._maybe_log_val_generations (ray_trainer.py) out of its class: the samples it hands its
    loggers."""
    source = (verl.root / "verl/trainer/ppo/ray_trainer.py").read_text()
    method = next(node for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.FunctionDef) and node.name == "_maybe_log_val_generations")
    namespace = {}
    exec(compile(ast.Module(body=[method], type_ignores=[]), "ray_trainer.py", "exec"), namespace)
    logged = []
    trainer = SimpleNamespace(config=SimpleNamespace(trainer=SimpleNamespace(log_val_generations=count, logger=[])),
                              validation_generations_logger=SimpleNamespace(log=lambda _, got, __: logged.extend(got)),
                              global_steps=1)
    return lambda inputs, outputs, scores: (namespace["_maybe_log_val_generations"](trainer, inputs, outputs, scores),
                                            logged)[1]


@pytest.mark.parametrize("count", [0, 1, 3, 10, 50])
def test_the_generations_logged_are_verls_choice(verl, count):
    g = np.random.default_rng(count)
    inputs = [f"prompt {int(i)}" for i in g.integers(0, 12, size=20)]  # repeated prompts: n samples each
    outputs = [f"response {i}" for i in range(20)]
    scores = g.random(20).tolist()
    expected = verl_log_val_generations(verl, count)(inputs, outputs, scores)
    assert validation.generations_to_log(inputs, outputs, scores, count) == expected
