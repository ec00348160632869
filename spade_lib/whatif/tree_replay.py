"""Replay of smaller draft trees from one recorded wide tree, under greedy verification (``T = 0``).

Terms: :mod:`spade_lib.decoding.drafts.tree`'s. Greedy verification (:func:`spade_lib.verify.verify_tree`, ``mode="greedy"``)
walks from the root into the first child whose token is the target's argmax after its parent, stopping when none is.
With ``m_i = [x_i = argmax p(. | path of parent(i))]`` (the trace's ``draft_token == p_top1``; ``p_top1``, the raw-logit
argmax at the parent, is recorded for every node, judged or not), node ``i`` of a sub-tree ``S`` is accepted iff

    ``i in S``, ``m_i``, ``parent(i)`` is accepted (or is the root), and no earlier sibling in ``S`` is,

and ``N_S`` (accepted nodes a step) gives ``tau_S = mean(N_S) + 1`` over the wide trace's steps
(:func:`spade_lib.measures.tau`). A sub-tree is a parent-closed node set (:class:`SubTree`: the first ``nodes`` in
drafting order or by cumulative draft path probability, a depth cap, a width cap on sibling rank).

**Exact per step, an estimate across steps.** In a given context the target's argmax after a node does not depend on the
other nodes, so ``N_S`` is exactly what verifying ``S`` in that step accepts (``S`` = the whole tree gives the recorded
``n_accepted``: tested). Every tree emits the same greedy text, but step starts depend on the tree (the replay reuses
the wide run's), so ``tau_S`` over a run is an estimate, to check against a real run of the smaller tree (notebook 04
prints both); on steps starting at the same position in both runs the replay must match the real run step by step
(:func:`shared_steps`) when the smaller tree is a sub-tree of the wide one. **EAGLE-2's smaller tree**:
``eagle2:nodes=k`` keeps the ``k`` candidates of highest ``c(i) = prod over the path of q(x_j)`` (temperature-1 draft
softmax, the trace's ``q_x_raw`` for a model drafter) from the candidate set that any ``nodes`` with the same depth and
``top_k`` shares, so ``SubTree(nodes=k, rank="score")`` of a wider tree is that tree, up to ties and float32 rounding.
``T > 0`` traces are refused: acceptance is random and depends on the sibling set through the residuals, so no per-node
fact of the wide tree decides a smaller tree's outcome.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from spade_lib import measures
from spade_lib.decoding.records import STEP_KEYS
from spade_lib.validate import check_choice, check_finite_columns, check_int

__all__ = ["SubTree", "RANKS", "check_greedy", "subtree_mask", "replay_accepted", "replay_steps", "replay_tau",
           "budget_curve", "shared_steps",
           "check_against_runs"]

RANKS = ("drafting", "score")  # how SubTree.nodes picks its first nodes
COLUMNS = ("prompt_id", "sample", "step", "node", "parent", "depth", "sibling_rank", "draft_token", "p_top1",
           "reached", "accepted", "n_accepted", "uniform", "accept_prob")


@dataclass(frozen=True)
class SubTree:
    """A sub-tree of each step's recorded tree: the nodes passing the caps, closed under parent."""

    nodes: int | None = None    # keep the first this many nodes (by rank) among those passing depth/width; None = all
    depth: int | None = None    # keep nodes of depth < this (a depth cap: levels below the root); None = all
    width: int | None = None    # keep nodes of sibling_rank < this (children per node); width=1 is the greedy chain
    rank: str = "drafting"      # order of `nodes`: "drafting" (node number) or "score" (cumulative q_x_raw, EAGLE-2)

    def __post_init__(self) -> None:
        for name in ("nodes", "depth", "width"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), min=1)
        check_choice("rank", self.rank, RANKS)

    @property
    def label(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in ("nodes", "depth", "width") if getattr(self, k) is not None]
        return ",".join(parts + ([f"rank={self.rank}"] if self.nodes is not None else [])) or "full"


_KEYS = (*STEP_KEYS, "node")  # what names a row in an error


def _trace(trace) -> pd.DataFrame:
    """``trace`` as a frame sorted by step and node, the columns the replay reads checked finite first (the
    error names the caller's row): every tree and token column; ``accept_prob`` where the node was reached (an
    unreached node's is NaN: never judged); ``uniform`` may be NaN (a greedy trace draws none)."""
    from spade_lib.runs.trace import as_frame

    trace = as_frame(trace, COLUMNS)
    check_finite_columns("trace", trace, [c for c in COLUMNS if c not in ("accept_prob", "uniform")], keys=_KEYS)
    check_finite_columns("trace", trace, ("uniform",), nan_ok=("uniform",), keys=_KEYS)
    reached = trace["reached"].to_numpy(dtype=bool)
    check_finite_columns("trace", trace.loc[reached], ("accept_prob",), keys=_KEYS)
    return trace.sort_values(STEP_KEYS + ["node"], kind="stable").reset_index(drop=True)


def _parent_rows(df: pd.DataFrame) -> np.ndarray:
    """Row of each node's parent in ``df`` (sorted by step, then node, nodes ``0 .. g-1``); ``-1``: the root."""
    node = df["node"].to_numpy(dtype=np.int64)
    start = np.arange(len(df)) - node  # nodes of a step are 0 .. g-1 in consecutive rows
    par = df["parent"].to_numpy(dtype=np.int64)
    if len(df) and (np.any(node[start] != 0) or np.any(par >= node)):
        raise ValueError("trace: each step's rows must be nodes 0 .. g-1 with parent < node")
    return np.where(par >= 0, start + par, -1)


def _step_ids(df: pd.DataFrame) -> np.ndarray:
    return np.cumsum(df["node"].to_numpy() == 0) - 1


def _walk(df: pd.DataFrame, keep: np.ndarray) -> np.ndarray:
    """Greedy acceptance of the kept nodes (module docstring), by depth: ``[rows]`` bool."""
    prow = _parent_rows(df)
    match = (df["draft_token"].to_numpy() == df["p_top1"].to_numpy()) & keep
    depth = df["depth"].to_numpy(dtype=np.int64)
    sid = _step_ids(df)
    acc = np.zeros(len(df), dtype=bool)
    for d in range(int(depth.max()) + 1 if len(df) else 0):
        at = np.flatnonzero((depth == d) & match)
        at = at[(prow[at] < 0) | acc[np.maximum(prow[at], 0)]]
        if not len(at):
            break
        # the first matching sibling only (rows are in node order): one per (step, parent)
        _, first = np.unique(np.stack([sid[at], prow[at]]), axis=1, return_index=True)
        acc[at[first]] = True
    return acc


def check_greedy(trace) -> pd.DataFrame:
    """``trace`` (sorted by step and node) if it was verified greedily; a ``ValueError`` naming ``trace``
    otherwise: at ``T > 0`` the rule draws uniforms (``uniform`` not NaN) or accepts with a probability
    in (0, 1), and the recorded ``accepted`` flags must be the greedy walk of the whole tree."""
    df = _trace(trace)
    reached = df["reached"].to_numpy(dtype=bool)
    ap = df["accept_prob"].to_numpy(dtype=np.float64)[reached]
    if df["uniform"].notna().any() or not np.all((ap == 0) | (ap == 1)):
        raise ValueError("trace: tree replay needs a greedy (temperature=0) trace; this one was sampled "
                         "(uniforms drawn or accept probabilities in (0, 1)), and at T > 0 a smaller tree's "
                         "outcome is not determined by the wide tree's")
    if not np.array_equal(_walk(df, np.ones(len(df), dtype=bool)), df["accepted"].to_numpy(dtype=bool)):
        raise ValueError("trace: its accepted flags are not the greedy walk over draft_token == p_top1 "
                         "(not a greedy run, or a tie in the target's argmax)")
    return df


def subtree_mask(df: pd.DataFrame, subtree: SubTree) -> np.ndarray:
    """``[rows]`` bool: the nodes of ``subtree`` in each step of ``df`` (sorted by step and node), closed
    under parent (a node whose parent is cut is cut)."""
    if not isinstance(subtree, SubTree):
        raise ValueError(f"subtree: must be a SubTree, got {type(subtree).__name__}")
    keep = np.ones(len(df), dtype=bool)
    if subtree.depth is not None:
        keep &= df["depth"].to_numpy() < subtree.depth
    if subtree.width is not None:
        keep &= df["sibling_rank"].to_numpy() < subtree.width
    prow = _parent_rows(df)
    depth = df["depth"].to_numpy(dtype=np.int64)
    for d in range(1, int(depth.max()) + 1 if len(df) else 0):  # close under parent, level by level
        at = np.flatnonzero(depth == d)
        keep[at] &= keep[np.maximum(prow[at], 0)] | (prow[at] < 0)
    if subtree.nodes is not None:
        sid = _step_ids(df)
        if subtree.rank == "drafting":
            key = df["node"].to_numpy(dtype=np.float64)
        else:  # EAGLE-2's rerank: highest cumulative draft probability, ties shallower then earlier
            if "q_x_raw" not in df.columns:
                raise ValueError("subtree: rank='score' needs the trace's q_x_raw column")
            check_finite_columns("trace", df, ("q_x_raw",), keys=_KEYS)
            logq = np.log(np.maximum(df["q_x_raw"].to_numpy(dtype=np.float64), 1e-300))
            c = np.zeros(len(df))
            for d in range(int(depth.max()) + 1 if len(df) else 0):
                at = np.flatnonzero(depth == d)
                c[at] = logq[at] + np.where(prow[at] >= 0, c[np.maximum(prow[at], 0)], 0.0)
            key = -c
        order = np.lexsort((df["node"].to_numpy(), depth, key, ~keep, sid))  # per step: kept, best first
        sorted_sid = sid[order]
        starts = np.searchsorted(sorted_sid, sorted_sid, side="left")
        rank_in_step = np.arange(len(df)) - starts
        within = np.zeros(len(df), dtype=bool)
        within[order] = rank_in_step < subtree.nodes
        keep &= within
        for d in range(1, int(depth.max()) + 1 if len(df) else 0):  # rounding may break closure: restore it
            at = np.flatnonzero(depth == d)
            keep[at] &= keep[np.maximum(prow[at], 0)] | (prow[at] < 0)
    return keep


def replay_accepted(trace, subtree: SubTree = SubTree()) -> pd.DataFrame:
    """The (greedy) trace sorted by step and node with ``kept`` (the node is in ``subtree``) and
    ``replay_accepted`` (it would be on the accepted path of ``subtree``) columns added."""
    df = check_greedy(trace)
    keep = subtree_mask(df, subtree)
    return df.assign(kept=keep, replay_accepted=_walk(df, keep))


def replay_steps(trace, subtree: SubTree = SubTree(), by: str | Sequence[str] | None = None) -> pd.DataFrame:
    """One row per step: the ``by`` columns, the step keys, ``nodes`` (kept nodes: the sub-tree's
    verification width), ``n_accepted`` (its replayed accepted length ``N_S``) and ``recorded`` (the wide
    tree's ``n_accepted``)."""
    rows = replay_accepted(trace, subtree)
    keys = [by] if isinstance(by, str) else list(by or [])
    g = rows.groupby(keys + STEP_KEYS, observed=True, sort=True)
    return g.agg(nodes=("kept", "sum"), n_accepted=("replay_accepted", "sum"),
                 recorded=("n_accepted", "first")).reset_index().astype({"nodes": np.int64, "n_accepted": np.int64})


def replay_tau(trace, subtrees: Mapping[str, SubTree], by: str | Sequence[str] | None = None) -> pd.DataFrame:
    """Per sub-tree (``subtrees``: label -> :class:`SubTree`) and ``by`` group: ``steps``, ``nodes`` (mean kept
    nodes per step), ``mean_accepted``, ``tau = mean_accepted + 1`` and its standard error over steps
    ``tau_se = sd(N_S) / sqrt(steps)`` (steps as independent: a lower bound on the uncertainty)."""
    df = check_greedy(trace)
    keys = [by] if isinstance(by, str) else list(by or [])
    out = []
    for label, st in subtrees.items():
        s = replay_steps(df, st, by=keys or None)
        g = s.groupby(keys or (lambda _: 0), observed=True, sort=True)
        t = g.agg(steps=("n_accepted", "size"), nodes=("nodes", "mean"), mean_accepted=("n_accepted", "mean"),
                  sd=("n_accepted", "std"), accepted=("n_accepted", "sum"))
        t = t.reset_index() if keys else t.reset_index(drop=True)
        t.insert(0, "subtree", label)
        t["tau"] = measures.tau(t.pop("accepted"), t["steps"])
        t["tau_se"] = t.pop("sd") / np.sqrt(t["steps"])
        out.append(t)
    return pd.concat(out, ignore_index=True)


def budget_curve(trace, budgets: Iterable[int], *, rank: str | Sequence[str] = RANKS,
                 depth: int | None = None, by: str | Sequence[str] | None = None) -> pd.DataFrame:
    """``tau`` versus node budget: :func:`replay_tau` of ``SubTree(nodes=b, depth=depth, rank=r)`` for every
    budget ``b`` and rank ``r``, with columns ``rank`` and ``budget`` added (``nodes`` is the mean kept,
    which is below ``b`` where a step's tree had fewer nodes)."""
    budgets = [check_int("budgets", b, min=1) for b in budgets]
    if not budgets:
        raise ValueError("budgets: give at least one node budget")
    ranks = [rank] if isinstance(rank, str) else list(rank)
    for r in ranks:
        check_choice("rank", r, RANKS)
    df = check_greedy(trace)
    subtrees = {f"{r}:{b}": SubTree(nodes=b, depth=depth, rank=r) for r in ranks for b in budgets}
    out = replay_tau(df, subtrees, by=by)
    out.insert(1, "rank", [subtrees[s].rank for s in out["subtree"]])
    out.insert(2, "budget", [subtrees[s].nodes for s in out["subtree"]])
    return out


def shared_steps(wide, small, subtree: SubTree) -> pd.DataFrame:
    """The steps of a real run of a smaller tree (``small``, a greedy trace) that start at the same generated
    position (``abs_pos`` of node 0) of the same generation as a step of ``wide``: there both steps see
    the same context, so ``n_accepted_replay`` (``subtree`` replayed on ``wide``) must equal
    ``n_accepted_real`` when ``small``'s tree is that sub-tree. One row per shared step with
    ``prompt_id``, ``sample``, ``abs_pos``, ``step_wide``, ``step_real``, both accepted lengths, ``nodes_replay``
    and ``nodes_real``."""
    df = check_greedy(wide)
    real = check_greedy(small)
    rs = replay_steps(df, subtree).rename(columns={"step": "step_wide", "n_accepted": "n_accepted_replay",
                                                   "nodes": "nodes_replay"}).drop(columns="recorded")
    starts = df.loc[df["node"] == 0, ["prompt_id", "sample", "step", "abs_pos"]].rename(columns={"step": "step_wide"})
    rs = rs.merge(starts, on=["prompt_id", "sample", "step_wide"])
    sm = real.loc[real["node"] == 0, ["prompt_id", "sample", "step", "abs_pos", "n_accepted", "gamma"]].rename(
        columns={"step": "step_real", "n_accepted": "n_accepted_real", "gamma": "nodes_real"})
    out = rs.merge(sm, on=["prompt_id", "sample", "abs_pos"])
    return out[["prompt_id", "sample", "abs_pos", "step_wide", "step_real", "n_accepted_replay", "n_accepted_real",
                "nodes_replay", "nodes_real"]]


def check_against_runs(wide, runs: Mapping[str, tuple[SubTree, object]], *, z: float = 1.96) -> pd.DataFrame:
    """The replay of each sub-tree against a real greedy run of it: ``runs`` maps a label to ``(subtree,
    trace)``. One row per run: ``label``, ``subtree``, ``nodes_replay`` / ``nodes_real`` (mean nodes per step),
    ``tau_replay`` (on ``wide``'s steps) with ``tau_replay_se``, ``tau_real`` (over the run's own steps,
    the same definition) with normal bounds ``tau_real_low`` / ``tau_real_high`` (``+- z`` standard errors),
    ``inside`` (the replay lies within them), and over :func:`shared_steps` ``shared`` (how many) and
    ``shared_equal`` (how many replayed exactly: all of them when the real tree is that sub-tree)."""
    df = check_greedy(wide)
    rows = []
    for label, (subtree, trace) in runs.items():
        real = check_greedy(trace)
        rep = replay_tau(df, {label: subtree}).iloc[0]
        steps = real.loc[real["node"] == 0, "n_accepted"].to_numpy(dtype=np.float64)
        tau = float(measures.tau(steps.sum(), len(steps)))  # NaN without steps
        se = float(steps.std(ddof=1) / np.sqrt(len(steps))) if len(steps) > 1 else float("nan")
        nodes = float(real.loc[real["node"] == 0, "gamma"].mean()) if len(steps) else float("nan")
        sh = shared_steps(df, real, subtree)
        rows.append({"label": label, "subtree": subtree.label, "nodes_replay": rep["nodes"], "nodes_real": nodes,
                     "tau_replay": rep["tau"], "tau_replay_se": rep["tau_se"], "tau_real": tau,
                     "tau_real_low": tau - z * se, "tau_real_high": tau + z * se,
                     "inside": bool(tau - z * se <= rep["tau"] <= tau + z * se), "shared": len(sh),
                     "shared_equal": int((sh["n_accepted_replay"] == sh["n_accepted_real"]).sum())})
    return pd.DataFrame(rows)
