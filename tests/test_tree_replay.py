"""Tree replay (spade_lib.whatif.tree_replay) against the verifier: a replayed sub-tree accepts what
spade_lib.verify.verify_tree (greedy) accepts on that sub-tree, and the whole tree replays the run."""

import numpy as np
import pytest

from spade_lib import diagnose as dg
from spade_lib.whatif import tree_replay as tr
from tests.tree_traces import greedy_verify, random_steps, tree_trace

SUBTREES = [tr.SubTree(), tr.SubTree(nodes=1), tr.SubTree(nodes=3), tr.SubTree(depth=2), tr.SubTree(width=1),
            tr.SubTree(nodes=4, depth=3, width=2), tr.SubTree(nodes=3, rank="score"), tr.SubTree(nodes=5, rank="score")]


def reference_sub_verify(parents, tokens, argmax, keep):
    """Accepted length of the sub-tree ``keep`` (closed under parent), renumbered and verified for real."""
    kept = [i for i in range(len(parents)) if keep[i]]
    if not kept:
        return 0
    new = {old: j for j, old in enumerate(kept)}
    sub_par = [new[parents[i]] if parents[i] >= 0 else -1 for i in kept]
    sub_arg = [argmax[0]] + [argmax[i + 1] for i in kept]
    return int(greedy_verify(sub_par, [tokens[i] for i in kept], sub_arg).n_accepted[0])


def test_full_tree_replays_the_recorded_accepted_lengths():
    t = tree_trace(random_steps(60, 9, seed=0))
    s = tr.replay_steps(t)
    assert (s["n_accepted"] == s["recorded"]).all() and (s["nodes"] == 9).all()
    rows = tr.replay_accepted(t)
    assert (rows["replay_accepted"] == rows["accepted"]).all()


@pytest.mark.parametrize("subtree", SUBTREES, ids=lambda s: s.label)
def test_sub_tree_replay_equals_verifying_the_sub_tree(subtree):
    steps = random_steps(40, 8, seed=5)
    rng = np.random.default_rng(7)
    q = [list(rng.uniform(0.05, 1.0, 8)) for _ in steps]
    t = tree_trace(steps, q_x_raw=q)
    rows = tr.replay_accepted(t, subtree)
    got = tr.replay_steps(t, subtree)
    for s, (parents, tokens, argmax) in enumerate(steps):
        keep = rows.loc[rows.step == s, "kept"].tolist()
        for i, par in enumerate(parents):  # closed under parent
            assert not keep[i] or par < 0 or keep[par]
        if subtree.nodes is not None:
            assert sum(keep) <= subtree.nodes
        assert got.loc[got.step == s, "n_accepted"].item() == reference_sub_verify(parents, tokens, argmax, keep)


def test_subtree_selection_by_hand():
    # root -> {0, 1}, 0 -> {2}, 1 -> {3}; q: 0.6, 0.4 at the root, 0.5 below 0, 0.9 below 1
    steps = [([-1, -1, 0, 1], [0, 1, 2, 3], [0, 0, 0, 0, 0])]
    t = tree_trace(steps, q_x_raw=[[0.6, 0.4, 0.5, 0.9]])
    df = tr.check_greedy(t)
    # cumulative: 0.6, 0.4, 0.30, 0.36 -> the best three are 0, 1, 3
    assert tr.subtree_mask(df, tr.SubTree(nodes=3, rank="score")).tolist() == [True, True, False, True]
    assert tr.subtree_mask(df, tr.SubTree(nodes=3)).tolist() == [True, True, True, False]
    assert tr.subtree_mask(df, tr.SubTree(depth=1)).tolist() == [True, True, False, False]
    assert tr.subtree_mask(df, tr.SubTree(width=1)).tolist() == [True, False, True, False]


def test_budget_curve_reaches_the_wide_tree_and_is_monotone_for_prefixes():
    t = tree_trace(random_steps(80, 10, seed=3))
    curve = tr.budget_curve(t, [1, 2, 4, 10], rank="drafting")
    taus = curve["tau"].to_numpy()
    assert np.all(np.diff(taus) >= 0)  # a bigger prefix contains the smaller: it never accepts less
    wide = t.groupby("step")["n_accepted"].first().mean() + 1
    assert taus[-1] == pytest.approx(wide)
    assert (curve["nodes"] <= curve["budget"]).all()
    both = tr.budget_curve(t, [2, 4], by="category")
    assert set(both["rank"]) == {"drafting", "score"} and "category" in both


def _run(at_position, length, cut=None):
    """The steps of a greedy generation of ``length`` tokens whose step starting at position ``j`` drafts
    ``at_position[j]`` (the context decides the tree and the target), cut to its first ``cut`` nodes."""
    steps, pos = [], 0
    while pos < length:
        parents, tokens, argmax = at_position[pos]
        if cut is not None:
            parents, tokens, argmax = parents[:cut], tokens[:cut], argmax[:cut + 1]
        steps.append((parents, tokens, argmax))
        pos += int(greedy_verify(parents, tokens, argmax).n_accepted[0]) + 1
    return steps


def test_shared_steps_of_a_run_of_the_sub_tree():
    at_position = random_steps(60, 6, seed=4)
    wide = tree_trace(_run(at_position, 50))
    small = tree_trace(_run(at_position, 50, cut=3))
    j = tr.shared_steps(wide, small, tr.SubTree(nodes=3))
    assert len(j) > 0 and (j["n_accepted_replay"] == j["n_accepted_real"]).all()
    assert (j["nodes_replay"] == j["nodes_real"]).all()


def test_chain_trace_replays_too():
    t = dg.synthetic_trace(50, 4, (0.8, 0.7, 0.6, 0.5), seed=1)
    t = t.assign(uniform=np.nan, accept_prob=t["accepted"].astype(float).where(t["reached"], np.nan),
                 p_top1=np.where(t["accepted"], t["draft_token"], t["draft_token"] + 1))
    s = tr.replay_steps(t, tr.SubTree(nodes=2))
    ref = t[t.pos == 0]["n_accepted"].clip(upper=2).to_numpy()
    # a chain cut after 2 nodes accepts min(N, 2)
    assert (s["n_accepted"].to_numpy() == ref).all()


def test_sampled_trace_is_refused():
    t = dg.synthetic_trace(20, 3, (0.8, 0.7, 0.6), seed=0)
    with pytest.raises(ValueError, match="trace: tree replay needs a greedy"):
        tr.replay_steps(t)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="nodes"):
        tr.SubTree(nodes=0)
    with pytest.raises(ValueError, match="rank"):
        tr.SubTree(rank="best")
    with pytest.raises(ValueError, match="budgets"):
        tr.budget_curve(tree_trace(random_steps(3, 3)), [])


def test_check_against_runs_compares_tau_and_shared_steps():
    at_position = random_steps(60, 6, seed=8)
    wide = tree_trace(_run(at_position, 50))
    small = tree_trace(_run(at_position, 50, cut=2))
    t = tr.check_against_runs(wide, {"two": (tr.SubTree(nodes=2), small)}).iloc[0]
    steps = small[small.node == 0]["n_accepted"]
    assert t["tau_real"] == pytest.approx(steps.mean() + 1)
    assert t["tau_real_low"] < t["tau_real"] < t["tau_real_high"]
    assert t["nodes_replay"] == 2 and t["nodes_real"] == 2
    assert t["shared"] > 0 and t["shared_equal"] == t["shared"]
    assert t["tau_replay"] == pytest.approx(tr.replay_tau(wide, {"x": tr.SubTree(nodes=2)})["tau"].item())


def test_non_finite_columns_are_refused_by_column_and_row():
    """Issue 57: the tree replay reads finite tree and token columns, and ``accept_prob`` where a node was
    reached; an unreached node's NaN ``accept_prob`` (never judged) and a greedy trace's NaN uniforms are its
    meaning, not a defect."""
    t = tree_trace(random_steps(6, 5, seed=3), q_x_raw=[[0.5] * 5] * 6)
    unreached = t.index[~t["reached"]]
    assert len(unreached) and np.isnan(t.loc[unreached, "accept_prob"]).all()  # the recorded trace has them
    tr.replay_steps(t)
    reached = int(t.index[t["reached"]][1])
    bad = t.assign(accept_prob=np.where(t.index == reached, np.nan, t["accept_prob"]))
    with pytest.raises(ValueError, match=f"trace: column 'accept_prob' is NaN at row {reached} .*step="):
        tr.replay_steps(bad)
    bad = t.astype({"p_top1": float}).assign(p_top1=lambda f: np.where(f.index == 2, np.nan, f["p_top1"]))
    with pytest.raises(ValueError, match="trace: column 'p_top1' is NaN at row 2"):
        tr.replay_tau(bad, {"all": tr.SubTree()})
    bad = t.assign(q_x_raw=np.where(t.index == 3, np.inf, t["q_x_raw"]))
    with pytest.raises(ValueError, match="trace: column 'q_x_raw' is inf at row 3"):
        tr.replay_steps(bad, tr.SubTree(nodes=2, rank="score"))
