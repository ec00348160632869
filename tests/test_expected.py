"""The expected-vs-realised sampler check (spade_lib.diagnose.expected): z has mean 0 for an exact
sampler (the real verifier on exact inputs, and the real decoder on a tiny pair, each tested with a
one-sample t-test) and no sign bias (a binomial test), its two bases correlate as stated, and the planted
wrong-q bug re-judged on a recorded trace, with its power."""

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from spade_lib import diagnose as dg
from spade_lib.diagnose.expected import basis_agreement, same_sign_chance
from spade_lib.verify import verify

ALPHA = (0.8, 0.7, 0.6, 0.5)


def exact_blocks(n_reps: int, n_steps: int, gamma: int = 4, V: int = 64, seed: int = 0) -> pd.DataFrame:
    """``n_reps`` traces of ``n_steps`` blocks verified by the real ``verify`` with ``x ~ q`` exactly:
    p ~ Dirichlet(0.3), q = 0.7 p + 0.3 Dirichlet(0.3) noise (acceptance ~0.8, many pi = 1)."""
    g = torch.Generator().manual_seed(seed)
    B = n_reps * n_steps
    conc = torch.full((V,), 0.3, dtype=torch.float64)
    p = torch._standard_gamma(conc.expand(B, gamma + 1, V).contiguous(), generator=g)
    p = p / p.sum(-1, keepdim=True)
    noise = torch._standard_gamma(conc.expand(B, gamma, V).contiguous(), generator=g)
    q = 0.7 * p[:, :gamma] + 0.3 * noise / noise.sum(-1, keepdim=True)
    x = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, gamma)
    r = verify(p.float(), q.float(), x, generator=g)
    tv = 0.5 * (p[:, :gamma] - q).abs().sum(-1)
    flat = lambda t: t.flatten().numpy()  # noqa: E731
    return pd.DataFrame({
        "rep": np.repeat(np.arange(n_reps), n_steps * gamma), "step": np.repeat(np.arange(B), gamma),
        "pos": np.tile(np.arange(gamma, dtype=np.int16), B), "reached": flat(r.reached),
        "accepted": flat(r.accepted), "accept_prob": flat(r.accept_prob), "uniform": flat(r.uniforms),
        "p_x": flat(r.p_x), "q_x": flat(r.q_x), "tv": flat(tv.float())})


def test_z_has_mean_zero_for_the_real_verifier_on_exact_inputs():
    """1,000 exact-sampler traces of 40 blocks: a one-sample t-test of mean(z) = 0 on each basis does not
    reject (p > 0.001), z's spread is 1, and the same t-test rejects at once under the planted bug."""
    trace = exact_blocks(1000, 40)
    table = dg.expected_vs_realised(trace, by="rep")
    for basis, t in table.groupby("basis"):
        z = t["z"].to_numpy()
        p = stats.ttest_1samp(z, 0.0).pvalue
        print(f"{basis}: mean z {z.mean():+.3f} (t-test p = {p:.3f}), sd {z.std():.3f}, P(z > 0) {(z > 0).mean():.3f}")
        assert p > 1e-3, basis
        assert 0.9 < z.std() < 1.1, basis
    wrong = dg.wrong_q_power(dg.rejudge_wrong_q(trace, 0.25), by="rep")
    assert stats.ttest_1samp(wrong["z"], 0.0).pvalue < 1e-6 and wrong["z"].mean() < -1


def test_z_has_no_sign_bias_for_the_real_verifier_and_the_bases_correlate_as_stated():
    """1,000 exact-sampler traces through the real ``verify`` (another seed than above): on each basis a binomial
    test finds P(z > 0) indistinguishable from 1/2 (the planted bug is rejected by the same test); the two
    bases' z correlate as ``rho = s_a / s_t`` says (Fisher z-test against the mean rho), and the share of
    traces with both z positive matches ``basis_agreement``'s ``p_both_positive`` (binomial test), where the
    claim that the bases give almost equal z (rho = 1, P = 1/2) is rejected."""
    trace = exact_blocks(1000, 40, seed=7)
    table = dg.expected_vs_realised(trace, by="rep")
    for basis, t in table.groupby("basis"):
        up = int((t["z"] > 0).sum())
        p = stats.binomtest(up, len(t), 0.5).pvalue
        print(f"{basis}: P(z > 0) = {up / len(t):.3f} (binomial p = {p:.3f})")
        assert p > 1e-3, basis
    wrong = dg.wrong_q_power(dg.rejudge_wrong_q(trace, 0.25), by="rep")
    assert stats.binomtest(int((wrong["z"] > 0).sum()), len(wrong), 0.5).pvalue < 1e-6

    agree = basis_agreement(table, by="rep")
    n = len(agree)
    r = np.corrcoef(agree["z_accept_prob"], agree["z_tv"])[0, 1]
    rho = float(agree["rho"].mean())
    assert 0.2 < rho < 0.9  # an informative case: neither independent nor equal
    fisher = abs(np.arctanh(r) - np.arctanh(rho)) * np.sqrt(n - 3)
    print(f"corr(z_a, z_tv) {r:.3f} vs rho {rho:.3f} (Fisher |z| {fisher:.2f})")
    assert fisher < 3.3
    both = int(((agree["z_accept_prob"] > 0) & (agree["z_tv"] > 0)).sum())
    assert stats.binomtest(both, n, float(agree["p_both_positive"].mean())).pvalue > 1e-3
    assert stats.binomtest(both, n, 0.5).pvalue < 1e-6  # "the two bases give almost equal z" is wrong here
    three = agree.iloc[:3]
    assert same_sign_chance(three) == pytest.approx(2 * np.prod(0.25 + np.arcsin(three["rho"]) / (2 * np.pi)))


def test_basis_agreement_needs_both_bases():
    trace = exact_blocks(2, 10)
    one = dg.expected_vs_realised(trace, by="rep", bases=("accept_prob",))
    with pytest.raises(ValueError, match="both bases"):
        basis_agreement(one, by="rep")
    whole = basis_agreement(dg.expected_vs_realised(trace))
    assert len(whole) == 1 and 0 < whole["rho"].iloc[0] <= 1 and 0.25 < whole["p_both_positive"].iloc[0] <= 0.5
    with pytest.raises(ValueError, match="agreement"):
        same_sign_chance(whole.iloc[:0])


@pytest.mark.slow
def test_z_has_mean_zero_for_the_real_decoder_on_a_tiny_pair():
    """The decoder itself (drafting, recording, verification) on a tiny Llama and a perturbed draft at
    T = 1: 240 generations, z per group of 4; a one-sample t-test of mean(z) = 0 does not reject."""
    from spade_lib.decoding.decode import SpeculativeDecoder
    from spade_lib.sampling import SamplingConfig
    from tests.tiny_models import llama, perturbed

    target = llama(vocab=128, seed=0)
    dec = SpeculativeDecoder(target, perturbed(target, 0.2), gamma=4, sampling=SamplingConfig(1.0), eos_token_id=[])
    rows = [dict(rec, rep=s // 4) for s in range(240) for rec in dec.generate([1 + s % 50, 7], 24, seed=s).records()]
    table = dg.expected_vs_realised(pd.DataFrame(rows), by="rep")
    for basis, t in table.groupby("basis"):
        z = t["z"].to_numpy()
        p = stats.ttest_1samp(z, 0.0).pvalue
        print(f"decoder, {basis}: mean z {z.mean():+.3f} over {len(z)} groups (t-test p = {p:.3f})")
        assert p > 1e-3, basis


def test_rejudge_keeps_the_block_structure_and_only_lowers_acceptance():
    trace = dg.synthetic_trace(2000, 4, ALPHA, n_prompts=4, seed=3)
    re = dg.rejudge_wrong_q(trace, 0.5)
    key = ["prompt_id", "step", "pos"]
    orig = trace[trace.reached].set_index(key)
    mine = re.set_index(key)
    assert mine.index.isin(orig.index).all()
    assert not (mine["accepted"] & ~orig.loc[mine.index, "accepted"]).any()  # pi' <= pi, same uniforms
    assert (mine["accept_prob"] == orig.loc[mine.index, "accept_prob"]).all()  # the expectation as recorded
    # a position is reached iff every earlier one of its block was accepted by the wrong verifier
    for (_, _), block in re.groupby(["prompt_id", "step"]):
        flags = block.sort_values("pos")["accepted"].to_numpy()
        assert flags[:-1].all() and block["pos"].tolist() == list(range(len(block)))
    with pytest.raises(ValueError, match="wrong_q"):
        dg.rejudge_wrong_q(trace, 0.0)
    greedy = trace.assign(uniform=np.float32("nan"))
    with pytest.raises(ValueError, match="uniform"):
        dg.rejudge_wrong_q(greedy, 0.25)


def test_wrong_q_power_matches_how_often_the_bug_is_flagged():
    """The stated power against the realised rejection rate of fresh synthetic traces; and a trace whose
    every draft has p(x) >= (1 + w) q(x) cannot show the bug: shift 0, power 0."""
    level = 0.01
    flagged, powers = [], []
    for seed in range(40):
        t = dg.synthetic_trace(150, 4, ALPHA, n_prompts=2, seed=seed)
        w = dg.wrong_q_power(dg.rejudge_wrong_q(t, 0.25), level=level).iloc[0]
        flagged.append(w["p_value"] < level)
        powers.append(w["power"])
    power = float(np.mean(powers))
    assert 0.2 < power < 0.95  # an informative case, neither sure nor hopeless
    # the flags are Bernoulli(power): a binomial test of the realised count against the stated power
    assert stats.binomtest(int(np.sum(flagged)), len(flagged), power).pvalue > 1e-3
    sure = dg.synthetic_trace(300, 4, ALPHA, n_prompts=2, seed=0)
    sure["p_x"] = (sure["q_x"] * 2).astype("float32")
    sure["accept_prob"] = np.float32(1.0)
    w = dg.wrong_q_power(dg.rejudge_wrong_q(sure, 0.25), level=level).iloc[0]
    assert w["shift"] == 0 and w["power"] == 0 and w["p_value"] == 1
    with pytest.raises(ValueError, match="level"):
        dg.wrong_q_power(dg.rejudge_wrong_q(sure, 0.25), level=0)
