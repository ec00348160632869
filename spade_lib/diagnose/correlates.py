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
  standard errors from the inverse Hessian. Generations ``(prompt_id, sample)`` are split into train
  and held-out sets (seeded), so the held-out AUC scores unseen generations. Note that ``H(p)`` is
  known only after the target's forward: the model *explains* rejections, it is not a stop rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import special, stats

from spade_lib.diagnose.frame import By, TraceLike, as_trace, group_keys, reached_rows
from spade_lib.diagnose.stats import add_rate, auc, bin_edges, digitize, mean_ci

BIN_MEASURES = ("h_p", "h_q", "tv", "kl")
LOGIT_FEATURES = ("pos", "h_p", "h_q", "q_top_prob")


def entropy_by_outcome(trace: TraceLike, by: By = None, *, measures: Sequence[str] = ("h_p", "h_q"),
                       level: float = 0.95, test: bool = True) -> pd.DataFrame:
    """Per ``by`` group, position, ``measure`` and ``outcome`` (``accepted`` / ``rejected``): ``n``,
    ``mean`` (``mean_low``, ``mean_high``), ``std``, ``q25``, ``median``, ``q75``; with ``test``, the
    Mann-Whitney ``p_value`` and ``auc_rejected`` of the group (same on both outcome rows)."""
    df = as_trace(trace, ("pos", "reached", "accepted", *measures))
    keys = group_keys(by, df) + ["pos"]
    r = reached_rows(df)
    outcome = np.where(r["accepted"].to_numpy(dtype=bool), "accepted", "rejected")
    parts = []
    for m in measures:
        work = pd.DataFrame({**{k: r[k] for k in keys}, "outcome": outcome,
                             "x": r[m].to_numpy(dtype=np.float64)})
        g = work.groupby(keys + ["outcome"], observed=True, sort=True)["x"]
        t = g.agg(["size", "mean", "std"]).rename(columns={"size": "n"})
        q = g.quantile([0.25, 0.5, 0.75]).unstack()
        q.columns = ["q25", "median", "q75"]
        t = t.join(q).reset_index()
        t.insert(len(keys), "measure", m)
        t["mean_low"], t["mean_high"] = mean_ci(t["mean"], t["std"], t["n"], level)
        if test:
            t["p_value"], t["auc_rejected"] = np.nan, np.nan
            for gkey, sub in work.groupby(keys, observed=True, sort=False):
                acc = sub["outcome"].to_numpy() == "accepted"
                x = sub["x"].to_numpy()
                if acc.all() or not acc.any():
                    continue
                res = stats.mannwhitneyu(x[~acc], x[acc], alternative="two-sided", method="asymptotic")
                gkey = gkey if isinstance(gkey, tuple) else (gkey,)
                mask = np.logical_and.reduce([t[k].to_numpy() == v for k, v in zip(keys, gkey)])
                t.loc[mask, "p_value"] = res.pvalue
                t.loc[mask, "auc_rejected"] = res.statistic / ((~acc).sum() * acc.sum())
        parts.append(t)
    return pd.concat(parts, ignore_index=True)


def acceptance_by_bins(trace: TraceLike, by: By = None, *, measures: Sequence[str] = BIN_MEASURES,
                       bins: int = 10, binning: str = "quantile", level: float = 0.95,
                       method: str = "wilson") -> pd.DataFrame:
    """Conditional acceptance as a function of each ``measure``, binned (edges shared by all ``by``
    groups): ``measure``, ``bin``, ``bin_low``, ``bin_high``, ``x_mean``, ``n``, ``accepted``,
    ``rate`` (bounds) and ``expected`` (mean ``1 - tv`` in the bin)."""
    df = as_trace(trace, ("reached", "accepted", "tv", *measures))
    keys = group_keys(by, df)
    r = reached_rows(df)
    acc = r["accepted"].to_numpy(dtype=bool)
    alpha = 1.0 - r["tv"].to_numpy(dtype=np.float64)
    parts = []
    for m in measures:
        x = r[m].to_numpy(dtype=np.float64)
        edges = bin_edges(x, bins, binning)
        work = pd.DataFrame({**{k: r[k] for k in keys}, "bin": digitize(x, edges), "x": x,
                             "acc": acc, "alpha": alpha})
        work = work[work["bin"].to_numpy() >= 0]
        t = work.groupby(keys + ["bin"], observed=True, sort=True).agg(
            x_mean=("x", "mean"), n=("acc", "size"), accepted=("acc", "sum"), expected=("alpha", "mean"),
        ).reset_index()
        t.insert(len(keys), "measure", m)
        b = t["bin"].to_numpy()
        t.insert(len(keys) + 2, "bin_low", edges[b])
        t.insert(len(keys) + 3, "bin_high", edges[b + 1])
        add_rate(t, "accepted", "n", "rate", level, method)
        parts.append(t)
    return pd.concat(parts, ignore_index=True)


@dataclass
class LogitFit:
    """A fitted acceptance model: ``coefficients`` (one row per term) and ``scores`` (AUCs)."""

    coefficients: pd.DataFrame  # term, coef, se, z, p_value, coef_per_sd, sd, mean (+ by columns)
    scores: pd.DataFrame  # n_train, n_test, auc_train, auc_test, iterations (+ by columns)


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


def _heldout_mask(r: pd.DataFrame, test_fraction: float, seed: int) -> np.ndarray:
    """True for rows of generations ``(prompt_id, sample)`` drawn (seeded) into the held-out set."""
    codes, uniques = pd.factorize(pd.MultiIndex.from_arrays([r["prompt_id"], r["sample"]]), sort=True)
    n_gen = len(uniques)
    n_test = int(round(test_fraction * n_gen))
    if n_gen >= 2:
        n_test = min(max(n_test, 1), n_gen - 1)
    test_gen = np.zeros(n_gen, dtype=bool)
    test_gen[np.random.default_rng(seed).permutation(n_gen)[:n_test]] = True
    return test_gen[codes]


def acceptance_logit(trace: TraceLike, by: By = None, *, features: Sequence[str] = LOGIT_FEATURES,
                     test_fraction: float = 0.3, l2: float = 1e-3, max_rows: int | None = 2_000_000,
                     seed: int = 0) -> LogitFit:
    """Fit ``P(accepted | reached, features)`` per ``by`` group (module docstring).

    ``max_rows`` caps the training rows (a seeded subsample; ``None``: all) to bound the time on very
    large traces; the held-out AUC always uses every held-out row.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if not features:
        raise ValueError("features must name at least one column")
    df = as_trace(trace, ("prompt_id", "sample", "reached", "accepted", *features))
    keys = group_keys(by, df)
    r = reached_rows(df)
    groups = r.groupby(keys, observed=True, sort=True) if keys else [((), r)]
    coefs, scores = [], []
    for gkey, sub in groups:
        gkey = gkey if isinstance(gkey, tuple) else (gkey,)
        label = dict(zip(keys, gkey))
        y = sub["accepted"].to_numpy(dtype=np.float64)
        Z = np.column_stack([sub[f].to_numpy(dtype=np.float64) for f in features])
        ok = np.all(np.isfinite(Z), axis=1)
        test = _heldout_mask(sub, test_fraction, seed) & ok
        train = ~test & ok
        idx = np.flatnonzero(train)
        if max_rows is not None and len(idx) > max_rows:
            idx = np.sort(np.random.default_rng(seed).choice(idx, max_rows, replace=False))
        if len(idx) < len(features) + 2 or y[idx].min() == y[idx].max():
            raise ValueError(f"group {label or 'all'}: too few rows or a single outcome to fit the model")
        mean, sd = Z[idx].mean(axis=0), Z[idx].std(axis=0)
        sd = np.where(sd > 0, sd, 1.0)
        X = np.column_stack([np.ones(len(Z)), (Z - mean) / sd])
        w, cov, iters = _newton_logit(X[idx], y[idx], l2)
        se = np.sqrt(np.diag(cov))
        # Back to raw units: slope b_j / sd_j, intercept b_0 - sum_j b_j mean_j / sd_j.
        raw = np.concatenate([[w[0] - np.sum(w[1:] * mean / sd)], w[1:] / sd])
        raw_se = np.concatenate([[np.nan], se[1:] / sd])
        c = pd.DataFrame({"term": ["intercept", *features], "coef": raw, "se": raw_se,
                          "z": w / se, "p_value": 2.0 * stats.norm.sf(np.abs(w / se)),
                          "coef_per_sd": w, "sd": np.concatenate([[np.nan], sd]),
                          "mean": np.concatenate([[np.nan], mean])})
        score = X @ w
        s = pd.DataFrame({"n_train": [len(idx)], "n_test": [int(test.sum())],
                          "auc_train": [auc(score[idx], y[idx])],
                          "auc_test": [auc(score[test], y[test]) if test.any() else np.nan],
                          "iterations": [iters]})
        for k, v in reversed(label.items()):
            c.insert(0, k, v)
            s.insert(0, k, v)
        coefs.append(c)
        scores.append(s)
    return LogitFit(pd.concat(coefs, ignore_index=True), pd.concat(scores, ignore_index=True))
