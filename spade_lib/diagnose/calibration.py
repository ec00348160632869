"""Calibration of acceptance scores: reliability tables and expected calibration error.

For a score ``s`` in ``[0, 1]`` of each reached position (the draft's confidence ``q(x)``, or the exact
acceptance probability ``min(1, p(x)/q(x))``), bin the scores into ``B`` bins and compare, per bin
``b``, the mean score ``conf_b`` with the empirical acceptance ``acc_b``:

    ECE = sum_b (n_b / n) |acc_b - conf_b|,     MCE = max_b |acc_b - conf_b|.

An exact sampler accepts ``x`` with probability ``min(1, p(x)/q(x))``, so that score is calibrated by
construction (ECE only sampling noise, of order ``sqrt(B / n)``); ``q(x)`` is not meant to be, and its
reliability curve shows how far draft confidence is from a usable acceptance predictor.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from spade_lib.diagnose.frame import By, Groups, TraceLike, as_trace, group_keys
from spade_lib.diagnose.stats import bin_edges
from spade_lib.rates import add_rate

SCORES = ("q_x", "accept_prob", "q_top_prob")  # scores in [0, 1] a reliability diagram makes sense for


def calibration_table(trace: TraceLike, by: By = None, *, score: str = "q_x", bins: int = 10,
                      binning: str = "uniform", level: float = 0.95, method: str = "wilson") -> pd.DataFrame:
    """Reliability table of ``score`` per ``by`` group: ``score``, ``bin``, ``bin_low``, ``bin_high``,
    ``n``, ``accepted``, ``confidence`` (mean score), ``rate`` (with bounds), ``gap = rate - confidence``.
    ``binning="uniform"`` uses ``bins`` equal bins of ``[0, 1]``; ``"quantile"`` equal-count bins."""
    df = as_trace(trace, ("reached", "accepted", score))
    keys = group_keys(by, df)
    base = Groups.of(df, keys, mask=df["reached"].to_numpy(dtype=bool))
    x = df[score].to_numpy()
    xr = base.take(x)
    edges = bin_edges(xr, bins, "uniform", 0.0, 1.0) if binning == "uniform" else bin_edges(xr, bins, binning)
    g, t = base.binned(xr, edges, "score", score)
    t["accepted"] = g.sum(df["accepted"].to_numpy(dtype=bool)).astype(np.int64)
    t["confidence"] = g.sum(x) / t["n"]
    add_rate(t, "accepted", "n", "rate", level, method)
    t["gap"] = t["rate"] - t["confidence"]
    return t


def calibration_error(table: pd.DataFrame, by: By = None) -> pd.DataFrame:
    """ECE and MCE (module docstring) of a :func:`calibration_table`, per ``by`` group and score."""
    keys = group_keys(by, table) + ["score"]
    work = table.assign(_w=table["n"] * table["gap"].abs(), _a=table["gap"].abs())
    out = work.groupby(keys, observed=True, sort=True).agg(
        n=("n", "sum"), _w=("_w", "sum"), mce=("_a", "max"), bins=("bin", "size")).reset_index()
    out.insert(len(keys) + 1, "ece", out["_w"] / out["n"])
    return out.drop(columns="_w")
