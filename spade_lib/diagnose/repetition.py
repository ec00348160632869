"""Degenerate generations: the repetition rate of a generation's n-grams, per generation and per run.

A greedy (``T = 0``) generation of a small model often falls into a loop, and acceptance measured on a
loop says little about acceptance on text: the draft only has to learn the loop. For a generation
``t_1 .. t_L`` and ``n`` (default 4) the **repetition rate** is the fraction of its ``L - n + 1``
n-grams that already occurred earlier in the same generation,

    rep_n(t) = #{i : (t_i, .., t_{i+n-1}) = (t_j, .., t_{j+n-1}) for some j < i} / (L - n + 1),

0 for text that never repeats a 4-gram, close to 1 for a short cycle (a period-k loop of length L has
``rep_n = 1 - (k) / (L - n + 1)`` once ``L >= k + n - 1``). A generation is **degenerate** when
``rep_n > DEGENERATE_ABOVE`` (0.5: more than half of its n-grams are repeats); one shorter than ``n``
tokens is not judged (NaN). The **attractor** of a set of generations is their most common n-gram and
the share of generations that contain it: a share near 1 with most generations degenerate means one
loop for every prompt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

DEGENERATE_ABOVE = 0.5  # a generation with more than this fraction of repeated n-grams is a loop
N_GRAM = 4  # the default n


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n: must be an integer >= 1, got {n!r}")
    return int(n)


def _ngrams(tokens: Sequence[int], n: int) -> list[tuple[int, ...]]:
    t = [int(x) for x in tokens]
    return [tuple(t[i:i + n]) for i in range(len(t) - n + 1)]


def repetition_rate(tokens: Sequence[int], n: int = N_GRAM) -> float:
    """``rep_n(tokens)`` of the module docstring (NaN for fewer than ``n`` tokens)."""
    n = _check_n(n)
    grams = _ngrams(tokens, n)
    if not grams:
        return float("nan")
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams)


def attractor(generations: Sequence[Sequence[int]], n: int = N_GRAM) -> tuple[tuple[int, ...], float]:
    """The n-gram contained in the most generations, and the share of generations containing it
    (``((), nan)`` when no generation has ``n`` tokens)."""
    n = _check_n(n)
    counts: Counter = Counter()
    judged = 0
    for g in generations:
        grams = set(_ngrams(g, n))
        judged += bool(grams)
        counts.update(grams)
    if not counts:
        return (), float("nan")
    gram, k = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
    return gram, k / judged


def repetition_by_generation(summary: pd.DataFrame, n: int = N_GRAM,
                             threshold: float = DEGENERATE_ABOVE) -> pd.DataFrame:
    """``summary`` (a run's ``summary.jsonl`` rows, with ``output_ids``) with ``repetition`` (``rep_n``)
    and ``degenerate`` (``repetition > threshold``) columns."""
    if "output_ids" not in summary.columns:
        raise ValueError("summary: needs the output_ids column of a run's summary.jsonl")
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold: must lie in [0, 1), got {threshold!r}")
    rep = np.array([repetition_rate(ids, n) for ids in summary["output_ids"]], dtype=np.float64)
    return summary.assign(repetition=rep, degenerate=rep > threshold)


def repetition_table(summaries: Mapping[str, pd.DataFrame], by: Sequence[str] = ("category",), *,
                     n: int = N_GRAM, threshold: float = DEGENERATE_ABOVE) -> pd.DataFrame:
    """Per run (the keys of ``summaries``: labels) and ``by`` group, plus an ``"overall"`` row per run:
    ``generations``, mean ``repetition``, the ``degenerate`` fraction, ``distinct_outputs`` (how many
    different generations), and the ``attractor_share`` (see :func:`attractor`)."""
    if not summaries:
        raise ValueError("summaries: needs at least one run")
    keys = list(by)
    rows = []
    for run, summary in summaries.items():
        g = repetition_by_generation(summary, n, threshold)
        missing = [k for k in keys if k not in g.columns]
        if missing:
            raise ValueError(f"by: run {run!r} has no column(s) {missing}")
        groups = list(g.groupby(keys, observed=True, sort=True)) if keys else []
        overall = (tuple("overall" for _ in keys), g)
        for key, part in [*groups, overall]:
            key = key if isinstance(key, tuple) else (key,)
            _, share = attractor(part["output_ids"], n)
            rows.append({"run": run, **dict(zip(keys, key)), "generations": len(part),
                         "repetition": float(part["repetition"].mean()),
                         "degenerate": float(part["degenerate"].mean()),
                         "distinct_outputs": len({tuple(int(x) for x in ids) for ids in part["output_ids"]}),
                         "attractor_share": share})
    return pd.DataFrame(rows)
