"""verl 0.9.1's rollout correction (algorithm.rollout_correction): our functions against verl's own
rollout_corr_helper.py (from its wheel, tests/verl_wheel.py), a quickstart that trains with it, and verl's scripts
that use it composing under ``python -m verl_runtime.main_ppo --cfg job``.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import verl_runtime.rollout_correction as R
from verl_runtime import rundir
from verl_runtime.main_ppo import main as main_ppo
from verl_wheel import WheelUnavailable, fetch_wheel, unavailable, verl_modules, wheel_cache

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "verl-scripts" / "scripts.jsonl"
CASES = 12


class Config(dict):
    """What verl reads from a config: attributes and .get (an OmegaConf DictConfig's interface)."""

    __getattr__ = dict.get


class DataProto:
    """verl's DataProto as rollout_corr_helper uses it: from_dict(tensors=...).batch."""

    def __init__(self, batch):
        self.batch = batch

    @classmethod
    def from_dict(cls, tensors):
        return cls(dict(tensors))


@pytest.fixture(scope="module")
def verl(request, tmp_path_factory):
    try:
        root = fetch_wheel(wheel_cache(request, tmp_path_factory))
    except WheelUnavailable as error:
        unavailable(error)
    with verl_modules(root) as modules:
        extra = {  # what rollout_corr_helper imports beyond verl_modules' stubs: annotations and DataProto
            "verl.protocol": types.ModuleType("verl.protocol"),
            "verl.trainer.config.algorithm": types.ModuleType("verl.trainer.config.algorithm"),
            "verl.workers.config.actor": types.ModuleType("verl.workers.config.actor"),
        }
        extra["verl.protocol"].DataProto = DataProto
        extra["verl.trainer.config.algorithm"].RolloutCorrectionConfig = Config
        extra["verl.workers.config.actor"].PolicyLossConfig = Config
        sys.modules.update(extra)
        modules.helper = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
        yield modules


def log_probs(seed: int):
    """(old, rollout, mask): trainer and sampler log-probs that differ by a little or a lot, rows of any length."""
    g = np.random.default_rng(seed)
    bs, length = int(g.integers(1, 7)), int(g.integers(1, 9))
    mask = (np.arange(length)[None, :] < g.integers(0, length + 1, size=bs)[:, None]).astype(np.float32)
    mask[g.integers(bs), g.integers(length)] = 1.0  # verl requires one valid token
    rollout = -np.abs(g.normal(size=(bs, length))) * 2
    old = rollout + g.normal(scale=[0.05, 0.5, 3.0][seed % 3], size=(bs, length))
    return torch.tensor(old, dtype=torch.float32), torch.tensor(rollout, dtype=torch.float32), torch.tensor(mask)


def same_metrics(ours: dict, theirs: dict):
    assert ours.keys() == theirs.keys()
    for key in ours:
        a, b = float(ours[key]), float(theirs[key])
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), (key, a, b)


SETTINGS = [
    dict(rollout_is="token", rollout_is_threshold=2.0),
    dict(rollout_is="token", rollout_is_threshold="1.5", rollout_is_batch_normalize=True),
    dict(rollout_is="sequence", rollout_is_threshold=2.0, rollout_is_batch_normalize=True),
    dict(rollout_is="token", rollout_is_threshold="0.5_4.0"),
    dict(rollout_is="sequence", rollout_is_threshold="0.5_4.0"),
    dict(rollout_rs="token_k1", rollout_rs_threshold="0.6_1.6"),
    dict(rollout_is="token", rollout_rs="token_k1,seq_max_k2", rollout_rs_threshold="0.6_1.6,2.5"),
    *(dict(rollout_rs=option, rollout_rs_threshold=1.5 if option.endswith("k1") else 0.3)
      for option in R.SUPPORTED_ROLLOUT_RS_OPTIONS),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_weights_mask_and_metrics_are_verls(verl, settings):
    for seed in range(CASES):
        old, rollout, mask = log_probs(seed)
        weights, new_mask, metrics = R.compute_rollout_correction_and_rejection_mask(old, rollout, mask, **settings)
        try:
            proto, their_mask, their_metrics = verl.helper.compute_rollout_correction_and_rejection_mask(
                old, rollout, mask, **settings
            )
        except ZeroDivisionError:  # IcePop zeroed every weight: verl stops, we report no effective samples
            assert not weights.any() and metrics["rollout_corr/rollout_is_eff_sample_size"] == 0.0
            continue
        if proto is None:
            assert weights is None
        else:
            torch.testing.assert_close(weights, proto.batch["rollout_is_weights"])
        torch.testing.assert_close(new_mask, their_mask)
        same_metrics(metrics, their_metrics)


@pytest.mark.parametrize("loss_type", ["reinforce", "ppo_clip"])
@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-sum"])
def test_bypass_mode_loss_is_verls(verl, loss_type, loss_agg_mode):
    correction = Config(loss_type=loss_type, rollout_is="sequence", rollout_is_threshold=2.0,
                        rollout_is_batch_normalize=True, rollout_rs="token_k1", rollout_rs_threshold="0.6_1.6")
    actor = Config(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, global_batch_info={},
                   policy_loss=Config(rollout_correction=correction))
    for seed in range(CASES):
        rollout, current, mask = log_probs(seed)
        current.requires_grad_(True)
        advantages = torch.from_numpy(np.random.default_rng(seed).normal(size=mask.shape).astype(np.float32))
        ours, our_metrics = R.compute_policy_loss_bypass_mode(rollout, current, advantages, mask, loss_agg_mode,
                                                              actor, correction, {})
        theirs, their_metrics = verl.core_algos.compute_policy_loss_bypass_mode(
            rollout, current, advantages, mask, loss_agg_mode, config=actor
        )
        if torch.isnan(theirs):  # every token rejected: verl's mean over no tokens is NaN, ours 0 (as elsewhere)
            assert ours.item() == 0.0
            continue
        torch.testing.assert_close(ours, theirs)
        grads = [torch.autograd.grad(loss, current)[0] for loss in (ours, theirs)]
        torch.testing.assert_close(*grads)
        same_metrics(our_metrics, their_metrics)


# --- configuration -------------------------------------------------------------------------------------------------


def compose(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main_ppo(["--cfg", "job", *argv])
    return code, out.getvalue(), err.getvalue()


def test_verls_scripts_with_rollout_correction_compose():
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines() if "rollout_correction" in line]
    rows = [row for row in rows if row["family"] == "fsdp-text"]  # the others are refused for their engine
    assert len(rows) >= 4
    composed = 0
    for row in rows:
        code, out, err = compose(*row["argv"])
        error = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 0 or "rollout_correction" not in error[-1], (row["path"], error)  # refused for another key
        composed += code == 0 and "rollout_is:" in out
    assert composed >= 3  # the tool-calling one stops at multi_turn.enable


@pytest.mark.parametrize("override, words", [
    ("algorithm.rollout_correction.rollout_is=tokens", "Invalid rollout_is: tokens"),
    ("algorithm.rollout_correction.rollout_rs=token_k4", "Invalid rollout_rs option: token_k4"),
    ("algorithm.rollout_correction.rollout_is_threshold=4.0_0.5", "lower bound must be <= upper bound"),
    ("algorithm.rollout_correction.loss_type=dpo", "choose one of ppo_clip, reinforce"),
])
def test_a_bad_setting_is_one_line_exit_2(override, words):
    code, _, err = compose("algorithm.rollout_correction.rollout_is=token",
                           "algorithm.rollout_correction.rollout_rs_threshold=2.0", override)
    assert code == 2
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_bypass_without_rollout_log_probs_and_the_hf_engine_are_refused():
    code, _, err = compose("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.calculate_log_probs=false",
                           "algorithm.rollout_correction.bypass_mode=true")  # verl's default is true
    assert code == 2 and "rollout.calculate_log_probs=true" in err
    code, _, err = compose("actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.calculate_log_probs=true",
                           "algorithm.rollout_correction.rollout_is=token")
    assert code == 2 and "rollout.name=builtin or vllm" in err


def test_without_calculate_log_probs_it_warns_that_it_does_nothing_as_in_verl():
    code, _, err = compose("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.calculate_log_probs=false",
                           "algorithm.rollout_correction.rollout_is=token")
    assert code == 0 and "no effect without rollout.calculate_log_probs=true" in err


# --- a run ---------------------------------------------------------------------------------------------------------


def train(tmp_path: Path, *sets: str) -> list[dict]:
    command = [sys.executable, "-m", "verl_runtime", "train", str(ROOT / "examples" / "quickstart.yaml"),
               "--set", "trainer.total_training_steps=2", "--set", "trainer.test_freq=-1", "--set", "trainer.save_freq=-1",
               "--set", "trainer.save_hf=false", "--set", "trainer.tensorboard=false",
               "--set", f"trainer.run_dir={tmp_path / 'run'}", "--set", "rollout.calculate_log_probs=true",
               *(arg for item in sets for arg in ("--set", item))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (tmp_path / "run" / rundir.METRICS_FILE).read_text().splitlines()
    return [row for row in map(json.loads, lines) if "step" in row]


@pytest.mark.slow
def test_quickstart_trains_two_steps_with_token_is(tmp_path):
    steps = train(tmp_path, "algorithm.rollout_correction.rollout_is=token",
                  "algorithm.rollout_correction.rollout_is_threshold=2.0",
                  "algorithm.rollout_correction.rollout_rs=token_k1",
                  "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0")
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        for key in ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_eff_sample_size", "rollout_corr/kl",
                    "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/chi2_token"):
            assert math.isfinite(step[key]), key
        assert 0 < step["rollout_corr/rollout_is_mean"] <= 2.0
        assert math.isfinite(step["actor/pg_loss"])


@pytest.mark.slow
def test_quickstart_trains_two_steps_in_bypass_mode(tmp_path):
    steps = train(tmp_path, "algorithm.rollout_correction.rollout_is=sequence",
                  "algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.loss_type=reinforce")
    assert [s["step"] for s in steps] == [1, 2]
    assert all(math.isfinite(s["rollout_corr/rollout_is_mean"]) and math.isfinite(s["actor/pg_loss"]) for s in steps)
    assert "rollout/logprob_diff" not in steps[0]  # the old log-probs are the rollout's: verl logs no gap either
