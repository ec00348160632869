"""M2 batch figure: throughput and speedup of speculative decoding against batch size.

A thin function over the table of :func:`spade_lib.decoding.studies.batch_study.batch_study`; saving is the caller's
``save_figure(fig, "m2_speedup_vs_batch")``. Intervals are optional: a column ``<value>_low`` with its
``<value>_high`` (the names of :mod:`spade_lib.runs.metrics`, e.g. ``speedup_low`` / ``speedup_high``, or
``spec_tps_low`` / ``spec_tps_high``) is drawn as error bars on ``<value>``; a table without them (one timed
batch per size, as today) draws points alone.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from spade_lib.plots.style import DOUBLE_COLUMN

_COLUMNS = ("temperature", "batch_size", "ar_tps", "spec_tps", "speedup", "predicted")
_WITH_INTERVALS = ("ar_tps", "spec_tps", "speedup")


def _interval(sub: pd.DataFrame, value: str) -> np.ndarray | None:
    """Asymmetric error bar lengths of ``value`` from ``value_low`` / ``value_high``, or None without them."""
    if f"{value}_low" not in sub.columns:
        return None
    c, lo, hi = (sub[k].to_numpy(dtype=np.float64) for k in (value, f"{value}_low", f"{value}_high"))
    return np.vstack([np.maximum(c - lo, 0.0), np.maximum(hi - c, 0.0)])


def plot_speedup_vs_batch(study: pd.DataFrame) -> Figure:
    """Left: throughput (all rows' new tokens per second) of batched autoregressive (dashed) and
    batched speculative (solid) decoding against batch size, one colour per temperature. Right: the
    measured speedup (solid) and the prediction ``E[tokens] / (gamma c(B) + r(B))`` (dotted), with the
    break-even line at 1. Where the table has ``speedup_low`` / ``speedup_high`` (or the same for
    ``spec_tps`` / ``ar_tps``) the measurement carries them as error bars (module docstring)."""
    missing = [c for c in _COLUMNS if c not in study.columns]
    if missing:
        raise ValueError(f"study: table is missing column(s) {missing}")
    if study.empty:
        raise ValueError("study: table is empty")
    for v in _WITH_INTERVALS:
        have = [f"{v}_{end}" in study.columns for end in ("low", "high")]
        if any(have) and not all(have):
            raise ValueError(f"study: an interval needs both {v}_low and {v}_high, got only one")
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(DOUBLE_COLUMN, DOUBLE_COLUMN * 0.45), constrained_layout=True)
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0", "C1", "C2"])
    for i, (T, sub) in enumerate(study.sort_values("batch_size").groupby("temperature", sort=True)):
        color = cycle[i % len(cycle)]
        label = "greedy" if T == 0 else f"T = {T:g}"
        B = sub["batch_size"].to_numpy()
        ax_t.errorbar(B, sub["spec_tps"], yerr=_interval(sub, "spec_tps"), fmt="-o", color=color, ms=3, capsize=2,
                      label=f"speculative, {label}")
        ax_t.errorbar(B, sub["ar_tps"], yerr=_interval(sub, "ar_tps"), fmt="--s", color=color, ms=3, capsize=2,
                      label=f"autoregressive, {label}")
        speedup_err = _interval(sub, "speedup")
        ax_s.errorbar(B, sub["speedup"], yerr=speedup_err, fmt="-o", color=color, ms=3, capsize=2,
                      label=f"measured{' (95 % interval)' if speedup_err is not None else ''}, {label}")
        ax_s.plot(B, sub["predicted"], ":", color=color, label=f"predicted, {label}")
    sizes = np.sort(study["batch_size"].unique())
    for ax in (ax_t, ax_s):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(int(b)) for b in sizes])
        ax.set_xlabel("batch size B")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("throughput [new tokens / s]")
    ax_s.axhline(1.0, color="0.5", lw=0.8)
    ax_s.set_ylabel("speedup over AR at the same B")
    ax_s.set_ylim(bottom=0)
    for ax in (ax_t, ax_s):
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False, fontsize="x-small")
    return fig
