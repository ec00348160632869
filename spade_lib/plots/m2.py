"""M2 figures: measured speedups with their intervals, and the predictions they are compared with.

Each function takes a table of :func:`spade_lib.runs.protocol.speedup_table` rows (or a per-category
table with the same columns) and returns the ``Figure``; the caller saves it under a name of its own
(``spade_lib.experiment.figure_name``). Colour is the draft (``spade_lib.plots.palette``); a
temperature is a marker fill and line style; every measured speedup is drawn with its bootstrap
interval (``speedup_low`` .. ``speedup_high``), and series at the same ``gamma`` are dodged
sideways so no marker hides another. A cost-model prediction is a hollow diamond (``PREDICTION_STYLE``)
in the colour of its measurement, never a bar-like ``_`` that reads as an interval's cap.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from spade_lib.plots.counts import bars
from spade_lib.plots.m3 import _check  # one table check for every figure function
from spade_lib.plots.palette import colors_for, legend_outside, temperature_style
from spade_lib.plots.style import DOUBLE_COLUMN, SINGLE_COLUMN

SERIES_MARKERS = {"spade": "o", "hf_assisted": "*", "ngram": "^"}
PREDICTION_STYLE = {"marker": "D", "ms": 4.5, "mfc": "none", "mew": 0.9}  # hollow diamond: not an error-bar cap
PREDICTION_LABEL = "cost-model prediction"


def _series_name(method: str, draft: str) -> str:
    if method == "hf_assisted":
        return "hf_assisted"
    return draft


def _palette(series) -> dict[str, str]:
    """Series name -> colour, distinct within the figure (:func:`spade_lib.plots.palette.colors_for`)."""
    names = list(dict.fromkeys(series))
    return dict(zip(names, colors_for([str(n) for n in names])))


def _yerr(center, low, high) -> np.ndarray:
    c, lo, hi = (np.asarray(v, dtype=np.float64) for v in (center, low, high))
    return np.vstack([np.maximum(c - lo, 0.0), np.maximum(hi - c, 0.0)])


def _measured(s: pd.DataFrame, series: str) -> tuple[pd.Series, pd.Series, pd.Series]:
    """The speedup drawn for a series and its interval: HF assisted against plain HF generate when the
    table holds ``speedup_vs_hf`` (its own baseline), every other series against AR."""
    if series == "hf_assisted" and "speedup_vs_hf" in s.columns and s["speedup_vs_hf"].notna().all():
        y = s["speedup_vs_hf"]
        return y, s.get("speedup_vs_hf_low", y), s.get("speedup_vs_hf_high", y)
    return s["speedup"], s["speedup_low"], s["speedup_high"]


def _series_label(series: str) -> str:
    return f"{series}{' (vs HF generate)' if series == 'hf_assisted' else ' (control)' if series == 'null' else ''}"


def speedup_vs_gamma(table: pd.DataFrame, *, ylabel: str = "speedup over autoregressive") -> Figure:
    """Measured speedup (points, bootstrap intervals) and the cost-model prediction from the measured
    alpha, c, r and drafted counts (``predicted``: a hollow diamond of the same colour, legend entry
    "cost-model prediction"), one series per (drafter, temperature). HF assisted generation is drawn
    against plain HF generate when the table holds ``speedup_vs_hf`` (its own baseline), otherwise
    against AR.

    Two forms. A sweep (some series measured at several ``gamma``): x is the draft length, a series is
    a line, its predictions dotted. No sweep (every series at one ``gamma``, as in a single-gamma profile
    and the README teaser): x is categorical, one labelled slot per configuration and temperature
    (greedy ones first), the draft length in the slot's label or, when all share it, in the axis label."""
    _check(table, ["method", "draft", "gamma", "T", "speedup", "speedup_low", "speedup_high"], "speedup_vs_gamma")
    t = table[table["method"].isin(["spade", "hf_assisted"])].copy()
    if t.empty:
        raise ValueError("speedup_vs_gamma: no SPADE or HF assisted rows")
    t["series"] = [_series_name(m, d) for m, d in zip(t["method"], t["draft"])]
    keys = list(dict.fromkeys(zip(t["series"], t["T"])))
    palette = _palette(t["series"])
    sweep = t.groupby(["series", "T"], sort=False)["gamma"].nunique().max() > 1
    fig, ax = plt.subplots(figsize=(SINGLE_COLUMN, 2.4))
    predicted_drawn = False
    if sweep:
        width = 0.5 / max(len(keys), 1)
        slots = [(j - (len(keys) - 1) / 2) * width for j in range(len(keys))]
    else:
        keys = sorted(keys, key=lambda k: (k[1], keys.index(k)))  # by temperature, then as the table lists them
        slots = list(range(len(keys)))
    for j, (series, T) in enumerate(keys):
        s = t[(t["series"] == series) & (t["T"] == T)].sort_values("gamma")
        x = (s["gamma"].to_numpy(dtype=np.float64) + slots[j]) if sweep else np.full(len(s), float(slots[j]))
        style = temperature_style(T)
        color = palette[series]
        y, lo, hi = _measured(s, series)
        label = f"{_series_label(series)}, T={T:g}" if sweep else None
        ax.errorbar(x, y, yerr=_yerr(y, lo, hi), marker=SERIES_MARKERS.get(series, "o"), color=color, capsize=1.5,
                    ms=4, lw=0.9, label=label, **(style if sweep else {**style, "linestyle": "none"}))
        if "predicted" in s.columns and s["predicted"].notna().any() and series != "hf_assisted":
            ax.plot(x if sweep else x + 0.25, s["predicted"], linestyle=":" if sweep else "none", color=color,
                    mec=color, lw=0.8, **PREDICTION_STYLE)  # beside its measurement in a slot, not on its cap
            predicted_drawn = True
    ax.axhline(1.0, color="0.5", lw=0.6)
    ax.set_ylabel(ylabel)
    if sweep:
        ax.set_xlabel(r"draft length $\gamma$")
        ax.set_xticks(sorted(set(int(g) for g in t["gamma"])))
    else:
        gammas = sorted(set(int(g) for g in t["gamma"]))
        ticks = []
        for series, T in keys:
            g = int(t.loc[(t["series"] == series) & (t["T"] == T), "gamma"].iloc[0])
            ticks.append(f"{_series_label(series)}, T={T:g}" + (rf", $\gamma$={g}" if len(gammas) > 1 else ""))
        ax.set_xticks(slots, ticks, fontsize=5.5, rotation=30, ha="right", rotation_mode="anchor")
        ax.set_xlim(-0.6, len(keys) - 0.4)
        ax.set_xlabel("configuration" + (rf" (draft length $\gamma$ = {gammas[0]})" if len(gammas) == 1 else ""))
        ax.errorbar([], [], yerr=[], marker="o", color="0.3", capsize=1.5, ms=4, lw=0.9, linestyle="none",
                    label="measured (95 % interval)")
    if predicted_drawn:  # one legend entry for every prediction: same colour as its measurement
        ax.plot([], [], linestyle="none", color="0.3", mec="0.3", label=PREDICTION_LABEL, **PREDICTION_STYLE)
    legend_outside(ax)
    return fig


def speedup_by_category(table: pd.DataFrame, categories: Sequence[str] | None = None, *,
                        count: str | None = "generations") -> Figure:
    """Speedup per category (bars with bootstrap intervals), one colour per drafter, one panel per
    temperature; a table with ``category``, ``series`` (or ``draft``), ``T`` and the speedup columns. Each
    bar is labelled with its ``count`` column (default ``generations``, the timed generations its
    speedup is the ratio over; ``None``: no labels).

    With one category (``categories``, else the table's, e.g. a HumanEval-only suite) there is nothing to
    split by: one panel, one slot per temperature, titled with the category -- the same bars as the
    panels would show, without a category axis of one tick per panel."""
    _check(table, ["category", "T", "speedup", "speedup_low", "speedup_high"], "speedup_by_category")
    if count is not None and count not in table.columns:
        raise ValueError(f"count: {count!r} is not a column of the table (None for no count labels)")
    t = table.copy()
    if "series" not in t.columns:
        _check(t, ["draft"], "speedup_by_category")
        t["series"] = t["draft"]
    cats = list(categories) if categories is not None else list(dict.fromkeys(t["category"]))
    if not cats:
        raise ValueError("categories: empty")
    temps = sorted(set(t["T"]))
    series = list(dict.fromkeys(t["series"]))
    palette = _palette(series)
    width = 0.8 / len(series)
    if len(cats) == 1:  # one panel: temperatures side by side
        fig, ax = plt.subplots(figsize=(SINGLE_COLUMN, 2.2))
        panels = [(ax, t[t["category"] == cats[0]], "T", temps)]
        ax.set_title(f"category: {str(cats[0]).replace('_', ' ')} (the suite's only one)", fontsize=7)
    else:
        fig, axes = plt.subplots(1, len(temps), figsize=(DOUBLE_COLUMN * 0.8, 2.2), squeeze=False, sharey=True)
        panels = [(ax, t[t["T"] == T], "category", cats) for ax, T in zip(axes[0], temps)]
        for ax, T in zip(axes[0], temps):
            ax.set_title(f"T = {T:g}")
    for ax, sub, key, slots in panels:
        for i, name in enumerate(series):
            s = sub[sub["series"] == name].set_index(key).reindex(slots)
            x = np.arange(len(slots)) + (i - (len(series) - 1) / 2) * width
            bars(ax, x, s["speedup"], width, palette[name], s[count] if count is not None else [""] * len(s),
                 top=s["speedup_high"], label=name, yerr=_yerr(s["speedup"], s["speedup_low"], s["speedup_high"]),
                 capsize=1.5, error_kw={"lw": 0.7})
        ax.axhline(1.0, color="0.5", lw=0.6)
        names = [f"T = {v:g}" for v in slots] if key == "T" else [str(c).replace("_", " ") for c in slots]
        ax.set_xticks(np.arange(len(slots)), names, fontsize=6, rotation=20 if key == "category" else 0)
    axes = [p[0] for p in panels]
    axes[0].set_ylabel("speedup over autoregressive" + (f"\n(labels: {count})" if count is not None else ""))
    fig.tight_layout()
    legend_outside(axes[-1])
    return fig


def predicted_vs_measured(table: pd.DataFrame, *, predicted: str = "predicted") -> Figure:
    """Each run's prediction (x) against its measured speedup (y, bootstrap interval), colour by
    drafter, fill by temperature, with the diagonal; points below it are the per-step overheads the
    model leaves out."""
    _check(table, [predicted, "speedup", "speedup_low", "speedup_high", "T"], "predicted_vs_measured")
    t = table[table[predicted].notna()].copy()
    if t.empty:
        raise ValueError("predicted_vs_measured: no row has a prediction")
    if "series" not in t.columns:
        t["series"] = t["draft"]
    fig, ax = plt.subplots(figsize=(SINGLE_COLUMN, 2.6))
    palette = _palette(t["series"])
    for (name, T), s in t.groupby(["series", "T"], sort=False):
        ax.errorbar(s[predicted], s["speedup"], yerr=_yerr(s["speedup"], s["speedup_low"], s["speedup_high"]),
                    fmt=SERIES_MARKERS.get(name, "o"), color=palette[name], capsize=1.5, ms=4,
                    fillstyle=temperature_style(T)["fillstyle"], label=f"{name}, T={T:g}")
    top = float(np.nanmax(np.r_[t[predicted], t["speedup_high"]])) * 1.08
    lim = [0, max(1.5, top)]
    ax.plot(lim, lim, color="0.5", lw=0.6, label="measured = predicted")
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_xlabel("predicted speedup (measured alpha, c, r)")
    ax.set_ylabel("measured speedup")
    legend_outside(ax)
    return fig


def early_exit_alpha(table: pd.DataFrame, *, n_layers: int | None = None) -> Figure:
    """An untrained early-exit draft, layer by layer: acceptance at T = 0 (top-1 agreement, solid) and at
    T = 1 (dashed) of the target's own head on exit layer ``k``, and the cost ratio ``c_k`` (dotted); a
    :func:`spade_lib.zoo.early_exit.early_exit_sweep` table (``layer``, ``alpha_T0``, ``alpha_T1``, ``c``;
    ``n_positions``, when present, in the title). Layers are integers on the axis (``n_layers``, the
    target's, in the axis label when given)."""
    _check(table, ["layer", "alpha_T0", "alpha_T1", "c"], "early_exit_alpha")
    if n_layers is not None and (isinstance(n_layers, bool) or not isinstance(n_layers, (int, np.integer))
                                 or n_layers < 1):
        raise ValueError(f"n_layers: must be an integer >= 1, got {n_layers!r}")
    t = table.sort_values("layer")
    fig, ax = plt.subplots(figsize=(SINGLE_COLUMN, SINGLE_COLUMN * 0.75))
    ax.plot(t["layer"], t["alpha_T0"], "o-", ms=3, label=r"$\alpha$, T = 0 (top-1 agreement)")
    ax.plot(t["layer"], t["alpha_T1"], "s--", ms=3, label=r"$\alpha$, T = 1")
    ax.plot(t["layer"], t["c"], ":", color="0.4", label="cost ratio $c_k$")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="exit layer k" + (f" (of {int(n_layers)})" if n_layers is not None else ""),
           ylabel="acceptance / cost", ylim=(0, 1.02))
    if "n_positions" in t.columns and t["n_positions"].notna().any():
        ax.set_title(f"n = {int(t['n_positions'].max()):,} teacher-forced positions", fontsize=7)
    legend_outside(ax)
    return fig
