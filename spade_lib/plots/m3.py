"""M3 figures: thin functions over the tables of :mod:`spade_lib.diagnose`.

Each function takes one tidy table (and ``by``, the grouping column the table was computed with, if
any: one colour per group), draws it, and returns the ``Figure``; saving is the caller's
``save_figure(fig, "m3_<name>")``. No statistics are computed here beyond reshaping, so a figure
shows exactly the numbers of its table. Every bar and bin carries its count
(:mod:`spade_lib.plots.counts`), in its group's colour; each docstring names the count.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from spade_lib.plots.counts import bars, count_text, label_counts
from spade_lib.plots.palette import colors_for, legend_outside
from spade_lib.plots.style import DOUBLE_COLUMN, SINGLE_COLUMN

MEASURE_LABELS = {
    "h_p": "target entropy H(p) [nats]", "h_q": "draft entropy H(q) [nats]",
    "tv": "TV(p, q)", "kl": "KL(p || q) [nats]",
    "q_x": "draft confidence q(x)", "accept_prob": "min(1, p(x)/q(x))", "q_top_prob": "draft max prob",
    "h_p_raw": "H(p) at T=1 [nats]", "h_q_raw": "H(q) at T=1 [nats]", "tv_raw": "TV(p, q) at T=1",
}


def _groups(table: pd.DataFrame, by: str | None) -> list[tuple[str | None, pd.DataFrame]]:
    if by is None:
        return [(None, table)]
    if by not in table.columns:
        raise ValueError(f"by={by!r} is not a column of the table")
    return [(str(k), sub) for k, sub in table.groupby(by, observed=True, sort=True)]


def _check(table: pd.DataFrame, columns: Sequence[str], name: str) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"{name}: table is missing column(s) {missing}")
    if table.empty:
        raise ValueError(f"{name}: table is empty")


def _yerr(center, low, high) -> list[np.ndarray]:
    """Asymmetric error bar lengths, never negative (interval bounds may round past the point)."""
    c, lo, hi = (np.asarray(v, dtype=np.float64) for v in (center, low, high))
    return [np.maximum(c - lo, 0.0), np.maximum(hi - c, 0.0)]


def _group_colors(groups: list[tuple[str | None, pd.DataFrame]]) -> list[str]:
    """One colour per group, distinct within the figure (:func:`spade_lib.plots.palette.colors_for`): a draft
    of the fixed palette keeps its colour everywhere, other groups take free colours by position."""
    return colors_for([label for label, _ in groups])


def acceptance_by_position(table: pd.DataFrame, by: str | None = None) -> Figure:
    """Conditional (solid) and unconditional (dashed) acceptance per draft position with their
    binomial intervals, and the exact expectation ``mean(1 - TV)`` (crosses); a
    :func:`~spade_lib.diagnose.position_acceptance` table. Each conditional point is labelled with
    ``reached``, the positions it is the rate of."""
    _check(table, ["pos", "alpha_cond", "alpha_cond_low", "alpha_cond_high", "alpha_uncond",
                   "alpha_uncond_low", "alpha_uncond_high", "expected_cond"], "acceptance_by_position")
    _check(table, ["reached"], "acceptance_by_position")
    fig, ax = plt.subplots(figsize=(SINGLE_COLUMN, 2.4))
    groups = _groups(table, by)
    for j, ((label, sub), color) in enumerate(zip(groups, _group_colors(groups))):
        x = sub["pos"].to_numpy()
        label_counts(ax, x, sub["alpha_cond_high"], sub["reached"], series=j, color=color)
        name = f"{label}: " if label else ""
        ax.plot(x, sub["alpha_cond"], "-o", color=color, label=f"{name}conditional")
        ax.fill_between(x, sub["alpha_cond_low"], sub["alpha_cond_high"], color=color, alpha=0.2, lw=0)
        ax.plot(x, sub["alpha_uncond"], "--s", color=color, label=f"{name}unconditional")
        ax.fill_between(x, sub["alpha_uncond_low"], sub["alpha_uncond_high"], color=color, alpha=0.12, lw=0)
        ax.plot(x, sub["expected_cond"], "x", color=color, ms=5, label=f"{name}expected mean(1 - TV)")
    ax.set_xlabel("draft position i (labels: positions reached)")
    ax.set_ylabel("acceptance")
    ax.set_ylim(0, 1.02)
    ax.set_xticks(np.unique(table["pos"]))
    legend_outside(ax)
    return fig


def accept_length_hist(table: pd.DataFrame, by: str | None = None) -> Figure:
    """Accepted-length distribution ``P(N = k)`` (bars, each labelled with its number of verification
    ``steps``) and survival ``P(N >= k)`` (right panel); an :func:`~spade_lib.diagnose.accept_length_hist`
    (or :func:`~spade_lib.diagnose.tree_accept_length_hist`) table."""
    _check(table, ["n_accepted", "fraction", "survival", "steps"], "accept_length_hist")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(DOUBLE_COLUMN * 0.7, 2.2))
    groups = _groups(table, by)
    width = 0.8 / len(groups)
    for j, ((label, sub), color) in enumerate(zip(groups, _group_colors(groups))):
        k = sub["n_accepted"].to_numpy()
        bars(ax1, k - 0.4 + width * (j + 0.5), sub["fraction"], width, color, sub["steps"], label=label)
        ax2.plot(k, sub["survival"], "-o", color=color, label=label)
    ax1.set_xlabel("accepted drafts per step N (labels: steps)")
    ax1.set_ylabel("P(N = k)")
    ax2.set_xlabel("k")
    ax2.set_ylabel("P(N >= k)")
    ax2.set_ylim(0, 1.02)
    for ax in (ax1, ax2):
        ax.set_xticks(np.unique(table["n_accepted"]))
    fig.tight_layout()
    if by is not None:
        legend_outside(ax2)
    return fig


def entropy_rejected_vs_accepted(table: pd.DataFrame, by: str | None = None) -> Figure:
    """Median and interquartile range of each entropy at accepted vs rejected positions, per draft
    position (one panel per measure, one row per group), each labelled with its ``n`` positions; an
    :func:`~spade_lib.diagnose.entropy_by_outcome` table."""
    _check(table, ["pos", "measure", "outcome", "median", "q25", "q75", "n"], "entropy_rejected_vs_accepted")
    measures = list(dict.fromkeys(table["measure"]))
    groups = _groups(table, by)
    fig, axes = plt.subplots(len(groups), len(measures), figsize=(DOUBLE_COLUMN * 0.7, 1.9 * len(groups)),
                             squeeze=False, sharey=True)
    styles = {"accepted": ("C2", -0.1, "o"), "rejected": ("C3", 0.1, "v")}
    for r, (label, sub) in enumerate(groups):
        for c, m in enumerate(measures):
            ax = axes[r, c]
            for k, (outcome, (color, dx, marker)) in enumerate(styles.items()):
                s = sub[(sub["measure"] == m) & (sub["outcome"] == outcome)]
                x = s["pos"].to_numpy() + dx
                label_counts(ax, x, s["q75"], s["n"], series=k, color=color)
                ax.errorbar(x, s["median"], yerr=_yerr(s["median"], s["q25"], s["q75"]),
                            fmt=marker, color=color, capsize=2, label=outcome)
            ax.set_title(f"{label}: {MEASURE_LABELS.get(m, m)}" if label else MEASURE_LABELS.get(m, m), fontsize=7)
            ax.set_xticks(np.unique(sub["pos"]))
            if r == len(groups) - 1:
                ax.set_xlabel("draft position i")
        axes[r, 0].set_ylabel("entropy [nats]")
    fig.tight_layout()
    legend_outside(axes[0, -1])
    return fig


def acceptance_vs_measure(table: pd.DataFrame, by: str | None = None) -> Figure:
    """Conditional acceptance against binned H(p), H(q), TV, KL (points with binomial intervals, each
    bin labelled with its ``n`` positions) and the exact expectation ``mean(1 - TV)`` per bin (dashed); an
    :func:`~spade_lib.diagnose.acceptance_by_bins` table."""
    _check(table, ["measure", "x_mean", "rate", "rate_low", "rate_high", "expected", "n"], "acceptance_vs_measure")
    measures = list(dict.fromkeys(table["measure"]))
    fig, axes = plt.subplots(1, len(measures), figsize=(DOUBLE_COLUMN, 2.0), squeeze=False, sharey=True)
    groups = _groups(table, by)
    for j, ((label, sub), color) in enumerate(zip(groups, _group_colors(groups))):
        for ax, m in zip(axes[0], measures):
            s = sub[sub["measure"] == m]
            ax.errorbar(s["x_mean"], s["rate"], yerr=_yerr(s["rate"], s["rate_low"], s["rate_high"]),
                        fmt="o-", color=color, capsize=1.5, label=label)
            label_counts(ax, s["x_mean"], s["rate_high"], s["n"], series=j, color=color)
            ax.plot(s["x_mean"], s["expected"], "--", color=color, lw=0.8)
            ax.set_xlabel(MEASURE_LABELS.get(m, m))
    axes[0, 0].set_ylabel("P(accept | reached)\n(labels: positions per bin)")
    axes[0, 0].set_ylim(0, 1.02)
    for (label, _), color in zip(groups, _group_colors(groups)):  # the dashed lines, once
        axes[0, -1].plot([], [], "--", color=color, lw=0.8, label=f"{label + ': ' if label else ''}expected 1 - TV")
    fig.tight_layout()
    legend_outside(axes[0, -1])
    return fig


def calibration(table: pd.DataFrame, by: str | None = None, errors: pd.DataFrame | None = None) -> Figure:
    """Reliability diagram per score: empirical acceptance against mean score per bin, the diagonal
    of perfect calibration, and the ECE in the legend when ``errors`` (a
    :func:`~spade_lib.diagnose.calibration_error` table) is given; a
    :func:`~spade_lib.diagnose.calibration_table` table. Each bin is labelled with its ``n`` positions."""
    _check(table, ["score", "confidence", "rate", "rate_low", "rate_high", "n"], "calibration")
    scores = list(dict.fromkeys(table["score"]))
    fig, axes = plt.subplots(1, len(scores), figsize=(SINGLE_COLUMN * len(scores) * 0.8, 2.4), squeeze=False)
    groups = _groups(table, by)
    for j, ((label, sub), color) in enumerate(zip(groups, _group_colors(groups))):
        for ax, sc in zip(axes[0], scores):
            s = sub[sub["score"] == sc]
            label_counts(ax, s["confidence"], s["rate_high"], s["n"], series=j, color=color)
            name = label or "empirical"
            if errors is not None:
                e = errors[errors["score"] == sc]
                if by is not None:
                    e = e[e[by].astype(str) == label]
                if len(e):
                    name += f" (ECE {float(e['ece'].iloc[0]):.3f})"
            ax.errorbar(s["confidence"], s["rate"], yerr=_yerr(s["rate"], s["rate_low"], s["rate_high"]),
                        fmt="o-", color=color, capsize=1.5, label=name)
    for ax, sc in zip(axes[0], scores):
        ax.plot([0, 1], [0, 1], ":", color="grey", lw=0.8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(MEASURE_LABELS.get(sc, sc))
    axes[0, 0].set_ylabel("empirical acceptance\n(labels: positions per bin)")
    fig.tight_layout()
    for ax in axes[0]:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), fontsize=6)
    return fig


def expected_vs_realised(table: pd.DataFrame, x: str = "pos", by: str | None = None) -> Figure:
    """Realised acceptance rate (points, +-1.96 Poisson-binomial standard errors) against the exactly
    known expectation (crosses), per ``x`` (e.g. ``pos`` or ``category``), one panel per basis, with
    the p-value of each group; an :func:`~spade_lib.diagnose.expected_vs_realised` table."""
    _check(table, ["basis", x, "n", "realised_rate", "expected_rate", "variance", "p_value"], "expected_vs_realised")
    bases = list(dict.fromkeys(table["basis"]))
    fig, axes = plt.subplots(1, len(bases), figsize=(SINGLE_COLUMN * len(bases) * 0.85, 2.3), squeeze=False,
                             sharey=True)
    groups = _groups(table, by)
    cats = list(dict.fromkeys(table[x].astype(str)))
    for j, ((label, sub), color) in enumerate(zip(groups, _group_colors(groups))):
        dx = (j - (len(groups) - 1) / 2) * 0.15
        for ax, basis in zip(axes[0], bases):
            s = sub[sub["basis"] == basis]
            pos = np.array([cats.index(v) for v in s[x].astype(str)]) + dx
            se = 1.96 * np.sqrt(s["variance"].to_numpy()) / s["n"].to_numpy()
            ax.errorbar(pos, s["realised_rate"], yerr=se, fmt="o", color=color, capsize=2, label=label or "realised")
            ax.plot(pos, s["expected_rate"], "x", color="k", ms=5,
                    label="expected" if j == len(groups) - 1 else None)
            for px, py, pv, n in zip(pos, s["realised_rate"], s["p_value"], s["n"]):
                ax.annotate(f"p={pv:.2g}, n={count_text(n)}", (px, py), textcoords="offset points", xytext=(3, 4),
                            fontsize=5)
            ax.set_title(f"basis: {basis}", fontsize=7)
    for ax in axes[0]:
        ax.set_xticks(range(len(cats)))
        ax.set_xticklabels(cats, rotation=30 if x != "pos" else 0, fontsize=6)
        ax.set_xlabel(x)
    axes[0, 0].set_ylabel("acceptance rate (x: expected)")
    fig.tight_layout()
    legend_outside(axes[0, -1])
    return fig


def acceptance_heatmap(table: pd.DataFrame, by: str | None = None, *, max_generations: int = 40) -> Figure:
    """Fraction of drafts kept per generation (rows, grouped by category) and step (columns); white
    after a generation ended; an :func:`~spade_lib.diagnose.acceptance_heatmap` table.

    A row is one generation (a prompt and a sample), labelled with its category and its number within
    the category (``code 3``: the third generation of ``code``, by prompt id and sample), the first
    ``max_generations`` rows in that order, the same rows in every panel; lines separate categories."""
    _check(table, ["prompt_id", "sample", "category", "step", "rate"], "acceptance_heatmap")
    if isinstance(max_generations, bool) or not isinstance(max_generations, int) or max_generations < 1:
        raise ValueError(f"max_generations: must be an integer >= 1, got {max_generations!r}")
    groups = _groups(table, by)
    fig, axes = plt.subplots(1, len(groups), figsize=(DOUBLE_COLUMN if len(groups) > 1 else SINGLE_COLUMN * 1.3,
                                                      2.8), squeeze=False)
    gens = (table[["category", "prompt_id", "sample"]].astype({"category": str, "prompt_id": str})
            .drop_duplicates().sort_values(["category", "prompt_id", "sample"], kind="stable").head(max_generations))
    rows = list(zip(gens["category"], gens["prompt_id"], gens["sample"]))  # same generations, same order, per panel
    number = gens.groupby("category", sort=False).cumcount() + 1
    labels = [f"{c} {k}" for c, k in zip(gens["category"], number)]
    breaks = [i - 0.5 for i in range(1, len(rows)) if rows[i][0] != rows[i - 1][0]]
    image = None
    for j, (ax, (label, sub)) in enumerate(zip(axes[0], groups)):
        grid = sub.assign(category=sub["category"].astype(str), prompt_id=sub["prompt_id"].astype(str)).pivot_table(
            index=["category", "prompt_id", "sample"], columns="step", values="rate", sort=True).reindex(rows)
        image = ax.imshow(grid.to_numpy(), aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=1)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(labels if j == 0 else [], fontsize=4)
        for y in breaks:
            ax.axhline(y, color="white", lw=0.8)
        steps = grid.columns.to_numpy()
        ticks = np.linspace(0, len(steps) - 1, min(6, len(steps))).astype(int)
        ax.set_xticks(ticks)
        ax.set_xticklabels(steps[ticks])
        ax.set_xlabel("verification step")
        ax.grid(False)
        if label:
            ax.set_title(label, fontsize=7)
    axes[0, 0].set_ylabel("generation (row: one prompt and sample,\nnumbered within its category)", fontsize=6)
    fig.colorbar(image, ax=axes[0].tolist(), label="fraction of drafts kept", shrink=0.9)
    return fig


def token_rejections(table: pd.DataFrame, by: str | None = None, *, top: int = 15) -> Figure:
    """The ``top`` tokens with most rejections (bars: rejections; labels: times judged; tokens never
    rejected are left out; ``display`` is already printable, see ``diagnose.tokens.show_text``); a :func:`~spade_lib.diagnose.token_table` table."""
    _check(table, ["display", "rejected", "rate", "n"], "token_rejections")
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    groups = _groups(table, by)
    fig, axes = plt.subplots(1, len(groups), figsize=(SINGLE_COLUMN * 1.1 * len(groups), 0.16 * top + 0.8),
                             squeeze=False)
    for ax, (label, sub), color in zip(axes[0], groups, _group_colors(groups)):
        s = sub[sub["rejected"] > 0].sort_values("rejected", ascending=False, kind="stable").head(top).iloc[::-1]
        if s.empty:
            ax.text(0.5, 0.5, "no rejections", ha="center", va="center", transform=ax.transAxes)
        y = np.arange(len(s))
        ax.barh(y, s["rejected"], color=color)
        ax.set_yticks(y)
        ax.set_yticklabels([str(t)[:14] for t in s["display"]], fontsize=6, family="monospace")
        for yy, (rej, n) in enumerate(zip(s["rejected"], s["n"])):
            ax.annotate(f"of {n}", (rej, yy), textcoords="offset points", xytext=(2, -2), fontsize=5)
        ax.set_xlabel("rejections (label: times judged)")
        ax.margins(x=0.25)
        ax.set_xlim(left=0)
        if label:
            ax.set_title(label, fontsize=7)
    fig.tight_layout()
    return fig


def logit_coefficients(table: pd.DataFrame, by: str | None = None) -> Figure:
    """Standardised logistic coefficients (change in log-odds of acceptance per standard deviation of
    each feature) with 95 % intervals; the ``coefficients`` of
    :func:`~spade_lib.diagnose.acceptance_logit`."""
    _check(table, ["term", "coef_per_sd", "z"], "logit_coefficients")
    t = table[table["term"] != "intercept"]
    terms = list(dict.fromkeys(t["term"]))
    groups = _groups(t, by)
    fig, ax = plt.subplots(figsize=(SINGLE_COLUMN, 0.35 * len(terms) + 0.9))
    for j, ((label, sub), color) in enumerate(zip(groups, _group_colors(groups))):
        y = np.array([terms.index(v) for v in sub["term"]]) + (j - (len(groups) - 1) / 2) * 0.2
        se = np.abs(sub["coef_per_sd"] / sub["z"])
        ax.errorbar(sub["coef_per_sd"], y, xerr=1.96 * se, fmt="o", color=color, capsize=2, label=label)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(range(len(terms)))
    ax.set_yticklabels(terms)
    ax.invert_yaxis()
    ax.set_xlabel("log-odds of acceptance per SD")
    if by is not None:
        legend_outside(ax)
    return fig


def category_summary(table: pd.DataFrame, by: str | None = None, *, value: str = "tau_drafting_steps",
                     count: str | None = "generations") -> Figure:
    """One bar per category (and group) of a :func:`~spade_lib.diagnose.category_summary` column
    (default ``tau_drafting_steps``, the mean accepted length with the bonus token over the trace's drafting
    steps: :func:`spade_lib.measures.tau`), each labelled with its ``count``
    column (default ``generations``; ``None``: no labels).

    With one category there is no category split to draw: one bar per group, the groups on the x axis
    (no legend needed) and the category in the title."""
    _check(table, ["category", value], "category_summary")
    if count is not None and count not in table.columns:
        raise ValueError(f"count: {count!r} is not a column of the table (None for no count labels)")
    cats = list(dict.fromkeys(table["category"].astype(str)))
    groups = _groups(table, by)
    single = len(cats) == 1
    width = 0.6 if single else 0.8 / len(groups)
    fig, ax = plt.subplots(figsize=(SINGLE_COLUMN, 2.2))
    for j, ((label, sub), color) in enumerate(zip(groups, _group_colors(groups))):
        x = np.full(len(sub), float(j)) if single else (
            np.array([cats.index(c) for c in sub["category"].astype(str)]) - 0.4 + width * (j + 0.5))
        bars(ax, x, sub[value], width, color, sub[count] if count is not None else [""] * len(sub), label=label)
    if single:
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([label or cats[0] for label, _ in groups], fontsize=6)
        ax.set_title(f"category: {cats[0]} (the only one)", fontsize=7)
    else:
        ax.set_xticks(range(len(cats)))
        ax.set_xticklabels(cats, rotation=30, fontsize=6)
    ax.set_ylabel(value + (f" (labels: {count})" if count is not None else ""))
    if by is not None and not single:
        legend_outside(ax)
    return fig


def crossvocab_boundaries(table: pd.DataFrame, by: str | None = None) -> Figure:
    """Cross-vocabulary acceptance by the kind of the target token at each drafted position (left:
    ``alpha`` with Wilson intervals, bars labelled ``accepted/reached``) and where the first rejections
    fall (right: share of first rejections, solid, beside the kind's share of the committed tokens,
    hatched; labelled with the counts); a :func:`~spade_lib.diagnose.boundary_acceptance` table."""
    _check(table, ["kind", "reached", "accepted", "alpha", "alpha_low", "alpha_high", "first_rejections",
                   "rejection_share", "committed", "committed_share"], "crossvocab_boundaries")
    kinds = [k for k in dict.fromkeys(table["kind"].astype(str)) if table.loc[table["kind"].astype(str) == k,
                                                                          "committed"].sum() > 0]
    groups = _groups(table, by)
    width = 0.8 / len(groups)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(DOUBLE_COLUMN * 0.75, 2.3))
    for j, ((label, sub), color) in enumerate(zip(groups, _group_colors(groups))):
        sub = sub.assign(kind=sub["kind"].astype(str)).set_index("kind").reindex(kinds)
        x = np.arange(len(kinds)) - 0.4 + width * (j + 0.5)
        alpha = sub["alpha"].fillna(0).to_numpy()
        bars(ax1, x, alpha, width, color, [f"{a}/{r}" for a, r in zip(sub["accepted"], sub["reached"])], label=label,
             yerr=_yerr(alpha, sub["alpha_low"].fillna(0), sub["alpha_high"].fillna(0)),
             error_kw={"elinewidth": 0.6, "capsize": 1.5}, top=sub["alpha_high"].fillna(0))
        half = width / 2
        bars(ax2, x - half / 2, sub["rejection_share"].fillna(0), half, color,
             [str(int(v)) for v in sub["first_rejections"]], label=label)
        bars(ax2, x + half / 2, sub["committed_share"].fillna(0), half, "white",
             [str(int(v)) for v in sub["committed"]], edgecolor=color, hatch="////", linewidth=0.6)
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(kinds)))
        ax.set_xticklabels(kinds)
        ax.set_xlabel("target token vs the draft's boundaries")
        ax.set_ylim(0, 1.15)
    ax1.set_ylabel("acceptance (accepted / reached)")
    ax2.set_ylabel("share (solid: first rejections; hatched: tokens)")
    fig.tight_layout()
    if by is not None:
        legend_outside(ax2)
    return fig


def crossvocab_costs(tokens: pd.DataFrame, costs: pd.DataFrame, by: str | None = None) -> Figure:
    """Cross-vocabulary drafting per configuration: acceptance per target token and per draft token
    (left, bars labelled ``accepted/drafted``; a :func:`~spade_lib.diagnose.token_acceptance` table) and
    the drafter's milliseconds per step, its forwards and its text work stacked (right, labelled with the
    text share and the tokenizer calls per step; a :func:`~spade_lib.diagnose.step_costs` table)."""
    _check(tokens, ["accepted", "drafted", "alpha_target", "draft_accepted", "draft_tokens", "alpha_draft"],
           "crossvocab_costs")
    _check(costs, ["ms_forward", "ms_text", "text_share", "tokenizer_calls"], "crossvocab_costs")
    tok_groups, cost_groups = _groups(tokens, by), _groups(costs, by)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(DOUBLE_COLUMN * 0.75, 2.3))
    width = 0.8 / len(tok_groups)
    for j, ((label, sub), color) in enumerate(zip(tok_groups, _group_colors(tok_groups))):
        r = sub.iloc[0]
        x = np.arange(2) - 0.4 + width * (j + 0.5)
        bars(ax1, x, [r["alpha_target"], r["alpha_draft"]], width, color,
             [f"{int(r['accepted'])}/{int(r['drafted'])}", f"{int(r['draft_accepted'])}/{int(r['draft_tokens'])}"],
             label=label)
    ax1.set_xticks([0, 1])
    ax1.set_xticklabels(["per target token", "per draft token"])
    ax1.set_ylabel("acceptance")
    ax1.set_ylim(0, 1.15)
    names = [label or "" for label, _ in cost_groups]
    for j, ((label, sub), color) in enumerate(zip(cost_groups, _group_colors(cost_groups))):
        r = sub.iloc[0]
        ax2.bar(j, r["ms_forward"], width=0.6, color=color, label="draft forwards" if j == 0 else None)
        ax2.bar(j, r["ms_text"], width=0.6, bottom=r["ms_forward"], color="white", edgecolor=color,
                hatch="////", linewidth=0.6, label="text sync" if j == 0 else None)
        label_counts(ax2, [j], [r["ms_forward"] + r["ms_text"]],
                     [f"text {r['text_share']:.0%}, {r['tokenizer_calls']:.1f} calls"])
    ax2.set_xticks(range(len(names)))
    ax2.set_xticklabels(names)
    ax2.set_ylabel("drafter ms per step")
    ax2.margins(y=0.2)
    fig.tight_layout()
    if by is not None:
        legend_outside(ax1, where="below", ncol=len(tok_groups))
    legend_outside(ax2)
    return fig
