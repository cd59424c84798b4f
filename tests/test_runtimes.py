"""One object per trainer (verl_deploy.runtimes): its names match the catalog's, and its rules are what `run` and
`plan` say, whichever command reaches them."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from verl_deploy import compat, runtimes
from verl_deploy.cli import app


def test_the_trainers_are_the_catalogs_runtimes():
    """docker/variants.yaml names the runtimes an image can hold; each has its trainer here, and ours is the default."""
    assert set(runtimes.TRAINERS) == set(compat.load_runtimes())
    assert runtimes.trainer(None) is runtimes.OURS and runtimes.OURS.name == compat.DEFAULT_RUNTIME
    assert [t.name for t in runtimes.TRAINERS.values() if t.own] == [compat.DEFAULT_RUNTIME]


def test_an_unknown_runtime_names_the_known_ones():
    with pytest.raises(ValueError, match=r"^--runtime 'megatron': use verl-deploy or verl$"):
        runtimes.trainer("megatron")


@pytest.mark.parametrize("given, ours, verls", [
    (["a=1", "+b=2"], ("a=1", "b=2"), ("a=1", "+b=2")),  # ours reads verl's +key=value as key=value
    (["++c.d=3"], ("c.d=3",), ("++c.d=3",)),
    (["~trainer.logger"], "dropping a key, ~key, is for python -m verl_runtime.main_ppo", ("~trainer.logger",)),
    (["trainer.total_epochs"], "needs the form key=value", "is not one verl takes"),
])
def test_each_trainer_owns_its_override_grammar(given, ours, verls):
    for trainer, expected in ((runtimes.OURS, ours), (runtimes.VERL, verls)):
        if isinstance(expected, tuple):
            assert trainer.check_overrides(given) == expected
        else:
            with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
                trainer.check_overrides(given)


def test_how_a_command_names_each_trainer():
    assert runtimes.OURS.flag == "" and runtimes.VERL.flag == "--runtime verl"
    assert runtimes.VERL.world_keys == ("trainer.n_gpus_per_node", "trainer.nnodes") and runtimes.OURS.world_keys is None


@pytest.mark.parametrize("args, message", [
    (["run", "examples/quickstart.yaml", "--runtime", "verl", "--dry-run", "--target", "local"],
     "error: --runtime verl takes no CONFIG file (examples/quickstart.yaml)"),
    (["plan", "examples/quickstart.yaml", "--runtime", "verl"],
     "error: --runtime verl takes no CONFIG file (examples/quickstart.yaml)"),
    (["run", "examples/quickstart.yaml", "--verl-source", ".", "--dry-run", "--target", "local"],
     "error: --verl-source is upstream verl's: add --runtime verl"),
    (["run", "examples/quickstart.yaml", "--entry", "python3 -m my_fork.main_ppo", "--dry-run", "--target", "local"],
     "error: --entry is upstream verl's: add --runtime verl"),
])
def test_run_and_plan_say_the_trainers_rule_in_one_line(args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1].startswith(message), result.output


def test_what_each_trainer_offers_the_planner_is_in_its_own_config():
    """runtimes.Planning says which changes the planner may suggest to each trainer; each one it offers is a key the
    trainer's own config has (ours: get_default_config; verl: the 0.9.1 wheel's key list)."""
    from pathlib import Path

    import verl_runtime
    from verl_deploy.plan.workload import OUR_KEYS, VERL_KEYS
    from verl_runtime.config import get_default_config

    def flat(tree, prefix=""):
        for key, value in tree.items():
            yield from flat(value, f"{prefix}{key}.") if isinstance(value, dict) else [prefix + key]

    ours = set(flat(get_default_config().to_dict()))
    keys_file = Path(verl_runtime.__file__).with_name("verl_0_9_1_keys.txt").read_text().splitlines()
    verls = {line for line in keys_file if line and not line.startswith("#")}
    needs = {
        "offloads_each_role": ("critic_param_offload", "critic_optimizer_offload", "ref_param_offload",
                               "ref_entropy_chunking"),
        "shards_by_setting": ("actor_sharded", "critic_sharded"),
        "offload_policy_alone": ("offload_policy",),
        "rollout_tp": ("rollout_tp",),
    }
    for trainer, keys, known in ((runtimes.OURS, OUR_KEYS, ours), (runtimes.VERL, VERL_KEYS, verls)):
        for trait, names in needs.items():
            if getattr(trainer.planning, trait):
                assert {keys[name] for name in names} <= known, (trainer.name, trait)
    assert "critic.forward_max_token_len_per_gpu" in ours  # values_budget: the critic's forward's own budget
    assert runtimes.OURS.planning != runtimes.VERL.planning
