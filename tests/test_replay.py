"""Replays pinned against direct verification: ``spade_lib.verify`` is the reference.

Synthetic traces are made by running :func:`spade_lib.verify.verify` on random ``p``/``q`` blocks and
writing its outcome in the trace's columns; replaying a rule on the columns must then give what
``verify`` decides with the same uniforms. The slow test does the same on a real trace of the tiny pair.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from spade_lib.decoding.drafts.policies import ConfidenceThreshold, EntropyThreshold, FixedGamma, get_policy
from spade_lib.decoding.records import STEP_KEYS
from spade_lib.measures import entropy, tv
from spade_lib.verify import verify
from spade_lib.whatif import replay

V = 12


def _random_blocks(n_blocks: int, gamma: int, seed: int, sharp: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n_blocks, gamma + 1, V, generator=g, dtype=torch.float64) * sharp
    p = base.softmax(-1)
    q = (base[:, :gamma] + torch.randn(n_blocks, gamma, V, generator=g, dtype=torch.float64)).softmax(-1)
    x = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(n_blocks, gamma)
    u = torch.rand(n_blocks, gamma, generator=g, dtype=torch.float64)
    return p, q, x, u


def _trace(p, q, x, u, mode: str = "exact", **opts) -> pd.DataFrame:
    """A trace frame (the columns replay reads) of ``verify`` on every block, with uniforms ``u``."""
    res = verify(p, q, x, mode=mode, uniforms=u, **opts)
    n_blocks, gamma = x.shape
    p_d, q_raw = p[:, :gamma], q
    rows = {
        "prompt_id": np.repeat([f"{b // 8}" for b in range(n_blocks)], gamma),
        "category": np.repeat([["a", "b"][b % 2] for b in range(n_blocks)], gamma),
        "sample": np.zeros(n_blocks * gamma, dtype=np.int32),
        "step": np.repeat(np.arange(n_blocks) % 8, gamma).astype(np.int32),
        "pos": np.tile(np.arange(gamma), n_blocks).astype(np.int16),
        "gamma": np.full(n_blocks * gamma, gamma, dtype=np.int16),
        "draft_token": x.reshape(-1).numpy().astype(np.int32),
        "p_x": res.p_x.reshape(-1).numpy().astype(np.float32),
        "q_x": res.q_x.reshape(-1).numpy().astype(np.float32),
        "accept_prob": torch.clamp(res.p_x / res.q_x, max=1.0).reshape(-1).numpy().astype(np.float32),
        "uniform": res.uniforms.reshape(-1).numpy().astype(np.float32),
        "reached": res.reached.reshape(-1).numpy(),
        "accepted": res.accepted.reshape(-1).numpy(),
        "n_accepted": np.repeat(res.n_accepted.numpy(), gamma).astype(np.int16),
        "h_p": entropy(p_d).reshape(-1).numpy().astype(np.float32),
        "tv": tv(p_d, q).reshape(-1).numpy().astype(np.float32),
        "p_top1": p_d.argmax(-1).reshape(-1).numpy().astype(np.int32),
        "q_top_prob": q_raw.max(-1).values.reshape(-1).numpy().astype(np.float32),
        "h_q_raw": entropy(q_raw).reshape(-1).numpy().astype(np.float32),
    }
    return pd.DataFrame(rows).sort_values(["prompt_id", "sample", "step", "pos"], kind="stable").reset_index(drop=True)


def _verify_n(p, q, x, u, mode, **opts) -> np.ndarray:
    """``n_accepted`` of ``verify`` in the trace's step order (prompt_id, step)."""
    n = verify(p, q, x, mode=mode, uniforms=u, **opts).n_accepted.numpy()
    order = sorted(range(len(n)), key=lambda b: (f"{b // 8}", b % 8))
    return n[order]


@pytest.mark.parametrize("mode", ["exact", "lenience", "one_hot_q", "typical", "greedy"])
def test_replaying_a_rule_on_its_own_trace_reproduces_its_decisions(mode):
    p, q, x, u = _random_blocks(64, 5, seed=1)
    trace = _trace(p, q, x, u, mode=mode)
    got = replay.replay_decisions(trace, mode)
    np.testing.assert_array_equal(got["reached"].to_numpy(), trace["reached"].to_numpy())
    np.testing.assert_array_equal(got["accepted"].to_numpy(), trace["accepted"].to_numpy())
    np.testing.assert_array_equal(got["n_accepted"].to_numpy(), trace["n_accepted"].to_numpy())


@pytest.mark.parametrize("mode", ["lenience", "one_hot_q", "typical", "greedy"])
def test_counterfactual_on_an_exact_trace_matches_verify_under_the_other_rule(mode):
    p, q, x, u = _random_blocks(64, 5, seed=2)
    trace = _trace(p, q, x, u, mode="exact")           # recorded under exact ...
    steps = replay.counterfactual_steps(trace, rules=[mode])
    expected = _verify_n(p, q, x, u, mode)             # ... re-verified with the same drafts and uniforms
    np.testing.assert_array_equal(steps["n_path"].to_numpy(), expected)


def test_sample_match_is_expected_only_and_its_law_is_one_hot_q():
    p, q, x, u = _random_blocks(32, 4, seed=3)
    trace = _trace(p, q, x, u)
    out = replay.counterfactual(trace, rules=["sample_match", "one_hot_q"]).set_index("rule")
    assert np.isnan(out.loc["sample_match", "tau_path"]) and out.loc["sample_match", "coverage_path"] == 0
    assert out.loc["sample_match", "tau_expected"] == pytest.approx(out.loc["one_hot_q", "tau_expected"])
    assert "not stored" in out.loc["sample_match", "exactness"]


def test_expected_tokens_is_the_mean_over_fresh_uniforms():
    """``tokens_expected`` (sum_k prod_{i<k} a_i) vs the average of verify over 4000 uniform draws."""
    p, q, x, _ = _random_blocks(6, 4, seed=4)
    trace = _trace(p, q, x, torch.rand(6, 4, dtype=torch.float64))
    expected = replay.counterfactual_steps(trace, rules=["exact"])["tokens_expected"].to_numpy()
    g = torch.Generator().manual_seed(5)
    draws = 4000
    total = np.zeros(6)
    for _ in range(draws):
        total += verify(p, q, x, uniforms=torch.rand(6, 4, generator=g, dtype=torch.float64)).n_accepted.numpy() + 1
    order = sorted(range(6), key=lambda b: (f"{b // 8}", b % 8))
    mc = total[order] / draws
    assert np.abs(mc - expected).max() < 5 * 2.0 / np.sqrt(draws)  # tokens in [1, 5]: sd <= 2


def test_nan_uniforms_give_no_pathwise_replay_of_stochastic_rules():
    p, q, x, u = _random_blocks(16, 3, seed=6)
    trace = _trace(p, q, x, u, mode="greedy")           # deterministic mode: NaN uniforms
    out = replay.counterfactual(trace, rules=["exact", "greedy"]).set_index("rule")
    assert out.loc["exact", "coverage_path"] == 0 and np.isfinite(out.loc["exact", "tau_expected"])
    assert out.loc["greedy", "tau_path"] == pytest.approx(out.loc["greedy", "tau_recorded"])
    with pytest.raises(ValueError, match="uniforms"):
        replay.replay_decisions(trace, "exact")


def test_unknown_rule_and_missing_columns_are_value_errors():
    p, q, x, u = _random_blocks(4, 2, seed=7)
    trace = _trace(p, q, x, u)
    with pytest.raises(ValueError, match="rule must be one of"):
        replay.counterfactual(trace, rules=["nope"])
    with pytest.raises(ValueError, match="h_p"):
        replay.counterfactual(trace.drop(columns=["h_p"]), rules=["typical"])
    with pytest.raises(ValueError, match="lenience"):
        replay.counterfactual(trace, rules=["lenience"], params={"lenience": {"lenience": 0.0}})


# -- top-k slices ----------------------------------------------------------------------------------

def _with_topk(trace: pd.DataFrame, p, q, k: int) -> pd.DataFrame:
    gamma = int(trace["gamma"].iloc[0])
    order = sorted(range(p.shape[0]), key=lambda b: (f"{b // 8}", b % 8))
    cols = {"p_topk_ids": [], "p_topk_probs": [], "q_topk_ids": [], "q_topk_probs": []}
    for b in order:
        for i in range(gamma):
            for name, dist in (("p", p[b, i]), ("q", q[b, i])):
                vals, ids = torch.topk(dist, k)
                cols[f"{name}_topk_ids"].append(ids.numpy().astype(np.int32))
                cols[f"{name}_topk_probs"].append(vals.numpy().astype(np.float32))
    out = trace.copy()
    for name, values in cols.items():
        out[name] = values
    return out


def test_topk_alpha_bounds_contain_the_truth_and_are_exact_with_full_slices():
    p, q, x, u = _random_blocks(16, 3, seed=8)
    trace = _trace(p, q, x, u)
    full = replay.rule_alpha_topk(_with_topk(trace, p, q, V), "exact")
    assert full["exact"].all()
    np.testing.assert_allclose(full["alpha_lower"], 1 - trace["tv"], atol=1e-5)
    part = replay.rule_alpha_topk(_with_topk(trace, p, q, 4), "exact")
    assert not part["exact"].any()
    truth = 1 - trace["tv"].to_numpy()
    assert (part["alpha_lower"] <= truth + 1e-5).all() and (truth <= part["alpha_upper"] + 1e-5).all()
    one_hot = replay.rule_alpha_topk(_with_topk(trace, p, q, V), "one_hot_q")
    order = sorted(range(16), key=lambda b: (f"{b // 8}", b % 8))
    direct = (p[order, :3] * q[order]).sum(-1).reshape(-1).numpy()  # sum_x p(x) q(x)
    np.testing.assert_allclose(one_hot["alpha_lower"], direct, atol=1e-5)
    with pytest.raises(ValueError, match="record_topk"):
        replay.rule_alpha_topk(trace, "exact")


# -- stop rules ------------------------------------------------------------------------------------

def test_fixed_gamma_truncation_equals_verifying_the_shorter_block():
    p, q, x, u = _random_blocks(48, 6, seed=9)
    trace = _trace(p, q, x, u)
    for g in (1, 3, 6):
        direct = _verify_n(p[:, :g + 1], q[:, :g], x[:, :g], u[:, :g], "exact")
        out = replay.replay_stop_rule(trace, FixedGamma(g), c=0.1, verify_cost=1.0)
        assert out["tau"].iloc[0] == pytest.approx(direct.mean() + 1)
        assert out["cost"].iloc[0] == pytest.approx(g * 0.1 + 1.0)
        assert out["speedup"].iloc[0] == pytest.approx((direct.mean() + 1) / (g * 0.1 + 1.0))


@pytest.mark.parametrize("policy,threshold", [("confidence", 0.35), ("entropy", 1.2)])
def test_threshold_stop_rules_draft_what_the_decoder_policy_drafts(policy, threshold):
    p, q, x, u = _random_blocks(48, 6, seed=10, sharp=1.0)
    trace = _trace(p, q, x, u)
    rule = get_policy(policy, max_gamma=6, threshold=threshold)
    steps, g = replay.blocks_used(trace, rule)
    pol = (ConfidenceThreshold if policy == "confidence" else EntropyThreshold)(threshold=threshold, max_gamma=6)
    for (_, row), g_used in zip(steps.iterrows(), g):
        block = trace[(trace["prompt_id"] == row["prompt_id"]) & (trace["step"] == row["step"])]
        drafted = 0
        for _, r in block.iterrows():                  # the decoder's loop: draft, then ask the policy
            drafted += 1
            if drafted == pol.max_gamma or not pol.keep_drafting(float(r["q_top_prob"]), float(r["h_q_raw"])):
                break
        assert g_used == drafted
    out = replay.replay_stop_rule(trace, rule, c=0.05)
    assert 1 <= out["g_mean"].iloc[0] <= 6


def test_frontier_and_best_rules_per_category():
    p, q, x, u = _random_blocks(64, 6, seed=11)
    trace = _trace(p, q, x, u)
    frontier = replay.stop_rule_frontier(trace, c=0.05, verify_cost=lambda g: 1.0 + 0.05 * g, by=["category"])
    assert set(frontier["policy"]) == {"fixed", "confidence", "entropy"}
    assert set(frontier["category"]) == {"a", "b"}
    best = replay.best_rules(frontier, by=["category"])
    assert len(best) == 6
    for _, row in best.iterrows():
        same = frontier[(frontier["category"] == row["category"]) & (frontier["policy"] == row["policy"])]
        assert row["speedup"] == same["speedup"].max()
    with pytest.raises(ValueError, match="exceeds"):
        replay.replay_stop_rule(trace, FixedGamma(7), c=0.1)
    with pytest.raises(ValueError, match="policy"):
        get_policy("sometimes", max_gamma=3)


# -- the tiny pair: replays against direct runs ----------------------------------------------------

@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Runs of the tiny pair on a small embedded suite: fixed gamma 6 (the trace to replay), fixed
    gamma 2, and a confidence policy, all at temperature 1 with top-k slices recorded."""
    from spade_lib.bench import default_suite
    from spade_lib.runs.config import RunConfig
    from spade_lib.runs.runner import run_suite
    from spade_lib.runs.trace import read_trace
    from spade_lib.zoo.pairs import load_pair

    pair = load_pair("tiny")
    suite = default_suite(tokenizer="tiny", n_per_category=2)
    root = tmp_path_factory.mktemp("runs")
    threads = torch.get_num_threads()
    base = dict(temperature=1.0, max_new_tokens=48, n_samples=3, warmup=0, repeats=1, max_prompt_tokens=128,
                record_topk=8, threads=1)  # one thread: tiny models only lose from a second one
    try:
        g6 = read_trace(run_suite(pair, suite, RunConfig(gamma=6, **base), root / "g6", progress=False))
        g2 = read_trace(run_suite(pair, suite, RunConfig(gamma=2, **base), root / "g2", progress=False))
        threshold = float(g6["q_top_prob"].median())
        conf = read_trace(run_suite(pair, suite, RunConfig(policy="confidence", threshold=threshold, max_gamma=6,
                                                           **base), root / "conf", progress=False))
    finally:
        torch.set_num_threads(threads)
    return {"g6": g6, "g2": g2, "conf": conf, "threshold": threshold}


def _tau_and_se(trace: pd.DataFrame) -> tuple[float, float]:
    n = trace.groupby(STEP_KEYS)["n_accepted"].first().to_numpy(np.float64) + 1
    return float(n.mean()), float(n.std(ddof=1) / np.sqrt(len(n)))


@pytest.mark.slow
def test_exact_replay_of_a_tiny_pair_trace_reproduces_every_decision(tiny_runs):
    tr = tiny_runs["g6"]
    got = replay.replay_decisions(tr, "exact")
    for col in ("reached", "accepted", "n_accepted"):
        np.testing.assert_array_equal(got[col].to_numpy(), tr[col].to_numpy())
    cf = replay.counterfactual(tr).set_index("rule")
    assert cf.loc["exact", "tau_path"] == cf.loc["exact", "tau_recorded"]
    assert cf.loc["lenience", "tau_path"] >= cf.loc["exact", "tau_path"]     # u < a/l accepts a superset
    alpha = replay.rule_alpha_topk(tr, "exact")
    truth = 1 - tr["tv"].to_numpy()
    assert (alpha["alpha_lower"] <= truth + 1e-5).all() and (truth <= alpha["alpha_upper"] + 1e-5).all()


@pytest.mark.slow
def test_stop_rule_replays_predict_direct_runs(tiny_runs):
    """Replayed fixed gamma 2 and a confidence policy vs runs made with them: tau within 4 combined
    standard errors (different blocks, different uniforms: a statistical comparison)."""
    tr = tiny_runs["g6"]
    for actual, rule in ((tiny_runs["g2"], FixedGamma(2)),
                         (tiny_runs["conf"], ConfidenceThreshold(threshold=tiny_runs["threshold"], max_gamma=6))):
        pred = replay.replay_stop_rule(tr, rule, c=0.1).iloc[0]
        per = tr.groupby(STEP_KEYS)["n_accepted"].first()
        tau, se = _tau_and_se(actual)
        se_pred = 2 * per.std() / np.sqrt(len(per))
        assert abs(pred["tau"] - tau) < 4 * np.hypot(se, se_pred), (rule.label, pred["tau"], tau, se)
        g_actual = actual.groupby(STEP_KEYS)["gamma"].first()
        assert abs(pred["g_mean"] - g_actual.mean()) < 4 * np.hypot(g_actual.std() / np.sqrt(len(g_actual)), 0.1) + 0.05


def test_non_finite_columns_are_refused_by_column_and_row():
    """Issue 57: a NaN ``accept_prob`` silently ended its block's run (``u < NaN`` is False): counterfactual gave
    tau 2.25 against 3.0 for the clean trace. Every replay refuses NaN / inf in a column it reads, naming the
    column and the caller's row; a NaN ``uniform`` stays "not drawn" (deterministic modes), an inf one is refused."""
    p, q, x, u = _random_blocks(8, 3, seed=11)
    clean = _trace(p, q, x, u)
    assert np.isfinite(replay.counterfactual(clean, rules=["exact"])["tau_path"]).all()
    broken = clean.copy()
    broken.loc[4, "accept_prob"] = np.nan
    where = r"at row 4 \(prompt_id='0', sample=0, step=1, pos=1\)"
    for call in (lambda t: replay.counterfactual(t, rules=["exact"]), lambda t: replay.replay_decisions(t, "exact"),
                 lambda t: replay.rule_accept_prob(t, "exact"), lambda t: replay.replay_stop_rule(t, FixedGamma(2), c=0.1)):
        with pytest.raises(ValueError, match=f"trace: column 'accept_prob' is NaN {where}"):
            call(broken)
    with pytest.raises(ValueError, match="trace: column 'p_x' is inf at row 2"):
        replay.counterfactual(clean.assign(p_x=np.where(clean.index == 2, np.inf, clean["p_x"])), rules=["one_hot_q"])
    with pytest.raises(ValueError, match="trace: column 'uniform' is inf at row 0 .*NaN means not recorded"):
        replay.rule_accepts(clean.assign(uniform=np.where(clean.index == 0, np.inf, clean["uniform"])), "exact")
    with pytest.raises(ValueError, match="trace: column 'q_top_prob' is NaN at row 7"):
        replay.replay_stop_rule(clean.assign(q_top_prob=np.where(clean.index == 7, np.nan, clean["q_top_prob"])),
                                ConfidenceThreshold(max_gamma=3, threshold=0.5), c=0.1)
    with pytest.raises(ValueError, match="trace: column 'n_accepted' is NaN at row 3"):
        replay.counterfactual(clean.astype({"n_accepted": float}).assign(
            n_accepted=lambda t: np.where(t.index == 3, np.nan, t["n_accepted"])), rules=["exact"])
