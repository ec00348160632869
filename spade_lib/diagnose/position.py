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

from spade_lib.diagnose.frame import By, TraceLike, as_trace, group_keys, step_rows
from spade_lib.diagnose.stats import add_rate

POSITION_COLUMNS = ("pos", "reached", "accepted", "tv")


def position_acceptance(trace: TraceLike, by: By = None, *, level: float = 0.95,
                        method: str = "wilson") -> pd.DataFrame:
    """Per ``by`` group and draft position: ``drafted``, ``reached``, ``accepted``, the conditional
    (``alpha_cond``) and unconditional (``alpha_uncond``) acceptance with binomial bounds
    (``*_low``, ``*_high``), and ``expected_cond`` (mean ``1 - tv`` over reached rows)."""
    df = as_trace(trace, POSITION_COLUMNS)
    keys = group_keys(by, df) + ["pos"]
    reached = df["reached"].to_numpy(dtype=bool)
    work = pd.DataFrame({
        **{k: df[k] for k in keys},
        "reached": reached,
        "accepted": df["accepted"].to_numpy(dtype=bool),
        "alpha_exp": np.where(reached, 1.0 - df["tv"].to_numpy(dtype=np.float64), 0.0),
    })
    out = work.groupby(keys, observed=True, sort=True).agg(
        drafted=("reached", "size"), reached=("reached", "sum"), accepted=("accepted", "sum"),
        expected_sum=("alpha_exp", "sum"),
    ).reset_index()
    add_rate(out, "accepted", "reached", "alpha_cond", level, method)
    add_rate(out, "accepted", "drafted", "alpha_uncond", level, method)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["expected_cond"] = np.where(out["reached"] > 0, out["expected_sum"] / out["reached"], np.nan)
    return out.drop(columns="expected_sum")


def accept_length_hist(trace: TraceLike, by: By = None) -> pd.DataFrame:
    """Distribution of the accepted length ``N`` per ``by`` group: ``n_accepted`` (``0..max gamma``,
    zero counts kept), ``steps``, ``fraction = P(N = k)``, ``survival = P(N >= k)`` and
    ``accept_length = k + 1`` (tokens emitted by such a step)."""
    df = as_trace(trace, ("pos", "n_accepted", "gamma"))
    keys = group_keys(by, df)
    steps = step_rows(df)
    k_max = int(steps["gamma"].max()) if len(steps) else 0
    counts = steps.groupby(keys + ["n_accepted"], observed=True, sort=True).size() if keys else \
        steps.groupby("n_accepted").size()
    table = counts.unstack("n_accepted", fill_value=0) if keys else counts.to_frame().T
    table = table.reindex(columns=range(k_max + 1), fill_value=0)
    total = table.sum(axis=1).to_numpy(dtype=np.float64)[:, None]
    arr = table.to_numpy(dtype=np.float64)
    frac = arr / np.where(total > 0, total, 1.0)
    surv = np.cumsum(frac[:, ::-1], axis=1)[:, ::-1]
    index = table.index.to_frame(index=False) if keys else pd.DataFrame(index=[0])
    rows = []
    for j in range(k_max + 1):
        part = index.copy() if keys else pd.DataFrame(index=range(len(arr)))
        part["n_accepted"] = j
        part["steps"] = arr[:, j].astype(np.int64)
        part["fraction"] = frac[:, j]
        part["survival"] = surv[:, j]
        rows.append(part)
    out = pd.concat(rows, ignore_index=True).sort_values(keys + ["n_accepted"], kind="stable")
    out["accept_length"] = out["n_accepted"] + 1
    return out.reset_index(drop=True)


def acceptance_heatmap(trace: TraceLike, by: By = None, *, step_bin: int = 1) -> pd.DataFrame:
    """Step-level acceptance over generation x step: one row per ``by`` group, prompt, sample and
    step bin (``step // step_bin``) with ``category``, ``steps``, ``drafted`` (sum of gamma),
    ``n_accepted`` (sum) and ``rate = n_accepted / drafted``, the fraction of drafts kept."""
    if step_bin < 1:
        raise ValueError(f"step_bin must be >= 1, got {step_bin}")
    df = as_trace(trace, ("prompt_id", "category", "sample", "step", "pos", "gamma", "n_accepted"))
    keys = group_keys(by, df)
    steps = step_rows(df)
    work = pd.DataFrame({
        **{k: steps[k] for k in keys},
        "prompt_id": steps["prompt_id"], "sample": steps["sample"],
        "step_bin": steps["step"].to_numpy() // step_bin,
        "category": steps["category"],
        "gamma": steps["gamma"].to_numpy(dtype=np.int64),
        "n_accepted": steps["n_accepted"].to_numpy(dtype=np.int64),
    })
    out = work.groupby(keys + ["prompt_id", "sample", "step_bin"], observed=True, sort=True).agg(
        category=("category", "first"), steps=("gamma", "size"), drafted=("gamma", "sum"),
        n_accepted=("n_accepted", "sum"),
    ).reset_index()
    out["step"] = out["step_bin"] * step_bin
    out["rate"] = out["n_accepted"] / out["drafted"].where(out["drafted"] > 0)
    return out
