"""Acceptance by draft position, accepted-length distribution, and the prompt x step heatmap.

The rates are those of :mod:`spade_lib.rates` (defined there, with their formulas): per draft position
``i``, over the steps that drafted it, the conditional acceptance ``alpha_cond = accepted / reached``
(EAGLE's per-position alpha), the unconditional ``alpha_uncond = accepted / drafted = P(N > i)`` and
``expected_cond`` (mean ``1 - tv`` over the reached rows, what an exact sampler gives); the accepted
length ``N`` of a step (``n_accepted``, ``0 .. gamma``) and its histogram, ``N + 1`` being the tokens
the step emits (Spec-Bench's ``accept_lengths``). This module counts (with the fast grouping of
:class:`spade_lib.diagnose.frame.Groups`) and tabulates per ``by`` group.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from spade_lib import rates
from spade_lib.diagnose.frame import By, Groups, TraceLike, as_trace, group_keys, step_rows

POSITION_COLUMNS = ("pos", "reached", "accepted", "tv")


def position_acceptance(trace: TraceLike, by: By = None, *, level: float = 0.95,
                        method: str = "wilson") -> pd.DataFrame:
    """Per ``by`` group and draft position ``pos``: the counts ``drafted``, ``reached``, ``accepted``, the
    conditional (``alpha_cond``) and unconditional (``alpha_uncond``) acceptance with binomial bounds
    (``*_low``, ``*_high``), and ``expected_cond`` (mean ``1 - tv`` over reached rows):
    :func:`spade_lib.rates.add_position_rates` of the counts."""
    df = as_trace(trace, POSITION_COLUMNS)
    g = Groups.of(df, group_keys(by, df) + ["pos"])
    reached = df["reached"].to_numpy(dtype=bool)
    out = g.frame()
    out["drafted"] = g.sum()
    out["reached"] = g.sum(reached).astype(np.int64)
    out["accepted"] = g.sum(df["accepted"].to_numpy(dtype=bool)).astype(np.int64)
    out["expected"] = g.sum(np.where(reached, 1.0 - df["tv"].to_numpy(dtype=np.float64), 0.0))
    return rates.add_position_rates(out, level, method)


def accept_length_hist(trace: TraceLike, by: By = None) -> pd.DataFrame:
    """Distribution of the accepted length ``N`` per ``by`` group, ``N = 0 .. max gamma``:
    :func:`spade_lib.rates.accept_length_hist` of the trace's steps (``n_accepted``, ``steps``,
    ``fraction = P(N = k)``, ``survival = P(N >= k)``, ``accept_length = k + 1``)."""
    df = as_trace(trace, ("pos", "n_accepted", "gamma"))
    keys = group_keys(by, df)
    steps = step_rows(df, keys + ["n_accepted", "gamma"])
    return rates.accept_length_hist(steps, keys, int(steps["gamma"].max()) if len(steps) else 0)


def acceptance_heatmap(trace: TraceLike, by: By = None, *, step_bin: int = 1) -> pd.DataFrame:
    """Step-level acceptance over generation x step: one row per ``by`` group, prompt, sample and
    step bin (``step // step_bin``) with ``category``, ``steps``, ``drafted`` (sum of gamma),
    ``n_accepted`` (sum) and ``rate = n_accepted / drafted``, the fraction of drafts kept; ``step`` is
    the first step of the bin."""
    if step_bin < 1:
        raise ValueError(f"step_bin must be >= 1, got {step_bin}")
    df = as_trace(trace, ("prompt_id", "category", "sample", "step", "pos", "gamma", "n_accepted"))
    keys = group_keys(by, df)
    steps = step_rows(df, keys + ["prompt_id", "sample", "step", "category", "gamma", "n_accepted"])
    step_of_bin = steps["step"].to_numpy(dtype=np.int64) // step_bin
    g = Groups.of(steps, keys + ["prompt_id", "sample", "step"], extra={"step": step_of_bin})
    out = g.frame()
    out["step"] = out["step"] * step_bin
    sizes = g.sum()
    first = np.argsort(g.ids, kind="stable")[np.cumsum(sizes) - sizes]  # first step row of each cell
    out.insert(len(keys) + 2, "category", steps["category"].to_numpy()[first])
    out["steps"] = sizes
    out["drafted"] = g.sum(steps["gamma"].to_numpy()).astype(np.int64)
    out["n_accepted"] = g.sum(steps["n_accepted"].to_numpy()).astype(np.int64)
    out["rate"] = rates.acceptance_per_drafted(out["n_accepted"], out["drafted"])
    return out
