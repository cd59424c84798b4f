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
