"""Draft-tree diagnostics: acceptance by depth and by sibling rank, the accepted-length histogram, a summary.

Terms of :mod:`spade_lib.decoding.drafts.tree` and the trace's tree columns (:mod:`spade_lib.decoding.records`): each row is a
*node* of its step's draft tree with ``parent`` (``-1``: the root), ``depth`` (0 below the root) and ``sibling_rank``
(0 first); ``reached``: the node was *judged* (its parent on the accepted path, every earlier sibling rejected);
``accepted``: it is *on the accepted path*; ``n_accepted`` the path's length ``N``, ``gamma`` the step's node count.
A chain is the tree with ``parent = node - 1``, so chain traces read too, giving :mod:`spade_lib.diagnose.position`'s
per-position tables. With ``s`` a step, ``A_d(s)``: the path reaches depth ``d`` (``N(s) > d``); ``J_d(s)``: a node at
depth ``d`` was judged (the path reached depth ``d - 1``, the root for ``d = 0``, and its end has a child):

- conditional acceptance by depth (EAGLE's per-position alpha for a tree): ``alpha_d = #{s: A_d(s)} / #{s: J_d(s)}``,
  P(path grows past ``d`` | it reached the parent); for a chain ``J_d = R_d``: ``alpha_cond`` of position ``d``;
- unconditional: ``beta_d = #{s: A_d(s)} / #{s: the tree has depth > d}`` = ``P(N > d)``;
- per judged node at depth ``d``: ``accepted / reached`` (a tree judges several siblings per step);
- by sibling rank ``k`` at depth ``d``: ``P(accepted | judged)`` of rank-``k`` nodes (parent on the path, ``k`` earlier
  siblings rejected) and ``share``, the fraction of steps accepting at depth ``d`` that took the rank-``k`` child;
- first drafted token (:func:`root_acceptance`): the root's rank-0 child, its acceptance and mean exact acceptance
  probability;
- accepted length ``N`` per step (``0 .. max depth + 1``), histogram, survival ``P(N >= k)``; ``tau = mean(N) + 1`` over
  the trace's steps (:func:`spade_lib.measures.tau`; steps that drafted nothing have no rows: ``tau_drafting_steps``).

Every rate is a ratio of counts as in :mod:`spade_lib.rates` (``alpha_cond``, ``alpha_uncond``: its per-position rates,
steps as trials; ``alpha``: accepted over reached (judged) nodes). Intervals are binomial
(:func:`spade_lib.rates.add_rate`, Wilson by default), steps (or judged nodes) as independent trials.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from spade_lib import measures
from spade_lib.decoding.records import STEP_KEYS
from spade_lib.diagnose.frame import By, TraceLike, as_trace, group_keys
from spade_lib.diagnose.stats import mean_ci
from spade_lib.rates import accept_length_hist, add_rate, alpha

COLUMNS = ("prompt_id", "sample", "step", "node", "parent", "depth", "sibling_rank", "gamma", "reached",
                "accepted", "n_accepted")


def _steps(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per step: ``keys``, the step keys, ``nodes`` (its ``gamma``), ``n_accepted`` and ``tree_depth``
    (1 + the deepest node's depth)."""
    g = df.groupby(keys + STEP_KEYS, observed=True, sort=True)
    return g.agg(nodes=("gamma", "first"), n_accepted=("n_accepted", "first"),
                 tree_depth=("depth", "max")).reset_index().assign(tree_depth=lambda t: t["tree_depth"] + 1)


def depth_acceptance(trace: TraceLike, by: By = None, *, level: float = 0.95,
                     method: str = "wilson") -> pd.DataFrame:
    """Per ``by`` group and ``depth``: ``steps_drafted`` (steps whose tree has a node there), ``steps_reached``
    (``J_d``), ``steps_accepted`` (``A_d``), ``alpha_cond = steps_accepted / steps_reached`` and
    ``alpha_uncond = steps_accepted / steps_drafted`` with bounds (``*_low``, ``*_high``), and the node counts
    ``nodes``, ``reached`` (judged), ``accepted`` with ``alpha = accepted / reached`` (module docstring)."""
    df = as_trace(trace, COLUMNS)
    keys = group_keys(by, df)
    per_step = df.groupby(keys + STEP_KEYS + ["depth"], observed=True, sort=True).agg(
        nodes=("node", "size"), reached=("reached", "sum"), accepted=("accepted", "sum"))
    per_step["any_reached"] = per_step["reached"] > 0
    per_step["any_accepted"] = per_step["accepted"] > 0
    out = per_step.groupby(keys + ["depth"], observed=True, sort=True).agg(
        steps_drafted=("nodes", "size"), steps_reached=("any_reached", "sum"),
        steps_accepted=("any_accepted", "sum"), nodes=("nodes", "sum"), reached=("reached", "sum"),
        accepted=("accepted", "sum")).reset_index()
    for c in ("steps_drafted", "steps_reached", "steps_accepted", "nodes", "reached", "accepted"):
        out[c] = out[c].astype(np.int64)
    add_rate(out, "steps_accepted", "steps_reached", "alpha_cond", level, method)
    add_rate(out, "steps_accepted", "steps_drafted", "alpha_uncond", level, method)
    add_rate(out, "accepted", "reached", "alpha", level, method)
    return out


def sibling_acceptance(trace: TraceLike, by: By = None, *, level: float = 0.95,
                       method: str = "wilson") -> pd.DataFrame:
    """Per ``by`` group, ``depth`` and ``sibling_rank``: ``nodes``, ``reached`` (judged), ``accepted``, ``rate =
    accepted / reached`` (``P(accepted | judged)`` at that rank) with bounds, and ``share`` = accepted /
    the steps that accepted a node at that depth (the ranks' shares of one depth sum to 1)."""
    df = as_trace(trace, COLUMNS)
    keys = group_keys(by, df)
    out = df.groupby(keys + ["depth", "sibling_rank"], observed=True, sort=True).agg(
        nodes=("node", "size"), reached=("reached", "sum"), accepted=("accepted", "sum")).reset_index()
    for c in ("nodes", "reached", "accepted"):
        out[c] = out[c].astype(np.int64)
    add_rate(out, "accepted", "reached", "rate", level, method)
    per_depth = out.groupby(keys + ["depth"], observed=True)["accepted"].transform("sum")
    with np.errstate(invalid="ignore", divide="ignore"):
        out["share"] = np.where(per_depth > 0, out["accepted"] / per_depth, np.nan)
    return out


def root_acceptance(trace: TraceLike, by: By = None, *, level: float = 0.95, method: str = "wilson") -> pd.DataFrame:
    """The first drafted token of each step, the root's rank-0 child (``depth = 0``, ``sibling_rank = 0``), per
    ``by`` group: its row of :func:`sibling_acceptance` (``nodes``, ``reached``, ``accepted``, ``rate =
    accepted / reached`` with bounds, ``share``) and ``accept_prob``, the mean over its judged nodes of the exact
    acceptance probability the verifier recorded there: ``min(1, p(x) / q(x))`` for a sampled ``x ~ q`` (a
    chain, a ``sampled`` tree), ``p(x)`` for a deterministic tree's node (judged as drawn from ``one_hot(x)``).
    ``trace``: the tree columns, ``reached``, ``accepted`` and ``accept_prob`` (NaN at the nodes never judged)."""
    df = as_trace(trace, COLUMNS)
    if "accept_prob" not in df.columns:
        raise ValueError("trace lacks column 'accept_prob' (the exact acceptance probability of a judged node)")
    keys = group_keys(by, df)
    sib = sibling_acceptance(df, by, level=level, method=method)
    first = sib[(sib["depth"] == 0) & (sib["sibling_rank"] == 0)].reset_index(drop=True)
    roots = df[(df["depth"] == 0) & (df["sibling_rank"] == 0) & df["reached"]]
    if not keys:
        return first.assign(accept_prob=float(roots["accept_prob"].mean()))
    exact = roots.groupby(keys, observed=True)["accept_prob"].mean().reset_index()
    return first.merge(exact, on=keys, how="left")


def tree_accept_length_hist(trace: TraceLike, by: By = None) -> pd.DataFrame:
    """Distribution of the accepted length ``N`` per ``by`` group, ``N = 0 .. max tree depth`` (zero counts
    kept): :func:`spade_lib.rates.accept_length_hist` of the trace's steps (``n_accepted``, ``steps``,
    ``fraction = P(N = k)``, ``survival = P(N >= k)``, ``accept_length = k + 1``), as
    :func:`spade_lib.diagnose.accept_length_hist` but over ``0 .. max depth + 1`` (a chain's range,
    ``0 .. max gamma``, would be a tree's node count)."""
    df = as_trace(trace, COLUMNS)
    keys = group_keys(by, df)
    steps = _steps(df, keys)
    return accept_length_hist(steps, keys, int(steps["tree_depth"].max()) if len(steps) else 0)


def tree_summary(trace: TraceLike, by: By = None, *, level: float = 0.95) -> pd.DataFrame:
    """One row per ``by`` group: ``steps``, ``nodes`` (mean node count per step, the verification width),
    ``tree_depth`` (mean), ``mean_accepted`` (mean ``N``), ``tau = mean_accepted + 1`` (over the trace's
    steps, :func:`spade_lib.measures.tau`) with normal bounds ``tau_low``, ``tau_high`` (``tau +- z sd(N) /
    sqrt(steps)``, steps as independent), ``max_accepted``,
    ``alpha`` (accepted / reached nodes) and ``accepted_per_node`` (mean ``N`` / mean nodes, the
    fraction of the verified nodes that were kept)."""
    df = as_trace(trace, COLUMNS)
    keys = group_keys(by, df)
    steps = _steps(df, keys)
    group = keys or (lambda _: 0)  # no by: one group
    out = steps.groupby(group, observed=True, sort=True).agg(
        steps=("nodes", "size"), nodes=("nodes", "mean"), tree_depth=("tree_depth", "mean"),
        mean_accepted=("n_accepted", "mean"), max_accepted=("n_accepted", "max"), sd=("n_accepted", "std"),
        accepted=("n_accepted", "sum"))
    out["steps"] = out["steps"].astype(np.int64)
    out["tau"] = measures.tau(out.pop("accepted"), out["steps"])
    out["tau_low"], out["tau_high"] = mean_ci(out["tau"], out.pop("sd"), out["steps"], level)
    nodes = df.groupby(group, observed=True, sort=True)[["reached", "accepted"]].sum().reindex(out.index)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["alpha"] = alpha(nodes["accepted"], nodes["reached"])
        out["accepted_per_node"] = out["mean_accepted"] / out["nodes"]
    return out.reset_index() if keys else out.reset_index(drop=True)
