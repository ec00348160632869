"""Trace inputs of the M3 diagnostics: load, check columns, label and combine runs.

Every table in :mod:`spade_lib.diagnose` takes a token-level trace (one row per drafted token, the
schema of :mod:`spade_lib.trace`) as a ``pandas.DataFrame`` or a run directory, and an optional
``by`` of extra grouping columns (e.g. ``"category"``, or the run label that :func:`combine_runs`
adds), so one call compares several runs or categories side by side.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

TraceLike = pd.DataFrame | str | os.PathLike
By = str | Sequence[str] | None


def as_trace(trace: TraceLike, columns: Sequence[str] = ()) -> pd.DataFrame:
    """``trace`` as a DataFrame (reading a run directory or shard with :func:`spade_lib.trace.read_trace`),
    checked to hold ``columns``."""
    if isinstance(trace, (str, os.PathLike)):
        from spade_lib.trace import read_trace

        trace = read_trace(trace)
    if not isinstance(trace, pd.DataFrame):
        raise ValueError(f"trace must be a DataFrame or a run directory, got {type(trace).__name__}")
    missing = [c for c in columns if c not in trace.columns]
    if missing:
        raise ValueError(f"trace is missing column(s) {missing}; see spade_lib.trace.TRACE_SCHEMA")
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


def step_rows(trace: pd.DataFrame) -> pd.DataFrame:
    """One row per verification step: the ``pos == 0`` row of each block (step-level columns such as
    ``n_accepted``, ``gamma`` and the timings are repeated on every row of a block)."""
    return trace[trace["pos"].to_numpy() == 0]


def reached_rows(trace: pd.DataFrame) -> pd.DataFrame:
    """Rows the verifier judged (``reached``): the population of every conditional acceptance."""
    return trace[trace["reached"].to_numpy(dtype=bool)]


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


class Groups:
    """Integer group ids of trace rows for a list of key columns, for ``np.bincount`` aggregation.

    ``ids[i]`` is the group of row ``i`` (``-1`` for rows outside ``mask``); ``keys`` holds one row
    per group present (sorted by the key columns; categorical keys in category order). Sums, means and
    counts over 10 M rows then cost one ``bincount`` each instead of a pandas groupby.
    """

    def __init__(self, trace: pd.DataFrame, keys: Sequence[str], mask: np.ndarray | None = None,
                 extra: Mapping[str, np.ndarray] | None = None):
        n = len(trace)
        columns: list[tuple[str, np.ndarray, pd.Index]] = []
        for k in keys:
            values = extra[k] if extra is not None and k in extra else trace[k]
            codes, uniques = _codes(values)
            columns.append((k, codes, uniques))
        sel = np.ones(n, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
        gid = np.zeros(n, dtype=np.int64)
        sizes = [len(u) for _, _, u in columns]
        total = int(np.prod(sizes, dtype=np.float64)) if sizes else 1
        for (_, codes, u), size in zip(columns, sizes):
            gid = gid * size + codes
        if total <= max(4 * n, 1 << 20):
            present = np.flatnonzero(np.bincount(gid[sel], minlength=total)) if n else np.zeros(0, np.int64)
            remap = np.full(total, -1, dtype=np.int64)
            remap[present] = np.arange(len(present))
            ids = remap[gid]
        else:
            present, inverse = np.unique(gid[sel], return_inverse=True)
            ids = np.full(n, -1, dtype=np.int64)
            ids[sel] = inverse
        ids[~sel] = -1
        self.ids = ids
        self.n = len(present)
        key_cols = {}
        rest = present
        for (name, _, u), size in reversed(list(zip(columns, sizes))):
            key_cols[name] = u.take(rest % size) if len(u) else u[:0]
            rest = rest // size
        self.keys = pd.DataFrame({name: np.asarray(key_cols[name]) if not isinstance(
            key_cols[name].dtype, pd.CategoricalDtype) else pd.Categorical(key_cols[name])
            for name, _, _ in columns}, index=range(self.n))
        self._bins = np.where(ids >= 0, ids, self.n)  # rows outside the mask go to a spare bin

    def sum(self, values: np.ndarray | None = None) -> np.ndarray:
        """Per-group sum of ``values`` (count of rows when ``None``)."""
        if values is None:
            return np.bincount(self._bins, minlength=self.n + 1)[: self.n].astype(np.int64)
        w = np.asarray(values)
        if w.dtype != np.float64:
            w = w.astype(np.float64)
        return np.bincount(self._bins, weights=w, minlength=self.n + 1)[: self.n]

    def frame(self) -> pd.DataFrame:
        """A copy of the group keys, to which aggregates are added as columns."""
        return self.keys.copy()


def _codes(values) -> tuple[np.ndarray, pd.Index]:
    """Integer codes ``0..k-1`` and the sorted distinct values (categorical: its categories in order)."""
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype):
        cat = values.array if isinstance(values, pd.Series) else values
        codes = np.asarray(cat.codes, dtype=np.int64)
        if (codes < 0).any():
            raise ValueError("grouping columns must not contain missing values")
        return codes, pd.CategoricalIndex(cat.categories, categories=cat.categories, ordered=cat.ordered)
    dtype = getattr(values, "dtype", None)
    arr = np.asarray(values) if isinstance(dtype, np.dtype) or dtype is None else None
    if arr is not None and arr.dtype.kind in "iub" and len(arr):
        lo, hi = int(arr.min()), int(arr.max())
        if hi - lo < max(4 * len(arr), 1 << 16):
            present = np.flatnonzero(np.bincount(arr.astype(np.int64) - lo, minlength=hi - lo + 1))
            remap = np.zeros(hi - lo + 1, dtype=np.int64)
            remap[present] = np.arange(len(present))
            return remap[arr.astype(np.int64) - lo], pd.Index((present + lo).astype(arr.dtype))
    codes, uniques = pd.factorize(values, sort=True, use_na_sentinel=True)
    if (codes < 0).any():
        raise ValueError("grouping columns must not contain missing values")
    return codes.astype(np.int64), pd.Index(uniques)
