"""Every helper we mirror from verl 0.9.1 takes what verl's takes: code written against verl's
core_algos / torch_functional (keyword arguments, their order, their defaults) runs against verl_runtime.algorithms.
The parameters are read from the wheel itself (tests/verl_wheel.py), not written down here."""

from __future__ import annotations

import inspect

from verl_runtime import algorithms
from verl_wheel import verl  # noqa: F401 - the fixture


def mirrored(verl) -> list[tuple[str, object, object]]:
    """(name, ours, verl's) for each public function of ours that verl's core_algos or torch_functional also has."""
    pairs = []
    for name, ours in vars(algorithms).items():
        if name.startswith("_") or not inspect.isfunction(ours) or ours.__module__ != algorithms.__name__:
            continue
        for module in (verl.core_algos, verl.F):
            theirs = getattr(module, name, None)
            if inspect.isfunction(theirs):
                pairs.append((name, ours, theirs))
                break
    return pairs


def missing_parameters(ours, theirs) -> list[str]:
    """verl's parameters ours does not take as verl does: by name and kind, positional ones at the same place."""
    mine = inspect.signature(ours).parameters
    if any(p.kind is p.VAR_KEYWORD for p in mine.values()):
        mine_names = None  # **kwargs takes any keyword
    else:
        mine_names = list(mine)
    problems = []
    for index, (name, param) in enumerate(inspect.signature(theirs).parameters.items()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if mine_names is not None and name not in mine_names:
            problems.append(f"{name} (missing)")
        elif param.kind is param.POSITIONAL_OR_KEYWORD and mine_names is not None and mine_names.index(name) != index:
            problems.append(f"{name} (at position {mine_names.index(name)}, verl's is {index})")
        elif param.default is not param.empty and name in mine and mine[name].default is param.empty:
            problems.append(f"{name} (verl gives it a default, ours requires it)")
    return problems


def test_we_mirror_verls_helpers(verl):
    names = {name for name, _, _ in mirrored(verl)}
    assert {"logprobs_from_logits", "compute_policy_loss", "agg_loss", "kl_penalty", "compute_grpo_outcome_advantage",
            "compute_gae_advantage_return", "masked_mean", "entropy_from_logits"} <= names


def test_every_mirrored_helper_takes_verls_arguments(verl):
    wrong = {name: problems for name, ours, theirs in mirrored(verl) if (problems := missing_parameters(ours, theirs))}
    assert wrong == {}


def test_logprobs_from_logits_takes_inplace_backward_and_gives_the_same_numbers(verl):
    import torch

    logits, labels = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    ours = algorithms.logprobs_from_logits(logits, labels, inplace_backward=False)
    theirs = verl.F.logprobs_from_logits(logits, labels, inplace_backward=False)
    assert torch.allclose(ours, theirs, atol=1e-6)
