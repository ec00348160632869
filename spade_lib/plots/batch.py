"""M2 batch figure: throughput and speedup of speculative decoding against batch size.

A thin function over the table of :func:`spade_lib.decoding.batch_study.batch_study`; saving is the caller's
``save_figure(fig, "m2_speedup_vs_batch")``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from spade_lib.plots.style import DOUBLE_COLUMN

_COLUMNS = ("temperature", "batch_size", "ar_tps", "spec_tps", "speedup", "predicted")


def plot_speedup_vs_batch(study: pd.DataFrame) -> Figure:
    """Left: throughput (all rows' new tokens per second) of batched autoregressive (dashed) and
    batched speculative (solid) decoding against batch size, one colour per temperature. Right: the
    measured speedup (solid) and the prediction ``E[tokens] / (gamma c(B) + r(B))`` (dotted), with the
    break-even line at 1."""
    missing = [c for c in _COLUMNS if c not in study.columns]
    if missing:
        raise ValueError(f"study: table is missing column(s) {missing}")
    if study.empty:
        raise ValueError("study: table is empty")
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(DOUBLE_COLUMN, DOUBLE_COLUMN * 0.45), constrained_layout=True)
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0", "C1", "C2"])
    for i, (T, sub) in enumerate(study.sort_values("batch_size").groupby("temperature", sort=True)):
        color = cycle[i % len(cycle)]
        label = "greedy" if T == 0 else f"T = {T:g}"
        B = sub["batch_size"].to_numpy()
        ax_t.plot(B, sub["spec_tps"], "-o", color=color, ms=3, label=f"speculative, {label}")
        ax_t.plot(B, sub["ar_tps"], "--s", color=color, ms=3, label=f"autoregressive, {label}")
        ax_s.plot(B, sub["speedup"], "-o", color=color, ms=3, label=f"measured, {label}")
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
