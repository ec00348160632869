"""Notebook 02's tables from spade_lib.exactness: the exactness table and E[tokens] simulated through verify,
against the notebook's former inline code (the reference) and against what they must show."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch

from spade_lib.exactness import (BLOCK_KINDS, EXACTNESS_COLUMNS, MC_CONFIGS, block_law_error, draft_tree,
                                 exactness_table, monte_carlo_check, overlap_pair, simulated_tokens, warped_pair)
from spade_lib.rules import get_rule, lossless_map, rule_names
from spade_lib.sampling import SamplingConfig, adjust


def _notebook_exactness(vocab, gamma, mc_samples, seed):
    """Notebook 02's exactness cell, as it was before exactness_table."""
    rows = []
    for kind in ["random", "disjoint", "identical", "one_hot", "q_zeros"]:
        p_t, q_t, x_t = draft_tree(vocab, gamma, kind, seed=seed)
        for mode in rule_names():
            rule = get_rule(mode)
            opts = rule.defaults
            if rule.samples_target:
                continue
            if mode == "greedy" and kind != "one_hot":
                continue
            err = block_law_error(p_t, q_t, x_t, mode=mode, **opts)
            rows.append({"check": "enumeration", "configuration": f"{kind} tree, V={vocab}, gamma={gamma}",
                         "mode": " ".join([mode, *(f"{k}={v:g}" for k, v in opts.items())]),
                         "lossless": lossless_map()[mode], "alpha": err["alpha_enumerated"],
                         "max abs error": err["max_abs_error"], "chi2 p (1st)": np.nan, "chi2 p (2nd)": np.nan})

    def mc_row(label, mode, p_, q_, **kwargs):
        r = monte_carlo_check(p_, q_, n=mc_samples, mode=mode, seed=seed, **kwargs)
        return {"check": "monte carlo", "configuration": label, "mode": mode, "lossless": lossless_map()[mode],
                "alpha": r["alpha_hat"], "max abs error": np.nan, "chi2 p (1st)": r["p_first"],
                "chi2 p (2nd)": r["p_second"]}

    for i, (T, k, tp, V, g, off) in enumerate(MC_CONFIGS):
        p_m, q_m, _ = warped_pair(T, k, tp, V, g, off + 1000 * seed)
        label = f"T={T}, top_k={k}, top_p={tp}, V={V}, gamma={g}"
        rows.append(mc_row(label, "exact", p_m, q_m))
        if i % 3 == 0:
            rows.append(mc_row(label, "one_hot_q", p_m, q_m))
            rows.append(mc_row(label, "sample_match", p_m, q_m))
    p_m, q_m, z_q = warped_pair(*MC_CONFIGS[1][:5], MC_CONFIGS[1][5] + 1000 * seed)
    wrong = mc_row("drafts from raw q, verifier told warped q (T=0.7)", "exact", p_m, q_m,
                   q_draft=adjust(z_q, SamplingConfig(), torch.float64))
    wrong["lossless"] = False
    rows.append(wrong)
    p_m, q_m, _ = warped_pair(*MC_CONFIGS[0][:5], MC_CONFIGS[0][5] + 1000 * seed)
    rows.append(mc_row("T=1.0, V=12, gamma=3", "typical", p_m, q_m))
    rows.append(mc_row("T=1.0, V=12, gamma=3", "lenience", p_m, q_m, lenience=0.5))
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def table():
    return exactness_table(4, 2, 5000, seed=0)  # the smoke profile's values


def test_exactness_table_equals_the_notebooks_inline_table(table):
    pd.testing.assert_frame_equal(table, _notebook_exactness(4, 2, 5000, 0))
    assert list(table.columns) == EXACTNESS_COLUMNS


def test_exactness_table_separates_the_lossless_from_the_lossy(table):
    """What notebook 02 asserts: lossless rules exact to 1e-12 and passing chi-square; lossy ones and the
    sampler bug caught by the same checks."""
    enum, mc = table[table["check"] == "enumeration"], table[table["check"] == "monte carlo"]
    assert (enum.loc[enum["lossless"], "max abs error"] < 1e-12).all()
    lossy = enum[~enum["lossless"] & enum["configuration"].str.startswith("random")]
    assert len(lossy) and (lossy["max abs error"] > 0.01).all()
    good, bad = mc[mc["lossless"]], mc[~mc["lossless"]]
    assert (good[["chi2 p (1st)", "chi2 p (2nd)"]] > 1e-3).all().all()
    assert len(bad) == 3 and (bad[["chi2 p (1st)", "chi2 p (2nd)"]].min(axis=1) < 1e-6).all()
    # every rule enumeration can check is enumerated on every kind (greedy on one_hot only)
    checked = {m for m in rule_names() if not get_rule(m).samples_target}
    for kind in BLOCK_KINDS:
        modes = {s.split()[0] for s in enum.loc[enum["configuration"].str.startswith(f"{kind} "), "mode"]}
        assert modes == (checked if kind == "one_hot" else checked - {"greedy"}), kind


def test_block_kinds_are_the_kinds_draft_tree_takes():
    for kind in BLOCK_KINDS:
        draft_tree(2, 1, kind)
    with pytest.raises(ValueError, match=re.escape(str(BLOCK_KINDS))):
        draft_tree(2, 1, "no_such_kind")


def test_exactness_table_bad_arguments():
    with pytest.raises(ValueError, match=r"^vocab: must be an integer >= 2"):
        exactness_table(1, 2, 10)
    with pytest.raises(ValueError, match=r"^mc_samples: must be an integer >= 1"):
        exactness_table(3, 2, 0)


def test_simulated_tokens_meets_the_closed_form_and_is_seeded():
    """Against independent facts, not a copy of the loop: Leviathan Eq. 1 (``(1 - alpha^(g+1)) / (1 - alpha)``
    written out here) within four standard errors, rows alpha-major, and the seed alone fixes the table."""
    got = simulated_tokens([0.5, 0.7, 0.9], [1, 3, 5], 4000, seed=2)
    assert list(zip(got["alpha"], got["gamma"])) == [(a, g) for a in (0.5, 0.7, 0.9) for g in (1, 3, 5)]
    eq1 = [(1 - a ** (g + 1)) / (1 - a) for a, g in zip(got["alpha"], got["gamma"])]
    assert got["closed form"].tolist() == pytest.approx(eq1, rel=1e-12)
    assert (got["std err"] > 0).all() and (got["z"].abs() < 4).all()
    assert got["z"].tolist() == pytest.approx(((got["simulated"] - got["closed form"]) / got["std err"]).tolist())
    pd.testing.assert_frame_equal(got, simulated_tokens([0.5, 0.7, 0.9], [1, 3, 5], 4000, seed=2))
    assert not got["simulated"].equals(simulated_tokens([0.5, 0.7, 0.9], [1, 3, 5], 4000, seed=3)["simulated"])


def test_simulated_tokens_at_the_ends_is_exact():
    got = simulated_tokens([0.0, 1.0], [3], 50)
    assert got["simulated"].tolist() == [1.0, 4.0] and (got["std err"] == 0).all()  # nothing or everything accepted
    assert got["closed form"].tolist() == [1.0, 4.0]
    with pytest.raises(ValueError, match=r"^n: must be an integer >= 2"):
        simulated_tokens([0.5], [1], 1)


def test_overlap_pair_overlaps_by_alpha():
    for a in (0.0, 0.3, 0.8, 1.0):
        p, q = overlap_pair(a, 2, 5)
        assert p.shape == (5, 3, 3) and q.shape == (5, 2, 3)
        assert torch.allclose(torch.minimum(p[:, :2], q).sum(-1), torch.full((5, 2), a, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^alpha: must lie in \[0, 1\]"):
        overlap_pair(1.5, 1, 1)
