"""Counts to rates (:mod:`spade_lib.rates`): each rate against a plain-pandas reference, on synthetic traces of
known acceptance, and one definition of each in the package."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spade_lib import diagnose as dg
from spade_lib import measures, rates
from spade_lib.intervals import binomial_ci

REPO = Path(__file__).resolve().parents[1]
ALPHA = (0.85, 0.7, 0.55, 0.4)


@pytest.fixture(scope="module")
def trace():
    return dg.synthetic_trace(3000, 4, ALPHA, n_prompts=8, seed=7)


@pytest.fixture(scope="module")
def mixed():
    """Two gammas and two categories: positions drafted by some steps only."""
    a = dg.synthetic_trace(400, 2, (0.9, 0.4), n_prompts=3, seed=1)
    b = dg.synthetic_trace(500, 4, ALPHA, n_prompts=4, categories=("math",), seed=2)
    return pd.concat([a, b.assign(prompt_id="m" + b["prompt_id"].astype(str))], ignore_index=True)


def test_rate_is_nan_where_nothing_was_counted():
    assert rates.rate(3, 4) == 0.75 and np.isnan(rates.rate(0, 0))
    np.testing.assert_array_equal(rates.rate(np.array([1, 0]), np.array([2, 0])), [0.5, np.nan])
    s = rates.rate(pd.Series([1, 2], index=["a", "b"]), pd.Series([4, 0], index=["a", "b"]))
    assert list(s.index) == ["a", "b"] and s["a"] == 0.25 and np.isnan(s["b"])


def test_counts_and_pooled_alphas_match_plain_pandas(mixed):
    ref = mixed.groupby("category").agg(drafted=("pos", "size"), reached=("reached", "sum"),
                                        accepted=("accepted", "sum")).reset_index()
    got = rates.counts(mixed, "category")
    pd.testing.assert_frame_equal(got[["category", "drafted", "reached", "accepted"]], ref, check_dtype=False)
    one = rates.counts(mixed).iloc[0]
    assert rates.alpha(one["accepted"], one["reached"]) == pytest.approx(mixed["accepted"].sum() / mixed["reached"].sum())
    assert rates.acceptance_per_drafted(one["accepted"], one["drafted"]) == pytest.approx(mixed["accepted"].mean())
    judged = mixed[mixed["reached"]]
    assert rates.expected_alpha(one["expected"], one["reached"]) == pytest.approx((1 - judged["tv"]).mean())


def test_position_rates_match_plain_pandas(mixed):
    table = rates.add_position_rates(rates.counts(mixed, ["category", "pos"]))
    for (cat, pos), g in mixed.groupby(["category", "pos"]):
        row = table[(table["category"] == cat) & (table["pos"] == pos)].iloc[0]
        reached = g[g["reached"]]
        assert row["alpha_cond"] == pytest.approx(reached["accepted"].mean())
        assert row["alpha_uncond"] == pytest.approx(g["accepted"].mean())
        assert row["expected_cond"] == pytest.approx((1 - reached["tv"]).mean())
        low, high = binomial_ci(reached["accepted"].sum(), len(reached))
        assert (row["alpha_cond_low"], row["alpha_cond_high"]) == pytest.approx((float(low), float(high)))
    assert "expected" not in table.columns
    # diagnose's table (its own fast counting) is these rates
    pos = dg.position_acceptance(mixed, by="category")
    pd.testing.assert_frame_equal(pos.reset_index(drop=True), table[pos.columns].reset_index(drop=True),
                                  check_dtype=False, check_categorical=False)


def test_position_rates_recover_the_known_alphas(trace):
    """A synthetic trace with conditional acceptance ALPHA at every position: alpha_cond -> ALPHA,
    alpha_uncond -> their running product (99.9 % Wilson intervals cover the truth)."""
    t = rates.add_position_rates(rates.counts(trace, "pos"), level=0.999)
    truth = dg.expected_position_acceptance(ALPHA).iloc[:4]
    for col in ("alpha_cond", "alpha_uncond"):
        assert (t[f"{col}_low"] <= truth[col]).all() and (truth[col] <= t[f"{col}_high"]).all()
    np.testing.assert_allclose(t["alpha_uncond"], np.cumprod(t["alpha_cond"]), rtol=1e-12)  # fixed gamma
    np.testing.assert_allclose(t["expected_cond"], ALPHA, atol=1e-6)


def test_accept_length_hist_matches_value_counts(mixed):
    steps = mixed[mixed["pos"] == 0]
    got = rates.accept_length_hist(steps, ["category"], k_max=4)
    for cat, g in steps.groupby("category"):
        ref = g["n_accepted"].value_counts().reindex(range(5), fill_value=0)
        h = got[got["category"] == cat].set_index("n_accepted")
        assert h["steps"].tolist() == ref.tolist()
        assert h["fraction"].tolist() == pytest.approx((ref / ref.sum()).tolist())
        assert h["survival"].tolist() == pytest.approx([(g["n_accepted"] >= k).mean() for k in range(5)])
        assert (h["accept_length"] == h.index + 1).all()
    assert rates.accept_length_hist(steps)["n_accepted"].max() == steps["n_accepted"].max()
    with pytest.raises(ValueError, match="k_max"):
        rates.accept_length_hist(steps, k_max=1)


def test_per_request_means_against_pooled(trace):
    steps = trace[trace["pos"] == 0]
    per = rates.tau_per_request(steps, ("prompt_id", "sample"))
    ref = steps.groupby(["prompt_id", "sample"])["n_accepted"].agg(lambda n: (n + 1).sum() / len(n))
    pd.testing.assert_series_equal(per, ref.rename("tau"), check_index_type=False)
    # pooled tau weighs each request by its steps: the steps-weighted mean of the per-request taus
    w = steps.groupby(["prompt_id", "sample"]).size()
    pooled = measures.tau(steps["n_accepted"].sum(), len(steps))
    assert pooled == pytest.approx((per * w).sum() / w.sum())
    # a summary's accept_lengths (n + 1 per step, every step) give the same per-request tau
    summ = pd.DataFrame({"question_id": ["a", "b"], "sample": [0, 0], "accept_lengths": [[1, 3, 4], [2]]})
    tau_s = rates.tau_per_request(summ)
    assert tau_s.tolist() == pytest.approx([8 / 3, 2.0])
    assert rates.tau_per_request(summ, with_bonus=False).tolist() == pytest.approx([5 / 3, 1.0])
    assert tau_s.mean() == pytest.approx((8 / 3 + 2) / 2) and measures.tau(6, 4) == pytest.approx(10 / 4)
    a = rates.alpha_per_request(trace)
    ref_a = trace[trace["reached"]].groupby(["prompt_id", "sample"])["accepted"].mean()
    np.testing.assert_allclose(a.to_numpy(), ref_a.to_numpy())


def test_add_rate_names_its_columns():
    t = pd.DataFrame({"k": [0, 3, 0], "n": [4, 4, 0]})
    rates.add_rate(t, "k", "n", "r")
    assert t["r"].tolist()[:2] == [0.0, 0.75] and np.isnan(t["r"].iloc[2])
    assert (t["r_low"].iloc[:2] <= t["r"].iloc[:2]).all() and np.isnan(t["r_high"].iloc[2])


def test_bad_input_names_the_argument(trace):
    with pytest.raises(ValueError, match="trace: lacks column"):
        rates.counts(trace.drop(columns="reached"))
    with pytest.raises(ValueError, match="steps: lacks column"):
        rates.accept_length_hist(trace.drop(columns="n_accepted"))


def _definitions(pattern: str) -> list[str]:
    hits = []
    for f in sorted((REPO / "spade_lib").rglob("*.py")):
        for i, line in enumerate(f.read_text().splitlines(), start=1):
            if re.search(pattern, line):
                hits.append(f"{f.relative_to(REPO)}:{i}")
    return hits


@pytest.mark.parametrize("pattern,home", [
    (r"^def position_acceptance\(", "spade_lib/diagnose/position.py"),
    (r"^def add_rate\(", "spade_lib/rates.py"),
    (r"^def tau\(", "spade_lib/measures.py"),
    (r"torch\.minimum\(p, q", "spade_lib/measures.py"),   # alpha from the distributions: measures.alpha
])
def test_one_definition(pattern, home):
    hits = _definitions(pattern)
    assert hits and all(re.fullmatch(home, h.split(":")[0]) for h in hits), hits


def test_the_tables_call_the_one_histogram_and_the_one_r_curve():
    import inspect

    from spade_lib import theory
    from spade_lib.diagnose import position, tree

    for f in (position.accept_length_hist, tree.tree_accept_length_hist):
        assert "accept_length_hist(steps" in inspect.getsource(f) and "bincount" not in inspect.getsource(f)
    assert "verify_cost_curve(" in inspect.getsource(theory.linear_verify_cost)
