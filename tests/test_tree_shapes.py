"""Tests for spade_lib.decoding.drafts.tree_shapes: the shapes of draft trees and their acceptance statistics.

References: hand-worked small trees; EAGLE-2's tree written declaratively over *every* path up to the
depth (and, where EAGLE-2 must equal it, the global top-N of all paths); Pearson chi-square of the
sampled trees' draws against their exact law; brute-force substring counts for the suffix index; and
Monte-Carlo runs of the real ``verify_tree`` against the closed-form path probabilities. Every
chi-square test below uses a fixed seed and passes at p > 1e-3; the negative controls fail at p < 1e-6.
"""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest
import torch

from spade_lib.decoding.drafts.tree_shapes import (
    MEDUSA_63,
    SuffixIndex,
    TreeShape,
    deterministic_accept_prob,
    eagle2_tree,
    fill_static,
    ngram_tree,
    path_probabilities,
    sampled_tree,
    static_tree,
)
from spade_lib.exactness import chi_square_pvalue
from spade_lib.verify import verify_tree

P_PASS = 1e-3   # fixed seeds: every lossless / exact law must pass at this level
P_FAIL = 1e-6   # negative controls must fail at this level


def random_dist_fn(V: int, seed: int = 0, power: float = 3.0, calls: list[int] | None = None):
    """A draft as a pure function of the path: ``q(. | path)`` from a seeded ``rand(V) ** power``
    (a larger power is more peaked). ``calls`` records the batch size of every call."""
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def fn(paths: list[list[int]]) -> torch.Tensor:
        if calls is not None:
            calls.append(len(paths))
        rows = []
        for path in paths:
            key = tuple(path)
            if key not in cache:
                g = torch.Generator().manual_seed((seed * 1_000_003 + hash(key)) & 0x7FFFFFFF)
                w = torch.rand(V, generator=g, dtype=torch.float64) ** power
                cache[key] = w / w.sum()
            rows.append(cache[key])
        return torch.stack(rows)

    return fn


def assert_tree(shape: TreeShape, vocab: int | None = None) -> None:
    """Structure invariants: shapes and dtypes, parents[i] < i, level order, siblings by score."""
    N = shape.tokens.numel()
    assert shape.tokens.dtype == torch.long and shape.parents.dtype == torch.long
    assert shape.tokens.shape == (N,) and shape.parents.shape == (N,)
    par = shape.parents.tolist()
    assert all(-1 <= par[i] < i for i in range(N))
    depth = shape.depths().tolist()
    assert depth == sorted(depth), "level order: depth never decreases"
    for i in range(1, N):
        if depth[i] == depth[i - 1]:
            assert par[i] >= par[i - 1], "within a depth, by the parent's index"
    if shape.draws == "deterministic":
        assert shape.q is None
        assert len(set(zip(par, shape.tokens.tolist()))) == N, "no repeated sibling token"
    else:
        assert shape.q is not None and shape.q.shape == (N, vocab)
    if shape.score is not None:
        for i in range(N):
            for j in range(i + 1, N):
                if par[i] == par[j]:
                    assert shape.score[i] >= shape.score[j], "siblings: the better-scored first"


# ----------------------------------------------------------------------------------------------
# static trees


def test_static_tree_hand_example():
    st = static_tree([[0, 0, 0], [1, 0], [0], [0, 1], [1], [0, 0]])  # any order in, Medusa's order out
    assert st.choices == [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    assert st.parents.tolist() == [-1, -1, 0, 0, 1, 2]
    assert st.topk_rank.tolist() == [0, 1, 0, 1, 0, 0]
    assert st.depths.tolist() == [1, 1, 2, 2, 2, 3]


@pytest.mark.parametrize("choices, match", [
    ([[0, 1]], "prefix"), ([[0], [0]], "more than once"), ([[0], []], "non-empty"), ([[-1]], ">= 0"),
])
def test_static_tree_rejects_bad_choices(choices, match):
    with pytest.raises(ValueError, match=match):
        static_tree(choices)


def test_medusa_63_is_medusas_sorted_tree():
    st = static_tree(MEDUSA_63)
    assert len(st.choices) == 63 and int(st.depths.max()) == 4
    assert st.choices == [tuple(c) for c in sorted(MEDUSA_63, key=lambda c: (len(c), c))]
    for i, c in enumerate(st.choices):
        par = int(st.parents[i])
        assert (par == -1) if len(c) == 1 else st.choices[par] == c[:-1]


def test_fill_static_hand_example():
    """V = 4; ties go to the lower token id (after [1], tokens 0 and 1 both have 0.25)."""
    table = {(): [0.1, 0.5, 0.3, 0.1], (1,): [0.25, 0.25, 0.4, 0.1], (2,): [0.7, 0.1, 0.1, 0.1],
             (1, 2): [0.0, 0.0, 0.0, 1.0]}
    calls = []

    def dist_fn(paths):
        calls.append([tuple(x) for x in paths])
        return torch.tensor([table[tuple(x)] for x in paths], dtype=torch.float64)

    shape = fill_static([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]], dist_fn)
    assert shape.tokens.tolist() == [1, 2, 2, 0, 0, 3]
    assert shape.parents.tolist() == [-1, -1, 0, 0, 1, 2]
    assert shape.score.tolist() == pytest.approx([0.5, 0.3, 0.2, 0.125, 0.21, 0.2])
    assert calls == [[()], [(1,), (2,)], [(1, 2)]]  # one batched call per depth, internal nodes only
    assert shape.draws == "deterministic" and shape.q is None
    assert_tree(shape)


def test_fill_static_medusa_heads():
    """Medusa's heads: a dist_fn that reads only len(path) puts the rank-th token of head d at depth d."""
    V = 12
    heads = random_dist_fn(V, seed=5)([[d] for d in range(4)])  # [4, V], one distribution per depth
    calls = []

    def dist_fn(paths):
        calls.append(len(paths))
        return heads[[len(x) for x in paths]]

    shape = fill_static(MEDUSA_63, dist_fn)
    st = static_tree(MEDUSA_63)
    ranked = torch.sort(heads, dim=-1, descending=True, stable=True).indices
    assert shape.tokens.tolist() == [int(ranked[d - 1, r]) for d, r in zip(st.depths.tolist(), st.topk_rank.tolist())]
    assert len(calls) == 4
    assert_tree(shape)
    with pytest.raises(ValueError, match="needs V > 8"):
        fill_static(MEDUSA_63, lambda paths: torch.full((len(paths), 8), 1 / 8))


# ----------------------------------------------------------------------------------------------
# EAGLE-2


def eagle2_reference(dist_fn, V: int, total_nodes: int, depth: int, top_k: int) -> dict[tuple, float]:
    """EAGLE-2's tree written declaratively over every path of length <= depth (V^d of each):
    a depth-d path is a candidate iff its last token is among the k most likely at its parent and
    (d > 1) its parent is one of the k best candidates of depth d - 1 by cumulative probability;
    keep the total_nodes best candidates. Cumulative probabilities as plain products."""
    k = min(top_k, V)
    dist = {}
    cum = {(): 1.0}
    candidates: list[tuple] = []
    frontier: set[tuple] = {()}
    for d in range(1, depth + 1):
        level = []
        for x in itertools.product(range(V), repeat=d):
            par = x[:-1]
            if par not in dist:
                dist[par] = dist_fn([list(par)])[0]
            q = dist[par]
            cum[x] = cum[par] * float(q[x[-1]])
            rank = int((q > q[x[-1]]).sum())  # continuous draws: no ties
            if rank < k and par in frontier:
                level.append(x)
        frontier = set(sorted(level, key=lambda x: -cum[x])[:k])
        candidates += level
    return {x: cum[x] for x in sorted(candidates, key=lambda x: -cum[x])[:total_nodes]}


def test_eagle2_hand_example():
    """V = 3, top_k = 2, depth = 2. Candidates [0] .5, [1] .3, [0,2] .35, [0,1] .1, [1,0] .27, [1,1] .015
    (tie with [1,2]: the lower id); the best 3 are [0], [0,2], [1]; the best 4 add [1,0]."""
    table = {(): [0.5, 0.3, 0.2], (0,): [0.1, 0.2, 0.7], (1,): [0.9, 0.05, 0.05]}
    calls = []

    def dist_fn(paths):
        calls.append(len(paths))
        return torch.tensor([table[tuple(x)] for x in paths], dtype=torch.float64)

    three = eagle2_tree(dist_fn, total_nodes=3, depth=2, top_k=2)
    assert three.tokens.tolist() == [0, 1, 2] and three.parents.tolist() == [-1, -1, 0]
    assert three.score.tolist() == pytest.approx([0.5, 0.3, 0.35])
    assert calls == [1, 2]
    four = eagle2_tree(dist_fn, total_nodes=4, depth=2, top_k=2)
    assert four.tokens.tolist() == [0, 1, 2, 0] and four.parents.tolist() == [-1, -1, 0, 1]
    every = eagle2_tree(dist_fn, total_nodes=100, depth=2, top_k=2)  # more budget than candidates: all 6
    assert sorted(map(tuple, every.paths())) == [(0,), (0, 1), (0, 2), (1,), (1, 0), (1, 1)]


@pytest.mark.parametrize("seed", range(4))
def test_eagle2_equals_declarative_reference(seed):
    V, total, depth, top_k = 5, 20, 4, 3
    fn = random_dist_fn(V, seed)
    calls = []
    shape = eagle2_tree(lambda paths: (calls.append(len(paths)), fn(paths))[1],
                        total_nodes=total, depth=depth, top_k=top_k)
    ref = eagle2_reference(fn, V, total, depth, top_k)
    paths = [tuple(x) for x in shape.paths()]
    assert set(paths) == set(ref) and len(paths) == total
    assert shape.score.tolist() == pytest.approx([ref[x] for x in paths], rel=1e-12)
    assert calls == [1] + [top_k] * (depth - 1)  # one call per depth: the expanded nodes, batched
    assert int(shape.depths().max()) <= depth
    assert_tree(shape)


def test_eagle2_equals_global_top_n_when_top_k_covers_the_budget():
    """With total_nodes <= min(top_k, V), every node of the global top-N (over all V + V^2 + V^3 paths)
    is among its parent's top_k and its parent among its depth's top_k: EAGLE-2 is the global top-N."""
    V, total, depth, top_k = 10, 6, 3, 6
    fn = random_dist_fn(V, seed=11, power=6.0)  # peaked, so the top-N reaches depth 3
    cum = {}
    for d in range(1, depth + 1):
        for x in itertools.product(range(V), repeat=d):
            cum[x] = (cum[x[:-1]] if d > 1 else 1.0) * float(fn([list(x[:-1])])[0, x[-1]])
    best = set(sorted(cum, key=lambda x: -cum[x])[:total])
    shape = eagle2_tree(fn, total_nodes=total, depth=depth, top_k=top_k)
    assert set(map(tuple, shape.paths())) == best
    assert max(map(len, best)) >= 2


def test_eagle2_ties_keep_ancestors():
    """A one-hot draft: every path's cumulative probability is 1 or 0 (log 0 or -inf), all tied;
    EAGLE's torch.topk could keep a child without its parent. Here: the probability-1 chain, then the
    shallowest zero-probability nodes, and every kept node's parent is kept."""
    V = 4
    one_hot = torch.zeros(V, dtype=torch.float64)
    one_hot[0] = 1.0
    shape = eagle2_tree(lambda paths: one_hot.expand(len(paths), V).clone(), total_nodes=6, depth=4, top_k=3)
    paths = [tuple(x) for x in shape.paths()]
    assert set(paths) == {(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (1,), (2,)}
    assert all(len(x) == 1 or x[:-1] in paths for x in paths)
    assert_tree(shape)


def test_eagle2_defaults_budget_and_verify_tree():
    """EAGLE-2's evaluation setting (59 draft nodes + the root, depth 6 = EAGLE's 5 + the root's
    children, top 10); the tree feeds verify_tree, whose accept_prob is the sequential residual."""
    V = 40
    fn = random_dist_fn(V, seed=2, power=4.0)
    shape = eagle2_tree(fn)
    assert shape.n_nodes == 59 and int(shape.depths().max()) <= 6
    assert_tree(shape)
    small = eagle2_tree(fn, total_nodes=500, depth=2, top_k=3)
    assert small.n_nodes == 3 + 9  # all candidates when the budget exceeds them
    g = torch.Generator().manual_seed(0)
    p = torch.rand(1, shape.n_nodes + 1, V, generator=g, dtype=torch.float64) ** 4
    p = p / p.sum(-1, keepdim=True)
    res = verify_tree(p, None, shape.tokens[None], shape.parents[None], mode="exact", draws="deterministic")
    a = deterministic_accept_prob(p[0], shape.tokens, shape.parents)
    reached = res.reached[0]
    assert torch.allclose(res.accept_prob[0][reached], a[reached], atol=1e-12, rtol=0)


# ----------------------------------------------------------------------------------------------
# sampled trees


def _pair_ids(n: int, fn, widths, draws, seed):
    """``n`` trees; per tree (root child 0, root child 1) and (root child 0, its first child) as
    category ids ``a * V + b``."""
    g = torch.Generator().manual_seed(seed)
    first, second = [], []
    for _ in range(n):
        t = sampled_tree(fn, widths, generator=g, draws=draws)
        tok, par = t.tokens.tolist(), t.parents.tolist()
        first.append((tok[0], tok[1]))
        child = par.index(0)
        second.append((tok[0], tok[child]))
    return first, second


@pytest.mark.parametrize("draws", ["iid", "without_replacement"])
def test_sampled_tree_draws_follow_their_law(draws):
    """Chi-square over V^2 cells: (x_0, x_1), the root's two children, ~ q(a) q(b) (iid) or
    q(a) q(b) / (1 - q(a)), a != b (without replacement); (x_0, its child) ~ q(a) q(b | a)."""
    V, n = 5, 4000
    fn = random_dist_fn(V, seed=3, power=2.0)
    first, second = _pair_ids(n, fn, (2, 1), draws, seed=7)
    q = fn([[]])[0]
    if draws == "iid":
        law = q[:, None] * q[None, :]
    else:
        law = q[:, None] * q[None, :] / (1 - q[:, None])
        law.fill_diagonal_(0.0)
    cond = torch.stack([q[a] * fn([[a]])[0] for a in range(V)])
    ids = lambda pairs: torch.tensor([a * V + b for a, b in pairs])
    assert chi_square_pvalue(ids(first), law.flatten()) > P_PASS
    assert chi_square_pvalue(ids(second), cond.flatten()) > P_PASS
    wrong = q[:, None] * q[None, :]
    if draws == "without_replacement":  # negative control: the iid law on draws without replacement
        assert chi_square_pvalue(ids(first), wrong.flatten()) < P_FAIL
    else:  # negative control: the without-replacement law on iid draws
        wr = wrong / (1 - q[:, None])
        wr.fill_diagonal_(0.0)
        assert chi_square_pvalue(ids(first), wr.flatten()) < P_FAIL


@pytest.mark.parametrize("draws", ["iid", "without_replacement"])
def test_sampled_tree_shape_and_q(draws):
    V = 6
    calls = []
    fn = random_dist_fn(V, seed=4, calls=calls)
    t = sampled_tree(fn, (3, 2), generator=torch.Generator().manual_seed(1), draws=draws)
    assert t.n_nodes == 3 + 3 * 2 and calls == [1, 3] and t.draws == draws and t.score is None
    assert_tree(t, vocab=V)
    paths = t.paths()
    for i, par in enumerate(t.parents.tolist()):  # q[i] is q at the parent, before any removal
        assert torch.equal(t.q[i], fn([paths[par] if par >= 0 else []])[0])
    if draws == "without_replacement":
        for par in set(t.parents.tolist()):
            kids = [tok for tok, pa in zip(t.tokens.tolist(), t.parents.tolist()) if pa == par]
            assert len(set(kids)) == len(kids)
    # verify_tree accepts the tree as drawn (validate=True checks q(x) > 0 and, without replacement, no repeats)
    p = fn([[9] * (i + 1) for i in range(t.n_nodes + 1)])[None]
    verify_tree(p, t.q[None], t.tokens[None], t.parents[None], mode="exact", draws=draws,
                generator=torch.Generator().manual_seed(0))


def test_sampled_tree_without_replacement_stops_at_the_support():
    q = torch.tensor([0.0, 0.7, 0.0, 0.3], dtype=torch.float64)
    t = sampled_tree(lambda paths: q.expand(len(paths), 4).clone(), (3,), generator=torch.Generator().manual_seed(0),
                     draws="without_replacement")
    assert sorted(t.tokens.tolist()) == [1, 3]
    with pytest.raises(ValueError, match="draws"):
        sampled_tree(lambda paths: q.expand(len(paths), 4).clone(), (1,), generator=torch.Generator(),
                     draws="deterministic")


# ----------------------------------------------------------------------------------------------
# prompt lookup trees


def test_ngram_tree_hand_example():
    """[1, 2] occurs at 0, 3 and 6 before the trailing one; depth 2 continuations [3, 1], [4, 1], [3, 9]
    (the trigram [9, 1, 2] never occurred earlier). Root children: 3 (twice) before 4; under 3: 9
    (occurrence 6) before 1 (occurrence 0)."""
    ctx = [1, 2, 3, 1, 2, 4, 1, 2, 3, 9, 1, 2]
    t = ngram_tree(ctx, max_ngram=3, min_ngram=1, max_nodes=59, depth=2)
    assert t.tokens.tolist() == [3, 4, 9, 1, 1] and t.parents.tolist() == [-1, -1, 0, 0, 1]
    assert t.score.tolist() == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3])
    assert t.draws == "deterministic" and t.q is None
    assert_tree(t)
    # budget 3: by (frequency, recency, shallower): 3, then 9 (occurrence 6), then 4 (occurrence 3)
    small = ngram_tree(ctx, max_ngram=3, min_ngram=1, max_nodes=3, depth=2)
    assert small.tokens.tolist() == [3, 4, 9] and small.parents.tolist() == [-1, -1, 0]


def test_ngram_tree_longest_match_recency_and_none():
    ctx = [5, 1, 2, 7, 1, 2, 8, 5, 1, 2]
    tri = ngram_tree(ctx, max_ngram=3, depth=2)  # [5, 1, 2] occurred at 0: continuation [7, 1] only
    assert tri.tokens.tolist() == [7, 1] and tri.parents.tolist() == [-1, 0]
    bi = ngram_tree(ctx, max_ngram=2, depth=2)  # [1, 2] at 1 ([7, 1]) and 4 ([8, 5]): the later first
    assert bi.tokens.tolist() == [8, 7, 5, 1] and bi.parents.tolist() == [-1, -1, 0, 1]
    none = ngram_tree([1, 2, 3], max_ngram=2)
    assert none.n_nodes == 0 and none.tokens.dtype == torch.long
    assert ngram_tree([4, 4], max_ngram=3, depth=5).tokens.tolist() == [4]  # a continuation may end the context
    assert ngram_tree([1, 2, 3, 1, 2], max_ngram=3, min_ngram=3).n_nodes == 0  # below min_ngram: no match


# ----------------------------------------------------------------------------------------------
# suffix index


def brute_count(seqs: list[list[int]], w: list[int]) -> int:
    m = len(w)
    return sum(1 for s in seqs for i in range(len(s) - m + 1) if s[i:i + m] == w)


def test_suffix_index_counts_match_brute_force_under_incremental_updates():
    rng = random.Random(0)
    max_depth = 5
    seqs = {"prompt": [rng.randrange(3) for _ in range(40)], "out": [rng.randrange(3) for _ in range(30)]}
    chunked = SuffixIndex(max_depth)
    whole = SuffixIndex(max_depth)
    for sid, s in seqs.items():
        whole.extend(sid, s)
    pos = {sid: 0 for sid in seqs}  # interleave the two sequences in random chunks
    while any(pos[sid] < len(s) for sid, s in seqs.items()):
        sid = rng.choice([k for k in seqs if pos[k] < len(seqs[k])])
        step = rng.randint(1, 4)
        chunked.extend(sid, torch.tensor(seqs[sid][pos[sid]:pos[sid] + step]))
        pos[sid] += step
        stored = [chunked.sequence(k) for k in seqs if pos[k]]
        for w in ([0, 1], [2, 2, 1], [1, 0, 2, 1]):
            assert chunked.count(w) == brute_count(stored, w)
    for m in range(1, max_depth + 1):
        for w in itertools.product(range(3), repeat=m):
            assert chunked.count(list(w)) == whole.count(list(w)) == brute_count(list(seqs.values()), list(w))
    assert chunked.count([]) == 70
    with pytest.raises(ValueError, match="max_depth"):
        chunked.count([0] * 6)


def test_suffix_index_speculate_hand_example():
    """Stored [7, 1, 2, 7, 1, 3, 7, 1, 2]; context [9, 7, 1]: [7, 1] occurs 3 times (the last has no
    continuation): P(2) = 2/3, P(3) = 1/3, and every longer continuation 1/3. Match length 2 with
    factor 1 allows 2 nodes: 2 and 3 (sum 1 > match 1's 2/3). With factor 3, 6 nodes: 2, then the
    1/3-nodes of the more recent occurrence (3 7 1 2) before the older branch's 7."""
    idx = SuffixIndex(max_depth=8)
    idx.extend("doc", [7, 1, 2, 7, 1, 3, 7, 1, 2])
    assert idx.count([7, 1]) == 3 and idx.count([1, 2]) == 2
    two = idx.speculate([9, 7, 1], max_spec_factor=1.0)
    assert two.tokens.tolist() == [2, 3] and two.parents.tolist() == [-1, -1]
    assert two.score.tolist() == pytest.approx([2 / 3, 1 / 3])
    six = idx.speculate([9, 7, 1], max_spec_factor=3.0)
    assert six.tokens.tolist() == [2, 3, 7, 7, 1, 2] and six.parents.tolist() == [-1, -1, 0, 1, 3, 4]
    assert float(six.score.sum()) == pytest.approx(2 / 3 + 5 / 3)
    assert_tree(six)
    pruned = idx.speculate([9, 7, 1], max_spec_factor=3.0, min_token_prob=0.5)
    assert pruned.tokens.tolist() == [2]
    assert idx.speculate([5], max_spec_factor=3.0).n_nodes == 0
    idx.extend("doc", [7, 1, 3])  # committed tokens move the counts: now 3 follows [7, 1] as often as 2
    assert idx.count([7, 1, 3]) == 2 and idx.speculate([9, 7, 1], max_spec_factor=1.0).score.tolist() == \
        pytest.approx([2 / 4, 2 / 4])


@pytest.mark.parametrize("seed", range(3))
def test_suffix_index_speculate_matches_brute_force(seed):
    """Node scores are count(w c) / count(w) (brute-force counts); the draft's probabilities are the
    best `budget` of all continuations above min_token_prob, for a match length of maximal total."""
    rng = random.Random(seed)
    max_depth, factor, min_prob = 6, 2.0, 0.123456
    seqs = [[rng.randrange(3) for _ in range(50)], [rng.randrange(3) for _ in range(20)]]
    idx = SuffixIndex(max_depth)
    for k, s in enumerate(seqs):
        idx.extend(k, s)
    for _ in range(5):
        ctx = [rng.randrange(3) for _ in range(8)]
        t = idx.speculate(ctx, max_spec_factor=factor, min_token_prob=min_prob, max_nodes=59)
        options = []  # (total, sorted probabilities) per match length
        for m in range(1, min(len(ctx), max_depth) + 1):
            w = ctx[len(ctx) - m:]
            cw = brute_count(seqs, w)
            if cw == 0:
                break
            probs = []
            for L in range(1, max_depth - m + 1):
                for c in itertools.product(range(3), repeat=L):
                    pr = Fraction(brute_count(seqs, w + list(c)), cw)
                    if pr > 0 and pr >= Fraction(min_prob):
                        probs.append(pr)
            top = sorted(probs, reverse=True)[:min(59, int(m * factor + 1e-6))]
            options.append((sum(top), [float(x) for x in top]))
        best = max(total for total, _ in options)
        assert float(t.score.sum()) == pytest.approx(float(best), abs=1e-9)
        got = sorted(t.score.tolist(), reverse=True)
        assert any(len(got) == len(pr) and got == pytest.approx(pr, abs=1e-12)
                   for total, pr in options if total == best)
        for path, s in zip(t.paths(), t.score.tolist()):  # each score: count(w c) / count(w) for some match w
            assert any(math.isclose(s, brute_count(seqs, ctx[len(ctx) - m:] + path) /
                                    max(brute_count(seqs, ctx[len(ctx) - m:]), 1), abs_tol=1e-12)
                       for m in range(1, len(ctx) + 1))
        assert_tree(t)


# ----------------------------------------------------------------------------------------------
# tree statistics


def test_path_probabilities_hand_example():
    """Nodes 0, 1 children of the root, 2 a child of 0; a = .5, .4, .2: node 1 is judged when 0 is
    rejected (.5), node 2 when 0 is accepted (.5); E[accepted] = .5 + .2 + .1."""
    stats = path_probabilities(torch.tensor([-1, -1, 0]), torch.tensor([0.5, 0.4, 0.2]))
    assert stats.reach.tolist() == pytest.approx([1.0, 0.5, 0.5])
    assert stats.on_path.tolist() == pytest.approx([0.5, 0.2, 0.1])
    assert stats.ends.tolist() == pytest.approx([0.3, 0.4, 0.2, 0.1])
    assert float(stats.expected_accepted) == pytest.approx(0.8)
    batched = path_probabilities(torch.tensor([-1, -1, 0]), torch.tensor([[0.5, 0.4, 0.2], [1.0, float("nan"), 0.0]]))
    assert batched.ends[1].tolist() == [0.0, 1.0, 0.0, 0.0]  # NaN is fine where the node cannot be reached
    assert torch.equal(batched.ends[0], stats.ends)


def _end_slots(res) -> torch.Tensor:
    rows = torch.arange(res.n_accepted.numel())
    last = res.path[rows, (res.n_accepted - 1).clamp(min=0)]
    return torch.where(res.n_accepted > 0, last + 1, 0)


def _mc_case(draws: str, B: int = 20_000):
    """A 9-node tree over V = 6 (deterministic: a static tree filled by the draft; iid: drawn from it)
    and a target correlated with the draft; verify_tree on B copies, one acceptance draw per node."""
    V = 6
    fn = random_dist_fn(V, seed=8, power=2.0)
    if draws == "deterministic":
        shape = fill_static([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0]], fn)
    else:
        shape = sampled_tree(fn, (3, 2), generator=torch.Generator().manual_seed(3), draws=draws)
    N = shape.n_nodes
    noise = random_dist_fn(V, seed=9, power=1.0)
    prefixes = [[]] + shape.paths()
    p = 0.6 * fn(prefixes) + 0.4 * noise(prefixes)          # [N+1, V]: the target at the root and after each node
    q = shape.q[None].expand(B, N, V) if shape.q is not None else None
    res = verify_tree(p[None].expand(B, N + 1, V), q, shape.tokens.expand(B, N), shape.parents.expand(B, N),
                      mode="exact", draws=draws, generator=torch.Generator().manual_seed(42))
    return shape, p, res


def _check_against_closed_form(shape, res, a):
    stats = path_probabilities(shape.parents, a)
    slots = _end_slots(res)
    assert chi_square_pvalue(slots, stats.ends) > P_PASS
    depth = torch.cat([torch.zeros(1, dtype=torch.float64), shape.depths().double()])
    mean, second = float((stats.ends * depth).sum()), float((stats.ends * depth ** 2).sum())
    se = math.sqrt((second - mean ** 2) / slots.numel())
    assert float(stats.expected_accepted) == pytest.approx(mean, abs=1e-12)
    assert abs(float(res.n_accepted.double().mean()) - mean) < 4 * se
    return stats, slots


def test_expected_accepted_matches_verify_tree_deterministic():
    """Deterministic children under the exact rule: P(child accepted | judged) = r(x) with the
    sequential residual (deterministic_accept_prob), so the path's end has the closed-form law."""
    shape, p, res = _mc_case("deterministic")
    a = deterministic_accept_prob(p, shape.tokens, shape.parents)
    reached = res.reached
    assert torch.allclose(res.accept_prob[reached], a.expand_as(res.accept_prob)[reached], atol=1e-12, rtol=0)
    stats, slots = _check_against_closed_form(shape, res, a)
    assert float(stats.expected_accepted) > 0.8  # the tree is reached beyond depth 1
    # negative control: a_i = p(x_i) at the parent, ignoring the earlier siblings' rejections
    naive = p[shape.parents + 1].gather(-1, shape.tokens[:, None]).squeeze(-1)
    assert chi_square_pvalue(slots, path_probabilities(shape.parents, naive).ends) < P_FAIL


def test_expected_accepted_matches_verify_tree_iid():
    """Drawn children (iid) with the tree fixed: each a_i = min(1, r(x)/q_c(x)) is still a number
    fixed by p, q and the tree (the same in every row where the node is judged), so the recursion applies."""
    shape, p, res = _mc_case("iid")
    ap = res.accept_prob
    a = torch.nan_to_num(ap, nan=-1.0).amax(0)
    lo = torch.nan_to_num(ap, nan=2.0).amin(0)
    seen = a >= 0
    assert torch.allclose(a[seen], lo[seen], atol=1e-12, rtol=0)
    _check_against_closed_form(shape, res, torch.where(seen, a, torch.nan))


def test_ranked_is_a_stable_descending_sort_without_sorting_everything():
    """The top-k the builders rank children by equals the first k of a stable sort of all V, ties included."""
    from spade_lib.decoding.drafts.tree_shapes import _ranked

    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        dist = torch.randint(0, 4, (30,), generator=g).double()  # many ties, zeros too
        dist /= dist.sum()
        full = torch.sort(dist, descending=True, stable=True).indices
        for k in (1, 3, 7, 30, 40):
            assert _ranked(dist, k).tolist() == full[:k].tolist()
    assert _ranked(torch.ones(3) / 3, 0).tolist() == []
