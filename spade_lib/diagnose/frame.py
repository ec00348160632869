"""Trace inputs of the M3 diagnostics: load, check columns, label and combine runs.

Every table in :mod:`spade_lib.diagnose` takes a token-level trace (one row per drafted token, the
schema of :mod:`spade_lib.runs.trace`) as a ``pandas.DataFrame`` or a run directory, and an optional
``by`` of extra grouping columns (e.g. ``"category"``, or the run label that :func:`combine_runs`
adds), so one call compares several runs or categories side by side.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

TraceLike = pd.DataFrame | str | os.PathLike
By = str | Sequence[str] | None
# Probability columns a diagnostic may read: a NaN there is a broken trace, not a rejection
# (``uniform`` is not one of them: it is NaN by design in deterministic modes).
PROB_COLUMNS = ("p_x", "q_x", "accept_prob", "tv", "p_margin", "q_top_prob", "p_x_raw", "q_x_raw", "tv_raw")


def as_trace(trace: TraceLike, columns: Sequence[str] = ()) -> pd.DataFrame:
    """``trace`` as a DataFrame (reading a run directory or shard with :func:`spade_lib.runs.trace.read_trace`),
    checked to hold ``columns``, none of which in :data:`PROB_COLUMNS` may hold a NaN."""
    from spade_lib.runs.trace import as_frame

    trace = as_frame(trace, columns)
    for c in dict.fromkeys(columns):
        if c in PROB_COLUMNS:
            bad = int(trace[c].isna().sum())
            if bad:
                raise ValueError(f"trace: column {c!r} has {bad} NaN row(s) of {len(trace)}; "
                                 "a probability must be a number (the trace is broken, not rejected)")
    return trace


def group_keys(by: By, trace: pd.DataFrame | None = None) -> list[str]:
    """``by`` as a list of column names (``None`` -> ``[]``), checked against ``trace`` if given."""
    if by is None:
        keys: list[str] = []
    elif isinstance(by, str):
        keys = [by]
    else:
        keys = list(by)
    if not all(isinstance(k, str) for k in keys):
        raise ValueError(f"by must be a column name or a list of column names, got {by!r}")
    if trace is not None:
        missing = [k for k in keys if k not in trace.columns]
        if missing:
            raise ValueError(f"by names column(s) {missing} that the trace does not have")
    return keys


def step_rows(trace: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """One row per verification step, with ``columns`` only: the ``pos == 0`` row of each block
    (step-level columns such as ``n_accepted``, ``gamma`` and the timings repeat on every row)."""
    return trace[list(dict.fromkeys(columns))][trace["pos"].to_numpy() == 0]


def categorize(trace: pd.DataFrame, columns: Sequence[str] = ("prompt_id", "category")) -> pd.DataFrame:
    """``trace`` with its string ``columns`` (those present) as categoricals, a cheap shallow copy.

    Grouping by a categorical costs nothing, by a string column one hash pass per table: do this once
    before computing many tables of a large trace (:func:`spade_lib.diagnose.all_tables` does).
    """
    todo = {c: trace[c].astype("category") for c in columns
            if c in trace.columns and not isinstance(trace[c].dtype, pd.CategoricalDtype)}
    return trace.assign(**todo) if todo else trace


def combine_runs(runs: Mapping[str, TraceLike], key: str = "run") -> pd.DataFrame:
    """Concatenate several traces, labelled by an ordered categorical column ``key``.

    ``combine_runs({"distilled": t1, "ngram": t2}, key="draft")`` gives one frame to pass with
    ``by="draft"`` to every table.
    """
    if not runs:
        raise ValueError("runs must name at least one trace")
    frames = []
    for label, trace in runs.items():
        df = as_trace(trace)
        if key in df.columns:
            raise ValueError(f"key {key!r} is already a column of run {label!r}")
        frames.append(df.assign(**{key: label}))
    out = pd.concat(frames, ignore_index=True)
    out[key] = pd.Categorical(out[key], categories=list(runs))
    return out


@dataclass(frozen=True, eq=False)
class Groups:
    """Integer group ids of the selected rows of a trace, for ``np.bincount`` aggregation.

    ``rows`` are the selected row positions (``None``: all ``n_rows`` rows), ``ids[j]`` the group
    (``0 .. n-1``) of row ``rows[j]``, and ``keys`` one row per group present (sorted by the key
    columns; categorical keys in category order). Build with :meth:`of` (from trace columns) or
    :meth:`refine` (split further).

    This is the one private fast path of :mod:`spade_lib.diagnose` besides the sort of
    :func:`spade_lib.diagnose.stats.grouped_compare`, kept because ``benchmarks/bench_diagnose.py``'s
    target (every table of 10 M rows in <= 10 s) needs it: sums and counts cost one ``bincount``
    each. Measured on 2 M synthetic rows (one run, shared 2-core machine): the same per
    ``(category, pos)`` sums and counts with ``df[mask].groupby(keys, observed=True)`` took 6.6x as
    long as ``Groups.of(...).sum(...)``.
    """

    n_rows: int                 # rows of the trace
    rows: np.ndarray | None     # selected row positions (None: all)
    ids: np.ndarray             # group id of each selected row
    n: int                      # number of groups present
    keys: pd.DataFrame          # one row per group: its key values

    @classmethod
    def of(cls, trace: pd.DataFrame, keys: Sequence[str], mask: np.ndarray | None = None,
           extra: Mapping[str, np.ndarray] | None = None) -> Groups:
        """Groups of ``trace`` by the columns ``keys`` over the rows where ``mask`` holds (all rows when
        ``None``); ``extra`` supplies key columns as arrays (one value per trace row)."""
        n_rows = len(trace)
        rows = None if mask is None else np.flatnonzero(np.asarray(mask, dtype=bool))
        gid = np.zeros(n_rows if rows is None else len(rows), dtype=np.int64)
        sizes, uniques = [], []
        for k in keys:
            codes, u = _codes(extra[k] if extra is not None and k in extra else trace[k])
            gid *= len(u)
            gid += codes if rows is None else codes[rows]
            sizes.append(len(u))
            uniques.append(u)
        ids, present = _compress(gid, int(np.prod(sizes, dtype=np.float64)) if sizes else 1)
        cols, rest = {}, present
        for name, size, u in reversed(list(zip(keys, sizes, uniques))):
            cols[name] = u.take(rest % size)
            rest = rest // size
        return cls(n_rows, rows, ids, len(present), pd.DataFrame({k: cols[k] for k in keys}, index=range(len(present))))

    def take(self, values) -> np.ndarray:
        """``values`` (one per trace row, or already one per selected row) at the selected rows."""
        v = values.to_numpy() if isinstance(values, pd.Series) else np.asarray(values)
        if self.rows is None or len(v) == len(self.ids) and len(v) != self.n_rows:
            return v
        if len(v) != self.n_rows:
            raise ValueError(f"values have {len(v)} entries; expected {self.n_rows} or {len(self.ids)}")
        return v[self.rows]

    def refine(self, name: str, codes: np.ndarray, labels: Sequence) -> Groups:
        """These groups split further by ``codes`` (one per trace row or selected row,
        ``0 .. len(labels) - 1``; negative drops the row), with a new last key column ``name``."""
        size = len(labels)
        codes = self.take(codes).astype(np.int64, copy=False)
        keep = codes >= 0
        all_kept = bool(keep.all())
        base_rows = np.arange(self.n_rows) if self.rows is None else self.rows
        rows = self.rows if all_kept else base_rows[keep]
        gid = self.ids * size + codes if all_kept else self.ids[keep] * size + codes[keep]
        ids, present = _compress(gid, self.n * size)
        keys = self.keys.take(present // size).reset_index(drop=True)
        keys[name] = np.asarray(labels)[present % size]
        return Groups(self.n_rows, rows, ids, len(present), keys)

    def binned(self, x: np.ndarray, edges: np.ndarray, column: str, value: str) -> tuple[Groups, pd.DataFrame]:
        """These groups split by the bin of ``x`` (per selected row) under ``edges``, and their table:
        the keys, ``column=value`` after them, then ``bin``, ``bin_low``, ``bin_high`` and ``n``."""
        from spade_lib.diagnose.stats import digitize  # stats is the lower layer; import on use

        g = self.refine("bin", digitize(x, edges), np.arange(len(edges) - 1))
        t = g.frame()
        n_keys = len(t.columns) - 1
        t.insert(n_keys, column, value)
        k = t["bin"].to_numpy()
        t.insert(n_keys + 2, "bin_low", edges[k])
        t.insert(n_keys + 3, "bin_high", edges[k + 1])
        t["n"] = g.sum()
        return g, t

    def sum(self, values=None) -> np.ndarray:
        """Per-group sum of ``values`` (one per trace row or per selected row); row counts if ``None``."""
        if values is None:
            return np.bincount(self.ids, minlength=self.n).astype(np.int64)
        w = self.take(values)
        return np.bincount(self.ids, weights=w if w.dtype == np.float64 else w.astype(np.float64), minlength=self.n)

    def frame(self) -> pd.DataFrame:
        """A copy of the group keys, to which aggregates are added as columns."""
        return self.keys.copy()


def _compress(gid: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray]:
    """Combined codes ``gid`` (``0 .. total-1``) as ids ``0 .. n-1`` of the groups present, and the
    present codes (sorted)."""
    if total <= max(4 * len(gid), 1 << 20):
        counts = np.bincount(gid, minlength=total)
        present = np.flatnonzero(counts)
        if len(present) == total:
            ids = gid
        else:
            remap = np.zeros(total, dtype=np.int64)
            remap[present] = np.arange(len(present))
            ids = remap[gid]
    else:
        present, ids = np.unique(gid, return_inverse=True)
    return ids.astype(np.intp, copy=False), present


def _codes(values) -> tuple[np.ndarray, pd.Index]:
    """Integer codes ``0..k-1`` and the sorted distinct values (categorical: its categories in order)."""
    dtype = getattr(values, "dtype", None)
    if isinstance(dtype, pd.CategoricalDtype):
        cat = values.array if isinstance(values, pd.Series) else values
        codes = np.asarray(cat.codes)
        if len(codes) and codes.min() < 0:
            raise ValueError("grouping columns must not contain missing values")
        return codes, pd.CategoricalIndex(cat.categories, categories=cat.categories, ordered=cat.ordered)
    arr = np.asarray(values) if isinstance(dtype, np.dtype) or dtype is None else None
    if arr is not None and arr.dtype.kind in "iub" and len(arr):
        lo, hi = int(arr.min()), int(arr.max())
        if hi - lo < max(4 * len(arr), 1 << 16):
            shifted = arr.astype(np.int64) - lo if lo != 0 or arr.dtype.kind == "b" else arr
            present = np.flatnonzero(np.bincount(shifted, minlength=hi - lo + 1))
            if len(present) == hi - lo + 1:
                return shifted, pd.Index((present + lo).astype(arr.dtype))
            remap = np.zeros(hi - lo + 1, dtype=np.int64)
            remap[present] = np.arange(len(present))
            return remap[shifted], pd.Index((present + lo).astype(arr.dtype))
    codes, uniques = pd.factorize(values, sort=True, use_na_sentinel=True)
    if len(codes) and codes.min() < 0:
        raise ValueError("grouping columns must not contain missing values")
    return codes, pd.Index(uniques)
