"""Trace inputs of the M3 diagnostics: load, check columns, label and combine runs.

Every table in :mod:`spade_lib.diagnose` takes a token-level trace (one row per drafted token, the
schema of :mod:`spade_lib.trace`) as a ``pandas.DataFrame`` or a run directory, and an optional
``by`` of extra grouping columns (e.g. ``"category"``, or the run label that :func:`combine_runs`
adds), so one call compares several runs or categories side by side.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

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
