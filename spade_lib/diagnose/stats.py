"""Small vectorised statistics shared by the M3 tables.

- Binomial confidence intervals for ``k`` successes in ``n`` trials, at level ``1 - a``:
  *Wilson* (score interval) ``(k + z^2/2) / (n + z^2) +- z / (n + z^2) * sqrt(k (n - k) / n + z^2 / 4)``
  with ``z = Phi^-1(1 - a/2)``, or *Clopper-Pearson* (exact) ``[B(a/2; k, n-k+1), B(1-a/2; k+1, n-k)]``
  with ``B`` the Beta quantile.
- The Poisson-binomial z test: for independent flags ``A_i ~ Bernoulli(pi_i)``,
  ``S = sum A_i`` has mean ``sum pi_i`` and variance ``sum pi_i (1 - pi_i)``;
  ``z = (S - E S) / sqrt(Var S)`` is asymptotically standard normal (Lyapunov CLT), p two-sided.
- AUC as the Mann-Whitney statistic: ``AUC = U_1 / (n_1 n_0)``, the probability that a random
  positive scores above a random negative (ties count one half).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

CI_METHODS = ("wilson", "clopper-pearson")


def _z(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return float(stats.norm.ppf(0.5 + level / 2.0))


def binomial_ci(k, n, level: float = 0.95, method: str = "wilson") -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper confidence bounds of ``k / n`` (arrays; NaN where ``n == 0``)."""
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    if np.any(k < 0) or np.any(k > n):
        raise ValueError("k must satisfy 0 <= k <= n")
    with np.errstate(invalid="ignore", divide="ignore"):
        if method == "wilson":
            z = _z(level)
            z2 = z * z
            center = (k + z2 / 2.0) / (n + z2)
            half = z / (n + z2) * np.sqrt(k * (n - k) / n + z2 / 4.0)
            low, high = center - half, center + half
        elif method == "clopper-pearson":
            a = 1.0 - level
            _z(level)
            low = np.where(k > 0, stats.beta.ppf(a / 2.0, k, n - k + 1.0), 0.0)
            high = np.where(k < n, stats.beta.ppf(1.0 - a / 2.0, k + 1.0, n - k), 1.0)
        else:
            raise ValueError(f"method must be one of {CI_METHODS}, got {method!r}")
    empty = n <= 0
    low = np.where(empty, np.nan, np.clip(low, 0.0, 1.0))
    high = np.where(empty, np.nan, np.clip(high, 0.0, 1.0))
    return low, high


def add_rate(table: pd.DataFrame, k: str, n: str, name: str, level: float = 0.95,
             method: str = "wilson") -> pd.DataFrame:
    """Add ``name = k / n`` and its ``name_low`` / ``name_high`` binomial bounds to ``table`` (in place)."""
    kk = table[k].to_numpy(dtype=np.float64)
    nn = table[n].to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        table[name] = np.where(nn > 0, kk / nn, np.nan)
    table[f"{name}_low"], table[f"{name}_high"] = binomial_ci(kk, nn, level, method)
    return table


def mean_ci(mean, std, n, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Normal-approximation bounds ``mean +- z std / sqrt(n)`` (NaN where ``n < 2``)."""
    mean, std, n = (np.asarray(v, dtype=np.float64) for v in (mean, std, n))
    with np.errstate(invalid="ignore", divide="ignore"):
        half = _z(level) * std / np.sqrt(n)
    half = np.where(n >= 2, half, np.nan)
    return mean - half, mean + half


def poisson_binomial_z(realised, expected, variance) -> tuple[np.ndarray, np.ndarray]:
    """z statistic and two-sided p-value of ``realised`` successes against a Poisson-binomial
    with mean ``expected`` and variance ``variance``.

    A zero variance (every probability 0 or 1, e.g. greedy decoding) gives z = 0, p = 1 when
    ``realised == expected`` and z = +-inf, p = 0 otherwise.
    """
    realised, expected, variance = (np.asarray(v, dtype=np.float64) for v in (realised, expected, variance))
    diff = realised - expected
    degenerate = variance <= 1e-12
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(degenerate, np.where(np.abs(diff) < 0.5, 0.0, np.sign(diff) * np.inf),
                     diff / np.sqrt(np.where(degenerate, 1.0, variance)))
    p = 2.0 * stats.norm.sf(np.abs(z))
    return z, p


def auc(scores, labels) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels`` (Mann-Whitney U / (n1 n0))."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=bool)
    pos, neg = scores[labels], scores[~labels]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    u = stats.mannwhitneyu(pos, neg, alternative="two-sided", method="asymptotic").statistic
    return float(u) / (len(pos) * len(neg))


def bin_edges(x: np.ndarray, bins: int, binning: str = "quantile",
              lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """Monotone bin edges of ``x``: ``bins`` equal-count (``"quantile"``, ties merged) or
    equal-width (``"uniform"``, over ``[lo, hi]``, default the data's range) bins."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return np.array([0.0, 1.0])
    if binning == "quantile":
        edges = np.unique(np.quantile(x, np.linspace(0.0, 1.0, bins + 1)))
    elif binning == "uniform":
        lo = float(x.min()) if lo is None else lo
        hi = float(x.max()) if hi is None else hi
        edges = np.linspace(lo, hi, bins + 1)
    else:
        raise ValueError(f"binning must be 'quantile' or 'uniform', got {binning!r}")
    if len(edges) < 2:
        edges = np.array([edges[0], edges[0] + 1e-9])
    return edges


def digitize(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin index in ``0 .. len(edges) - 2`` of every value (closed on both outer edges; NaN -> -1)."""
    x = np.asarray(x, dtype=np.float64)
    idx = np.searchsorted(edges, x, side="right") - 1
    idx = np.clip(idx, 0, len(edges) - 2)
    return np.where(np.isfinite(x), idx, -1)


def _sorted_by_group(ids: np.ndarray, x: np.ndarray, n_groups: int,
                     x_order: np.ndarray | None = None) -> np.ndarray:
    """Indices of rows with ``ids >= 0`` and finite ``x``, sorted by (group, x). ``x_order``, an
    argsort of ``x`` computed once, can be shared by several groupings of the same values."""
    if x_order is None:
        x_order = np.argsort(x)
    order = x_order[(ids[x_order] >= 0) & np.isfinite(x[x_order])]
    gid = ids[order]
    if n_groups < 1 << 16:
        gid = gid.astype(np.uint16)  # a 16-bit stable sort is a radix sort: linear time
    return order[np.argsort(gid, kind="stable")]


def grouped_quantiles(ids: np.ndarray, x: np.ndarray, n_groups: int, qs,
                      x_order: np.ndarray | None = None) -> np.ndarray:
    """Quantiles ``qs`` of ``x`` within each group (``np.quantile``'s linear rule; NaN for empty
    groups): an array of shape ``(n_groups, len(qs))``."""
    order = _sorted_by_group(ids, x, n_groups, x_order)
    xs = np.asarray(x, dtype=np.float64)[order]
    counts = np.bincount(ids[order], minlength=n_groups)
    starts = np.cumsum(counts) - counts
    out = np.full((n_groups, len(qs)), np.nan)
    has = counts > 0
    for j, q in enumerate(qs):
        h = q * (counts[has] - 1)
        lo = np.floor(h).astype(np.int64)
        hi = np.minimum(lo + 1, counts[has] - 1)
        a, b = xs[starts[has] + lo], xs[starts[has] + hi]
        out[has, j] = a + (h - lo) * (b - a)
    return out


def grouped_mannwhitney(ids: np.ndarray, x: np.ndarray, flag: np.ndarray, n_groups: int,
                        x_order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two-sided Mann-Whitney test of ``x[flag]`` vs ``x[~flag]`` within each group, vectorised.

    Returns ``U`` (of the flagged sample), ``auc = U / (n_1 n_0)`` and the p-value of the normal
    approximation with tie and continuity corrections (scipy's ``method="asymptotic"``).
    """
    flag = np.asarray(flag, dtype=bool)
    order = _sorted_by_group(ids, x, n_groups, x_order)
    gid, xs, fl = ids[order], x[order], flag[order]
    counts = np.bincount(gid, minlength=n_groups)
    starts = np.cumsum(counts) - counts
    # Tie runs: consecutive equal (group, x); every member gets the run's mean 1-based rank.
    new_run = np.ones(len(order), dtype=bool)
    new_run[1:] = (gid[1:] != gid[:-1]) | (xs[1:] != xs[:-1])
    run = np.cumsum(new_run) - 1
    run_start = np.flatnonzero(new_run)
    run_len = np.diff(np.append(run_start, len(order)))
    run_rank = (run_start - starts[gid[run_start]]) + (run_len + 1) / 2.0
    rank = run_rank[run]
    n1 = np.bincount(gid, weights=fl, minlength=n_groups)
    n0 = counts - n1
    u = np.bincount(gid, weights=rank * fl, minlength=n_groups) - n1 * (n1 + 1) / 2.0
    ties = np.bincount(gid[run_start], weights=run_len.astype(np.float64) ** 3 - run_len, minlength=n_groups)
    n = counts.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        area = u / (n1 * n0)
        var = n1 * n0 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)))
        dev = np.maximum(np.abs(u - n1 * n0 / 2.0) - 0.5, 0.0)
        p = 2.0 * stats.norm.sf(dev / np.sqrt(var))
    bad = (n1 == 0) | (n0 == 0)
    return u, np.where(bad, np.nan, area), np.where(bad | ~np.isfinite(p), np.nan, np.minimum(p, 1.0))
