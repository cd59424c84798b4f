"""DAPO's reward manager (verl's reward_model.reward_manager=dapo, reward.manager here) with its overlong buffer:
the reward and extra information of every sample equal those of verl 0.9.1's own DAPORewardManager (its reward
loop's, verl/experimental/reward_loop/reward_manager/dapo.py, loaded from the wheel with a tiny tokenizer), the keys
of verl's DAPO scripts land on ours, what could not act is refused in one line, and a DAPO run trains."""

import asyncio
import subprocess
import sys
import types
import zipfile

import pytest
import torch

from verl_runtime.config import load_config
from verl_runtime.errors import ConfigError
from verl_runtime.metrics import read_metrics
from verl_runtime.models import load_tokenizer
from verl_runtime.rewards.managers import overlong_penalty
from verl_runtime.workers.reward import RewardWorker
from verl_wheel import WheelUnavailable, download_wheel, fetch_wheel, unavailable, verl_modules, wheel_cache

DAPO_FILE = "verl/experimental/reward_loop/reward_manager/dapo.py"
BASE_FILE = "verl/experimental/reward_loop/reward_manager/base.py"


class Config(dict):
    """What verl's manager reads from its config: attributes and .get, as an OmegaConf DictConfig gives."""

    __getattr__ = dict.get


@pytest.fixture(scope="module")
def verl_dapo(request, tmp_path_factory):
    """verl's DAPORewardManager class, its module run from the wheel's source with the few imports it needs stubbed."""
    try:
        cache = wheel_cache(request, tmp_path_factory)
        root, wheel = fetch_wheel(cache), download_wheel(cache)
    except WheelUnavailable as error:
        unavailable(error)
    with zipfile.ZipFile(wheel) as archive:
        sources = {name: archive.read(name).decode() for name in (BASE_FILE, DAPO_FILE)}
    with verl_modules(root) as verl:
        package = "verl.experimental.reward_loop.reward_manager"
        sys.modules.update({
            "verl.experimental": types.ModuleType("verl.experimental"),
            "verl.experimental.reward_loop": types.ModuleType("verl.experimental.reward_loop"),
            package: types.SimpleNamespace(register=lambda name: (lambda cls: cls)),
            "verl.utils.ray_utils": types.SimpleNamespace(get_event_loop=asyncio.new_event_loop),
        })
        for module_name, path in ((f"{package}.base", BASE_FILE), (f"{package}.dapo", DAPO_FILE)):
            module = types.ModuleType(module_name)
            module.__file__ = path
            sys.modules[module_name] = module
            exec(compile(sources[path], path, "exec"), module.__dict__)
        yield sys.modules[f"{package}.dapo"].DAPORewardManager, verl


class _Proto:
    """verl's DataProto as run_single reads one sample: data[-1:], data[0], .batch, .non_tensor_batch."""

    def __init__(self, batch, non_tensor_batch):
        self.batch, self.non_tensor_batch = batch, non_tensor_batch

    def __getitem__(self, index):
        return self


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin:tiny")


TEXTS = ["The answer is \\boxed{4}", "Answer: 4", "I think it is 5. Answer: 5", "x", ""]


def batch_of(tokenizer, texts, data_source, truth):
    """Responses (EOS included, then padding) as the rollout returns them."""
    rows = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id] for text in texts]
    width = max(len(row) for row in rows) + 2
    responses = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    n = len(texts)
    return {"responses": responses, "response_mask": mask, "attention_mask": torch.cat([torch.ones(n, 3, dtype=torch.long), mask], 1),
            "data_source": [data_source] * n, "ground_truth": [truth] * n, "extra_info": [{"index": i} for i in range(n)],
            "raw_prompt": [None] * n}


def verls(manager_cls, tokenizer, batch, reward_kwargs, compute_score):
    manager = manager_cls(Config(reward=Config(reward_kwargs=reward_kwargs)), tokenizer, compute_score)
    loop = asyncio.new_event_loop()
    manager.loop = loop
    out = []
    try:
        for i in range(len(batch["responses"])):
            proto = _Proto({"responses": batch["responses"][i], "attention_mask": batch["attention_mask"][i]},
                           {"data_source": batch["data_source"][i], "reward_model": {"ground_truth": batch["ground_truth"][i]},
                            "extra_info": dict(batch["extra_info"][i])})
            out.append(loop.run_until_complete(manager.run_single(proto)))
    finally:
        loop.close()
    return out


def plain(value):
    return value.item() if isinstance(value, torch.Tensor) else value


BUFFERS = [  # (max_resp_len, len, penalty_factor, enable, log)
    (8, 4, 1.0, True, True), (10, 3, 0.5, True, False), (6, 6, 1.0, True, True), (20, 4, 1.0, True, True),
    (7, 2, 0.1, True, True), (8, 4, 1.0, False, True),
]


@pytest.mark.parametrize("buffer", BUFFERS)
@pytest.mark.parametrize("source, truth", [("math_dapo", "4"), ("openai/gsm8k", "4")])  # a dict, a float
def test_rewards_and_extra_info_are_verls(verl_dapo, tokenizer, buffer, source, truth):
    manager_cls, verl = verl_dapo
    max_resp_len, length, factor, enable, log = buffer
    cfg = Config(enable=enable, len=length, penalty_factor=factor, log=log)
    batch = batch_of(tokenizer, TEXTS, source, truth)
    theirs = verls(manager_cls, tokenizer, batch, Config(overlong_buffer_cfg=cfg, max_resp_len=max_resp_len),
                   verl.reward_score.default_compute_score)
    config = load_config(None, ["reward_model.reward_manager=dapo", f"+reward_model.reward_kwargs.max_resp_len={max_resp_len}",
                                *(f"+reward_model.reward_kwargs.overlong_buffer_cfg.{k}={v}" for k, v in cfg.items())])
    ours = RewardWorker(config, tokenizer, torch.device("cpu")).score_details(batch)
    expected = torch.tensor([float(t["reward_score"]) for t in theirs], dtype=torch.float32)
    assert torch.equal(ours["scores"], expected)
    for info, their in zip(ours["infos"], theirs):
        assert info == {key: plain(value) for key, value in their["reward_extra_info"].items()}


def test_the_penalty_is_verls_formula():
    # verl: expected_len = max_resp_len - len; min(-(length - expected_len) / len * penalty_factor, 0)
    assert [float(overlong_penalty(n, 8, 4, 1.0)) for n in (1, 4, 5, 6, 8)] == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert float(overlong_penalty(10, 8, 4, 0.5)) == -0.75  # longer than max_resp_len: the penalty goes on growing


def test_naive_scores_are_unchanged(tokenizer):
    batch = batch_of(tokenizer, TEXTS, "math_dapo", "4")
    naive = RewardWorker(load_config(None, []), tokenizer, torch.device("cpu")).score_details(batch)
    assert naive["scores"].tolist() == [1.0, 1.0, -1.0, -1.0, -1.0]
    assert naive["infos"][0] == {"score": 1.0, "acc": True, "pred": "4"}  # DAPO's scorer's dict, kept as verl keeps it
    gsm8k = RewardWorker(load_config(None, []), tokenizer, torch.device("cpu")).score_details(
        batch_of(tokenizer, ["#### 4"], "openai/gsm8k", "4"))
    assert gsm8k["scores"].tolist() == [1.0] and gsm8k["infos"] == [{}]  # a float: the reward alone


def test_verls_dapo_keys_are_ours():
    for section, manager in (("reward_model", "reward_model.reward_manager=dapo"), ("reward", "reward.reward_manager.name=dapo")):
        config = load_config(None, [manager, f"+{section}.reward_kwargs.overlong_buffer_cfg.enable=True",
                                    f"+{section}.reward_kwargs.overlong_buffer_cfg.len=4096",
                                    f"+{section}.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
                                    f"+{section}.reward_kwargs.overlong_buffer_cfg.log=False",
                                    f"+{section}.reward_kwargs.max_resp_len=8192"])
        reward = config.reward
        assert reward.manager == "dapo" and reward.max_resp_len == 8192
        assert (reward.overlong_buffer.enable, reward.overlong_buffer.len, reward.overlong_buffer.penalty_factor,
                reward.overlong_buffer.log) == (True, 4096, 1.0, False)
    assert load_config(None, ["reward_model.reward_manager=null"]).reward.manager == "naive"  # verl's default
    # verl migrates the older key over the newer one
    assert load_config(None, ["reward.reward_manager.name=naive", "reward_model.reward_manager=dapo"]).reward.manager == "dapo"


@pytest.mark.parametrize("overrides, message", [
    (["reward_model.reward_manager=prime"], "reward_model.reward_manager='prime' on the command line is refused: PRIME's reward manager is not here"),
    (["reward.reward_manager.name=gdpo"], "GDPO's"),
    (["reward.manager=mine"], "reward.manager: unknown value 'mine'"),
    (["+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True"], "needs reward.manager=dapo"),
    (["reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
      "+reward_model.reward_kwargs.overlong_buffer_cfg.len=8"], "needs reward.max_resp_len"),
    (["reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
      "+reward_model.reward_kwargs.overlong_buffer_cfg.len=16", "+reward_model.reward_kwargs.max_resp_len=8"],
     "reward.overlong_buffer.len=16 must be at least 1 and at most reward.max_resp_len (8)"),
    (["reward.manager=dapo", "reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=4",
      "reward.max_resp_len=8", "reward.model_path=/rm"], "the overlong penalty would not apply"),
])
def test_what_could_not_act_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
def test_a_dapo_script_trains_with_the_penalty(tmp_path):
    """verl's DAPO recipe keys on the built-in model, max_resp_len 8 with a 4-token buffer: a response of more than
    4 tokens loses up to 1.0; validation reports acc as the core metric and the penalty under val-aux/."""
    command = [sys.executable, "-m", "verl_runtime.main_ppo", "algorithm.adv_estimator=grpo",
               "actor_rollout_ref.model.path=builtin:tiny", "trainer.device=cpu", f"trainer.run_dir={tmp_path}",
               "data.train_files=toy:letter", "data.val_files=toy:letter", "+data.toy_size=16",
               "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "data.max_response_length=8",
               "actor_rollout_ref.rollout.n=2",
               "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.logger=[console]",
               "reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
               "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
               "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
               "+reward_model.reward_kwargs.overlong_buffer_cfg.log=True", "+reward_model.reward_kwargs.max_resp_len=8"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(tmp_path)
    val = [r for r in records if "val-core/toy/letter/acc/mean@1" in r]
    assert len(val) == 2  # before training and at the last step
    for record in val:  # dapo keeps a float score as acc (the core metric) and logs the penalty
        penalty = record["val-aux/toy/letter/overlong_reward/mean@1"]
        assert -1.0 <= penalty < 0 and "val-aux/toy/letter/overlong/mean@1" in record
        assert record["val-aux/toy/letter/reward/mean@1"] == pytest.approx(record["val-core/toy/letter/acc/mean@1"] + penalty)
    steps = [r for r in records if "critic/score/mean" in r]
    assert len(steps) == 2
    for step in steps:  # a toy score is at most 1 and a full-length (8-token) response loses 1.0
        assert step["response_length/clip_ratio"] == 0 or step["critic/score/min"] <= 0
