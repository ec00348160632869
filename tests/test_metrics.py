"""Metrics: hand-computed cases, and the i.i.d. model's closed forms on simulated traces."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from spade_lib.diagnose import position_acceptance
from spade_lib.runs import metrics


def trace_from_blocks(blocks, gamma_of=None, tv=0.3, t_draft=0.01):
    """Trace rows from a list of (prompt_id, n_accepted, gamma) blocks."""
    rows, step = [], {}
    for pid, n, gamma in blocks:
        s = step.get(pid, 0)
        step[pid] = s + 1
        for pos in range(gamma):
            rows.append(dict(prompt_id=pid, category="c", sample=0, step=s, pos=pos, gamma=gamma,
                             reached=pos <= n, accepted=pos < n, n_accepted=n, tv=tv,
                             t_draft=t_draft, next_token=1, t_verify=0.0, t_overhead=0.0))
    return pd.DataFrame(rows)


def summary(qids, new_tokens, wall_time, accept_lengths=None):
    return pd.DataFrame({
        "question_id": qids, "category": "c", "sample": 0, "new_tokens": new_tokens,
        "wall_time": wall_time,
        "accept_lengths": accept_lengths if accept_lengths is not None else [[] for _ in qids],
    })


def test_hand_computed_block_metrics():
    # steps: n=2 of 3, n=3 of 3 (bonus), n=0 of 3  -> judged 3 + 3 + 1 = 7, accepted 5
    t = trace_from_blocks([("a", 2, 3), ("a", 3, 3), ("b", 0, 3)])
    assert metrics.acceptance_rate(t) == pytest.approx(5 / 7)
    assert metrics.acceptance_rate(t, over="drafted") == pytest.approx(5 / 9)
    assert metrics.mean_accepted_length(t) == pytest.approx((3 + 4 + 1) / 3)
    assert metrics.mean_accepted_length(t, with_bonus=False) == pytest.approx(5 / 3)
    pa_ = position_acceptance(t)
    assert pa_["drafted"].tolist() == [3, 3, 3]
    assert pa_["reached"].tolist() == [3, 2, 2]
    assert pa_["accepted"].tolist() == [2, 2, 1]
    assert pa_["alpha_cond"].tolist() == pytest.approx([2 / 3, 1.0, 0.5])
    assert pa_["alpha_uncond"].tolist() == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    assert pa_["expected_cond"].tolist() == pytest.approx([0.7] * 3)
    m = metrics.run_metrics(t, summary(["a", "b"], [8, 1], [1.0, 1.0], [[3, 4], [1]]))
    assert (m["alpha"], m["accepted"], m["reached"]) == (pytest.approx(5 / 7), 5.0, 7.0)
    assert m["alpha_expected"] == pytest.approx(0.7)  # mean 1 - tv over the judged positions


def test_tau_drafting_steps_leaves_out_steps_that_drafted_nothing():
    """A run's tau counts every step (summary); its trace has rows only for the steps that drafted, so
    the trace gives tau_drafting_steps, larger when some steps drafted nothing; a decoder's result
    carries the run's tau."""
    from spade_lib.decoding.common import GenerationResult, StepInfo

    t = trace_from_blocks([("a", 2, 3), ("a", 3, 3)])  # two drafting steps ...
    s = summary(["a"], [8], [1.0], [[3, 4, 1]])       # ... and one that drafted nothing (n = 0)
    assert metrics.tau_drafting_steps(t) == pytest.approx((3 + 4) / 2)
    assert metrics.tau_drafting_steps(t, with_bonus=False) == pytest.approx(5 / 2)
    assert metrics.mean_accepted_length(t) == metrics.tau_drafting_steps(t)  # a trace: the named variant
    assert metrics.mean_accepted_length(s) == pytest.approx((3 + 4 + 1) / 3)
    steps = [StepInfo(g, n, 7, n + 1, 0, "max_gamma") for g, n in ((3, 2), (3, 3), (0, 0))]
    out = GenerationResult([7] * 8, 4, "max_new_tokens", steps)
    assert out.tau == metrics.mean_accepted_length(s) == sum(out.accept_lengths) / out.n_steps
    assert math.isnan(GenerationResult([], 4, "max_new_tokens").tau)


def test_summary_metrics_and_truncation_rule():
    # the last step of "a" yielded 4 tokens but only 2 fit in max_new_tokens: new_tokens counts 2
    s = summary(["a", "b"], [6, 4], [2.0, 1.0], [[4, 4], [1, 1, 2]])
    assert metrics.mean_accepted_length(s) == pytest.approx((4 + 4 + 1 + 1 + 2) / 5)
    assert metrics.block_efficiency(s) == pytest.approx(10 / 5)
    assert metrics.tokens_per_second(s) == pytest.approx(10 / 3)
    assert metrics.tokens_per_second(s, per_generation=True).tolist() == [3.0, 4.0]


def test_speedups_ratio_of_totals_vs_mean_of_ratios():
    base = summary(["a", "b"], [10, 10], [1.0, 4.0])
    meth = summary(["b", "a"], [10, 10], [1.0, 0.5])  # order does not matter
    assert metrics.speedup_ratio_of_totals(meth, base) == pytest.approx(5.0 / 1.5)
    assert metrics.speedup_mean_of_ratios(meth, base) == pytest.approx((2.0 + 4.0) / 2)
    with pytest.raises(ValueError, match="same .* generations"):
        metrics.speedup_ratio_of_totals(meth.iloc[:1], base)


def test_cost_ratio_counts_step_time_once():
    t = trace_from_blocks([("a", 1, 4), ("a", 4, 4)], t_draft=0.004)  # 8 drafted, 2 steps
    ar = summary(["a"], [100], [1.0])  # 10 ms per target step
    assert metrics.cost_ratio(t, ar) == pytest.approx((0.008 / 8) / 0.01)


def test_trace_costs_by_hand():
    """c_trace and r_trace of one run against its AR generations, from the step timings by hand: a step's
    t_draft / t_verify sit on each of its rows and count once."""
    t = trace_from_blocks([("a", 1, 4), ("a", 4, 4), ("b", 0, 2)], t_draft=0.006)  # 10 drafted, 3 steps
    t["t_verify"] = np.repeat([0.01, 0.02, 0.03], [4, 4, 2])  # per step
    ar = summary(["a", "b"], [60, 40], [0.5, 0.5])  # 10 ms per AR token
    got = metrics.trace_costs(t, ar)
    assert got == pytest.approx({"c_trace": (3 * 0.006 / 10) / 0.01, "r_trace": 0.02 / 0.01})
    assert got["c_trace"] == metrics.cost_ratio(t, ar) and got["r_trace"] == metrics.verify_cost_ratio(t, ar)
    assert math.isnan(metrics.trace_costs(t.drop(columns="t_verify"), ar)["r_trace"])
    assert metrics.run_metrics(t, summary(["a", "b"], [8, 1], [0.1, 0.1]), ar)["c_trace"] == got["c_trace"]
    with pytest.raises(ValueError, match="cost_ratio"):
        metrics.trace_costs(t.iloc[:0], ar)


def test_predicted_speedup_closed_form():
    assert metrics.predicted_speedup(0.0, 4, 0.0) == 1.0
    assert metrics.predicted_speedup(1.0, 4, 0.0) == 5.0
    assert metrics.predicted_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8**5) / 0.2 / 1.2)
    assert metrics.predicted_speedup(1 - 1e-12, 3, 0.1) == pytest.approx(4 / 1.3)
    with pytest.raises(ValueError, match="alpha"):
        metrics.predicted_speedup(1.5, 4, 0.1)


def test_iid_simulation_matches_closed_forms():
    """Blocks with i.i.d. Bernoulli(alpha) acceptances: tau -> (1 - a^(g+1)) / (1 - a), position i
    unconditional -> a^(i+1), conditional -> a. Each check is a z-test at two-sided p = 1e-4."""
    alpha, gamma, n_blocks = 0.7, 4, 4000
    rng = np.random.default_rng(0)
    coins = rng.random((n_blocks, gamma)) < alpha
    n_acc = np.where(coins.all(1), gamma, coins.argmin(1))
    t = trace_from_blocks([("p", int(n), gamma) for n in n_acc])
    z = stats.norm.ppf(1 - 1e-4 / 2)
    pa_ = position_acceptance(t)
    for i in range(gamma):
        p_u = alpha ** (i + 1)
        assert abs(pa_["alpha_uncond"][i] - p_u) < z * math.sqrt(p_u * (1 - p_u) / n_blocks)
        r = pa_["reached"][i]
        assert abs(pa_["alpha_cond"][i] - alpha) < z * math.sqrt(alpha * (1 - alpha) / r)
    tau = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    lengths = n_acc + 1
    assert abs(metrics.mean_accepted_length(t) - tau) < z * lengths.std() / math.sqrt(n_blocks)
    assert metrics.predicted_speedup(alpha, gamma, 0.0) == pytest.approx(tau)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="trace lacks column"):
        metrics.acceptance_rate(pd.DataFrame({"accepted": [True]}))
    with pytest.raises(ValueError, match="over must be"):
        metrics.acceptance_rate(trace_from_blocks([("a", 1, 2)]), over="steps")
    with pytest.raises(ValueError, match="empty"):
        metrics.acceptance_rate(trace_from_blocks([]).reindex(columns=["accepted", "reached"]))
    with pytest.raises(ValueError, match="wall_time must be positive"):
        metrics.tokens_per_second(summary(["a"], [3], [0.0]))


def test_run_metrics_collects_everything():
    t = trace_from_blocks([("a", 2, 3), ("a", 3, 3), ("b", 0, 3)], t_draft=0.003)
    s = summary(["a", "b"], [7, 1], [0.5, 0.1], [[3, 4], [1]])
    ar = summary(["a", "b"], [7, 1], [1.0, 0.2])
    m = metrics.run_metrics(t, s, ar, gamma=3)
    assert m["alpha"] == pytest.approx(5 / 7) and m["tau"] == pytest.approx(8 / 3)
    assert (m["accepted"], m["reached"]) == (5, 7)  # the counts behind alpha
    assert m["speedup"] == pytest.approx(2.0) and m["mean_gamma"] == 3
    assert m["predicted_thm38"] == pytest.approx(metrics.predicted_speedup(5 / 7, 3, m["c_trace"]))
    # no cost table: the trace's estimates only, under their own names; c and r are the measurement's
    assert m["c_trace"] == metrics.cost_ratio(t, ar) and math.isnan(m["c"]) and math.isnan(m["r"])
    assert m["predicted"] == pytest.approx(m["predicted_thm38"])  # every step drafted 3, r unmeasured (0 s)
    assert m["speedup_low"] <= m["speedup"] <= m["speedup_high"]
    assert m["fraction_of_prediction"] == pytest.approx(2.0 / m["predicted"])
    b = metrics.run_metrics(t.iloc[:0], ar, ar, gamma=3)  # a baseline: no trace rows
    assert b["speedup"] == 1.0 and math.isnan(b["alpha"]) and math.isnan(b["predicted"])


def test_predicted_speedup_with_verify_cost_and_drafted_counts():
    from spade_lib import theory

    assert metrics.predicted_speedup(0.8, 4, 0.1, verify_cost=1.6) == pytest.approx(
        theory.speedup(0.8, 4, 0.1, verify_cost=1.6))
    # fixed gamma at every step: the per-step form equals the closed form
    assert metrics.predicted_speedup(0.8, np.full(10, 4), 0.1, 1.6) == pytest.approx(
        metrics.predicted_speedup(0.8, 4, 0.1, 1.6))
    # prompt lookup: half the steps draft nothing (1 token for cost 1), half draft 4
    tok4 = (1 - 0.8 ** 5) / 0.2
    assert metrics.predicted_speedup(0.8, [0, 4], 0.0, 1.5) == pytest.approx((1 + tok4) / (1 + 1.5))
    # the loop's per-step cost o: every step pays it, the ones that drafted nothing too
    assert metrics.predicted_speedup(0.8, [0, 4], 0.0, 1.5, overhead=0.25) == pytest.approx(
        (1 + tok4) / (1.25 + 1.75))
    assert metrics.predicted_speedup(0.8, 4, 0.1, 1.6, overhead=0.3) == pytest.approx(
        theory.speedup(0.8, 4, 0.1, verify_cost=1.6, overhead=0.3))
    with pytest.raises(ValueError, match="overhead"):
        metrics.predicted_speedup(0.8, 4, 0.1, overhead=float("nan"))


def test_run_metrics_prices_steps_with_the_cost_tables_overhead():
    t = trace_from_blocks([("a", 2, 3), ("a", 3, 3), ("b", 0, 3)], t_draft=0.003)
    s = summary(["a", "b"], [7, 1], [0.5, 0.1], [[3, 4], [1]])
    ar = summary(["a", "b"], [7, 1], [1.0, 0.2])
    costs = {"c": 0.1, "r": {1: 1.1, 2: 1.2, 3: 1.3}}
    plain = metrics.run_metrics(t, s, ar, gamma=3, costs=costs)
    loaded = metrics.run_metrics(t, s, ar, gamma=3, costs={**costs, "overhead": 0.4})
    assert plain["overhead"] == 0.0 and loaded["overhead"] == 0.4
    g = metrics.drafted_per_step(t, s)
    assert loaded["predicted"] == pytest.approx(metrics.predicted_speedup(loaded["alpha"], g, 0.1, [1.3] * len(g), 0.4))
    assert loaded["predicted"] < plain["predicted"]
    assert loaded["predicted_thm38"] == plain["predicted_thm38"]  # the paper's formula has no loop cost
    assert plain["stalls"] == 0.0
    assert metrics.run_metrics(t, s.assign(stalls=[1, 0]), ar, gamma=3)["stalls"] == 1.0


def test_the_prediction_pays_the_prompts_prefill_on_both_sides():
    """A measured speedup is over whole generations, prefill included: a null-draft-like run whose decode steps
    cost 1.5 AR steps each measures (P + N) / (P' + 1.5 N), not 1 / 1.5, and the prediction must say so."""
    t = trace_from_blocks([("a", 0, 3)] * 4 + [("b", 0, 3)] * 4, t_draft=0.0)
    costs = {"c": 0.0, "r": {1: 1.2, 2: 1.35, 3: 1.5}}
    # AR: 4 tokens a prompt at 0.01 s a step after a 0.02 s prefill (P_AR = 2 AR steps a prompt); the run's
    # prefill 0.03 s (its draft's too: P_run = 3) and 4 steps of 1.5 AR steps
    ar = summary(["a", "b"], [4, 4], [0.06, 0.06]).assign(prefill_time=[0.02, 0.02])
    s = summary(["a", "b"], [4, 4], [0.09, 0.09], [[1] * 4, [1] * 4]).assign(prefill_time=[0.03, 0.03])
    assert metrics.prefill_steps(s, ar) == pytest.approx((4.0, 6.0))
    m = metrics.run_metrics(t, s, ar, gamma=3, costs=costs)
    assert m["predicted_steady"] == pytest.approx(1 / 1.5)  # decode steps alone
    assert m["predicted"] == pytest.approx((4 + 8) / (6 + 8 * 1.5)) and m["speedup"] == pytest.approx(0.12 / 0.18)
    assert m["predicted"] == pytest.approx(m["speedup"])  # the whole generations' ratio, met exactly here
    assert m["prefill_share"] == pytest.approx(4 / 12)
    # a side without recorded prefills (HF, older runs): the steady-state prediction, no share
    bare = metrics.run_metrics(t, s.drop(columns="prefill_time"), ar, gamma=3, costs=costs)
    assert bare["predicted"] == pytest.approx(1 / 1.5) and math.isnan(bare["prefill_share"])
    assert metrics.prefill_steps(s, ar.assign(prefill_time=[None, 0.02])) is None
    with pytest.raises(ValueError, match="prefill"):
        metrics.predicted_speedup(0.5, 3, 0.1, prefill=(1.0, 1.0))
    with pytest.raises(ValueError, match="prefill"):
        metrics.predicted_speedup(0.5, [3, 3], 0.1, prefill=(float("nan"), 1.0))


def test_decode_phase_takes_each_sides_prefill_out():
    """AR: 48 tokens in 10 s after a 1 s prefill; the run: 48 in 5.5 s after 1.5 s (its draft's too). Whole
    generations 10 / 5.5; the decode phase (48 / 4) / (48 / 9) = 2.25, each round less the same prefill."""
    t = trace_from_blocks([("a", 3, 4)] * 12 + [("b", 3, 4)] * 12)
    ar = summary(["a", "b"], [48, 48], [10.0, 10.0]).assign(
        prefill_time=[1.0, 1.0], wall_times=[[9.9, 10.0, 10.1], [9.8, 10.0, 10.3]])
    s = summary(["a", "b"], [48, 48], [5.5, 5.5], [[4] * 12, [4] * 12]).assign(
        prefill_time=[1.5, 1.5], wall_times=[[5.4, 5.5, 5.6], [5.5, 5.5, 5.7]])
    d = metrics.decode_phase(s)
    assert d["wall_time"].tolist() == pytest.approx([4.0, 4.0])
    assert d["wall_times"].iloc[1] == pytest.approx([4.0, 4.0, 4.2])
    assert s["wall_time"].tolist() == [5.5, 5.5]  # the input frame is not changed
    m = metrics.run_metrics(t, s, ar, gamma=4)
    assert m["speedup"] == pytest.approx(10 / 5.5) and m["speedup_decode"] == pytest.approx(2.25)
    assert m["speedup_decode_low"] <= m["speedup_decode"] <= m["speedup_decode_high"]
    assert m["speedup_decode_low"] < m["speedup_decode_high"]  # the rounds' spread is resampled
    # a side without prefills (HF generate hides them): no decode phase
    assert metrics.decode_phase(s.drop(columns="prefill_time")) is None
    assert metrics.decode_phase(ar.assign(prefill_time=[None, 1.0])) is None
    bare = metrics.run_metrics(t, s, ar.drop(columns="prefill_time"), gamma=4)
    assert math.isnan(bare["speedup_decode"]) and math.isnan(bare["speedup_decode_low"])
    # a round that would not stay positive: the rounds are left out, the prompts alone resampled
    short = metrics.decode_phase(s.assign(wall_times=[[1.2, 5.5, 5.6], [5.5, 5.5, 5.7]]))
    assert "wall_times" not in short.columns and short["wall_time"].tolist() == pytest.approx([4.0, 4.0])
    assert metrics.decode_phase(s.assign(prefill_time=[5.5, 1.5])) is None  # a prefill as long as its generation


def test_drafted_per_step_counts_steps_without_drafts():
    t = trace_from_blocks([("a", 2, 3), ("b", 0, 2)])
    s = summary(["a", "b"], [4, 3], [1.0, 1.0], [[3, 1], [1, 1]])  # two of the four steps drafted nothing
    assert sorted(metrics.drafted_per_step(t, s).tolist()) == [0, 0, 2, 3]
    t2 = t.assign(t_verify=0.02)
    ar = summary(["a", "b"], [4, 3], [0.4, 0.3])  # 10 tok/s: 0.1 s per AR step
    assert metrics.verify_cost_ratio(t2, ar) == pytest.approx(0.2)


def test_bootstrap_speedup_intervals_and_disagreement():
    rng = np.random.default_rng(1)
    n = 40
    qids = [f"q{i}" for i in range(n)]
    tokens = rng.integers(50, 150, n)
    ar = summary(qids, tokens, tokens / 20.0)
    fast = summary(qids, tokens, tokens / 40.0 * rng.uniform(0.9, 1.1, n))
    b = metrics.bootstrap_speedup(fast, ar, n_boot=500)
    assert b["ratio_of_totals_low"] < 2.0 < b["ratio_of_totals_high"]
    assert b["mean_of_ratios_low"] < 2.0 < b["mean_of_ratios_high"] and not b["disagree"]
    assert b["ratio_of_totals"] == pytest.approx(metrics.speedup_ratio_of_totals(fast, ar))
    # long generations ran slower than AR, short ones twice as fast: the totals follow the long ones
    t = np.where(np.arange(n) % 2 == 0, 1000.0, 20.0)
    ar2 = summary(qids, t, t / 20.0)
    mixed = summary(qids, t, np.where(t > 100, t / 16.0, t / 40.0))
    b2 = metrics.bootstrap_speedup(mixed, ar2, n_boot=500, seed=3)
    assert b2["ratio_of_totals"] < 0.9 and b2["mean_of_ratios"] > 1.3
    assert b2["disagree"]
    with pytest.raises(ValueError, match="level"):
        metrics.bootstrap_speedup(fast, ar, level=1.0)
    with pytest.raises(ValueError, match="by must be"):
        metrics.bootstrap_speedup(fast, ar, by="prompt")


def test_bootstrap_resamples_rounds_within_prompts():
    # two prompts, three rounds each: prompts alone give an interval that is only the gap between the
    # two prompts' ratios; the rounds' own noise (here +-20 %) must widen it
    ar = summary(["a", "b"], [32, 32], [2.0, 2.0]).assign(wall_times=[[2.0, 2.0, 2.0]] * 2)
    noisy = [[1.0, 0.8, 1.2], [1.02, 0.82, 1.22]]
    fast = summary(["a", "b"], [32, 32], [1.0, 1.02]).assign(wall_times=noisy)
    one = metrics.bootstrap_speedup(fast, ar, n_boot=2000, rounds=False)
    two = metrics.bootstrap_speedup(fast, ar, n_boot=2000)
    assert one["rounds"] == 0 and two["rounds"] == 3 and two["units"] == 2
    assert one["ratio_of_totals"] == two["ratio_of_totals"] == pytest.approx(4 / 2.02)
    assert one["ratio_of_totals_high"] - one["ratio_of_totals_low"] < 0.05
    assert two["ratio_of_totals_low"] < 1.8 and two["ratio_of_totals_high"] > 2.2
    # rounds that all agree add nothing: the same interval as prompts alone (same seed, same draws)
    steady = fast.assign(wall_times=[[1.0] * 3, [1.02] * 3])
    same = metrics.bootstrap_speedup(steady, ar, n_boot=500)
    plain = metrics.bootstrap_speedup(steady.drop(columns="wall_times"), ar, n_boot=500)
    assert same["ratio_of_totals_low"] == pytest.approx(plain["ratio_of_totals_low"])
    assert same["mean_of_ratios_high"] == pytest.approx(plain["mean_of_ratios_high"])
    # paired rounds: a drift shared by method and baseline in one round cancels
    drift = [[1.0, 1.5, 2.0], [1.0, 1.5, 2.0]]
    ar_d = ar.assign(wall_times=[[2 * x for x in r] for r in drift])
    fast_d = fast.assign(wall_times=drift)
    d = metrics.bootstrap_speedup(fast_d, ar_d, n_boot=500)
    assert d["ratio_of_totals_high"] - d["ratio_of_totals_low"] == pytest.approx(0.0, abs=1e-12)
    # unequal round counts: prompts only
    ragged = fast.assign(wall_times=[[1.0, 1.1], [1.0, 1.1, 0.9]])
    assert metrics.bootstrap_speedup(ragged, ar, n_boot=50)["rounds"] == 0
    with pytest.raises(ValueError, match="wall_times"):
        metrics.bootstrap_speedup(fast.assign(wall_times=[[1.0, -1.0, 1.0]] * 2), ar, n_boot=50)


def _acc_trace(rates: dict[str, float], n: int = 200, seed: int = 0) -> pd.DataFrame:
    """One-position steps per prompt, accepted with the prompt's own rate (prompts differ)."""
    rng = np.random.default_rng(seed)
    rows = []
    for pid, a in rates.items():
        acc = rng.random(n) < a
        rows += [{"prompt_id": pid, "accepted": bool(x), "reached": True} for x in acc]
    return pd.DataFrame(rows)


def test_bootstrap_acceptance_intervals_hold_the_prompt_spread():
    # two prompts with very different acceptance: the interval spans the prompts, not the coin flips
    tr = _acc_trace({"a": 0.1, "b": 0.9}, n=2000)
    summ = pd.DataFrame({"question_id": ["a", "b"], "accept_lengths": [[1, 2, 1], [2, 2, 2, 2]]})
    out = metrics.bootstrap_acceptance(tr, summ)
    assert out["alpha"] == pytest.approx(tr["accepted"].mean())
    assert out["alpha_low"] < 0.2 and out["alpha_high"] > 0.8  # a pooled binomial interval would be +-0.02
    assert out["tau"] == pytest.approx(metrics.mean_accepted_length(summ))
    assert out["tau_low"] <= out["tau"] <= out["tau_high"]
    assert out["prompts"] == 2
    # many alike prompts: a narrow interval around the pooled rate
    tr2 = _acc_trace({str(i): 0.6 for i in range(20)}, n=200)
    out2 = metrics.bootstrap_acceptance(tr2)
    assert out2["alpha_high"] - out2["alpha_low"] < 0.06 and out2["alpha_low"] < 0.6 < out2["alpha_high"]
    with pytest.raises(ValueError, match="level"):
        metrics.bootstrap_acceptance(tr, level=1.5)


def test_paired_alpha_difference_pairs_prompts():
    # prompts differ a lot but within each prompt run a beats run b by 0.1: pairing sees the difference
    rates = {str(i): r for i, r in enumerate(np.linspace(0.1, 0.8, 12))}
    ta = _acc_trace({k: v + 0.1 for k, v in rates.items()}, n=400, seed=1)
    tb = _acc_trace(rates, n=400, seed=2)
    d = metrics.paired_alpha_difference(ta, tb)
    assert d["low"] > 0 and d["p_value"] < 0.01 and d["prompts"] == 12
    # the same rates: no detectable difference
    same = metrics.paired_alpha_difference(_acc_trace(rates, seed=3), _acc_trace(rates, seed=4))
    assert same["low"] < 0 < same["high"] and same["p_value"] > 0.05
    with pytest.raises(ValueError, match="no prompt in common"):
        metrics.paired_alpha_difference(ta, _acc_trace({"zz": 0.5}))


def test_loop_costs_sums_each_step_once_in_ar_decode_steps():
    # three steps (g = 3, 3, 2): t_verify 0.3, 0.3, 0.2 s, t_overhead 0.01 each (step-level, repeated per row)
    t = trace_from_blocks([("a", 1, 3), ("a", 0, 3), ("b", 2, 2)])
    t["t_verify"] = t["gamma"].map({3: 0.3, 2: 0.2})
    t["t_overhead"] = 0.01
    base = summary(["a", "b"], [10, 10], [1.5, 1.5]).assign(prefill_time=[0.5, 0.5])
    assert metrics.ar_step_seconds(base) == pytest.approx(0.1)  # (3.0 - 1.0) / 20
    got = metrics.loop_costs(t, base, lambda g: {2: 1.5, 3: 2.0}[g])
    assert got == pytest.approx({"verify": 8.0, "table": 5.5, "rest": 0.3, "steps": 3})
    assert metrics.loop_costs(t, base.drop(columns="prefill_time"), lambda g: 1.0) is None
    assert metrics.ar_step_seconds(base.assign(prefill_time=[None, 0.5])) is None
    assert metrics.loop_costs(t.drop(columns="t_overhead"), base, lambda g: 1.0) is None
