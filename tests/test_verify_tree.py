"""Proof that spade_lib.verify.verify_tree is exact where its rules claim it: enumeration of every draft
tree (draft-token randomness included), Monte-Carlo p-values through the real function, the chain
verifier and a plain-Python reference, greedy's argmax walk, and the arguments' errors.

Notation (Leviathan et al. 2023): ``p`` target, ``q`` draft; a tree's ``parents`` list has ``-1`` for a
child of the root. ``draws`` is how siblings were drawn: iid, without replacement, deterministic (top-k).
"""

from __future__ import annotations

import pytest
import torch

from spade_lib.exactness import (
    sample_tree,
    tree_case,
    tree_law_error,
    tree_monte_carlo_check,
    verify_tree_reference,
)
from spade_lib.rules import DRAWS, get_tree_rule, tree_rule_names
from spade_lib.verify import verify, verify_tree

SHAPES = {  # small trees: children at depth 1 and 2, a node with two children, duplicated subtrees
    "3+1": [-1, -1, -1, 0],
    "2+2+1": [-1, -1, 0, 0, 1],
    "2x1": [-1, -1, 0, 1],
}
EXACT = 1e-9   # enumeration tolerance for a lossless rule (fp64)
P_MIN = 1e-3   # fixed seeds: a lossless rule must not be rejected at this level
P_DETECT = 1e-6  # a biased one must be rejected at this level


# ---------------------------------------------------------------- exact enumeration (fp64)

@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["random", "identical", "q_zeros"])
@pytest.mark.parametrize("draws", DRAWS)
@pytest.mark.parametrize("mode", ["exact", "eagle"])
def test_enumerated_law_equals_target(mode, draws, kind, shape, seed):
    """Every sibling assignment weighted by its probability under ``draws``, every accept/reject
    pattern: each emitted level's law equals ``p`` given the emitted prefix."""
    case = tree_case(SHAPES[shape], 4, draws, kind, seed=seed)
    err = tree_law_error(case, mode)
    assert err["max_abs_error"] < EXACT, err
    assert err["total_mass_error"] < EXACT, err
    if draws != "deterministic":
        assert case.tokens.shape[0] >= 6  # the draft randomness was enumerated
        assert err["reach_deepest"] > 1e-3, err  # and depth 2 was reached with positive probability


def test_enumeration_detects_a_biased_rule():
    """The harness can fail: a lossy rule (lenience 0.5 at every sibling) is far from p."""
    from spade_lib import rules

    rules.register_tree_rule(rules.TreeRule("toy_lenient", "lenience", "drawn", frozenset()))
    try:
        case = tree_case(SHAPES["3+1"], 4, "iid", seed=0)
        err = tree_law_error(case, "toy_lenient", lenience=0.5)
    finally:
        rules.unregister_tree_rule("toy_lenient")
    assert err["tv_first"] > 0.05, err


@pytest.mark.parametrize("mode", ["exact", "eagle"])
def test_duplicated_siblings_are_exact(mode):
    """iid over V = 3 with three children: most assignments repeat a token (measured below), and
    duplicated subtrees (two nodes with the same token, each with its own child) are exact too."""
    case = tree_case(SHAPES["3+1"], 3, "iid", seed=4)
    t = case.tokens
    dup = (t[:, 0] == t[:, 1]) | (t[:, 0] == t[:, 2]) | (t[:, 1] == t[:, 2])
    assert float(case.weight[dup].sum()) > 0.3
    assert tree_law_error(case, mode)["max_abs_error"] < EXACT
    # deterministic, duplicated on purpose: token 1 twice at depth 1, each with a child
    fixed = tree_case(SHAPES["2x1"], 4, "deterministic", seed=5, tokens=[1, 1, 2, 3])
    assert tree_law_error(fixed, mode)["max_abs_error"] < EXACT
    res = verify_tree(fixed.p, None, fixed.tokens, fixed.parents, mode=mode, draws="deterministic",
                      generator=torch.Generator().manual_seed(0))
    if bool(res.reached[0, 1]):  # the repeat was judged after its twin's rejection: r(x) = 0 by then
        assert float(res.accept_prob[0, 1]) == 0.0 and not bool(res.accepted[0, 1])


@pytest.mark.parametrize("draws", DRAWS)
def test_lossless_flags_are_measured(draws):
    """Every registered tree rule's ``lossless`` claim, measured: exact (< 1e-9) under the draws it
    names, far from p (> 0.01) under the others. Rules with ``target="greedy"`` are measured against
    one-hot targets. Measured max |P(emit) - p| (V = 4, shapes 3+1 and 2+2+1, seeds 0-1): exact and
    eagle <= 1e-15 for every draws; greedy 0 for one-hot p (first-token TV 0.17 for a sampling p);
    typical 0.26 (iid, w/o replacement) and 0.57 (deterministic)."""
    for name in tree_rule_names():
        rule = get_tree_rule(name)
        kind = "greedy_target" if rule.target == "greedy" else "random"
        worst = max(tree_law_error(tree_case(SHAPES[s], 4, draws, kind, seed=seed), name)["max_abs_error"]
                    for s in ("3+1", "2+2+1") for seed in (0, 1))
        print(f"{name} draws={draws} ({kind}): max |P(emit) - p| = {worst:.3g}")
        if draws in rule.lossless:
            assert worst < EXACT, (name, draws, worst)
        else:
            assert worst > 0.01, (name, draws, worst)
    greedy_on_sampling_p = tree_law_error(tree_case(SHAPES["3+1"], 4, draws, "random", seed=0), "greedy")
    assert greedy_on_sampling_p["tv_first"] > 0.1  # greedy is lossless only for greedy decoding


@pytest.mark.parametrize("drawn,told,exact", [
    ("without_replacement", "iid", False),        # ignoring the removal of earlier siblings is biased
    ("deterministic", "iid", False),              # top-k children are not draws from q
    ("deterministic", "without_replacement", False),
    ("iid", "without_replacement", False),
    ("iid", "deterministic", True),               # one-hot q_c is "eagle", exact for any proposal
    ("without_replacement", "deterministic", True),
])
def test_verifying_with_the_wrong_draws(drawn, told, exact):
    """The proposal q_c must be the distribution each sibling was drawn from *given the earlier ones*.
    Measured (3+1, V = 4, worst first-two-token TV over seeds 0-2): w/o replacement verified as iid
    0.010, iid as w/o replacement 0.0073, deterministic (top-k) as iid or w/o replacement 0.48;
    verified as deterministic (one-hot q_c, i.e. "eagle"): exact whatever the draws."""
    tv = max(tree_law_error(tree_case(SHAPES["3+1"], 4, drawn, seed=seed), "exact", draws=told)["tv_max"]
             for seed in range(3))
    print(f"drawn {drawn}, verified as {told}: TV = {tv:.3g}")
    assert (tv < EXACT) == exact, tv
    if not exact:
        assert tv > 1e-3


def test_eagle_scheme_is_lossless_for_every_draws():
    """The finding on EAGLE's sampling-mode scheme (eagle/model/utils.py evaluate_posterior: accept x
    with probability p(x), ``qx = 1.0``; else p(x) <- 0 and renormalise; disputed in SafeAILab/EAGLE
    #329 as "not lossless"): measured *exact* for iid, without-replacement and deterministic
    children alike (max error ~1e-16), because for any fixed x, ``r(x) 1[y=x] + (1-r(x)) r(y)
    1[y!=x]/(1-r(x)) = r(y)``. What it loses is acceptance: with sampled children it accepts fewer
    tokens than recursive rejection sampling (measured mean accepted nodes, V = 4, seed 0, shapes
    3+1 / 2+2+1 / 2x1: iid 1.13 / 1.20 / 1.13 vs 1.51 / 1.57 / 1.53; w/o replacement 1.23 / 1.44 /
    1.31 vs 1.52 / 1.67 / 1.57); with deterministic (top-k) children the two are the same rule."""
    for draws in DRAWS:
        for shape in SHAPES:
            case = tree_case(SHAPES[shape], 4, draws, seed=0)
            eagle, exact = tree_law_error(case, "eagle"), tree_law_error(case, "exact")
            print(f"eagle {draws} {shape}: err {eagle['max_abs_error']:.2g}, mean accepted "
                  f"{eagle['mean_accepted']:.3f} vs exact {exact['mean_accepted']:.3f}")
            assert eagle["max_abs_error"] < EXACT
            if draws == "deterministic":
                assert eagle["mean_accepted"] == pytest.approx(exact["mean_accepted"], abs=1e-12)
            else:
                assert eagle["mean_accepted"] < exact["mean_accepted"] - 0.05


def test_p_equal_q_accepts_the_first_child():
    """p = q at every node and iid draws: min(1, r/q) = 1, so the first child is always accepted."""
    case = tree_case(SHAPES["3+1"], 4, "iid", "identical", seed=2)
    res = verify_tree(case.p, case.q, case.tokens, case.parents, generator=torch.Generator().manual_seed(0))
    assert torch.equal(res.path[:, :2], torch.tensor([[0, 3]]).expand_as(res.path[:, :2]))
    assert (res.accept_prob[:, 0] == 1).all() and not res.reached[:, 1:3].any()


def test_zero_residual_mass_keeps_the_residual():
    """A rejection whose residual has no mass (reachable only by round-off: here p <= q everywhere
    because p sums to 1 - 1e-6) keeps r instead of producing NaN."""
    q = torch.tensor([[[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]]], dtype=torch.float64)
    p = torch.tensor([[[0.5 - 1e-6, 0.5, 0.0], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]]], dtype=torch.float64)
    tokens, parents = torch.tensor([[0, 1]]), torch.tensor([[-1, -1]])
    u = torch.tensor([[0.9999999, 0.0]], dtype=torch.float64)
    res = verify_tree(p, q, tokens, parents, uniforms=u, next_uniforms=torch.tensor([0.1], dtype=torch.float64))
    assert not res.accepted[0, 0] and res.accepted[0, 1]  # the first rejected; r kept, so token 1 (r = 0.5) judged
    assert float(res.r_x[0, 1]) == pytest.approx(0.5, abs=1e-5)
    assert torch.isfinite(res.next_dist).all()


# ---------------------------------------------------------------- Monte-Carlo with p-values

MC_SHAPE = [-1, -1, -1, 0, 0, 1]


@pytest.mark.parametrize("draws", DRAWS)
@pytest.mark.parametrize("mode", ["exact", "eagle"])
def test_monte_carlo_emitted_tokens_follow_p(mode, draws):
    """20 000 trees drawn under ``draws`` (V = 6), the real vectorised verify_tree: first token vs
    p(. | root), second (steps that accepted a node) vs p(. | y_0) per y_0; Pearson chi-square,
    p-values > 1e-3 at these fixed seeds."""
    r = tree_monte_carlo_check(MC_SHAPE, 6, draws, mode=mode, n=20_000, seed=DRAWS.index(draws))
    print(f"{mode} {draws}: p_first={r['p_first']:.3g} p_second={r['p_second']:.3g} (n={r['n_second']}) "
          f"mean accepted {r['mean_accepted']:.3f}")
    assert r["p_first"] > P_MIN and r["p_second"] > P_MIN, r
    assert r["n_second"] > 1_000


@pytest.mark.parametrize("mode,draws,told", [("typical", "iid", "iid"), ("exact", "without_replacement", "iid"),
                                             ("exact", "deterministic", "iid")])
def test_monte_carlo_detects_bias(mode, draws, told):
    """The same chi-square check rejects the lossy rule and the wrong draws (p-value < 1e-6)."""
    r = tree_monte_carlo_check(MC_SHAPE, 6, draws, mode=mode, verify_draws=told, n=20_000, seed=0)
    assert min(r["p_first"], r["p_second"]) < P_DETECT, r


# ---------------------------------------------------------------- references

def _random_trees(B, N, V, draws, seed):
    """Per-row random tree shapes, p and q that overlap, tokens drawn under ``draws``."""
    gen = torch.Generator().manual_seed(seed)
    parents = torch.stack([torch.tensor([int(torch.randint(-1, i, (1,), generator=gen)) if i else -1
                                         for i in range(N)]) for _ in range(B)])
    z = 2 * torch.randn(B, N + 1, V, generator=gen, dtype=torch.float64)
    p = z.softmax(-1)
    # the draft after node i's parent: a noisy copy of the target there
    z_par = z.gather(1, (parents + 1)[..., None].expand(B, N, V))
    q = (z_par + torch.randn(B, N, V, generator=gen, dtype=torch.float64)).softmax(-1)
    tokens = torch.zeros(B, N, dtype=torch.long)
    for i in range(N):
        w = q[:, i].clone()
        if draws == "without_replacement":
            for j in range(i):
                same = parents[:, j] == parents[:, i]
                w[same, tokens[same, j]] = 0.0
        if draws == "deterministic":
            rank = (parents[:, :i] == parents[:, i:i + 1]).sum(-1)
            tokens[:, i] = torch.sort(w, descending=True, stable=True).indices.gather(1, rank[:, None]).squeeze(1)
        else:
            tokens[:, i] = torch.multinomial(w, 1, generator=gen).squeeze(-1)
    return p, q, tokens, parents, gen


@pytest.mark.parametrize("draws", DRAWS)
@pytest.mark.parametrize("mode", ["exact", "eagle", "greedy", "typical"])
def test_matches_plain_python_reference(mode, draws):
    """Same uniforms, same paths and next tokens as the row-by-row reference (``"eagle"``: a port of
    EAGLE's evaluate_posterior loop)."""
    p, q, tokens, parents, gen = _random_trees(48, 8, 5, draws, seed=DRAWS.index(draws))
    res = verify_tree(p, q, tokens, parents, mode=mode, draws=draws, generator=gen)
    u = res.uniforms if not torch.isnan(res.uniforms).all() else torch.zeros_like(res.uniforms)
    paths, nxt = verify_tree_reference(p, q, tokens, parents, u, res.next_uniforms, mode=mode, draws=draws)
    assert [res.path[b, : int(res.n_accepted[b])].tolist() for b in range(48)] == paths
    assert res.next_token.tolist() == nxt
    assert res.n_accepted.max() >= 2 and (res.reached & ~res.accepted).any()  # deep paths and rejections occur


CHAIN_PAIRS = [("exact", "exact", "iid"), ("exact", "exact", "without_replacement"),
               ("exact", "one_hot_q", "deterministic"), ("eagle", "one_hot_q", "iid"),
               ("greedy", "greedy", "iid"), ("typical", "typical", "iid")]


@pytest.mark.parametrize("tree_mode,chain_mode,draws", CHAIN_PAIRS)
def test_chain_tree_matches_chain_verify(tree_mode, chain_mode, draws):
    """A chain (parents = i - 1; one child each, so draws do not matter except deterministic's
    one-hot q) gives the chain verifier's decisions from the same generator, bit for bit."""
    B, gamma, V = 64, 4, 5
    gen = torch.Generator().manual_seed(7)
    z = 2 * torch.randn(B, gamma + 1, V, generator=gen, dtype=torch.float64)
    p = z.softmax(-1)
    q = (z[:, :gamma] + torch.randn(B, gamma, V, generator=gen, dtype=torch.float64)).softmax(-1)
    x = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(B, gamma)
    parents = (torch.arange(gamma) - 1).expand(B, gamma)
    tree = verify_tree(p, q, x, parents, mode=tree_mode, draws=draws, generator=torch.Generator().manual_seed(1))
    chain = verify(p, q, x, mode=chain_mode, generator=torch.Generator().manual_seed(1))
    assert torch.equal(tree.n_accepted, chain.n_accepted)
    assert torch.equal(tree.next_token, chain.next_token)
    assert torch.equal(tree.accepted, chain.accepted) and torch.equal(tree.reached, chain.reached)
    torch.testing.assert_close(tree.accept_prob[tree.reached], chain.accept_prob[chain.reached].to(p.dtype))
    torch.testing.assert_close(tree.next_dist, chain.next_dist)
    assert torch.equal(tree.uniforms.isnan(), chain.uniforms.isnan())
    assert len(set(tree.n_accepted.tolist())) >= 3


def test_greedy_equals_the_argmax_walk():
    p, q, tokens, parents, _ = _random_trees(64, 8, 3, "iid", seed=11)
    res = verify_tree(p, None, tokens, parents, mode="greedy")
    for b in range(64):
        cur, path = -1, []
        for i in range(8):
            if int(parents[b, i]) == cur and int(tokens[b, i]) == int(p[b, cur + 1].argmax()):
                path.append(i)
                cur = i
        assert res.path[b, : len(path)].tolist() == path and int(res.n_accepted[b]) == len(path)
        assert int(res.next_token[b]) == int(p[b, cur + 1].argmax())
    assert torch.isnan(res.uniforms).all() and torch.isnan(res.next_uniforms).all()
    assert res.n_accepted.max() >= 2


# ---------------------------------------------------------------- result fields, randomness

def test_result_fields_are_consistent():
    p, q, tokens, parents, gen = _random_trees(32, 7, 6, "iid", seed=3)
    res = verify_tree(p, q, tokens, parents, generator=gen)
    for b in range(32):
        depth, rank = [], []
        for i in range(7):
            a = int(parents[b, i])
            depth.append(0 if a < 0 else depth[a] + 1)
            rank.append(sum(int(parents[b, j]) == a for j in range(i)))
        assert res.depth[b].tolist() == depth and res.sibling_rank[b].tolist() == rank
        nodes = res.path[b, : int(res.n_accepted[b])].tolist()
        assert sorted(nodes) == res.accepted[b].nonzero().squeeze(-1).tolist()
        assert all(int(parents[b, c]) == (nodes[k - 1] if k else -1) for k, c in enumerate(nodes))
        assert (res.path[b, int(res.n_accepted[b]):] == -1).all()
        for i in range(7):
            assert float(res.p_x[b, i]) == float(p[b, int(parents[b, i]) + 1, tokens[b, i]])
    assert not (res.accepted & ~res.reached).any()
    assert torch.equal(res.accepted, res.reached & (res.uniforms < res.accept_prob))
    assert torch.isnan(res.accept_prob[~res.reached]).all() and not torch.isnan(res.accept_prob[res.reached]).any()
    first = res.reached & (res.sibling_rank == 0)  # the first child sees r = p at its parent
    torch.testing.assert_close(res.r_x[first], res.p_x[first])
    torch.testing.assert_close(res.accept_prob[res.reached], (res.r_x / res.q_x).clamp(max=1)[res.reached])
    torch.testing.assert_close(res.next_dist.sum(-1), torch.ones(32, dtype=p.dtype))
    assert (res.next_dist.gather(-1, res.next_token[:, None]) > 0).all()
    assert [len(e) for e in res.emitted(tokens)] == (res.n_accepted + 1).tolist()


@pytest.mark.parametrize("mode", ["exact", "eagle", "typical"])
def test_seeded_and_replayable(mode):
    p, q, tokens, parents, _ = _random_trees(16, 6, 5, "iid", seed=5)
    a = verify_tree(p, q, tokens, parents, mode=mode, generator=torch.Generator().manual_seed(1),
                    residual_generator=torch.Generator().manual_seed(2))
    b = verify_tree(p, q, tokens, parents, mode=mode, generator=torch.Generator().manual_seed(1),
                    residual_generator=torch.Generator().manual_seed(2))
    c = verify_tree(p, q, tokens, parents, mode=mode, uniforms=a.uniforms, next_uniforms=a.next_uniforms)
    for other in (b, c):
        assert torch.equal(a.path, other.path) and torch.equal(a.next_token, other.next_token)
    d = verify_tree(p, q, tokens, parents, mode=mode, generator=torch.Generator().manual_seed(1),
                    residual_generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.uniforms.isnan(), d.uniforms.isnan())
    assert torch.equal(a.uniforms[~a.uniforms.isnan()], d.uniforms[~d.uniforms.isnan()])
    assert not torch.equal(a.next_uniforms, d.next_uniforms)


def test_empty_tree_samples_the_root_target():
    p = torch.tensor([[[0.25, 0.75]]], dtype=torch.float64)
    empty = torch.zeros(1, 0, dtype=torch.long)
    res = verify_tree(p, None, empty, empty, draws="deterministic", next_uniforms=torch.tensor([0.5], dtype=p.dtype))
    assert res.n_accepted.tolist() == [0] and res.next_token.tolist() == [1]
    torch.testing.assert_close(res.next_dist, p[:, 0])


def test_sample_tree_draws_without_replacement_distinct_siblings():
    """The Monte-Carlo sampler itself: siblings distinct without replacement, top-k when deterministic."""
    from spade_lib.exactness import tree_tables

    _, q_table = tree_tables(MC_SHAPE, 6, seed=0)
    tok = sample_tree(MC_SHAPE, q_table, "without_replacement", 2_000, torch.Generator().manual_seed(0))
    assert ((tok[:, 0] != tok[:, 1]) & (tok[:, 0] != tok[:, 2]) & (tok[:, 1] != tok[:, 2])).all()
    assert (tok[:, 3] != tok[:, 4]).all()
    top = sample_tree(MC_SHAPE, q_table, "deterministic", 3, torch.Generator().manual_seed(0))
    assert top[0, :3].tolist() == q_table[0].argsort(descending=True, stable=True)[:3].tolist()


# ---------------------------------------------------------------- input validation

def _bad(match, **changes):
    p, q, tokens, parents, _ = _random_trees(2, 4, 5, "without_replacement", seed=9)
    args = {"p": p, "q": q, "tokens": tokens, "parents": parents, **changes}
    with pytest.raises(ValueError, match=match):
        verify_tree(args.pop("p"), args.pop("q"), args.pop("tokens"), args.pop("parents"), **args)


def test_validation_errors_name_the_argument():
    p, q, tokens, parents, _ = _random_trees(2, 4, 5, "without_replacement", seed=9)
    forward = parents.clone(); forward[1, 2] = 2
    below = parents.clone(); below[0, 3] = -2
    _bad(r"parents: .*parents\[1, 2\] = 2", parents=forward)
    _bad(r"parents: .*parents\[0, 3\] = -2", parents=below)
    _bad("parents: must have the shape of tokens", parents=parents[:, :3])
    _bad("parents: must be an integer", parents=parents.double())
    _bad("tokens: must have shape", tokens=tokens[0])
    _bad(r"tokens: must lie in \[0, V=5\)", tokens=tokens + 5)
    _bad("p: must have shape", p=p[:, :4])
    _bad("q: must have shape", q=q[:, :3])
    _bad("q: must have the dtype", q=q.float())
    _bad("q: required", q=None)
    _bad("mode: must be one of the tree rules", mode="one_hot_q")
    _bad("draws: must be one of", draws="top_k")
    _bad("unknown", mode="typical", nope=1.0)
    _bad("eps: must be", mode="typical", eps=-1.0)
    _bad("p rows must sum to 1", p=p * 1.1)
    _bad("uniforms must have shape", uniforms=torch.zeros(2, 3, dtype=p.dtype))
    zero_q = q.clone(); zero_q[0, 0, tokens[0, 0]] = 0.0
    _bad(r"tokens: node 0 of row 0 has q\(x\) = 0", q=zero_q / zero_q.sum(-1, keepdim=True), draws="iid")
    repeat = tokens.clone(); repeat[0, 1] = repeat[0, 0]  # nodes 0 and 1 are both children of the root
    assert int(parents[0, 1]) == int(parents[0, 0]) == -1
    _bad("tokens: node 1 of row 0 repeats an earlier sibling", tokens=repeat, draws="without_replacement")
    verify_tree(p, q, repeat, parents, draws="iid", generator=torch.Generator())  # a repeat is fine iid
    verify_tree(p, None, tokens, parents, mode="exact", draws="deterministic")   # q not needed


def test_an_unknown_option_names_what_the_caller_passed():
    """Issue 57: ``verify_tree(mode="eagle", foo=1)`` named the chain rule ``one_hot_q`` (an internal alias the
    caller never wrote); the error now starts with the option and names the mode as passed."""
    _bad(r"^foo: unknown option of mode 'eagle' \(its options: none\), got foo=1$", mode="eagle",
         draws="deterministic", q=None, foo=1)
    _bad(r"^nope: unknown option of mode 'typical' \(its options: delta, eps\)", mode="typical", nope=1.0)
    with pytest.raises(ValueError) as err:
        verify_tree(*_random_trees(2, 4, 5, "iid", seed=9)[:4], mode="eagle", foo=1)
    assert "one_hot_q" not in str(err.value)
