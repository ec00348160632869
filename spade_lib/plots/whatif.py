"""What-if figures (notebook 05): thin functions over the tables of :mod:`spade_lib.whatif`.

Each function takes its tables, draws them and returns the ``Figure``; saving is the caller's
``save_figure(fig, "m3_whatif_<name>")``. Nothing is computed here beyond reshaping, and every bar and
measured point carries its count (:mod:`spade_lib.plots.counts`):

- :func:`predicted_tau`: ``tau`` and speedup against ``gamma``, predicted from teacher-forced alphas
  (:func:`spade_lib.whatif.align.predict`, one line per method) beside the measured sweep (points with
  intervals; ``tau`` points labelled with the full-length blocks they average);
- :func:`rules_replayed`: ``tau_expected`` of every acceptance rule replayed on one trace, per category
  (:func:`spade_lib.whatif.replay.counterfactual` with ``by=["category"]``), bars labelled with their steps;
- :func:`stop_frontier`: tokens per step against the cost per step ``g c + r(g) + o`` of every stop rule
  replayed on a ``max_gamma`` trace (:class:`spade_lib.whatif.stoprules.StopStudy`'s ``front``), one panel
  per temperature titled with the steps replayed, and the line of the best speedup ``tau / cost``.

:mod:`spade_lib.plots` sits below :mod:`spade_lib.rules` and :mod:`spade_lib.whatif` in the layers, so what
a figure needs to know about the rules (which are lossless) is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from spade_lib.plots.counts import bars, label_counts
from spade_lib.plots.m3 import _check
from spade_lib.plots.palette import legend_outside
from spade_lib.plots.style import DOUBLE_COLUMN, figure

METHOD_STYLES = {"iid": ":", "block": "--", "renewal": "-"}  # the prediction methods of whatif.align
MEASURED_COLOR = "#0072B2"
POLICY_MARKERS = {"fixed": "o-", "confidence": "s--", "entropy": "^:", "adaedl": "v-.", "learned": "D-"}


def predicted_tau(curve: pd.DataFrame, measured: pd.DataFrame) -> Figure:
    """Left: ``tau`` against ``gamma``, one grey line per prediction method of ``curve`` (columns ``method``,
    ``gamma``, ``tau``, ``speedup``: :func:`spade_lib.whatif.align.predict`), and the measured
    ``tau_full_blocks`` of ``measured`` with ``+- 2 se``, each point labelled with its ``steps`` (full-length
    blocks). Right: the predicted speedups and the measured ``speedup_measured`` with its 95 % interval
    (``speedup_low_measured``, ``speedup_high_measured``): notebook 05's ``tau_table``."""
    _check(curve, ["method", "gamma", "tau", "speedup"], "predicted_tau")
    _check(measured, ["gamma", "tau_full_blocks", "se", "steps", "speedup_measured", "speedup_low_measured",
                      "speedup_high_measured"], "predicted_tau (measured)")
    fig, (ax1, ax2) = figure(DOUBLE_COLUMN, 0.36, ncols=2)
    for m in dict.fromkeys(curve["method"]):
        part = curve[curve["method"] == m]
        style = METHOD_STYLES.get(m, "-.")
        ax1.plot(part["gamma"], part["tau"], style, color="0.3", label=f"predicted ({m})")
        ax2.plot(part["gamma"], part["speedup"], style, color="0.3", label=f"predicted ({m})")
    ax1.errorbar(measured["gamma"], measured["tau_full_blocks"], yerr=2 * measured["se"], fmt="o",
                 color=MEASURED_COLOR, label="measured, full blocks (±2 se)")
    label_counts(ax1, measured["gamma"], measured["tau_full_blocks"] + 2 * measured["se"], measured["steps"],
                 color=MEASURED_COLOR)
    yerr = [measured["speedup_measured"] - measured["speedup_low_measured"],
            measured["speedup_high_measured"] - measured["speedup_measured"]]
    ax2.errorbar(measured["gamma"], measured["speedup_measured"], yerr=yerr, fmt="o", color=MEASURED_COLOR, capsize=2,
                 label="measured (wall clock, 95 % CI)")
    ax1.set(xlabel=r"draft length $\gamma$ (labels: full blocks)", ylabel=r"tokens per step $\tau$")
    ax2.set(xlabel=r"draft length $\gamma$", ylabel="speedup over autoregressive")
    fig.tight_layout()
    legend_outside(ax2)
    return fig


def rules_replayed(table: pd.DataFrame, *, lossless: Mapping[str, bool] | None = None,
                   max_gamma: int | None = None) -> Figure:
    """One bar per category and rule of ``table`` (a :func:`spade_lib.whatif.replay.counterfactual` table by
    ``category``: ``rule``, ``category``, ``tau_expected``, ``steps``), rules in the table's order, each bar
    labelled with its ``steps``; a rule that ``lossless`` (rule name -> whether it keeps the target's
    distribution, :func:`spade_lib.rules.lossless_map`) does not mark lossless is hatched and called lossy.
    ``max_gamma``: the trace's draft length, for the title."""
    _check(table, ["rule", "category", "tau_expected", "steps"], "rules_replayed")
    lossless = {} if lossless is None else lossless
    rules = list(dict.fromkeys(table["rule"]))
    cats = sorted(table["category"].unique())
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", [f"C{i}" for i in range(10)])
    fig, ax = figure(DOUBLE_COLUMN, 0.32)
    width = 0.8 / len(rules)
    for j, rule in enumerate(rules):
        part = table[table["rule"] == rule].set_index("category").reindex(cats)
        lossy = not lossless.get(rule, False)
        bars(ax, np.arange(len(cats)) + (j - len(rules) / 2 + 0.5) * width, part["tau_expected"], width,
             cycle[j % len(cycle)], part["steps"], label=f"{rule}{' (lossy)' if lossy else ''}",
             hatch="///" if lossy else None, edgecolor="white", lw=0)
    ax.set_xticks(np.arange(len(cats)), cats)
    title = "acceptance rules on one trace" + (rf" ($\gamma$ = {max_gamma})" if max_gamma is not None else "")
    ax.set(ylabel=r"replayed $\tau$ (expected, same blocks; labels: steps)", title=title)
    legend_outside(ax)
    return fig


def stop_frontier(fronts: Mapping[float, pd.DataFrame]) -> Figure:
    """One panel per temperature of ``fronts`` (temperature -> a stop study's ``front``: ``policy``, ``cost``,
    ``tau``, ``speedup``, ``steps``): ``tau`` against the cost per step, one line per policy ordered by cost,
    and the line ``tau = s * cost`` through the best speedup ``s``; each panel's title gives the steps the
    rules were replayed on."""
    if not fronts:
        raise ValueError("fronts: no temperature to draw")
    for front in fronts.values():
        _check(front, ["policy", "cost", "tau", "speedup", "steps"], "stop_frontier")
    fig, axes = figure(DOUBLE_COLUMN, 0.36, ncols=len(fronts), squeeze=False, sharey=True)
    for ax, (T, front) in zip(axes[0], fronts.items()):
        for policy, style in POLICY_MARKERS.items():
            part = front[front["policy"] == policy].sort_values("cost")
            if len(part):
                ax.plot(part["cost"], part["tau"], style, label=policy, markersize=3, lw=0.8)
        top = front.loc[front["speedup"].idxmax()]
        xs = np.linspace(front["cost"].min(), front["cost"].max(), 2)
        ax.plot(xs, xs * top["speedup"], color="0.6", lw=0.6, label="best speedup (tau / cost)")
        ax.set(xlabel=r"cost per step $g\,c + r(g) + o$", title=f"T = {T:g} ({int(front['steps'].max()):,} steps)")
    axes[0][0].set_ylabel(r"tokens per step $\tau$")
    fig.tight_layout()
    legend_outside(axes[0][-1])
    return fig
