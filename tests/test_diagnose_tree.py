"""Tree diagnostics (spade_lib.diagnose.tree) against hand-counted answers and, on chains, against the
per-position tables of spade_lib.diagnose.position."""

import numpy as np
import pandas as pd
import pytest

from spade_lib import diagnose as dg
from spade_lib.diagnose import tree as dt
from tests.tree_traces import random_steps, tree_trace

# Two steps of the tree  root -> {0, 1}, 0 -> {2, 3}, 1 -> {4}, 2 -> {5}.
PARENTS = [-1, -1, 0, 0, 1, 2]
TOKENS = [0, 1, 2, 3, 1, 0]
# step 0: 0 rejected (argmax 1 at the root), 1 accepted, 4 rejected -> N = 1
# step 1: 0 accepted, 2 accepted (argmax 2 after 0), 5 accepted (argmax 0 after 2) -> N = 3
STEPS = [(PARENTS, TOKENS, [1, 3, 3, 3, 3, 0, 0]),
         (PARENTS, TOKENS, [0, 2, 3, 0, 3, 3, 3])]


@pytest.fixture
def trace():
    return tree_trace(STEPS)


def test_depth_acceptance_by_hand(trace):
    t = dt.depth_acceptance(trace).set_index("depth")
    # depth 0: judged in both steps, accepted in both; depth 1: judged in both (4 under 1; 2 under 0),
    # accepted in step 1; depth 2: judged in step 1 only (5 under the accepted 2), accepted
    assert t["steps_reached"].tolist() == [2, 2, 1]
    assert t["steps_accepted"].tolist() == [2, 1, 1]
    assert t["steps_drafted"].tolist() == [2, 2, 2]
    assert t["alpha_cond"].tolist() == [1.0, 0.5, 1.0]
    assert t["alpha_uncond"].tolist() == [1.0, 0.5, 0.5]
    # nodes judged: step 0 judges 0, 1, 4; step 1 judges 0, 2, 5
    assert t["reached"].tolist() == [3, 2, 1] and t["accepted"].tolist() == [2, 1, 1]
    assert t["nodes"].tolist() == [4, 6, 2]
    assert (t["alpha_cond_low"] <= t["alpha_cond"]).all() and (t["alpha_cond"] <= t["alpha_cond_high"]).all()


def test_sibling_acceptance_by_hand(trace):
    t = dt.sibling_acceptance(trace).set_index(["depth", "sibling_rank"])
    assert t.loc[(0, 0), "reached"] == 2 and t.loc[(0, 0), "accepted"] == 1   # node 0
    assert t.loc[(0, 1), "reached"] == 1 and t.loc[(0, 1), "accepted"] == 1   # node 1, judged after 0's rejection
    assert t.loc[(1, 1), "reached"] == 0 and np.isnan(t.loc[(1, 1), "rate"])  # node 3: never judged
    assert t.loc[(0, 0), "share"] == 0.5 and t.loc[(0, 1), "share"] == 0.5
    assert t.groupby("depth")["share"].sum().round(12).tolist() == [1.0, 1.0, 1.0]


def test_hist_and_summary_by_hand(trace):
    h = dt.tree_accept_length_hist(trace)
    assert h["n_accepted"].tolist() == [0, 1, 2, 3] and h["steps"].tolist() == [0, 1, 0, 1]
    assert h["survival"].tolist() == [1.0, 1.0, 0.5, 0.5]
    s = dt.tree_summary(trace).iloc[0]
    assert s["steps"] == 2 and s["nodes"] == 6 and s["tau"] == 3.0 and s["max_accepted"] == 3
    assert s["alpha"] == pytest.approx(4 / 6)
    half = 1.959963984540054 * np.std([1, 3], ddof=1) / np.sqrt(2)  # normal bounds over the 2 steps
    assert s["tau_low"] == pytest.approx(3.0 - half) and s["tau_high"] == pytest.approx(3.0 + half)


def test_grouped_tables_split_the_pooled_counts():
    a = tree_trace(random_steps(30, 7, seed=1), prompt_id="a", category="x")
    b = tree_trace(random_steps(20, 5, seed=2), prompt_id="b", category="y")
    both = pd.concat([a, b], ignore_index=True)
    by = dt.depth_acceptance(both, by="category")
    pooled = dt.depth_acceptance(both).set_index("depth")
    sums = by.groupby("depth")[["steps_reached", "steps_accepted", "reached", "accepted"]].sum()
    assert (sums == pooled[sums.columns]).all().all()
    s = dt.tree_summary(both, by="category").set_index("category")
    assert s.loc["x", "tau"] == pytest.approx(dt.tree_summary(a).iloc[0]["tau"])
    assert s.loc["y", "nodes"] == 5


def test_chain_tables_equal_position_tables():
    t = dg.synthetic_trace(400, 5, (0.8, 0.7, 0.6, 0.5, 0.4), seed=3)
    pos = dg.position_acceptance(t).set_index("pos")
    dep = dt.depth_acceptance(t).set_index("depth")
    assert dep["steps_reached"].tolist() == pos["reached"].tolist()
    assert dep["steps_accepted"].tolist() == pos["accepted"].tolist()
    assert dep["steps_drafted"].tolist() == pos["drafted"].tolist()
    for col in ("alpha_cond", "alpha_cond_low", "alpha_cond_high", "alpha_uncond"):
        np.testing.assert_allclose(dep[col], pos[col], equal_nan=True)
    np.testing.assert_allclose(dep["alpha"], pos["alpha_cond"], equal_nan=True)
    sib = dt.sibling_acceptance(t)
    assert (sib["sibling_rank"] == 0).all() and np.allclose(sib["rate"], pos["alpha_cond"], equal_nan=True)
    mine = dt.tree_accept_length_hist(t)
    ref = dg.accept_length_hist(t)
    pd.testing.assert_frame_equal(mine[ref.columns].reset_index(drop=True), ref.reset_index(drop=True),
                                  check_dtype=False)


def test_missing_column_is_named():
    with pytest.raises(ValueError, match="sibling_rank"):
        dt.depth_acceptance(tree_trace(STEPS).drop(columns="sibling_rank"))
