"""Counts to rates: every acceptance rate and accepted-length statistic of SPADE, each defined once.

Notation (Leviathan et al. 2023): ``p`` target, ``q`` draft, ``gamma`` tokens drafted in a step, ``alpha`` acceptance
rate, ``tau`` mean accepted length; a step accepts a prefix of ``N`` (``n_accepted``) of ``x_0 .. x_{gamma-1}`` and
emits one more (residual or bonus), ``N + 1`` tokens. Inputs are counts under the trace schema's names
(:mod:`spade_lib.decoding.records`): one row per *drafted* token with ``reached`` (every earlier position of its block
accepted: judged), ``accepted``, ``pos`` (draft position ``i``), ``tv = TV(p, q)``, per step ``gamma``, ``n_accepted``.
Over rows: ``D`` drafted, ``R`` reached, ``A`` accepted; at position ``i``: ``D_i``, ``R_i``, ``A_i`` (column names).

- ``alpha`` = ``A / R``, acceptance per judged token (i.i.d.: each judged position Bernoulli(alpha)); SPADE's "alpha".
- ``acceptance_per_drafted`` = ``A / D``, drafted tokens kept (unjudged count as lost), ``<= alpha``.
- ``alpha_cond`` (position i) = ``A_i / R_i = P(x_i accepted | x_0 .. x_{i-1} accepted)``, EAGLE's per-position alpha.
- ``alpha_uncond`` (position i) = ``A_i / D_i = P(N > i)`` over steps that drafted ``i``; for a fixed ``gamma``
  ``alpha_uncond_i = prod_{j <= i} alpha_cond_j`` (i.i.d.: ``alpha^(i+1)``).
- ``expected_alpha`` = ``sum_{reached rows} (1 - tv) / R`` (an exact sampler accepts a judged ``x ~ q`` with
  probability ``1 - TV(p, q)``); per position ``expected_cond``.
- ``tau`` = :func:`spade_lib.measures.tau`: ``mean_s (N_s + 1)``, or ``mean_s N_s`` (``tau_no_bonus``).
- ``accept_length_hist``: per ``k = 0 .. k_max`` ``steps`` with ``N = k``, ``fraction = P(N = k)``, ``survival =
  P(N >= k)``, ``accept_length = k + 1``; ``tau_per_request`` ``tau_r``, ``alpha_per_request`` ``alpha_r = A_r / R_r``.

**Pooled vs per-request means.** Pooled rates are ratios of totals: ``tau = sum_r (A_r + S_r) / sum_r S_r`` (``S_r``
steps, ``A_r`` accepted drafts of request ``r``) ``= sum_r w_r tau_r``, ``w_r = S_r / sum S``: long completions weigh
more. The per-request mean ``mean_r tau_r`` weighs each request 1; they differ when acceptance and length are related
(a request that repeats itself is long and easy). Likewise ``alpha`` with weights ``R_r``. Rates are ``NaN`` where the
denominator is 0; bounds from :func:`spade_lib.intervals.binomial_ci` (:func:`add_rate`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from spade_lib import measures
from spade_lib.intervals import binomial_ci

__all__ = ["COUNT_COLUMNS", "rate", "add_rate", "alpha", "acceptance_per_drafted", "expected_alpha", "counts", "add_position_rates",
           "accept_length_hist", "tau_per_request", "alpha_per_request"]

COUNT_COLUMNS = ("drafted", "reached", "accepted")


def rate(k, n):
    """``k / n`` elementwise (numbers, arrays or Series), ``NaN`` where ``n <= 0``; a float for numbers."""
    kk = np.asarray(k, dtype=np.float64)
    nn = np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(nn > 0, kk / np.where(nn > 0, nn, 1.0), np.nan)
    if isinstance(k, pd.Series) or isinstance(n, pd.Series):
        return pd.Series(out, index=(k if isinstance(k, pd.Series) else n).index)
    return float(out) if out.ndim == 0 else out


def add_rate(table: pd.DataFrame, k: str, n: str, name: str, level: float = 0.95,
             method: str = "wilson") -> pd.DataFrame:
    """Add ``name = k / n`` (:func:`rate`) and its ``name_low`` / ``name_high`` binomial bounds
    (:func:`spade_lib.intervals.binomial_ci`, ``method`` Wilson or Clopper-Pearson) to ``table`` (in place)."""
    kk = table[k].to_numpy(dtype=np.float64)
    nn = table[n].to_numpy(dtype=np.float64)
    table[name] = rate(kk, nn)
    table[f"{name}_low"], table[f"{name}_high"] = binomial_ci(kk, nn, level, method)
    return table


def alpha(accepted, reached):
    """``alpha = A / R``: acceptance per judged (reached) token (module docstring)."""
    return rate(accepted, reached)


def acceptance_per_drafted(accepted, drafted):
    """``A / D``: the fraction of drafted tokens kept, unjudged ones counting as lost (module docstring)."""
    return rate(accepted, drafted)


def expected_alpha(expected, reached):
    """``sum_{reached rows} (1 - tv) / R``: alpha from the distributions, ``expected`` the sum of ``1 - tv``
    over the ``reached`` judged rows (:func:`counts`' ``expected``; module docstring)."""
    return rate(expected, reached)


def _check(frame: pd.DataFrame, columns: Sequence[str], arg: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{arg}: lacks column(s) {missing}; has {list(frame.columns)}")


def counts(trace: pd.DataFrame, by: str | Sequence[str] = ()) -> pd.DataFrame:
    """The counts every acceptance rate rests on, one row per group of ``by`` (one row in all without):
    the ``by`` columns, ``drafted`` (rows), ``reached`` and ``accepted`` (rows with the flag set) and, where the
    trace has ``tv``, ``expected`` (``sum (1 - tv)`` over the reached rows: :func:`add_position_rates`'s
    ``expected_cond`` numerator). ``trace``: one row per drafted token (the trace schema)."""
    keys = [by] if isinstance(by, str) else list(by)
    _check(trace, keys + ["reached", "accepted"], "trace")
    reached = trace["reached"].to_numpy(dtype=bool)
    cols = {"drafted": np.ones(len(trace), dtype=np.int64), "reached": reached.astype(np.int64),
            "accepted": trace["accepted"].to_numpy(dtype=bool).astype(np.int64)}
    if "tv" in trace.columns:
        cols["expected"] = np.where(reached, 1.0 - trace["tv"].to_numpy(dtype=np.float64), 0.0)
    frame = pd.DataFrame(cols, index=trace.index)
    if not keys:
        return pd.DataFrame({c: [frame[c].sum()] for c in frame.columns})
    for k in keys:
        frame[k] = trace[k]
    return frame.groupby(keys, observed=True, sort=True).sum().reset_index()


def add_position_rates(table: pd.DataFrame, level: float = 0.95, method: str = "wilson") -> pd.DataFrame:
    """Per-position acceptance from a table of per-position counts ``drafted``, ``reached``, ``accepted`` (and
    ``expected``, :func:`counts`; consumed): adds ``alpha_cond = accepted / reached`` and ``alpha_uncond =
    accepted / drafted``, each with binomial bounds (``*_low``, ``*_high``; :func:`add_rate`), and
    ``expected_cond = expected / reached`` (module docstring). In place; returns ``table``."""
    _check(table, COUNT_COLUMNS, "table")
    add_rate(table, "accepted", "reached", "alpha_cond", level, method)
    add_rate(table, "accepted", "drafted", "alpha_uncond", level, method)
    if "expected" in table.columns:
        table["expected_cond"] = expected_alpha(table.pop("expected").to_numpy(dtype=np.float64),
                                                table["reached"].to_numpy(dtype=np.float64))
    return table


def accept_length_hist(steps: pd.DataFrame, by: Sequence[str] = (), k_max: int | None = None) -> pd.DataFrame:
    """The distribution of the accepted length ``N`` per group of ``by``: ``n_accepted`` ``k = 0 .. k_max``
    (zero counts kept; default the largest ``N`` seen), ``steps`` with ``N = k``, ``fraction = P(N = k)``,
    ``survival = P(N >= k)`` and ``accept_length = k + 1`` (the tokens such a step emits).

    ``steps``: one row per verification step with ``n_accepted`` and the ``by`` columns."""
    keys = list(by)
    _check(steps, keys + ["n_accepted"], "steps")
    n = steps["n_accepted"].to_numpy(dtype=np.int64)
    k_max = (int(n.max()) if len(n) else 0) if k_max is None else int(k_max)
    if len(n) and (n.min() < 0 or n.max() > k_max):
        raise ValueError(f"steps: n_accepted must lie in 0 .. k_max = {k_max}, got {n.min()} .. {n.max()}")
    if keys:
        g = steps.groupby(keys, observed=True, sort=True)
        ids = g.ngroup().to_numpy(dtype=np.int64)
        key_rows = g.size().reset_index()[keys]
    else:
        ids = np.zeros(len(n), dtype=np.int64)
        key_rows = pd.DataFrame(index=range(1))
    n_groups = len(key_rows)
    width = k_max + 1
    hist = np.bincount(ids * width + n, minlength=n_groups * width).reshape(n_groups, width)
    frac = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1)
    out = key_rows.loc[np.repeat(np.arange(n_groups), width)].reset_index(drop=True)
    out["n_accepted"] = np.tile(np.arange(width), n_groups)
    out["steps"] = hist.ravel()
    out["fraction"] = frac.ravel()
    out["survival"] = np.cumsum(frac[:, ::-1], axis=1)[:, ::-1].ravel()
    out["accept_length"] = out["n_accepted"] + 1
    return out


def tau_per_request(frame: pd.DataFrame, request: Sequence[str] = ("question_id", "sample"), *,
                    with_bonus: bool = True) -> pd.Series:
    """``tau_r`` (:func:`spade_lib.measures.tau`) of every request ``r``, indexed by ``request``.

    ``frame`` is a run's summary (one row per generation with ``accept_lengths``, ``N + 1`` per step: every
    step) or one row per step with ``n_accepted`` (a trace's steps: those that drafted). ``mean()`` of the
    result is the per-request mean, which weighs every request 1; the pooled ``tau`` weighs a request by its
    steps (module docstring)."""
    keys = list(request)
    if "accept_lengths" in frame.columns:
        _check(frame, keys, "frame")
        steps = frame["accept_lengths"].map(len).astype(np.float64)
        accepted = frame["accept_lengths"].map(lambda a: float((np.asarray(a, dtype=np.float64) - 1.0).sum()))
        per = pd.DataFrame({"accepted": accepted, "steps": steps}).join(frame[keys]).groupby(keys, sort=True).sum()
    else:
        _check(frame, keys + ["n_accepted"], "frame")
        per = frame.groupby(keys, observed=True, sort=True)["n_accepted"].agg(accepted="sum", steps="size")
    return pd.Series(measures.tau(per["accepted"].to_numpy(np.float64), per["steps"].to_numpy(np.float64),
                                  with_bonus=with_bonus), index=per.index, name="tau")


def alpha_per_request(trace: pd.DataFrame, request: Sequence[str] = ("prompt_id", "sample")) -> pd.Series:
    """``alpha_r = A_r / R_r`` (:func:`alpha`) of every request ``r`` of a trace, indexed by ``request``; its
    ``mean()`` is the per-request mean (module docstring)."""
    c = counts(trace, list(request)).set_index(list(request))
    return pd.Series(alpha(c["accepted"].to_numpy(), c["reached"].to_numpy()), index=c.index, name="alpha")
