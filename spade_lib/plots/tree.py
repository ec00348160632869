"""Draft-tree figures: thin functions over the tables of :mod:`spade_lib.diagnose.tree` and
:mod:`spade_lib.whatif.tree_replay`.

Each function takes one tidy table (and ``by``, its grouping column, one colour per group), draws it
and returns the ``Figure``; saving is the caller's ``save_figure(fig, "m3_tree_<name>")``. The
accepted-length histogram of a tree is :func:`spade_lib.plots.m3.accept_length_hist` (the table has
its columns).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from spade_lib.plots.counts import label_counts
from spade_lib.plots.m3 import _check, _group_colors, _groups, _yerr
from spade_lib.plots.palette import colors_for, legend_outside
from spade_lib.plots.style import DOUBLE_COLUMN, SINGLE_COLUMN

REPLAY_STYLE = {"score": ("#000000", "-"), "drafting": ("#777777", "--")}  # replay curves: greys, runs: colours


def depth_acceptance(table: pd.DataFrame, by: str | None = None) -> Figure:
    """Conditional acceptance by depth (solid, the path grows past depth ``d`` given it reached the parent)
    and per judged node (dashed), with their binomial intervals, each solid point labelled with
    ``steps_reached`` (the steps it is the rate of); a :func:`~spade_lib.diagnose.tree.depth_acceptance` table."""
    _check(table, ["depth", "alpha_cond", "alpha_cond_low", "alpha_cond_high", "alpha", "steps_reached"],
           "depth_acceptance")
    fig, ax = plt.subplots(figsize=(SINGLE_COLUMN, 2.3))
    groups = _groups(table, by)
    for j, ((label, sub), color) in enumerate(zip(groups, _group_colors(groups))):
        sub = sub[sub["steps_reached"] > 0] if "steps_reached" in sub else sub
        x = sub["depth"].to_numpy() + 0.06 * (j - (len(groups) - 1) / 2)
        ax.errorbar(x, sub["alpha_cond"], yerr=_yerr(sub["alpha_cond"], sub["alpha_cond_low"], sub["alpha_cond_high"]),
                    fmt="-o", color=color, capsize=2, label=label)
        ax.plot(x, sub["alpha"], "--", color=color, alpha=0.7)
        label_counts(ax, x, sub["alpha_cond_high"], sub["steps_reached"], series=j, color=color)
    ax.set_xlabel("depth d (0: children of the root; labels: steps judged)")
    ax.set_ylabel("P(path past d | reached d)")
    ax.set_ylim(0, 1.02)
    ax.set_xticks(np.unique(table["depth"]))
    if by is not None:
        legend_outside(ax)
    fig.tight_layout()
    return fig


def sibling_acceptance(table: pd.DataFrame, by: str | None = None) -> Figure:
    """``P(accepted | judged)`` by sibling rank, one panel per depth, with binomial intervals, each point
    labelled with its judged (``reached``) nodes; a :func:`~spade_lib.diagnose.tree.sibling_acceptance` table."""
    _check(table, ["depth", "sibling_rank", "rate", "rate_low", "rate_high", "reached"], "sibling_acceptance")
    depths = sorted(np.unique(table["depth"]))
    fig, axes = plt.subplots(1, len(depths), figsize=(DOUBLE_COLUMN * min(1.0, 0.25 * len(depths) + 0.25), 2.2),
                             sharey=True, squeeze=False)
    groups = _groups(table, by)
    max_rank = int(table["sibling_rank"].max())
    for ax, d in zip(axes[0], depths):
        for j, ((label, sub), color) in enumerate(zip(groups, _group_colors(groups))):
            s = sub[(sub["depth"] == d) & sub["rate"].notna()]
            x = s["sibling_rank"].to_numpy() + 0.08 * (j - (len(groups) - 1) / 2)
            ax.errorbar(x, s["rate"], yerr=_yerr(s["rate"], s["rate_low"], s["rate_high"]), fmt="o", color=color,
                        capsize=2, label=label)
            label_counts(ax, x, s["rate_high"], s["reached"], series=j, color=color)
        ax.set_title(f"depth {d}")
        ax.set_xlabel("sibling rank (labels: judged)")
        ax.set_xticks(range(max_rank + 1))
        ax.set_xlim(-0.5, max_rank + 0.5)
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("P(accepted | judged)")
    if by is not None:
        legend_outside(axes[0][-1])
    fig.tight_layout()
    return fig


def tau_vs_budget(curve: pd.DataFrame, real: pd.DataFrame | None = None) -> Figure:
    """``tau`` versus node budget: the replayed curve(s) of a
    :func:`~spade_lib.whatif.tree_replay.budget_curve` table (one line per ``rank``, ``+-`` two standard
    errors shaded) and, from ``real`` (columns ``label``, ``nodes``, ``tau``, ``tau_low``, ``tau_high``), real
    runs as points with their intervals."""
    _check(curve, ["rank", "budget", "nodes", "tau", "tau_se"], "tau_vs_budget")
    fig, ax = plt.subplots(figsize=(SINGLE_COLUMN, 2.4))
    for rank, sub in curve.groupby("rank", sort=True):
        sub = sub.sort_values("budget")
        color, line = REPLAY_STYLE.get(rank, ("#555555", ":"))
        ax.plot(sub["budget"], sub["tau"], line, marker=".", color=color, label=f"replay ({rank} order)")
        ax.fill_between(sub["budget"], sub["tau"] - 2 * sub["tau_se"], sub["tau"] + 2 * sub["tau_se"],
                        color=color, alpha=0.15, lw=0)
    if real is not None and len(real):
        _check(real, ["label", "nodes", "tau", "tau_low", "tau_high"], "tau_vs_budget (real)")
        colors = colors_for([str(v) for v in real["label"]])  # one colour per real run, distinct in the figure
        for (_, r), color in zip(real.iterrows(), colors):
            ax.errorbar([r["nodes"]], [r["tau"]], yerr=_yerr([r["tau"]], [r["tau_low"]], [r["tau_high"]]), fmt="s",
                        color=color, capsize=2, label=str(r["label"]))
    ax.set_xscale("log", base=2)
    budgets = np.unique(curve["budget"])
    ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.set_xlabel("nodes verified per step")
    ax.set_ylabel("tau (tokens per step)")
    legend_outside(ax)
    fig.tight_layout()
    return fig
