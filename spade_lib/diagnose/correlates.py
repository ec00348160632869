"""Entropy and divergence correlates of rejection: position-wise rejection entropy, binned
acceptance curves, and a logistic model of acceptance.

All three look only at *reached* positions (the verifier judged them), with outcome
``accepted`` vs ``rejected``:

- :func:`entropy_by_outcome` — per position and outcome, the distribution (mean with a normal CI,
  quartiles) of ``H(p)`` and ``H(q)`` (nats), and a Mann-Whitney test of accepted vs rejected with its
  effect size ``auc_rejected = P(H at a rejected position > H at an accepted one)`` (0.5: no
  difference; ties count one half).
- :func:`acceptance_by_bins` — ``P(accepted | reached, X in bin)`` for ``X`` in ``H(p)``, ``H(q)``,
  ``TV``, ``KL``, with binomial bounds, next to the exact expectation ``mean(1 - TV)`` in the bin.
- :func:`acceptance_logit` — ``P(accepted | reached, z) = sigmoid(b0 + sum_j b_j z_j)`` fitted by
  Newton-Raphson (IRLS) with a small ridge ``l2`` on the slopes, on features standardised to unit
  variance (``coef_per_sd``) and reported on their raw scale too (``coef = coef_per_sd / sd_j``);
  standard errors from the inverse Hessian. Within each group, generations ``(prompt_id, sample)``
  are split into train and held-out sets (seeded), so the held-out AUC scores unseen generations.
  ``H(p)`` is known only after the target's forward: the model *explains* rejections, it is not a
  stop rule. A group whose outcomes are (quasi-)separated on its training rows gets huge standardised
  coefficients whose sign and size mean nothing: :func:`separated_fits` names those with
  ``|coef_per_sd| > MAX_COEF_PER_SD``.

Quantiles, Mann-Whitney ranks and AUCs compare values at float32 precision, the trace's storage type
(one ``np.sort`` of packed keys per measure, :func:`spade_lib.diagnose.stats.grouped_compare`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import special, stats

from spade_lib.diagnose.frame import By, Groups, TraceLike, as_trace, group_keys
from spade_lib.diagnose.stats import (
    auc, bin_edges, grouped_compare, grouped_quantiles, mean_ci,
)
from spade_lib.rates import add_rate

BIN_MEASURES = ("h_p", "h_q", "tv", "kl")
LOGIT_FEATURES = ("pos", "h_p", "h_q", "q_top_prob")
MAX_COEF_PER_SD = 8.0  # |coefficient| per sd beyond which a fit is taken as (quasi-)separated


def entropy_by_outcome(trace: TraceLike, by: By = None, *, measures: Sequence[str] = ("h_p", "h_q"),
                       level: float = 0.95, test: bool = True) -> pd.DataFrame:
    """Per ``by`` group, position, ``measure`` and ``outcome`` (``accepted`` / ``rejected``): ``n``,
    ``mean`` (``mean_low``, ``mean_high``), ``std``, ``q25``, ``median``, ``q75``; with ``test``, the
    Mann-Whitney ``p_value`` and ``auc_rejected`` of the group (same on both outcome rows)."""
    df = as_trace(trace, ("pos", "reached", "accepted", *measures))
    g = Groups.of(df, group_keys(by, df) + ["pos"], mask=df["reached"].to_numpy(dtype=bool))
    rejected = ~g.take(df["accepted"]).astype(bool)
    cell = 2 * g.ids + rejected  # (group, outcome) cells, outcome 1 = rejected
    n_cells = 2 * g.n
    base = g.keys.loc[np.repeat(np.arange(g.n), 2)].reset_index(drop=True)
    base["outcome"] = np.tile(["accepted", "rejected"], g.n)
    parts = []
    for m in measures:
        x = g.take(df[m])
        ok = np.isfinite(x)
        c, xv = (cell, x) if ok.all() else (cell[ok], x[ok])
        xv = xv.astype(np.float64)
        n = np.bincount(c, minlength=n_cells)
        s1 = np.bincount(c, weights=xv, minlength=n_cells)
        s2 = np.bincount(c, weights=xv * xv, minlength=n_cells)
        t = base.copy()
        t.insert(len(t.columns) - 1, "measure", m)
        t["n"] = n
        with np.errstate(invalid="ignore", divide="ignore"):
            t["mean"] = np.where(n > 0, s1 / n, np.nan)
            t["std"] = np.where(n > 1, np.sqrt(np.maximum(s2 - n * t["mean"] ** 2, 0.0) / (n - 1)), np.nan)
        if test:
            r = grouped_compare(g.ids, x, rejected, g.n, (0.25, 0.5, 0.75))
            t[["q25", "median", "q75"]] = r["quantiles"].reshape(n_cells, 3)
            t["p_value"] = np.repeat(r["p_value"], 2)
            t["auc_rejected"] = np.repeat(r["auc"], 2)
        else:
            t[["q25", "median", "q75"]] = grouped_quantiles(cell, x, n_cells, (0.25, 0.5, 0.75))
        t["mean_low"], t["mean_high"] = mean_ci(t["mean"], t["std"], t["n"], level)
        parts.append(t[t["n"] > 0])
    return pd.concat(parts, ignore_index=True)


def acceptance_by_bins(trace: TraceLike, by: By = None, *, measures: Sequence[str] = BIN_MEASURES,
                       bins: int = 10, binning: str = "quantile", level: float = 0.95,
                       method: str = "wilson") -> pd.DataFrame:
    """Conditional acceptance as a function of each ``measure``, binned (edges shared by all ``by``
    groups): ``measure``, ``bin``, ``bin_low``, ``bin_high``, ``x_mean``, ``n``, ``accepted``,
    ``rate`` (bounds) and ``expected`` (mean ``1 - tv`` in the bin)."""
    df = as_trace(trace, ("reached", "accepted", "tv", *measures))
    keys = group_keys(by, df)
    reached = df["reached"].to_numpy(dtype=bool)
    base = Groups.of(df, keys, mask=reached)
    acc = df["accepted"].to_numpy(dtype=bool)
    alpha = 1.0 - df["tv"].to_numpy(dtype=np.float64)
    parts = []
    for m in measures:
        x = df[m].to_numpy()
        xr = base.take(x)
        edges = bin_edges(xr, bins, binning)
        g, t = base.binned(xr, edges, "measure", m)
        t["x_mean"] = g.sum(x) / t["n"]
        t["accepted"] = g.sum(acc).astype(np.int64)
        t["expected"] = g.sum(alpha) / t["n"]
        add_rate(t, "accepted", "n", "rate", level, method)
        parts.append(t)
    return pd.concat(parts, ignore_index=True)


@dataclass
class LogitFit:
    """A fitted acceptance model: ``coefficients`` (one row per term) and ``scores`` (AUCs)."""

    coefficients: pd.DataFrame  # term, coef, se, z, p_value, coef_per_sd, sd, mean (+ by columns)
    scores: pd.DataFrame  # n_train, n_test, auc_train, auc_test, iterations, fitted (+ by columns)


def _newton_logit(X: np.ndarray, y: np.ndarray, l2: float, max_iter: int = 50,
                  tol: float = 1e-8) -> tuple[np.ndarray, np.ndarray, int]:
    """Ridge-penalised logistic regression by Newton-Raphson; column 0 of ``X`` is the intercept."""
    d = X.shape[1]
    penalty = np.full(d, l2)
    penalty[0] = 0.0
    w = np.zeros(d)
    it = 0
    for it in range(1, max_iter + 1):
        mu = special.expit(X @ w)
        grad = X.T @ (y - mu) - penalty * w
        hess = (X * (mu * (1.0 - mu))[:, None]).T @ X + np.diag(penalty)
        step = np.linalg.solve(hess, grad)
        w += step
        if np.max(np.abs(step)) < tol:
            break
    mu = special.expit(X @ w)
    hess = (X * (mu * (1.0 - mu))[:, None]).T @ X + np.diag(penalty)
    return w, np.linalg.inv(hess), it


def _heldout(generation: np.ndarray, n_generations: int, test_fraction: float, seed: int) -> np.ndarray:
    """True for rows whose generation id (``0 .. n_generations - 1``) is drawn (seeded) into the
    held-out set: a fraction ``test_fraction`` of the distinct generations present, at least one and
    never all."""
    gens = np.flatnonzero(np.bincount(generation, minlength=n_generations))
    n_test = int(round(test_fraction * len(gens)))
    if len(gens) >= 2:
        n_test = min(max(n_test, 1), len(gens) - 1)
    is_test = np.zeros(n_generations, dtype=bool)
    is_test[np.random.default_rng(seed).permutation(gens)[:n_test]] = True
    return is_test[generation]


def acceptance_logit(trace: TraceLike, by: By = None, *, features: Sequence[str] = LOGIT_FEATURES,
                     test_fraction: float = 0.3, l2: float = 1e-3, max_rows: int | None = 500_000,
                     seed: int = 0, skip_degenerate: bool = False) -> LogitFit:
    """Fit ``P(accepted | reached, features)`` per ``by`` group (module docstring).

    ``max_rows`` caps the training rows of each group (a seeded subsample; ``None``: all) to bound the
    time on very large traces; the held-out AUC always uses every held-out row. A group whose training
    rows are too few or all of one outcome (a greedy run that accepts everything) raises a
    ``ValueError``, or with ``skip_degenerate`` gets no coefficients and a ``fitted = False`` score row.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if not features:
        raise ValueError("features must name at least one column")
    df = as_trace(trace, ("prompt_id", "sample", "reached", "accepted", *features))
    keys = group_keys(by, df)
    reached = df["reached"].to_numpy(dtype=bool)
    g = Groups.of(df, keys, mask=reached)
    gen = Groups.of(df, ["prompt_id", "sample"], mask=reached)
    y_all = g.take(df["accepted"]).astype(np.float64)
    columns = [df[f].to_numpy() for f in features]

    def design(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Features and outcomes of the selected rows ``rows`` (rows with a non-finite feature dropped)."""
        Z = np.column_stack([c[g.rows[rows]] for c in columns]).astype(np.float64)
        ok = np.all(np.isfinite(Z), axis=1)
        return (Z, y_all[rows]) if ok.all() else (Z[ok], y_all[rows[ok]])

    order = np.argsort(g.ids, kind="stable") if g.n > 1 else np.arange(len(g.ids))
    sizes = np.bincount(g.ids, minlength=g.n)
    coefs, scores = [], []
    for j, rows in enumerate(np.split(order, np.cumsum(sizes)[:-1])):
        label = {k: g.keys[k].iloc[j] for k in keys}
        test = _heldout(gen.ids[rows], gen.n, test_fraction, seed)
        train = rows[~test]
        if max_rows is not None and len(train) > max_rows:
            train = np.sort(np.random.default_rng(seed).choice(train, max_rows, replace=False))
        Zt, yt = design(train)
        Zh, yh = design(rows[test])
        if len(yt) < len(features) + 2 or yt.min() == yt.max():
            if not skip_degenerate:
                raise ValueError(f"group {label or 'all'}: too few rows or a single outcome to fit the model")
            s = pd.DataFrame({"n_train": [len(yt)], "n_test": [len(yh)], "auc_train": [np.nan],
                              "auc_test": [np.nan], "iterations": [0], "fitted": [False]})
            for k, v in reversed(label.items()):
                s.insert(0, k, v)
            scores.append(s)
            continue
        mean, sd = Zt.mean(axis=0), Zt.std(axis=0)
        sd = np.where(sd > 0, sd, 1.0)
        w, cov, iters = _newton_logit(np.column_stack([np.ones(len(yt)), (Zt - mean) / sd]), yt, l2)
        se = np.sqrt(np.diag(cov))
        # Back to raw units: slope b_j / sd_j, intercept b_0 - sum_j b_j mean_j / sd_j.
        raw = np.concatenate([[w[0] - np.sum(w[1:] * mean / sd)], w[1:] / sd])
        raw_se = np.concatenate([[np.nan], se[1:] / sd])
        c = pd.DataFrame({"term": ["intercept", *features], "coef": raw, "se": raw_se,
                          "z": w / se, "p_value": 2.0 * stats.norm.sf(np.abs(w / se)),
                          "coef_per_sd": w, "sd": np.concatenate([[np.nan], sd]),
                          "mean": np.concatenate([[np.nan], mean])})
        s = pd.DataFrame({"n_train": [len(yt)], "n_test": [len(yh)],
                          "auc_train": [auc(Zt @ raw[1:], yt)],
                          "auc_test": [auc(Zh @ raw[1:], yh) if len(yh) else np.nan],
                          "iterations": [iters], "fitted": [True]})
        for k, v in reversed(label.items()):
            c.insert(0, k, v)
            s.insert(0, k, v)
        coefs.append(c)
        scores.append(s)
    columns = [*keys, "term", "coef", "se", "z", "p_value", "coef_per_sd", "sd", "mean"]
    coefficients = pd.concat(coefs, ignore_index=True) if coefs else pd.DataFrame(columns=columns)
    return LogitFit(coefficients, pd.concat(scores, ignore_index=True))


def separated_fits(coefficients: pd.DataFrame, by: str, *, max_coef_per_sd: float = MAX_COEF_PER_SD) -> list[str]:
    """The groups of ``by`` (sorted, as strings) whose fit has a term with ``|coef_per_sd| > max_coef_per_sd``:
    (quasi-)separated outcomes on the training rows, so the coefficients are not to be read or drawn.
    ``coefficients``: :attr:`LogitFit.coefficients` (``by``, ``coef_per_sd``); empty: none."""
    if not len(coefficients):
        return []
    big = coefficients["coef_per_sd"].abs() > max_coef_per_sd
    return sorted(set(coefficients.loc[big, by].astype(str)))
