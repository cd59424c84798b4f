"""WorkerGroup: the controller calls a role like one object; dispatch modes say how a call reaches the workers."""

import pytest
import torch

from verl_runtime.controller import ALL, DP_SPLIT, RANK_ZERO, WorkerGroup, register


class Doubler:
    def __init__(self, rank):
        self.rank = rank
        self.seen = []

    @register(DP_SPLIT)
    def double(self, batch, factor=2):
        self.seen.append(batch["uid"])
        return {"x": batch["x"] * factor, "rank": float(self.rank)}

    @register(ALL)
    def whoami(self):
        return self.rank

    @register(RANK_ZERO)
    def save(self):
        return f"saved by {self.rank}"

    def private(self):
        return "not callable through the group"


def test_dp_split_splits_the_batch_and_joins_the_results():
    workers = [Doubler(0), Doubler(1)]
    group = WorkerGroup(workers)
    out = group.double({"x": torch.arange(5), "uid": ["a", "b", "c", "d", "e"]}, factor=3)
    assert out["x"].tolist() == [0, 3, 6, 9, 12]  # the padding sample's result is dropped again
    assert out["rank"] == 0.5  # numbers (metrics) are averaged
    # equal shares: 5 samples padded to 6 with the first one again
    assert workers[0].seen == [["a", "b", "c"]] and workers[1].seen == [["d", "e", "a"]]


def test_all_and_rank_zero():
    group = WorkerGroup([Doubler(0), Doubler(1), Doubler(2)])
    assert group.whoami() == [0, 1, 2]
    assert group.save() == "saved by 0"
    assert group.world_size == 3


def test_unregistered_methods_are_not_dispatched():
    group = WorkerGroup([Doubler(0)])
    with pytest.raises(AttributeError, match="Doubler.private is not a registered worker method"):
        group.private()


def test_the_controller_layer_imports_neither_the_trainer_nor_the_workers():
    """Lower layers never import upper ones: the trainer hands the Ray backend how roles are built."""
    import ast
    from pathlib import Path

    import verl_runtime.controller as controller

    for path in Path(controller.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        upper = {name for name in imported if name.startswith(("verl_runtime.trainer", "verl_runtime.workers"))}
        assert not upper, f"{path.name} imports {upper}"
