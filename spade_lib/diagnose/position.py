"""Acceptance by draft position, accepted-length distribution, and the prompt x step heatmap.

Definitions (one row per drafted token; ``R_i`` the reached, ``A_i`` the accepted tokens at position
``i``, ``D_i`` all drafted tokens at position ``i``, counted over steps with ``gamma > i``):

- conditional acceptance (EAGLE's per-position alpha): ``alpha_i = |A_i| / |R_i|``, the probability
  that position ``i`` is accepted given that positions ``0..i-1`` were;
- unconditional acceptance: ``beta_i = |A_i| / |D_i| = P(N > i)``, the fraction of blocks whose
  ``i``-th token survives; for fixed ``gamma``, ``beta_i = prod_{j <= i} alpha_j``;
- expected conditional acceptance: ``mean over R_i of (1 - TV(p, q))``, what an exact sampler gives;
- accepted length ``N`` of a step (``n_accepted``, ``0..gamma``); the tokens a step emits are
  ``N + 1`` (the residual or bonus token), Spec-Bench's ``accept_lengths``; survival
  ``S(k) = P(N >= k)``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from spade_lib.diagnose.frame import By, Groups, TraceLike, as_trace, group_keys, step_rows
from spade_lib.diagnose.stats import add_rate

POSITION_COLUMNS = ("pos", "reached", "accepted", "tv")


def position_acceptance(trace: TraceLike, by: By = None, *, level: float = 0.95,
                        method: str = "wilson") -> pd.DataFrame:
    """Per ``by`` group and draft position: ``drafted``, ``reached``, ``accepted``, the conditional
    (``alpha_cond``) and unconditional (``alpha_uncond``) acceptance with binomial bounds
    (``*_low``, ``*_high``), and ``expected_cond`` (mean ``1 - tv`` over reached rows)."""
    df = as_trace(trace, POSITION_COLUMNS)
    g = Groups.of(df, group_keys(by, df) + ["pos"])
    reached = df["reached"].to_numpy(dtype=bool)
    out = g.frame()
    out["drafted"] = g.sum()
    out["reached"] = g.sum(reached).astype(np.int64)
    out["accepted"] = g.sum(df["accepted"].to_numpy(dtype=bool)).astype(np.int64)
    expected_sum = g.sum(np.where(reached, 1.0 - df["tv"].to_numpy(dtype=np.float64), 0.0))
    add_rate(out, "accepted", "reached", "alpha_cond", level, method)
    add_rate(out, "accepted", "drafted", "alpha_uncond", level, method)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["expected_cond"] = np.where(out["reached"] > 0, expected_sum / out["reached"], np.nan)
    return out


def accept_length_hist(trace: TraceLike, by: By = None) -> pd.DataFrame:
    """Distribution of the accepted length ``N`` per ``by`` group: ``n_accepted`` (``0..max gamma``,
    zero counts kept), ``steps``, ``fraction = P(N = k)``, ``survival = P(N >= k)`` and
    ``accept_length = k + 1`` (tokens emitted by such a step)."""
    df = as_trace(trace, ("pos", "n_accepted", "gamma"))
    keys = group_keys(by, df)
    steps = step_rows(df, keys + ["n_accepted", "gamma"])
    k_max = int(steps["gamma"].max()) if len(steps) else 0
    g = Groups.of(steps, keys)
    n_acc = steps["n_accepted"].to_numpy(dtype=np.int64)
    counts = np.bincount(g.ids * (k_max + 1) + n_acc, minlength=g.n * (k_max + 1)).reshape(g.n, k_max + 1)
    total = counts.sum(axis=1, keepdims=True)
    frac = counts / np.maximum(total, 1)
    surv = np.cumsum(frac[:, ::-1], axis=1)[:, ::-1]
    out = g.keys.loc[np.repeat(np.arange(g.n), k_max + 1)].reset_index(drop=True)
    out["n_accepted"] = np.tile(np.arange(k_max + 1), g.n)
    out["steps"] = counts.ravel()
    out["fraction"] = frac.ravel()
    out["survival"] = surv.ravel()
    out["accept_length"] = out["n_accepted"] + 1
    return out


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
    out["rate"] = out["n_accepted"] / out["drafted"].where(out["drafted"] > 0)
    return out
