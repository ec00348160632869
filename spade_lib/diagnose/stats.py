"""Small vectorised statistics shared by the M3 tables.

- Binomial confidence intervals for ``k`` successes in ``n`` trials (Wilson or Clopper-Pearson):
  :func:`spade_lib.intervals.binomial_ci`, re-exported here; a rate with its bounds is
  :func:`spade_lib.rates.add_rate`.
- The Poisson-binomial z test: for independent flags ``A_i ~ Bernoulli(pi_i)``,
  ``S = sum A_i`` has mean ``sum pi_i`` and variance ``sum pi_i (1 - pi_i)``;
  ``z = (S - E S) / sqrt(Var S)`` is asymptotically standard normal (Lyapunov CLT), p two-sided.
- AUC as the Mann-Whitney statistic: ``AUC = U_1 / (n_1 n_0)``, the probability that a random
  positive scores above a random negative (ties count one half).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from spade_lib.intervals import CI_METHODS, _z, binomial_ci  # noqa: F401  (defined there for the zoo's use too)


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
    """Area under the ROC curve of ``scores`` for binary ``labels``: ``U / (n_1 n_0)`` of the
    Mann-Whitney test (ties count one half), scores compared at float32 precision."""
    scores = np.asarray(scores)
    labels = np.asarray(labels, dtype=bool)
    if labels.all() or not labels.any():
        return float("nan")
    return float(grouped_compare(np.zeros(len(scores), dtype=np.intp), scores, labels, 1, ())["auc"][0])


QUANTILE_SAMPLE = 1_000_000  # quantile bin edges come from at most about this many rows


def bin_edges(x: np.ndarray, bins: int, binning: str = "quantile",
              lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """Monotone bin edges of ``x``: ``bins`` (near) equal-count (``"quantile"``, ties merged; computed on
    at most ~``QUANTILE_SAMPLE`` evenly spaced values, outer edges the exact range) or
    equal-width (``"uniform"``, over ``[lo, hi]``, default the data's range) bins."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    x = np.asarray(x)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return np.array([0.0, 1.0])
    if binning == "quantile":
        sample = x[:: max(1, len(x) // QUANTILE_SAMPLE)]  # evenly spaced rows: edges need not be exact
        edges = np.quantile(sample, np.linspace(0.0, 1.0, bins + 1))
        edges[0], edges[-1] = x.min(), x.max()
        if x.dtype == np.float32:  # float32-exact edges: rows fall exactly between the reported bounds
            edges = edges.astype(np.float32).astype(np.float64)
        edges = np.unique(edges)
    elif binning == "uniform":
        lo = float(x.min()) if lo is None else lo
        hi = float(x.max()) if hi is None else hi
        edges = np.linspace(lo, hi, bins + 1)
        if x.dtype == np.float32:
            edges = np.unique(edges.astype(np.float32).astype(np.float64))
    else:
        raise ValueError(f"binning must be 'quantile' or 'uniform', got {binning!r}")
    if len(edges) < 2:
        edges = np.array([edges[0], edges[0] + 1e-9])
    return edges


def digitize(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin index in ``0 .. len(edges) - 2`` of every value (closed on both outer edges; NaN -> -1)."""
    x = np.asarray(x)
    if x.dtype == np.float32 and np.array_equal(edges.astype(np.float32), edges):
        edges = edges.astype(np.float32)  # same bins, compared without a float64 copy of x
    if len(edges) <= 64:  # a few vectorised comparisons beat a binary search per value
        idx = np.zeros(len(x), dtype=np.int8)
        for e in edges[1:-1]:
            idx += x >= e
        idx = idx.astype(np.int64)
    else:
        idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    return np.where(np.isfinite(x), idx, -1)


def _order_bits(x: np.ndarray) -> np.ndarray:
    """uint64 codes whose unsigned order is the numeric order of ``x`` at float32 precision (the
    trace's storage precision): the sign-flip trick on the IEEE-754 bits."""
    b = (np.asarray(x, dtype=np.float32) + np.float32(0.0)).view(np.uint32)  # + 0.0 turns -0.0 into 0.0
    return np.where(b >> 31 == 1, ~b, b | np.uint32(0x80000000)).astype(np.uint64)


def _bits_to_float(u: np.ndarray) -> np.ndarray:
    u = u.astype(np.uint32)
    return np.where(u >> 31 == 1, u & np.uint32(0x7FFFFFFF), ~u).view(np.float32).astype(np.float64)


def _sorted_keys(ids: np.ndarray, x: np.ndarray, flag: np.ndarray | None) -> np.ndarray:
    """Rows with ``ids >= 0`` and finite ``x`` as packed uint64 keys ``group << 33 | bits(x) << 1 | flag``,
    sorted: one ``np.sort`` orders them by (group, x, flag).

    A private fast path (see :class:`spade_lib.diagnose.frame.Groups` for the other), kept for
    ``benchmarks/bench_diagnose.py``'s 10 M-row target: the plain ``np.lexsort((flag, x, group))``
    gives identical results but made :func:`grouped_compare` 3.1x slower (2 M rows, 24 groups, one
    run on a shared 2-core machine)."""
    x = np.asarray(x)
    ids = np.asarray(ids)
    ok = (ids >= 0) & np.isfinite(x)
    if not ok.all():
        ids, x, flag = ids[ok], x[ok], None if flag is None else np.asarray(flag)[ok]
    key = ids.astype(np.uint64) << np.uint64(33)
    key |= _order_bits(x) << np.uint64(1)
    if flag is not None:
        key |= np.asarray(flag, dtype=np.uint64)
    key.sort()
    return key


def _key_value(key: np.ndarray) -> np.ndarray:
    return _bits_to_float((key >> np.uint64(1)) & np.uint64(0xFFFFFFFF))


def _quantiles_sorted(key: np.ndarray, where: np.ndarray | None, n_groups: int, qs) -> np.ndarray:
    """Quantiles per group of the sorted ``key`` rows (all, or those at positions ``where``)."""
    sel = key if where is None else key[where]
    gid = (sel >> np.uint64(33)).astype(np.intp)
    counts = np.bincount(gid, minlength=n_groups)
    starts = np.cumsum(counts) - counts
    out = np.full((n_groups, len(qs)), np.nan)
    has = counts > 0
    for j, q in enumerate(qs):
        h = q * (counts[has] - 1)
        lo = np.floor(h).astype(np.int64)
        hi = np.minimum(lo + 1, counts[has] - 1)
        a, b = _key_value(sel[starts[has] + lo]), _key_value(sel[starts[has] + hi])
        out[has, j] = a + (h - lo) * (b - a)
    return out


def grouped_quantiles(ids: np.ndarray, x: np.ndarray, n_groups: int, qs) -> np.ndarray:
    """Quantiles ``qs`` of ``x`` (at float32 precision) within each group (``np.quantile``'s linear
    rule; NaN for empty groups; rows with ``ids < 0`` or non-finite ``x`` ignored): an array of shape
    ``(n_groups, len(qs))``."""
    return _quantiles_sorted(_sorted_keys(ids, x, None), None, n_groups, qs)


def grouped_compare(ids: np.ndarray, x: np.ndarray, flag: np.ndarray, n_groups: int, qs=(0.25, 0.5, 0.75)
                    ) -> dict[str, np.ndarray]:
    """Compare ``x[flag]`` with ``x[~flag]`` within each group, from one sort of ``x`` (float32 precision).

    Returns ``quantiles`` of shape ``(n_groups, 2, len(qs))`` (index 1: flagged), and the two-sided
    Mann-Whitney test of the flagged sample: ``u``, ``auc = U / (n_1 n_0)`` and ``p_value`` (normal
    approximation with tie and continuity corrections, scipy's ``method="asymptotic"``).
    """
    key = _sorted_keys(ids, x, flag)
    gid = (key >> np.uint64(33)).astype(np.intp)
    fl = (key & np.uint64(1)).astype(bool)
    pos1 = np.flatnonzero(fl)
    if len(qs):
        quantiles = np.stack([_quantiles_sorted(key, np.flatnonzero(~fl), n_groups, qs),
                              _quantiles_sorted(key, pos1, n_groups, qs)], axis=1)
    else:
        quantiles = np.zeros((n_groups, 2, 0))
    counts = np.bincount(gid, minlength=n_groups)
    starts = np.cumsum(counts) - counts
    n1 = np.bincount(gid[pos1], minlength=n_groups).astype(np.float64)
    n0 = counts - n1
    value = key >> np.uint64(1)  # (group, x): equal for the tied rows of a group
    new_run = np.ones(len(key), dtype=bool)
    np.not_equal(value[1:], value[:-1], out=new_run[1:])
    if new_run.all():  # no ties: the 1-based rank is the position within the group
        rank_sum = np.bincount(gid[pos1], weights=pos1.astype(np.float64), minlength=n_groups) - n1 * (starts - 1)
        ties = np.zeros(n_groups)
    else:  # tie runs: every member gets the run's mean rank
        run_start = np.flatnonzero(new_run)
        run_len = np.diff(np.append(run_start, len(key)))
        run_gid = gid[run_start]
        run_rank = (run_start - starts[run_gid]) + (run_len + 1) / 2.0
        n1_run = np.add.reduceat(fl.astype(np.float64), run_start)
        rank_sum = np.bincount(run_gid, weights=run_rank * n1_run, minlength=n_groups)
        ties = np.bincount(run_gid, weights=run_len.astype(np.float64) ** 3 - run_len, minlength=n_groups)
    u = rank_sum - n1 * (n1 + 1) / 2.0
    n = counts.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        area = u / (n1 * n0)
        var = n1 * n0 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)))
        dev = np.maximum(np.abs(u - n1 * n0 / 2.0) - 0.5, 0.0)
        p = 2.0 * stats.norm.sf(dev / np.sqrt(var))
    bad = (n1 == 0) | (n0 == 0)
    return {"quantiles": quantiles, "u": u, "auc": np.where(bad, np.nan, area),
            "p_value": np.where(bad | ~np.isfinite(p), np.nan, np.minimum(p, 1.0))}


def grouped_mannwhitney(ids: np.ndarray, x: np.ndarray, flag: np.ndarray, n_groups: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two-sided Mann-Whitney test of ``x[flag]`` vs ``x[~flag]`` within each group, vectorised:
    ``U`` of the flagged sample, ``auc = U / (n_1 n_0)`` and the p-value (see :func:`grouped_compare`)."""
    r = grouped_compare(ids, x, flag, n_groups, ())
    return r["u"], r["auc"], r["p_value"]
