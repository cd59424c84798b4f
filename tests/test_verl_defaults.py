"""A verl command line trains with verl 0.9.1's defaults where it does not say (verl_keys.VERL_DEFAULTS), checked
against verl's own composed config in its wheel; and data.filter_overlong_prompts is a setting of its own, as in
verl, whatever the order of it and data.truncation."""

import re
import zipfile

import pytest
import yaml
from conftest import REPO
from verl_wheel import WheelUnavailable, download_wheel, unavailable, wheel_cache

from verl_runtime import verl_keys
from verl_runtime.config import Config, all_keys, load_config
from verl_runtime.data import encode_prompts
from verl_runtime.models import load_tokenizer

VERL_LINE = ["actor_rollout_ref.model.path=builtin:tiny", "data.train_files=toy:letter",
             "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4", "data.train_batch_size=8",
             "actor_rollout_ref.actor.ppo_mini_batch_size=8"]


@pytest.fixture(scope="module")
def verl_tree(request, tmp_path_factory):
    """verl 0.9.1's composed PPO config, from its wheel."""
    try:
        wheel = download_wheel(wheel_cache(request, tmp_path_factory))
    except WheelUnavailable as error:
        unavailable(error)
    with zipfile.ZipFile(wheel) as archive:
        return yaml.safe_load(archive.read("verl/trainer/config/_generated_ppo_trainer.yaml"))


def _at(tree: dict, key: str):
    node = tree
    for part in key.split("."):
        node = node[part]
    return node


def _ours(key: str):
    node = Config()
    for part in key.split("."):
        node = getattr(node, part)
    return node


def test_each_default_is_verls_own(verl_tree):
    for ours, (key, value) in verl_keys.VERL_DEFAULTS.items():
        assert _at(verl_tree, key) == value, (ours, key)


def test_every_other_difference_is_named_with_why_ours_stays(verl_tree):
    """Every key of verl's that is one of ours (by name or a mapping) whose default differs from ours: applied, or
    left out with a reason. A new verl release's differences show here."""
    ours = set(all_keys())
    differing = set()
    for key in verl_keys.verl_keys():
        rule = None if key in ours else verl_keys.rule_for(key)
        target = key if key in ours else rule.target if rule is not None and rule.kind == verl_keys.MAPS else None
        if target not in ours:
            continue
        value = _at(verl_tree, key)
        if isinstance(value, str) and ("${" in value or value == "???"):
            continue  # an interpolation (another key's value) or a value verl requires
        if value != _ours(target):
            differing.add(target)
    named = set(verl_keys.VERL_DEFAULTS) | set(verl_keys.VERL_DEFAULTS_LEFT_OUT)
    assert differing - named == set()


def test_a_verl_command_line_gets_verls_defaults_and_ours_keeps_ours():
    verl = load_config(None, VERL_LINE, warn=False)
    assert (verl.actor.strategy, verl.critic.strategy) == ("fsdp", "fsdp")
    assert verl.model.gradient_checkpointing and verl.model.use_remove_padding
    assert (verl.data.max_prompt_length, verl.data.max_response_length, verl.trainer.num_epochs) == (512, 512, 30)
    assert verl.rollout.n == 4 and not verl.actor.use_kl_loss  # given: kept; not given: verl's (no KL loss)
    ours = load_config(None, ["algorithm.adv_estimator=grpo"], warn=False)
    assert ours.actor.strategy == "dp" and ours.actor.use_kl_loss and ours.data.max_response_length == 64


def test_verl_keys_over_a_config_of_ours_translate_onto_it_with_our_defaults():
    """The base decides: verl's spellings given over our quickstart (trackers, vLLM's memory share) translate onto it
    and bring none of verl's defaults (verl's mini-batch of 256 would refuse the quickstart's batch of 8)."""
    config = load_config(REPO / "examples" / "quickstart.yaml",
                         ["trainer.logger=['console','tensorboard']", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4"],
                         warn=False)
    assert config.actor.strategy == "dp" and config.actor.ppo_mini_batch_size != 256
    assert config.trainer.tensorboard and config.rollout.gpu_memory_utilization == 0.4


def test_verls_tracker_and_ignored_keys_alone_are_not_a_verl_line():
    """trainer.logger names trackers, a key ignored here changes nothing: on their own they keep our defaults."""
    config = load_config(None, ["trainer.logger=['console']", "trainer.default_local_dir=/tmp/ckpt"], warn=False)
    assert config.actor.strategy == "dp" and config.actor.ppo_mini_batch_size != 256


def test_a_key_given_wins_over_verls_default_in_either_name():
    config = load_config(None, [*VERL_LINE, "actor.strategy=dp", "actor_rollout_ref.model.use_remove_padding=False",
                                "data.max_response_length=32"], warn=False)
    assert config.actor.strategy == "dp" and not config.model.use_remove_padding
    assert config.data.max_response_length == 32


def test_verls_defaults_say_where_they_came_from_when_they_are_refused():
    """verl's mini-batch of 256 prompts against a batch of 8: refused in one line naming verl's default."""
    with pytest.raises(Exception) as info:
        load_config(None, ["actor_rollout_ref.model.path=builtin:tiny", "data.train_batch_size=8"], warn=False)
    assert "actor.ppo_mini_batch_size (256)" in str(info.value)


@pytest.mark.parametrize("order", ["filter first", "truncation first"])
def test_filter_overlong_prompts_filters_in_either_order_with_truncation_error(order):
    """verl's GSM8K scripts write data.filter_overlong_prompts=True data.truncation=error: the long prompts are
    dropped, none stops the run."""
    keys = ["data.filter_overlong_prompts=True", "data.truncation=error"]
    config = load_config(None, [*VERL_LINE, *(keys if order == "filter first" else keys[::-1])], warn=False)
    assert config.data.filter_overlong_prompts and config.data.truncation == "error"
    tokenizer = load_tokenizer("builtin:tiny")
    rows = [{"prompt": [{"role": "user", "content": text}], "data_source": "t"} for text in ("hi", "word " * 400)]
    kept = encode_prompts(rows, tokenizer, config.data.max_prompt_length, config.data.truncation,
                          filter_overlong=config.data.filter_overlong_prompts)
    assert [p.index for p in kept] == [0]


def test_the_docs_table_is_the_code_table():
    docs = (REPO / "docs" / "verl.md").read_text()
    table = re.search(r"<!-- verl-defaults table -->\n(.*?)\n<!-- end -->", docs, re.S)
    assert table and table.group(1).strip() == verl_keys.defaults_markdown().strip()
