"""M3 tables against known answers: synthetic traces with closed-form acceptance, and plain pandas /
scipy references for every aggregation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from spade_lib import diagnose as dg
from spade_lib.diagnose.frame import Groups
from spade_lib.diagnose.stats import digitize, grouped_mannwhitney, grouped_quantiles
from spade_lib.runs import metrics
from spade_lib.runs.trace import schema_for, write_shard

ALPHA = (0.8, 0.7, 0.6, 0.5)


@pytest.fixture(scope="module")
def trace() -> pd.DataFrame:
    return dg.synthetic_trace(6000, 4, ALPHA, n_prompts=12, seed=11)


@pytest.fixture(scope="module")
def sloped() -> pd.DataFrame:
    """Acceptance falls with H(p): logit(alpha) = logit(0.7) - 1.0 (H(p) - 1.5)."""
    return dg.synthetic_trace(12000, 4, (0.7,) * 4, n_prompts=24, entropy_slope=-1.0, seed=5)


@pytest.fixture(scope="module")
def mixed() -> pd.DataFrame:
    """Two runs with different gamma, concatenated: positions 2-3 exist only in some steps."""
    a = dg.synthetic_trace(500, 2, (0.9, 0.4), n_prompts=4, seed=1)
    b = dg.synthetic_trace(700, 4, ALPHA, n_prompts=5, categories=("math",), seed=2)
    b["prompt_id"] = "b" + b["prompt_id"]
    return pd.concat([a, b], ignore_index=True)


# -- synthetic traces ---------------------------------------------------------------------------


def test_synthetic_trace_schema_and_determinism(trace):
    empty = schema_for().empty_table().to_pandas()
    assert list(trace.columns) == list(empty.columns)
    assert (trace.dtypes == empty.dtypes).all()
    again = dg.synthetic_trace(6000, 4, ALPHA, n_prompts=12, seed=11)
    pd.testing.assert_frame_equal(trace, again)
    assert not trace.equals(dg.synthetic_trace(6000, 4, ALPHA, n_prompts=12, seed=12))


def test_synthetic_trace_block_invariants(trace):
    blocks = trace["accepted"].to_numpy().reshape(-1, 4)
    reached = trace["reached"].to_numpy().reshape(-1, 4)
    assert reached[:, 0].all()
    assert (reached[:, 1:] == np.cumprod(blocks[:, :-1], axis=1).astype(bool)).all()
    assert not (trace["accepted"] & ~trace["reached"]).any()
    assert (trace["n_accepted"].to_numpy().reshape(-1, 4)[:, 0] == blocks.sum(axis=1)).all()
    r = trace[trace["reached"]]
    assert ((r["uniform"] < r["accept_prob"]) == r["accepted"]).all()  # an exact sampler
    assert np.allclose(r["accept_prob"], np.minimum(1, r["p_x"] / r["q_x"]), atol=1e-6)
    assert (trace["kl"] >= 2 * trace["tv"] ** 2 - 1e-6).all()  # Pinsker
    # abs_pos counts the tokens emitted before the step: N + 1 per earlier step of the generation.
    steps = trace[trace["pos"] == 0]
    emitted = steps.groupby("prompt_id")["n_accepted"].transform(lambda s: (s + 1).cumsum() - (s + 1))
    assert (steps["abs_pos"] == emitted).all()


@pytest.mark.parametrize("kwargs", [dict(n_steps=0), dict(gamma=0), dict(alpha_by_pos=(0.5,)),
                                    dict(alpha_by_pos=(1.0, 0.5, 0.5, 0.5)), dict(n_prompts=0),
                                    dict(wrong_q=-1.0), dict(category_logit=(1.0,))])
def test_synthetic_trace_rejects_bad_arguments(kwargs):
    args = dict(n_steps=10, gamma=4, alpha_by_pos=ALPHA, n_prompts=2)
    args.update(kwargs)
    with pytest.raises(ValueError):
        dg.synthetic_trace(**args)


# -- statistics ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method,ref", [("wilson", "wilson"), ("clopper-pearson", "exact")])
def test_binomial_ci_matches_scipy(method, ref):
    for k, n in [(0, 10), (3, 10), (10, 10), (57, 200), (1, 1)]:
        low, high = dg.binomial_ci(k, n, 0.9, method)
        ci = stats.binomtest(k, n).proportion_ci(0.9, method=ref)
        assert low == pytest.approx(ci.low, abs=1e-9) and high == pytest.approx(ci.high, abs=1e-9)
    low, high = dg.binomial_ci([0], [0])
    assert np.isnan(low).all() and np.isnan(high).all()
    with pytest.raises(ValueError):
        dg.binomial_ci(5, 3)
    with pytest.raises(ValueError):
        dg.binomial_ci(1, 3, method="agresti")


def test_grouped_mannwhitney_and_quantiles_match_scipy_and_numpy():
    """Both work at float32 precision, the trace's storage type."""
    rng = np.random.default_rng(0)
    ids = rng.integers(-1, 4, 3000)  # -1: excluded rows
    x = np.round(rng.normal(size=3000) + 0.3 * ids, 1).astype(np.float32)  # rounded: many ties
    flag = rng.random(3000) < 0.3 + 0.2 * (x > 0)
    u, area, p = grouped_mannwhitney(ids, x, flag, 4)
    q = grouped_quantiles(ids, x, 4, (0.1, 0.5, 0.9))
    for g in range(4):
        m = ids == g
        ref = stats.mannwhitneyu(x[m & flag].astype(float), x[m & ~flag].astype(float), method="asymptotic")
        assert u[g] == ref.statistic and p[g] == pytest.approx(ref.pvalue, rel=1e-9)
        assert area[g] == pytest.approx(ref.statistic / ((m & flag).sum() * (m & ~flag).sum()))
        assert np.allclose(q[g], np.quantile(x[m], (0.1, 0.5, 0.9)))
    smooth = rng.normal(size=3000).astype(np.float32)  # no ties: the other code path
    u, area, p = grouped_mannwhitney(ids, smooth, flag, 4)
    for g in range(4):
        m = ids == g
        ref = stats.mannwhitneyu(smooth[m & flag].astype(float), smooth[m & ~flag].astype(float),
                                 method="asymptotic")
        assert u[g] == ref.statistic and p[g] == pytest.approx(ref.pvalue, rel=1e-9)


def test_digitize_matches_searchsorted():
    x = np.random.default_rng(1).normal(size=5000).astype(np.float32)
    x[7] = np.nan
    for edges in (np.array([-5, -1, 0, 0.5, 1, 5.0]), np.linspace(-3, 3, 100)):
        ref = np.clip(np.searchsorted(edges, x.astype(float), side="right") - 1, 0, len(edges) - 2)
        assert (digitize(x, edges) == np.where(np.isfinite(x), ref, -1)).all()


def test_auc_is_the_probability_of_a_correct_ranking():
    scores = np.array([0.1, 0.4, 0.35, 0.8, 0.4])
    labels = np.array([0, 0, 1, 1, 1], bool)
    pairs = [(s1 > s0) + 0.5 * (s1 == s0) for s1 in scores[labels] for s0 in scores[~labels]]
    assert dg.auc(scores, labels) == pytest.approx(np.mean(pairs))
    assert np.isnan(dg.auc(scores, np.ones(5, bool)))


def test_poisson_binomial_z_degenerate_variance():
    z, p = dg.poisson_binomial_z([3, 3], [3.0, 2.0], [0.0, 0.0])
    assert z[0] == 0 and p[0] == 1 and np.isinf(z[1]) and p[1] == 0


def test_groups_match_pandas_groupby(mixed):
    df = mixed.assign(cat=mixed["category"].astype("category"))
    mask = df["reached"].to_numpy()
    for keys in (["category", "pos"], ["cat", "gamma"], ["prompt_id"], []):
        g = Groups.of(df, keys, mask=mask)
        got = g.frame().assign(n=g.sum(), acc=g.sum(df["accepted"].to_numpy()))
        if keys:
            ref = df[mask].groupby(keys, observed=True).agg(n=("pos", "size"), acc=("accepted", "sum")).reset_index()
        else:
            ref = pd.DataFrame({"n": [mask.sum()], "acc": [df["accepted"][mask].sum()]})
        assert got["n"].tolist() == ref["n"].tolist() and got["acc"].tolist() == ref["acc"].tolist()
        for k in keys:
            assert got[k].astype(str).tolist() == ref[k].astype(str).tolist()


# -- inputs ---------------------------------------------------------------------------------------


def test_inputs_are_checked(trace):
    with pytest.raises(ValueError, match="missing column"):
        dg.position_acceptance(trace.drop(columns="tv"))
    with pytest.raises(ValueError, match="by names column"):
        dg.position_acceptance(trace, by="nope")
    with pytest.raises(ValueError, match="DataFrame or a run directory"):
        dg.position_acceptance([1, 2, 3])
    with pytest.raises(FileNotFoundError):
        dg.position_acceptance("/nonexistent/run")


def test_nan_probabilities_are_refused_naming_the_column(trace):
    bad = trace.copy()
    bad.loc[bad.index[:3], "accept_prob"] = np.nan
    with pytest.raises(ValueError, match=r"^trace: column 'accept_prob' has 3 NaN row\(s\)"):
        dg.expected_vs_realised(bad)
    with pytest.raises(ValueError, match="'accept_prob' has 3 NaN"):
        dg.calibration_table(bad, score="accept_prob")
    bad = trace.copy()
    bad.loc[bad.index[5], "p_x"] = np.nan
    with pytest.raises(ValueError, match=r"^trace: column 'p_x' has 1 NaN"):
        dg.acceptance_by_bins(bad, measures=("p_x",))
    bad = trace.copy()
    bad.loc[bad.index[:2], "tv"] = np.nan
    with pytest.raises(ValueError, match="'tv' has 2 NaN"):
        dg.position_acceptance(bad)
    ok = trace.copy()
    ok["uniform"] = np.float32(np.nan)  # NaN by design in deterministic modes
    dg.expected_vs_realised(ok)
    dg.position_acceptance(ok)


def test_tables_read_a_run_directory(tmp_path):
    small = dg.synthetic_trace(40, 4, ALPHA, n_prompts=2, seed=3)
    for pid, sub in small.groupby("prompt_id"):
        write_shard(sub.to_dict("records"), tmp_path / "trace" / f"{pid}.parquet", {"pair": "synthetic"})
    from_dir = dg.position_acceptance(tmp_path)
    pd.testing.assert_frame_equal(from_dir, dg.position_acceptance(small))


def test_combine_runs_labels_in_order(trace):
    both = dg.combine_runs({"distilled": trace, "ngram": trace.head(400)}, key="draft")
    assert list(both["draft"].cat.categories) == ["distilled", "ngram"]
    assert (both["draft"] == "ngram").sum() == 400
    with pytest.raises(ValueError):
        dg.combine_runs({})


# -- position -------------------------------------------------------------------------------------


def test_position_acceptance_recovers_alpha_by_position(trace):
    t = dg.position_acceptance(trace, level=0.999)
    truth = dg.expected_position_acceptance(ALPHA).iloc[:4]
    assert (t["alpha_cond_low"] <= truth["alpha_cond"]).all() and (truth["alpha_cond"] <= t["alpha_cond_high"]).all()
    assert (t["alpha_uncond_low"] <= truth["alpha_uncond"]).all()
    assert (truth["alpha_uncond"] <= t["alpha_uncond_high"]).all()
    assert np.allclose(t["expected_cond"], ALPHA, atol=1e-6)  # 1 - tv is exact in the generator
    assert (t["drafted"] == 6000).all()


def test_position_acceptance_matches_reference_with_mixed_gamma(mixed):
    t = dg.position_acceptance(mixed, by="category")
    ref = mixed.groupby(["category", "pos"]).agg(drafted=("pos", "size"), reached=("reached", "sum"),
                                                 accepted=("accepted", "sum")).reset_index()
    assert t[["drafted", "reached", "accepted"]].to_numpy().tolist() == \
        ref[["drafted", "reached", "accepted"]].to_numpy().tolist()
    assert np.allclose(t["alpha_cond"], ref["accepted"] / ref["reached"])
    assert np.allclose(t["alpha_uncond"], ref["accepted"] / ref["drafted"])


def test_accept_length_hist_matches_closed_form(trace):
    h = dg.accept_length_hist(trace)
    truth = dg.expected_position_acceptance(ALPHA)
    assert h["n_accepted"].tolist() == [0, 1, 2, 3, 4] and h["accept_length"].tolist() == [1, 2, 3, 4, 5]
    assert h["steps"].sum() == 6000 and h["fraction"].sum() == pytest.approx(1.0)
    assert h["survival"].iloc[0] == pytest.approx(1.0)
    chi2 = stats.chisquare(h["steps"], truth["p_n_accepted"] * 6000)
    assert chi2.pvalue > 1e-3
    assert np.allclose(h["survival"], truth["survival"], atol=0.03)


def test_accept_length_hist_by_group_keeps_zero_counts(mixed):
    h = dg.accept_length_hist(mixed, by="gamma")
    assert len(h) == 2 * 5  # k = 0..max gamma for every group
    two = h[h["gamma"] == 2]
    assert (two.loc[two["n_accepted"] > 2, "steps"] == 0).all()
    ref = mixed[mixed["pos"] == 0].groupby(["gamma", "n_accepted"]).size()
    assert all(two.set_index("n_accepted").loc[k, "steps"] == ref[(2, k)] for k in range(3))


def test_acceptance_heatmap_sums_steps(trace):
    hm = dg.acceptance_heatmap(trace, step_bin=7)
    steps = trace[trace["pos"] == 0]
    assert hm["n_accepted"].sum() == steps["n_accepted"].sum() and hm["steps"].sum() == len(steps)
    ref = steps.assign(b=steps["step"] // 7).groupby(["prompt_id", "b"])["n_accepted"].sum()
    assert hm["n_accepted"].tolist() == ref.tolist()
    assert (hm["step"] % 7 == 0).all() and hm["rate"].between(0, 1).all()
    assert (hm.groupby("prompt_id")["category"].nunique() == 1).all()
    with pytest.raises(ValueError):
        dg.acceptance_heatmap(trace, step_bin=0)


# -- correlates ---------------------------------------------------------------------------------


def test_entropy_by_outcome_matches_reference(sloped):
    t = dg.entropy_by_outcome(sloped)
    r = sloped[sloped["reached"]]
    sub = r[(r["pos"] == 1) & ~r["accepted"]]["h_q"].astype(float)
    row = t[(t["pos"] == 1) & (t["measure"] == "h_q") & (t["outcome"] == "rejected")].iloc[0]
    assert row["n"] == len(sub) and row["mean"] == pytest.approx(sub.mean())
    assert row["std"] == pytest.approx(sub.std()) and row["median"] == pytest.approx(sub.median())
    acc = r[(r["pos"] == 1) & r["accepted"]]["h_q"].astype(float)
    ref = stats.mannwhitneyu(sub, acc, method="asymptotic")
    assert row["p_value"] == pytest.approx(ref.pvalue, rel=1e-6, abs=1e-300)
    # acceptance falls with H(p): rejected positions carry more target entropy, at every position
    hp = t[t["measure"] == "h_p"].pivot(index="pos", columns="outcome", values="mean")
    assert (hp["rejected"] > hp["accepted"]).all()
    assert (t.loc[t["measure"] == "h_p", "auc_rejected"] > 0.6).all()


def test_entropy_by_outcome_without_effect(trace):
    t = dg.entropy_by_outcome(trace, measures=("h_p",))
    assert (t["auc_rejected"].between(0.45, 0.55)).all()
    assert (t["p_value"] > 1e-3).all()


def test_acceptance_by_bins_matches_expectation(sloped):
    t = dg.acceptance_by_bins(sloped, bins=8, level=0.999)
    reached = int(sloped["reached"].sum())
    assert (t.groupby("measure")["n"].sum() == reached).all()
    assert ((t["rate_low"] <= t["expected"]) & (t["expected"] <= t["rate_high"])).all()
    hp = t[t["measure"] == "h_p"]
    assert hp["rate"].is_monotonic_decreasing or np.corrcoef(hp["x_mean"], hp["rate"])[0, 1] < -0.9
    assert (np.diff(hp["bin_low"]) > 0).all() and np.allclose(hp["bin_high"].iloc[:-1], hp["bin_low"].iloc[1:])


def test_acceptance_logit_recovers_known_coefficients(sloped):
    fit = dg.acceptance_logit(sloped, features=("pos", "h_p", "h_q"), seed=0)
    c = fit.coefficients.set_index("term")
    assert abs(c.loc["h_p", "coef"] - (-1.0)) < 4 * c.loc["h_p", "se"]
    assert abs(c.loc["h_q", "coef"]) < 4 * c.loc["h_q", "se"]
    assert abs(c.loc["pos", "coef"]) < 4 * c.loc["pos", "se"]
    intercept = np.log(0.7 / 0.3) + 1.5  # logit(0.7) - (-1.0) * 1.5
    assert c.loc["intercept", "coef"] == pytest.approx(intercept, abs=0.15)
    s = fit.scores.iloc[0]
    assert 0.65 < s["auc_test"] < 0.85 and s["n_test"] > 0 and s["n_train"] > s["n_test"]


def test_acceptance_logit_held_out_generations_and_groups(sloped):
    fit = dg.acceptance_logit(sloped, by="category", features=("h_p",), test_fraction=0.25, seed=3)
    assert fit.scores["category"].tolist() == ["code", "prose"]
    assert (fit.scores["n_test"] > 0).all()
    all_accepted = sloped.assign(accepted=sloped["reached"])
    with pytest.raises(ValueError, match="single outcome"):
        dg.acceptance_logit(all_accepted, features=("h_p",))
    half = pd.concat([all_accepted[all_accepted["category"] == "code"], sloped[sloped["category"] == "prose"]])
    skipped = dg.acceptance_logit(half, by="category", features=("h_p",), skip_degenerate=True)
    assert skipped.scores["fitted"].tolist() == [False, True]
    assert set(skipped.coefficients["category"]) == {"prose"}
    none = dg.acceptance_logit(all_accepted, features=("h_p",), skip_degenerate=True)
    assert none.coefficients.empty and not none.scores["fitted"].any()
    with pytest.raises(ValueError):
        dg.acceptance_logit(sloped, test_fraction=1.0)


# -- calibration and expected vs realised ---------------------------------------------------------


def test_accept_prob_is_calibrated_and_ece_formula(sloped):
    t = dg.calibration_table(sloped, score="accept_prob", bins=10, level=0.999)
    assert ((t["rate_low"] <= t["confidence"]) & (t["confidence"] <= t["rate_high"])).all()
    e = dg.calibration_error(t).iloc[0]
    assert e["ece"] == pytest.approx((t["n"] * t["gap"].abs()).sum() / t["n"].sum())
    assert e["ece"] < 0.02 and e["mce"] == pytest.approx(t["gap"].abs().max())
    q = dg.calibration_error(dg.calibration_table(sloped, score="q_x")).iloc[0]
    assert q["ece"] > 0.1  # the synthetic draft's confidence says nothing about acceptance


def test_expected_vs_realised_passes_an_exact_sampler(trace):
    for by in (None, "pos", "category", ["category", "pos"]):
        t = dg.expected_vs_realised(trace, by)
        assert (t["p_bonferroni"] > 0.01).all(), t
    t = dg.expected_vs_realised(trace, "pos")
    r = trace[trace["reached"] & (trace["pos"] == 2)]
    row = t[(t["basis"] == "accept_prob") & (t["pos"] == 2)].iloc[0]
    pi = r["accept_prob"].astype(float)
    assert row["expected"] == pytest.approx(pi.sum()) and row["variance"] == pytest.approx((pi * (1 - pi)).sum())
    assert row["z"] == pytest.approx((r["accepted"].sum() - pi.sum()) / np.sqrt((pi * (1 - pi)).sum()))


def test_expected_vs_realised_flags_a_wrong_q():
    wrong = dg.synthetic_trace(6000, 4, ALPHA, n_prompts=12, seed=11, wrong_q=0.15)
    t = dg.expected_vs_realised(wrong)
    assert (t["p_value"] < 1e-6).all() and (t["gap"] < 0).all()
    per_pos = dg.expected_vs_realised(wrong, "pos", bases=("accept_prob",))
    assert (per_pos["z"] < 0).all() and per_pos["p_value"].min() < 1e-6
    with pytest.raises(ValueError):
        dg.expected_vs_realised(wrong, bases=("kl",))


def test_expected_vs_realised_greedy_trace():
    g = dg.synthetic_trace(50, 4, ALPHA, n_prompts=2, seed=0)
    g["accept_prob"] = g["accepted"].astype("float32")  # greedy: pi in {0, 1}, flags deterministic
    g["tv"] = 1.0 - g["accept_prob"]
    t = dg.expected_vs_realised(g)
    assert (t["z"] == 0).all() and (t["p_value"] == 1).all()
    g.loc[g.index[g["reached"]][0], "accepted"] = not g.loc[g.index[g["reached"]][0], "accepted"]
    assert (dg.expected_vs_realised(g)["p_value"] == 0).all()


# -- tokens and summary -------------------------------------------------------------------------


class _Decoder:
    vocab = {0: " ", 1: "\n", 2: " self", 3: "(", 4: "42", 5: "x=1"}

    def decode(self, ids):
        return "".join(self.vocab[i] for i in ids)


class _HFLike:
    def convert_ids_to_tokens(self, i):
        return f"tok{i}"


def _token_trace() -> pd.DataFrame:
    t = dg.synthetic_trace(300, 1, (0.5,), n_prompts=3, seed=4)
    tokens = np.arange(len(t)) % 6
    t["draft_token"] = tokens.astype(np.int32)
    t["accepted"] = tokens % 2 == 0  # even ids always accepted, odd ids always rejected
    t["reached"] = True
    return t


def test_token_table_counts_rates_and_decoding():
    t = dg.token_table(_token_trace(), _Decoder(), min_support=10)
    assert set(t["token"]) == set(range(6)) and (t["n"] == 50).all()
    assert t["rejected"].iloc[0] == 50 and t["token"].iloc[0] == 1  # most rejections first, ties by id
    assert (t.loc[t["token"] % 2 == 0, "rate"] == 1).all() and (t.loc[t["token"] % 2 == 1, "rate"] == 0).all()
    assert t["rejected_share"].sum() == pytest.approx(1.0)
    assert dict(zip(t["token"], t["display"]))[1] == "\\n"
    assert dict(zip(t["token"], t["token_class"])) == {0: "whitespace", 1: "whitespace", 2: "identifier",
                                                       3: "punctuation", 4: "number", 5: "other"}
    assert dg.token_table(_token_trace(), None, min_support=51).empty
    assert dg.token_table(_token_trace(), _HFLike())["text"].str.startswith("tok").all()
    assert dg.token_table(_token_trace())["text"].iloc[0] == "<1>"
    with pytest.raises(ValueError):
        dg.token_table(_token_trace(), object())


def test_token_class_acceptance():
    t = dg.token_class_acceptance(_token_trace(), _Decoder()).set_index("token_class")
    assert t.loc["whitespace", "n"] == 100 and t.loc["whitespace", "accepted"] == 50
    assert t.loc["identifier", "rate"] == 1 and t.loc["other", "rate"] == 0
    assert t["rejected_share"].sum() == pytest.approx(1.0)


def test_off_head_rejections_counts_emitted_tokens_off_the_head():
    """A trimmed head scores {0, 1, 2}: of the four rejections, the two whose emitted token is 7 or 9 are off it;
    accepted and unreached rows never count, a draft not named in ``heads`` is left out."""
    rows = pd.DataFrame({
        "draft": ["fr"] * 7 + ["full"] * 2,
        "reached": [True, True, True, True, True, True, False, True, True],
        "accepted": [True, False, False, False, False, True, False, False, False],
        "next_token": [0, 7, 1, 9, 2, 5, 8, 9, 9],
        "prompt_id": ["a"] * 9, "sample": [0] * 9, "step": [0, 1, 2, 3, 4, 5, 6, 7, 8],
    })
    t = dg.off_head_rejections(rows, {"fr": [0, 1, 2]}, by="draft")
    assert t[["draft", "head_size", "rejections", "off_head"]].values.tolist() == [["fr", 3, 4, 2]]
    tree = pd.concat([rows, rows.iloc[[1]]])  # a second rejected sibling of step 1 (same next_token): counted once
    assert dg.off_head_rejections(tree, {"fr": [0, 1, 2]})["rejections"].iloc[0] == 4
    assert t["off_head_share"].iloc[0] == pytest.approx(0.5)
    assert t["off_head_share_low"].iloc[0] < 0.5 < t["off_head_share_high"].iloc[0]
    for bad in ({}, [0, 1]):
        with pytest.raises(ValueError, match="^heads: a non-empty dict"):
            dg.off_head_rejections(rows, bad)


def test_category_summary_in_spec_bench_shape(trace):
    s = dg.category_summary(trace, baseline_tokens_per_second={"code": 100.0, "prose": 100.0, "overall": 50.0})
    assert s["category"].tolist() == ["code", "prose", "overall"]
    steps = trace[trace["pos"] == 0]
    for cat, sub in list(steps.groupby("category")) + [("overall", steps)]:
        row = s.set_index("category").loc[cat]
        assert row["tau_drafting_steps"] == pytest.approx((sub["n_accepted"] + 1).mean())
        toks = trace if cat == "overall" else trace[trace["category"] == cat]
        assert row["tau_drafting_steps"] == pytest.approx(metrics.tau_drafting_steps(toks))
        assert row["tau_no_bonus_drafting_steps"] == pytest.approx(sub["n_accepted"].mean())
        assert row["generations"] == sub["prompt_id"].nunique()
        assert row["acceptance"] == pytest.approx(toks["accepted"].sum() / len(toks))
        assert row["alpha"] == pytest.approx(toks["accepted"].sum() / toks["reached"].sum())
        t = (sub["t_draft"] + sub["t_verify"] + sub["t_overhead"]).sum()
        assert row["tokens_per_second"] == pytest.approx((sub["n_accepted"] + 1).sum() / t)
    assert s.set_index("category").loc["overall", "speedup"] == pytest.approx(
        s.set_index("category").loc["overall", "tokens_per_second"] / 50.0)
    no_time = dg.category_summary(trace.assign(t_draft=np.nan), overall=False)
    assert no_time["tokens_per_second"].isna().all() and len(no_time) == 2


def test_all_tables_with_runs_side_by_side(trace):
    both = dg.combine_runs({"distilled": trace, "ngram": dg.synthetic_trace(800, 4, (0.5, 0.4, 0.3, 0.2),
                                                                           n_prompts=8, seed=9)}, "draft")
    tables = dg.all_tables(both, by="draft", min_support=5)
    assert {"position", "accept_length", "entropy", "binned", "logit_coefficients", "logit_scores",
            "calibration", "calibration_error", "expected_overall", "expected_by_position",
            "expected_by_category", "tokens", "token_classes", "summary", "heatmap"} <= set(tables)
    for name, t in tables.items():
        assert isinstance(t, pd.DataFrame) and len(t) > 0, name
        assert "draft" in t.columns, name
    pos = tables["position"]
    assert (pos.groupby("draft", observed=True)["alpha_cond"].first() > [0.75, 0.4]).all()
