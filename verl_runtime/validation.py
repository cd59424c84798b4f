"""Validation metrics as verl 0.9.1 computes them from the scored validation samples.

``process_validation_metrics``, ``bootstrap_metric`` and ``calc_maj_val`` follow verl/trainer/ppo/metric_utils.py,
``validation_metrics`` its trainer's ``_val_metrics_update`` (verl/trainer/ppo/ray_trainer.py): per data source
and per variable (``reward``, and each extra item the reward manager keeps: ``acc``, ``pred``, ...), the mean and
std over a prompt's N samples, bootstrapped best@n / worst@n and majority-vote maj@n (when the scorer gives a
``pred``) for n = 2, 4, 8, ... N, averaged over prompts. The core variable (``acc`` where there is one, else
``reward``) at the largest n goes to ``val-core/``, everything else to ``val-aux/``. tests/test_val_sampled.py holds
them equal to verl's own functions.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import numpy as np

BOOTSTRAP_SEED = 42  # verl's defaults: process_validation_metrics(seed=42), n_bootstrap = 1000
N_BOOTSTRAP = 1000


def bootstrap_metric(data: list, subset_size: int, reduce_fns: list[Callable], n_bootstrap: int = N_BOOTSTRAP,
                     seed: int = BOOTSTRAP_SEED) -> list[tuple[float, float]]:
    """(mean, std) of each reduce_fn over n_bootstrap resamples (with replacement) of subset_size items. verl seeds
    NumPy's global generator; a RandomState of the same seed draws the same indices and leaves the global one be."""
    idxs = np.random.RandomState(seed).choice(len(data), size=(n_bootstrap, subset_size), replace=True)
    data_np = np.array(data, dtype=object)
    results = np.empty((len(reduce_fns), n_bootstrap), dtype=np.float64)
    for fn_idx, reduce_fn in enumerate(reduce_fns):
        for boot_idx in range(n_bootstrap):
            results[fn_idx, boot_idx] = reduce_fn(data_np[idxs[boot_idx]])
    return [(float(np.mean(row)), float(np.std(row))) for row in results]


def _best_worst(values: list, subset_size: int, seed: int = BOOTSTRAP_SEED) -> list[tuple[float, float]]:
    """bootstrap_metric with reduce_fns [np.max, np.min] (verl's best/worst), vectorized: the same draws, the same
    maxima and minima, the same float64 results in the same order."""
    idxs = np.random.RandomState(seed).choice(len(values), size=(N_BOOTSTRAP, subset_size), replace=True)
    samples = np.asarray(values, dtype=np.float64)[idxs]
    best, worst = samples.max(axis=1), samples.min(axis=1)
    return [(float(np.mean(best)), float(np.std(best))), (float(np.mean(worst)), float(np.std(worst)))]


def calc_maj_val(data, vote_key: str, val_key: str) -> float:
    """The value of the first sample whose vote is the most common one (ties: the vote seen first)."""
    vote2vals: dict[Any, list] = defaultdict(list)
    for item in data:
        vote2vals[item[vote_key]].append(item[val_key])
    vote2cnt = {vote: len(vals) for vote, vals in vote2vals.items()}
    return vote2vals[max(vote2cnt, key=vote2cnt.get)][0]


def _subset_sizes(n_resps: int) -> list[int]:
    """2, 4, 8, ... below n_resps, then n_resps itself (none for one response)."""
    if n_resps <= 1:
        return []
    sizes, n = [], 2
    while n < n_resps:
        sizes.append(n)
        n *= 2
    return sizes + [n_resps]


def process_validation_metrics(data_sources: list[str], sample_uids: list, infos_dict: dict[str, list],
                               seed: int = BOOTSTRAP_SEED) -> dict[str, dict[str, dict[str, float]]]:
    """{data_source: {variable: {metric: value}}}, each metric the mean over the source's prompts (sample_uids)."""
    grouped: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for index, (source, uid) in enumerate(zip(data_sources, sample_uids)):
        for var_name, values in infos_dict.items():
            grouped[source][uid][var_name].append(values[index])

    per_prompt: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for source, by_uid in grouped.items():
        for var2vals in by_uid.values():
            preds = var2vals.get("pred")
            for var_name, values in var2vals.items():
                values = [value for value in values if value is not None]
                if not values or isinstance(values[0], str):  # pred itself: votes, not a number
                    continue
                has_pred = preds is not None and len(preds) == len(values) and all(p is not None for p in preds)
                n_resps = len(values)
                metric = {f"mean@{n_resps}": float(np.mean(values))}
                if n_resps > 1:
                    metric[f"std@{n_resps}"] = float(np.std(values))
                    for n in _subset_sizes(n_resps):
                        (best_mean, best_std), (worst_mean, worst_std) = _best_worst(values, n, seed)
                        metric.update({f"best@{n}/mean": best_mean, f"best@{n}/std": best_std,
                                       f"worst@{n}/mean": worst_mean, f"worst@{n}/std": worst_std})
                        if has_pred:
                            votes = [{"val": value, "pred": pred} for value, pred in zip(values, preds, strict=True)]
                            [(maj_mean, maj_std)] = bootstrap_metric(
                                votes, n, [lambda sample: calc_maj_val(sample, "pred", "val")], seed=seed)
                            metric.update({f"maj@{n}/mean": maj_mean, f"maj@{n}/std": maj_std})
                for name, value in metric.items():
                    per_prompt[source][var_name][name].append(value)
    return {source: {var: {name: float(np.mean(values)) for name, values in metrics.items()}
                     for var, metrics in by_var.items()}
            for source, by_var in per_prompt.items()}


def validation_metrics(data_sources: list[str], sample_uids: list, infos_dict: dict[str, list]) -> dict[str, float]:
    """verl's metric names: val-core/<data_source>/<variable>/<metric> for the core variable's mean@, maj@ and best@
    at the largest n, val-aux/... for the rest."""
    out = {}
    for source, var2metric in process_validation_metrics(data_sources, sample_uids, infos_dict).items():
        core_var = "acc" if "acc" in var2metric else "reward"
        for var_name, metrics in var2metric.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in metrics)
            for name, value in metrics.items():
                core = (var_name == core_var and name.startswith(("mean", "maj", "best")) and f"@{n_max}" in name)
                out[f"{'val-core' if core else 'val-aux'}/{source}/{var_name}/{name}"] = value
    return out


def generations_to_log(inputs: list[str], outputs: list[str], scores: list[float], count: int) -> list[tuple]:
    """The (input, output, score) samples verl's trainer.log_val_generations logs: sorted by input, shuffled with a
    fixed seed, the first `count` (verl/trainer/ppo/ray_trainer.py:548-570, _maybe_log_val_generations), so each
    validation shows the same prompts."""
    if count <= 0:
        return []
    samples = sorted(zip(inputs, outputs, scores), key=lambda sample: sample[0])
    np.random.RandomState(42).shuffle(samples)
    return samples[:count]
