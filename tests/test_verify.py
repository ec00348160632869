"""Proof that spade_lib.verify is exact: enumeration, Monte-Carlo p-values, references, replay."""

from __future__ import annotations

import inspect

import pytest
import torch

from spade_lib.sampling import SamplingConfig, adjust
from spade_lib.exactness import (
    MC_CONFIGS,
    block_law_error,
    chi_square_pvalue,
    draft_tree,
    forced_cuts,
    monte_carlo_check,
    verify_reference,
    warped_pair,
)
from spade_lib.rules import lossless_map, rule_names
from spade_lib.verify import sample_inverse_cdf, verify

KINDS = ("random", "disjoint", "identical", "one_hot", "q_zeros")
P_MIN = 1e-3  # fixed seeds: a lossless mode must not be rejected at this level


def random_pq(B=8, gamma=3, V=11, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    p = (2 * torch.randn(B, gamma + 1, V, generator=gen, dtype=dtype)).softmax(-1)
    q = (2 * torch.randn(B, gamma, V, generator=gen, dtype=dtype)).softmax(-1)
    x = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(B, gamma)
    return p, q, x, gen


# ---------------------------------------------------------------- exact enumeration (fp64)

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("vocab,gamma", [(4, 3), (6, 2)])
@pytest.mark.parametrize("mode", ["exact", "one_hot_q"])
def test_enumerated_block_law_equals_target(kind, vocab, gamma, mode):
    p, q, x = draft_tree(vocab, gamma, kind, seed=vocab * 10 + gamma)
    err = block_law_error(p, q, x, mode=mode)
    assert err["max_abs_error"] < 1e-12, err
    assert err["total_mass_error"] < 1e-12, err


def test_enumerated_alpha_is_sum_min():
    p, q, x = draft_tree(5, 2, "random", seed=3)
    err = block_law_error(p, q, x)
    assert err["alpha_enumerated"] == pytest.approx(float(torch.minimum(p[0, 0], q[0, 0]).sum()), abs=1e-12)


def test_forced_cuts_give_every_outcome_its_probability():
    """Each block's cut weights are a distribution over k = 0 .. g (they sum to the block's weight), and
    k = 0 has probability 1 - min(1, p(x_0) / q(x_0)) as the rule defines it."""
    p, q, x, _ = random_pq(B=6, gamma=3, V=7, seed=4)
    w = torch.rand(6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cuts = list(forced_cuts(p, q, x, w))
    assert [k for k, _, _ in cuts] == [0, 1, 2, 3]
    torch.testing.assert_close(sum(weight for _, _, weight in cuts), w, rtol=0, atol=1e-15)
    ratio = p[:, 0].gather(-1, x[:, :1]).squeeze(-1) / q[:, 0].gather(-1, x[:, :1]).squeeze(-1)
    torch.testing.assert_close(cuts[0][2], w * (1 - ratio.clamp(max=1.0)), rtol=0, atol=1e-15)
    for k, res, weight in cuts:
        assert torch.equal(res.n_accepted[weight > 0], torch.full_like(res.n_accepted[weight > 0], k))


def test_lenience_one_is_exact():
    p, q, x = draft_tree(4, 3, "random", seed=5)
    assert block_law_error(p, q, x, mode="lenience", lenience=1.0)["max_abs_error"] < 1e-12


@pytest.mark.parametrize("mode,opts", [("typical", {}), ("lenience", {"lenience": 0.5})])
def test_lossy_modes_are_biased(mode, opts):
    """The enumeration measures the bias: the emitted law is far from p."""
    p, q, x = draft_tree(4, 3, "random", seed=7)
    lossy = block_law_error(p, q, x, mode=mode, **opts)
    exact = block_law_error(p, q, x)
    print(f"{mode}: max |P(emit) - p| = {lossy['max_abs_error']:.3f}, "
          f"alpha {lossy['alpha_enumerated']:.3f} vs exact {exact['alpha_enumerated']:.3f}")
    assert lossy["max_abs_error"] > 0.02
    if mode == "lenience":  # lenience trades exactness for acceptance
        assert lossy["alpha_enumerated"] > exact["alpha_enumerated"]
    assert not lossless_map()[mode]


def test_greedy_is_exact_for_a_greedy_target():
    p, q, x = draft_tree(4, 3, "one_hot", seed=11)
    assert block_law_error(p, q, x, mode="greedy")["max_abs_error"] == 0.0


def test_sample_match_cannot_be_enumerated():
    p, q, x = draft_tree(3, 1, "random")
    with pytest.raises(ValueError, match="Monte-Carlo"):
        block_law_error(p, q, x, mode="sample_match")


# ---------------------------------------------------------------- Monte-Carlo with p-values

MC_CASES = [("exact", c) for c in MC_CONFIGS] + [  # the lossless variants on a third of them
    (mode, c) for mode in ("one_hot_q", "sample_match") for c in MC_CONFIGS[::3]]


@pytest.mark.parametrize("mode,config", MC_CASES,
                         ids=[f"{m}-T{c[0]}-k{c[1]}-p{c[2]}-V{c[3]}-g{c[4]}" for m, c in MC_CASES])
def test_monte_carlo_first_and_second_token_follow_p(mode, config):
    p, q, _ = warped_pair(*config)
    r = monte_carlo_check(p, q, n=20_000, mode=mode, seed=config[-1])
    print(f"{mode} {config}: p_first={r['p_first']:.3g} p_second={r['p_second']:.3g} "
          f"(n={r['n_second']}) alpha_hat={r['alpha_hat']:.3f}")
    assert r["p_first"] > P_MIN and r["p_second"] > P_MIN, r


@pytest.mark.parametrize("config", MC_CONFIGS[1:7], ids=lambda c: f"T{c[0]}-k{c[1]}-p{c[2]}")
def test_monte_carlo_detects_a_wrong_q(config):
    """Drafts drawn from the *raw* draft distribution while the verifier is told the warped one."""
    p, q, z_q = warped_pair(*config)
    raw = adjust(z_q, SamplingConfig(), torch.float64)
    r = monte_carlo_check(p, q, q_draft=raw, n=20_000, seed=config[-1])
    print(f"wrong q {config}: p_first={r['p_first']:.3g} p_second={r['p_second']:.3g}")
    assert min(r["p_first"], r["p_second"]) < 1e-6, r


@pytest.mark.parametrize("mode,opts", [("typical", {}), ("lenience", {"lenience": 0.5})])
def test_monte_carlo_detects_lossy_modes(mode, opts):
    p, q, _ = warped_pair(*MC_CONFIGS[0])
    r = monte_carlo_check(p, q, n=20_000, mode=mode, seed=0, **opts)
    assert min(r["p_first"], r["p_second"]) < 1e-6, r


def test_chi_square_pvalue_flags_support_violations():
    probs = torch.tensor([0.5, 0.5, 0.0])
    assert chi_square_pvalue(torch.tensor([0, 1, 2]), probs) == 0.0
    assert chi_square_pvalue(torch.tensor([0, 1] * 50), probs) == pytest.approx(1.0)


# ---------------------------------------------------------------- references

def test_matches_plain_per_row_reference():
    p, q, x, gen = random_pq(B=64, gamma=4, V=9, seed=1)
    res = verify(p, q, x, generator=gen)
    n_ref, next_ref = verify_reference(p, q, x, res.uniforms, res.next_uniforms)
    assert res.n_accepted.tolist() == n_ref
    assert res.next_token.tolist() == next_ref
    assert 0 < res.n_accepted.float().mean() < 4


def test_greedy_equals_argmax_prefix_matching():
    p, q, x, gen = random_pq(B=64, gamma=5, V=3, seed=2)
    res = verify(p, q, x, mode="greedy")
    argmax = p.argmax(-1)
    for b in range(64):
        n = 0
        while n < 5 and int(x[b, n]) == int(argmax[b, n]):
            n += 1
        assert int(res.n_accepted[b]) == n
        assert int(res.next_token[b]) == int(argmax[b, n])
    assert torch.isnan(res.uniforms).all()
    assert res.n_accepted.max() > 0


@pytest.mark.slow  # importing transformers.generation takes ~5-15 s on 2 shared cores
def test_matches_hf_speculative_sampling(monkeypatch):
    """transformers' own _speculative_sampling (batch 1, logits in): same acceptance decisions given
    the same uniforms, and the same residual / bonus distribution (captured from its multinomial)."""
    from transformers.generation import utils as hf

    params = inspect.signature(hf._speculative_sampling).parameters
    if list(params)[:4] != ["candidate_input_ids", "candidate_logits", "candidate_length", "new_logits"]:
        pytest.skip(f"unknown _speculative_sampling signature {list(params)}")
    extra = {"is_done_candidate": False} if "is_done_candidate" in params else {}  # transformers < 5.2x
    gamma, V = 4, 10
    seen = []
    real_multinomial = torch.multinomial

    def spy(probs, *args, **kwargs):
        seen.append(probs.detach().clone())
        return real_multinomial(probs, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", spy)
    outcomes = set()
    for seed in range(40):
        gen = torch.Generator().manual_seed(seed)
        z_p = 1.5 * torch.randn(1, gamma + 1, V, generator=gen)
        z_q = z_p[:, :gamma] + torch.randn(1, gamma, V, generator=gen)
        q = z_q.softmax(-1)
        x = real_multinomial(q[0], 1, generator=gen).T  # [1, gamma]
        torch.manual_seed(seed)
        tokens, n_hf = hf._speculative_sampling(torch.cat([torch.zeros(1, 3, dtype=torch.long), x], 1),
                                                z_q, gamma, z_p, **extra)
        torch.manual_seed(seed)
        u = torch.rand(gamma)[None]  # what torch.rand_like drew inside
        res = verify(z_p.softmax(-1), q, x, uniforms=u)
        assert int(res.n_accepted[0]) == int(n_hf)
        assert tokens[0, : int(n_hf)].tolist() == x[0, : int(n_hf)].tolist()
        torch.testing.assert_close(res.next_dist[0], seen[-1].reshape(-1), atol=1e-6, rtol=0)
        outcomes.add(int(n_hf))
    assert len(outcomes) >= 3  # rejections at several positions and (likely) full acceptance


# ---------------------------------------------------------------- replay, randomness, shapes

@pytest.mark.parametrize("mode", rule_names())
def test_recorded_uniforms_replay_the_decision(mode):
    p, q, x, gen = random_pq(seed=4)
    res = verify(p, q, x, mode=mode, generator=gen)
    again = verify(p, q, x, mode=mode, uniforms=res.uniforms, next_uniforms=res.next_uniforms)
    assert torch.equal(res.n_accepted, again.n_accepted)
    assert torch.equal(res.next_token, again.next_token)
    assert torch.equal(res.accepted, again.accepted)


def test_seeded_generators_are_deterministic_and_separate():
    p, q, x, _ = random_pq(seed=5)
    a = verify(p, q, x, generator=torch.Generator().manual_seed(1),
               residual_generator=torch.Generator().manual_seed(2))
    b = verify(p, q, x, generator=torch.Generator().manual_seed(1),
               residual_generator=torch.Generator().manual_seed(2))
    c = verify(p, q, x, generator=torch.Generator().manual_seed(1),
               residual_generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.uniforms, b.uniforms) and torch.equal(a.next_token, b.next_token)
    assert torch.equal(a.uniforms, c.uniforms)  # acceptance draws do not depend on the residual stream
    assert not torch.equal(a.next_uniforms, c.next_uniforms)


def test_result_fields_are_consistent():
    p, q, x, gen = random_pq(B=32, gamma=4, seed=6)
    res = verify(p, q, x, generator=gen)
    assert res.n_accepted.dtype == torch.long and res.next_token.dtype == torch.long
    assert res.accept_prob.shape == res.uniforms.shape == res.accepted.shape == (32, 4)
    assert torch.equal(res.accepted.sum(-1), res.n_accepted)
    assert torch.equal(res.accepted, res.reached & (res.uniforms < res.accept_prob))
    torch.testing.assert_close(res.accept_prob, (res.p_x / res.q_x).clamp(max=1))
    torch.testing.assert_close(res.next_dist.sum(-1), torch.ones(32, dtype=p.dtype))
    assert (res.next_dist.gather(-1, res.next_token[:, None]) > 0).all()
    emitted = res.emitted(x)
    assert [len(e) for e in emitted] == (res.n_accepted + 1).tolist()


def test_validate_false_gives_the_same_answer():
    p, q, x, _ = random_pq(seed=7)
    a = verify(p, q, x, generator=torch.Generator().manual_seed(0))
    b = verify(p, q, x, generator=torch.Generator().manual_seed(0), validate=False)
    assert torch.equal(a.next_token, b.next_token) and torch.equal(a.n_accepted, b.n_accepted)


def test_float32_inputs():
    p, q, x, gen = random_pq(seed=8, dtype=torch.float32)
    res = verify(p, q, x, generator=gen)
    assert res.accept_prob.dtype == torch.float32 and res.uniforms.dtype == torch.float32


def test_inverse_cdf_never_picks_zero_weight():
    w = torch.tensor([[0.0, 1.0, 0.0, 2.0, 0.0]]).expand(5, -1)
    u = torch.tensor([0.0, 0.3, 1 / 3, 0.5, 1 - 2**-24])
    assert sample_inverse_cdf(w, u).tolist() == [1, 1, 3, 3, 3]


# ---------------------------------------------------------------- input validation

def _bad(match, p=None, q=None, x=None, **kwargs):
    p0, q0, x0, _ = random_pq(B=2, gamma=2, V=5, seed=9)
    with pytest.raises(ValueError, match=match):
        verify(p0 if p is None else p, q0 if q is None else q, x0 if x is None else x, **kwargs)


def test_validation_errors_name_the_argument():
    p, q, x, _ = random_pq(B=2, gamma=2, V=5, seed=9)
    nan_p = p.clone(); nan_p[0, 0, 0] = float("nan")
    inf_q = q.clone(); inf_q[1, 1, 2] = float("inf")
    neg_p = p.clone(); neg_p[0, 1, 0] = -0.1; neg_p[0, 1, 1] += 0.1
    _bad("p contains NaN", p=nan_p)
    _bad("q contains inf", q=inf_q)
    _bad("p has negative", p=neg_p)
    _bad("q rows must sum to 1", q=q * 1.01)
    _bad("p must have shape", p=p[:, :2])
    _bad("q must have shape", q=q[:1])
    _bad("vocabulary mismatch", q=torch.cat([q, torch.zeros(2, 2, 1, dtype=q.dtype)], -1))
    _bad("gamma must be >= 1", x=x[:, :0])
    _bad(r"draft_tokens must lie in \[0, V=5\)", x=x + 5)
    _bad("draft_tokens must be an integer", x=x.double())
    _bad("mode: must be one of", mode="nope")
    _bad("unknown", mode="exact", eps=0.1)
    _bad("lenience: must be", mode="lenience", lenience=1.5)
    _bad("uniforms must have shape", uniforms=torch.zeros(2, 3, dtype=p.dtype))
    _bad(r"uniforms must lie in \[0, 1\)", uniforms=torch.ones(2, 2, dtype=p.dtype))
    _bad("same dtype", q=q.float())
    zero_q = q.clone(); zero_q[0, 0, x[0, 0]] = 0.0
    _bad("q\\(x\\) = 0", q=zero_q / zero_q.sum(-1, keepdim=True))


def test_reject_rule_rejects_everything_and_emits_from_p():
    """The null-draft control's rule: a(x) = 0 at every position, the next token's law is p at the root."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(3, 4, 7, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(3, 3, 7, generator=g, dtype=torch.float64), -1)
    x = torch.randint(0, 7, (3, 3), generator=g)
    res = verify(p, q, x, mode="reject", generator=g)
    assert (res.n_accepted == 0).all() and (res.accept_prob == 0).all() and not res.accepted.any()
    torch.testing.assert_close(res.next_dist, p[:, 0])
