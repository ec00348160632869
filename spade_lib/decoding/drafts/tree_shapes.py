"""The shapes of draft trees: which tokens a drafter puts where, and what a tree is expected to yield.

**Terms** (:func:`spade_lib.verify.verify_tree`'s; ``p`` target, ``q`` draft). A tree has ``N`` *nodes*; node ``i``
carries ``tokens[i]`` and a *parent* ``parents[i]``: ``-1`` for a child of the *root* (the position after the last
committed token), else an earlier node (``parents[i] < i``). *Depth*: 1 for a child of the root; *path*: the tokens
from the root down to the node, itself included (root: ``[]``); *sibling rank*: how many earlier nodes share its
parent. verify_tree judges siblings in index order, so every builder puts first the sibling it trusts most.
**Layout** (every builder): level order, within a depth by parent index, then by the builder's sibling order (for a
Medusa choice list, Medusa's own ``sorted(choices, key=lambda c: (len(c), c))``).
**The draft** is ``dist_fn(paths) -> [n, V]``: for ``n`` paths from the root, the *adjusted* next-token distribution
(after :func:`spade_lib.sampling.adjust`: the ``q`` verify_tree gets), called once per depth with every node expanded
there (one forward per level for a model draft). Medusa: ``dist_fn = lambda paths: heads[[len(x) for x in paths]]``.
Every builder returns a :class:`TreeShape` ``(tokens [N], parents [N], q [N, V] | None, draws, score [N] | None)``:

- :func:`static_tree` / :func:`fill_static`: a Medusa-style choice list (top-k ranks per depth; :data:`MEDUSA_63` is
  ``mc_sim_7b_63``), each token the rank-th most likely at its parent; ``draws="deterministic"``;
- :func:`eagle2_tree` (EAGLE-2, Li et al. 2024): per depth expand the ``top_k`` nodes of highest ``prod q(x_j | x_<j)``
  along the path into ``top_k`` children each, then keep the best ``total_nodes`` (ancestor-closed);
- :func:`sampled_tree` (SpecInfer, Miao et al. 2024): ``widths[d]`` children per depth-``d + 1`` node, i.i.d. from ``q``
  or without replacement (Jeon et al. 2024); :func:`ngram_tree`: prompt lookup, every earlier occurrence of the trailing
  n-gram's continuation merged into a trie;
- :class:`SuffixIndex` (SuffixDecoding, Oliaro et al. 2024): a depth-bounded suffix trie with counts over prompt and
  outputs, updated on commit, proposing a trie scored by continuation frequency;
- :func:`path_probabilities` / :func:`deterministic_accept_prob`: each node's probability of being reached and of being
  on the accepted path, and the expected number of accepted nodes, exactly by recursion (given acceptance per node).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple

import torch

from spade_lib.validate import MAX_GAMMA, check_choice, check_float, check_int, check_prob_tensor, check_token_ids

__all__ = ["TreeShape", "DistFn", "StaticTree", "MEDUSA_63", "MAX_TREE_NODES", "MAX_TREE_CANDIDATES", "check_tree_size",
           "static_tree", "fill_static", "eagle2_tree",
           "sampled_tree", "ngram_tree", "SuffixIndex", "TreeAcceptance", "path_probabilities",
           "deterministic_accept_prob"]

DistFn = Callable[[list[list[int]]], torch.Tensor]  # paths -> [len(paths), V] draft distributions

MAX_TREE_NODES = 1024
"""The most nodes a draft tree may have (a choice list's paths, a sampled tree's nodes, EAGLE-2's kept nodes, a
trie's cap) and the most children per node: verification holds ``[N, N]`` sibling masks and ``N + 1`` target
rows, so a larger tree is refused up front instead of failing on an allocation (the same bound as
:data:`spade_lib.validate.MAX_GAMMA` for a chain)."""
MAX_TREE_CANDIDATES = 64 * MAX_TREE_NODES
"""The most candidates EAGLE-2 may score, ``top_k + (depth - 1) top_k^2`` (:func:`eagle2_tree`)."""


class TreeShape(NamedTuple):
    """A draft tree as plain tensors (see the module docstring for the terms and the layout)."""

    tokens: torch.Tensor               # [N] long: node i's drafted token
    parents: torch.Tensor              # [N] long: -1 (a child of the root) or an earlier node
    q: torch.Tensor | None             # [N, V]: what node i was drawn from at its parent, before any removal; None if deterministic
    draws: str                         # "iid" | "without_replacement" | "deterministic" (spade_lib.rules.DRAWS)
    score: torch.Tensor | None = None  # [N] float64: what the builder ranked the nodes by (see each builder)

    @property
    def n_nodes(self) -> int:
        return self.tokens.numel()

    def depths(self) -> torch.Tensor:
        """``[N]`` long: 1 for a child of the root."""
        d = torch.zeros(self.n_nodes, dtype=torch.long)
        for i, par in enumerate(self.parents.tolist()):
            d[i] = 1 if par < 0 else d[par] + 1
        return d

    def paths(self) -> list[list[int]]:
        """Node ``i``'s path: the tokens from the root down to it, itself included."""
        out: list[list[int]] = []
        for tok, par in zip(self.tokens.tolist(), self.parents.tolist()):
            out.append((out[par] if par >= 0 else []) + [tok])
        return out


def _evaluate(dist_fn: DistFn, paths: list[list[int]], vocab: int | None) -> torch.Tensor:
    """``dist_fn(paths)``, checked: ``[len(paths), V]`` probabilities (``V = vocab`` once known)."""
    out = dist_fn([list(x) for x in paths])
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != len(paths):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"dist_fn: must return a tensor [n={len(paths)}, V] for n paths, got {got}")
    if vocab is not None and out.shape[1] != vocab:
        raise ValueError(f"dist_fn: returned V={out.shape[1]}, earlier calls returned V={vocab}")
    return check_prob_tensor("dist_fn(paths)", out)


def _ranked(dist: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` most likely token ids of ``dist [V]``, most likely first (ties: the lower id first): the
    first ``k`` of a stable descending sort of all ``V``, without sorting all ``V`` (the candidates are
    the tokens at least as likely as the ``k``-th, ties included, in id order; only they are sorted)."""
    k = min(int(k), dist.numel())
    if k <= 0:
        return dist.new_empty(0, dtype=torch.long)
    kth = torch.topk(dist, k).values[-1]
    cand = torch.nonzero(dist >= kth).flatten()  # increasing ids
    return cand[torch.sort(dist[cand], descending=True, stable=True).indices[:k]]


def _assemble(parent: list[int], token: list[int], key: list, keep: Sequence[int], draws: str,
              q_rows: list[torch.Tensor] | None = None, score: list[float] | None = None,
              vocab: int = 0) -> TreeShape:
    """Lay out the nodes ``keep`` (creation ids; ``parent[i]`` a creation id or -1) in level order,
    siblings by ``key``, as a :class:`TreeShape`. ``keep`` must be ancestor-closed. ``q_rows``: one
    ``[V]`` row per creation id (``vocab`` gives the empty tree's ``q`` its shape ``[0, V]``)."""
    children: dict[int, list[int]] = defaultdict(list)
    for i in keep:
        children[parent[i]].append(i)
    order: list[int] = []
    queue = deque(sorted(children[-1], key=lambda i: key[i]))
    while queue:
        i = queue.popleft()
        order.append(i)
        queue.extend(sorted(children[i], key=lambda c: key[c]))
    if len(order) != len(keep):
        raise AssertionError("tree_shapes: a kept node's parent was not kept (please report)")
    new = {old: k for k, old in enumerate(order)}
    tokens = torch.tensor([token[i] for i in order], dtype=torch.long)
    parents = torch.tensor([new[parent[i]] if parent[i] >= 0 else -1 for i in order], dtype=torch.long)
    q = None
    if q_rows is not None:
        q = torch.stack([q_rows[i] for i in order]) if order else torch.zeros(0, vocab)
    s = torch.tensor([score[i] for i in order], dtype=torch.float64) if score is not None else None
    return TreeShape(tokens, parents, q, draws, s)


def check_tree_size(shape: str, *, total_nodes: int | None = None, depth: int | None = None,
                    top_k: int | None = None, widths: Sequence[int] | None = None) -> None:
    """Refuse a tree too large to build (:data:`MAX_TREE_NODES`, :data:`MAX_TREE_CANDIDATES`, a depth of at
    most :data:`spade_lib.validate.MAX_GAMMA`), naming the field and the bound. ``shape``: whose sizes."""
    if total_nodes is not None and total_nodes > MAX_TREE_NODES:
        raise ValueError(f"total_nodes: a {shape} tree has at most {MAX_TREE_NODES} nodes, got {total_nodes}")
    if depth is not None and depth > MAX_GAMMA:
        raise ValueError(f"depth: a {shape} tree is at most {MAX_GAMMA} levels deep (MAX_GAMMA), got {depth}")
    if top_k is not None and top_k > MAX_TREE_NODES:
        raise ValueError(f"top_k: a {shape} tree has at most {MAX_TREE_NODES} children per node, got {top_k}")
    if shape == "eagle2" and top_k is not None and depth is not None:
        candidates = top_k + (depth - 1) * top_k * top_k
        if candidates > MAX_TREE_CANDIDATES:
            raise ValueError(f"top_k: an eagle2 tree scores top_k + (depth - 1) top_k^2 candidates, at most "
                             f"{MAX_TREE_CANDIDATES}; top_k={top_k}, depth={depth} give {candidates}")
    if widths is not None:
        if len(widths) > MAX_GAMMA:
            raise ValueError(f"widths: a {shape} tree is at most {MAX_GAMMA} levels deep (MAX_GAMMA), got "
                             f"{len(widths)} levels")
        nodes, level = 0, 1
        for d, w in enumerate(widths):
            level *= int(w)
            nodes += level
            if nodes > MAX_TREE_NODES:
                raise ValueError(f"widths: a {shape} tree has at most {MAX_TREE_NODES} nodes; "
                                 f"{'-'.join(map(str, widths))} has {nodes} by depth {d + 1}")


# ----------------------------------------------------------------------------------------------
# static trees (Medusa, EAGLE-1)

# Medusa's default sparse tree, ``mc_sim_7b_63`` in FasterDecoding/Medusa ``medusa/model/medusa_choices.py``
# (Cai et al. 2024, Apache-2.0): 63 paths of top-k ranks, depth <= 4, found by simulated acceptance on Vicuna-7B.
MEDUSA_63: list[list[int]] = [
    [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5],
    [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8],
    [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0],
    [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0],
    [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1],
    [9, 0], [0, 6, 0], [0, 0, 0, 1], [1, 6], [0, 7, 0],
]


class StaticTree(NamedTuple):
    """The structure of a choice list, in node order."""

    choices: list[tuple[int, ...]]  # node i's path of top-k ranks (depth = its length)
    parents: torch.Tensor           # [N] long: -1 or an earlier node
    topk_rank: torch.Tensor         # [N] long: node i's token is the topk_rank-th most likely (0 = argmax) at its parent
    depths: torch.Tensor            # [N] long: 1 for a child of the root


def static_tree(choices: Sequence[Sequence[int]]) -> StaticTree:
    """The parent structure of a Medusa-style choice list.

    Each choice is a path of top-k ranks: ``[0, 1]`` is the second most likely token after the most
    likely one. Every proper prefix of a choice must itself be a choice, and no choice may repeat.
    Nodes come in level order, siblings by rank -- Medusa's ``sorted(choices, key=lambda c: (len(c), c))``.
    """
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence):
        raise ValueError(f"choices: must be a list of paths of ranks, got {type(choices).__name__} {choices!r}")
    if not 1 <= len(choices) <= MAX_TREE_NODES:
        raise ValueError(f"choices: must hold 1 to {MAX_TREE_NODES} paths of ranks (the nodes of the tree), "
                         f"got {len(choices)}")
    paths: list[tuple[int, ...]] = []
    for k, c in enumerate(choices):
        if isinstance(c, (str, bytes)) or not isinstance(c, Sequence) or len(c) == 0:
            raise ValueError(f"choices[{k}]: must be a non-empty list of ranks, got {c!r}")
        paths.append(tuple(check_int(f"choices[{k}][{j}]", r, min=0) for j, r in enumerate(c)))
    seen = set(paths)
    if len(seen) != len(paths):
        dup = next(c for c in paths if paths.count(c) > 1)
        raise ValueError(f"choices: {list(dup)} appears more than once")
    for c in paths:
        if len(c) > 1 and c[:-1] not in seen:
            raise ValueError(f"choices: {list(c)} needs its prefix {list(c[:-1])} (every proper prefix must be a choice)")
    paths.sort(key=lambda c: (len(c), c))
    index = {c: i for i, c in enumerate(paths)}
    parents = torch.tensor([index[c[:-1]] if len(c) > 1 else -1 for c in paths], dtype=torch.long)
    rank = torch.tensor([c[-1] for c in paths], dtype=torch.long)
    depths = torch.tensor([len(c) for c in paths], dtype=torch.long)
    return StaticTree(paths, parents, rank, depths)


def fill_static(choices: Sequence[Sequence[int]], dist_fn: DistFn) -> TreeShape:
    """The tokens of a static tree under a draft: node ``i`` gets the ``topk_rank[i]``-th most likely
    token of ``dist_fn`` at its parent's path (ties: the lower token id first).

    One ``dist_fn`` call per depth, with every node of that depth that has children (the root first).
    ``score`` is the cumulative draft probability of the node's path, ``prod_j q(x_j | x_<j)``.
    ``draws="deterministic"``, ``q=None``. EAGLE-1 fills its static tree this way; Medusa's heads are
    the special case of a ``dist_fn`` that reads only ``len(path)`` (module docstring).
    """
    st = static_tree(choices)
    N = len(st.choices)
    parents, rank = st.parents.tolist(), st.topk_rank.tolist()
    tokens = [0] * N
    score = [1.0] * N
    path: dict[int, list[int]] = {-1: []}
    children: dict[int, list[int]] = defaultdict(list)
    for i, par in enumerate(parents):
        children[par].append(i)
    level, vocab = [-1], None
    while level:
        expand = [n for n in level if children[n]]
        if not expand:
            break
        dists = _evaluate(dist_fn, [path[n] for n in expand], vocab)
        vocab = dists.shape[1]
        for n, dist in zip(expand, dists.double()):
            order = _ranked(dist, max(rank[c] for c in children[n]) + 1)
            for c in children[n]:
                if rank[c] >= vocab:
                    raise ValueError(f"choices: rank {rank[c]} of {list(st.choices[c])} needs V > {rank[c]}, got V={vocab}")
                tokens[c] = int(order[rank[c]])
                score[c] = (score[n] if n >= 0 else 1.0) * float(dist[tokens[c]])
                path[c] = path[n] + [tokens[c]]
        level = [c for n in expand for c in children[n]]
    return TreeShape(torch.tensor(tokens, dtype=torch.long), st.parents.clone(), None, "deterministic",
                     torch.tensor(score, dtype=torch.float64))


# ----------------------------------------------------------------------------------------------
# EAGLE-2 dynamic trees


def eagle2_tree(dist_fn: DistFn, *, total_nodes: int = 59, depth: int = 6, top_k: int = 10) -> TreeShape:
    """EAGLE-2's context-aware dynamic draft tree (Li et al. 2024, "EAGLE-2"; ``topK_genrate`` in
    SafeAILab/EAGLE ``eagle/model/cnets.py``).

    With ``k = min(top_k, V)`` and ``c(x_1..x_d) = sum_j log q(x_j | x_<j)`` (the log cumulative draft
    probability of the path):

    1. *expand*: the root's ``k`` most likely children are the depth-1 candidates, and all of them
       are expanded. At each depth ``d = 2 .. depth`` every expanded node of depth ``d - 1`` gets its
       ``k`` most likely children as candidates (``k^2`` of them); the ``k`` candidates of highest
       ``c`` are the ones expanded next (ties: the earlier candidate).
    2. *rerank*: of all ``k + (depth - 1) k^2`` candidates keep the ``total_nodes`` of highest ``c``
       (ties: the shallower, then the earlier). Since ``c`` never increases along a path and a tie
       prefers the shallower node, a kept node's parent is always kept.

    ``dist_fn`` is called ``depth`` times: with ``[[]]``, then with the ``k`` expanded paths of each
    depth. ``score`` = ``exp(c)``, the cumulative draft probability; ``draws="deterministic"``, ``q=None``.

    **Against EAGLE's code.** EAGLE counts the root in ``total_token`` (it keeps ``total_token - 1``
    draft tokens) and runs ``depth`` expansion steps *after* the root's (draft depth ``depth + 1``);
    EAGLE-2's evaluation setting ``--total-token 60 --depth 5 --top-k 10`` is therefore this
    function's default ``total_nodes=59, depth=6, top_k=10``. EAGLE breaks ties with ``torch.topk``
    (unspecified order), so under ties (a draft probability of exactly 1 or 0) it can keep a node
    without its parent; here the tie rules above exclude that. EAGLE lays kept nodes out by candidate
    order; here in level order with siblings by rank (module docstring) -- the same tree. EAGLE ranks
    by the draft's log-softmax of its raw logits whatever the sampling temperature; to match it, pass
    that (temperature-1) distribution as ``dist_fn``.
    """
    total_nodes = check_int("total_nodes", total_nodes, min=0)
    depth = check_int("depth", depth, min=1)
    top_k = check_int("top_k", top_k, min=1)
    check_tree_size("eagle2", total_nodes=total_nodes, depth=depth, top_k=top_k)
    parent: list[int] = []
    token: list[int] = []
    rank: list[int] = []
    node_depth: list[int] = []
    logc: list[float] = []
    path: dict[int, list[int]] = {-1: []}

    def add_children(node: int, dist: torch.Tensor, k: int) -> list[int]:
        order = _ranked(dist, k).tolist()
        base = logc[node] if node >= 0 else 0.0
        ids = []
        for r, t in enumerate(order):
            ids.append(len(parent))
            parent.append(node)
            token.append(t)
            rank.append(r)
            node_depth.append(node_depth[node] + 1 if node >= 0 else 1)
            pt = float(dist[t])
            logc.append(base + (math.log(pt) if pt > 0 else -math.inf))
            path[ids[-1]] = path[node] + [t]
        return ids

    root = _evaluate(dist_fn, [[]], None)
    vocab = root.shape[1]
    k = min(top_k, vocab)
    expanded = add_children(-1, root[0].double(), k)
    for _ in range(2, depth + 1):
        dists = _evaluate(dist_fn, [path[n] for n in expanded], vocab)
        level = [c for n, dist in zip(expanded, dists.double()) for c in add_children(n, dist, k)]
        expanded = sorted(level, key=lambda i: (-logc[i], i))[:k]
    keep = sorted(range(len(parent)), key=lambda i: (-logc[i], node_depth[i], i))[:total_nodes]
    return _assemble(parent, token, rank, keep, "deterministic", score=[math.exp(c) for c in logc])


# ----------------------------------------------------------------------------------------------
# sampled trees (SpecInfer; without replacement: Jeon et al. 2024)


def sampled_tree(dist_fn: DistFn, widths: Sequence[int], *, generator: torch.Generator,
                 draws: str = "iid") -> TreeShape:
    """A tree of drawn children: every node at depth ``d`` (the root at 0) gets ``widths[d]``
    children drawn from ``q = dist_fn(path)`` with ``generator`` (SpecInfer's expansion
    configuration; ``widths = (k,) * depth`` draws ``k`` children at every node).

    - ``draws="iid"``: the children are independent draws from ``q`` (a token may repeat; each copy
      gets its own subtree, and ``dist_fn`` is asked about each copy).
    - ``draws="without_replacement"``: drawn one after another, each from ``q`` with the earlier
      siblings' tokens removed and renormalised; a node whose ``q`` has fewer than ``widths[d]``
      tokens of positive probability gets only those.

    ``q[i]`` is ``q`` at node ``i``'s parent, *before* any removal -- what verify_tree expects for
    both draws (it re-derives the removal). Siblings keep their draw order. One ``dist_fn`` call per
    depth with every node of the previous depth. ``score`` is ``None``.
    """
    draws = check_choice("draws", draws, ("iid", "without_replacement"))
    widths = [check_int(f"widths[{d}]", w, min=1) for d, w in enumerate(widths)]
    check_tree_size("sampled", widths=widths)
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: must be a torch.Generator (seeded), got {type(generator).__name__}")
    parent: list[int] = []
    token: list[int] = []
    order: list[int] = []
    q_rows: list[torch.Tensor] = []
    path: dict[int, list[int]] = {-1: []}
    level, vocab = [-1], None
    for width in widths:
        if not level:
            break
        dists = _evaluate(dist_fn, [path[n] for n in level], vocab)
        vocab = dists.shape[1]
        nxt = []
        for n, dist in zip(level, dists):
            if draws == "iid":
                drawn = torch.multinomial(dist.double(), width, replacement=True, generator=generator).tolist()
            else:
                w, drawn = dist.double().clone(), []
                for _ in range(width):
                    if not bool((w > 0).any()):
                        break
                    t = int(torch.multinomial(w, 1, generator=generator))
                    drawn.append(t)
                    w[t] = 0.0
            for j, t in enumerate(drawn):
                nxt.append(len(parent))
                parent.append(n)
                token.append(t)
                order.append(j)
                q_rows.append(dist)
                path[nxt[-1]] = path[n] + [t]
        level = nxt
    return _assemble(parent, token, order, range(len(parent)), draws, q_rows=q_rows, vocab=vocab or 0)


# ----------------------------------------------------------------------------------------------
# model-free trees: prompt lookup and SuffixDecoding


def _trie_shape(continuations: list[tuple[list[int], int]], max_nodes: int) -> TreeShape:
    """Merge ``(continuation, recency)`` pairs into a trie; node score = the fraction of
    continuations through it; keep the ``max_nodes`` best by (count, recency, shallower)."""
    ids: dict[tuple[int, ...], int] = {}
    parent, token, count, recent, depth = [], [], [], [], []
    for cont, when in continuations:
        up = -1
        for d in range(1, len(cont) + 1):
            key = tuple(cont[:d])
            i = ids.get(key)
            if i is None:
                i = ids[key] = len(parent)
                parent.append(up)
                token.append(cont[d - 1])
                count.append(0)
                recent.append(when)
                depth.append(d)
            count[i] += 1
            recent[i] = max(recent[i], when)
            up = i
    sibling_key = [(-count[i], -recent[i], token[i]) for i in range(len(parent))]
    keep = sorted(range(len(parent)), key=lambda i: (-count[i], -recent[i], depth[i], i))[:max_nodes]
    total = max(len(continuations), 1)
    return _assemble(parent, token, sibling_key, keep, "deterministic", score=[c / total for c in count])


def ngram_tree(context: Sequence[int] | torch.Tensor, max_ngram: int = 3, min_ngram: int = 1,
               max_nodes: int = 59, depth: int = 10) -> TreeShape:
    """Prompt lookup (Saxena 2023) as a tree: for the longest ``n`` in ``[min_ngram, max_ngram]``
    whose trailing n-gram ``context[-n:]`` occurred earlier, *every* earlier occurrence (one with at
    least one token after it) proposes the up to ``depth`` tokens that followed it.

    The continuations merge into a trie: shared prefixes become one path, distinct continuations
    siblings, ordered by frequency (how many continuations pass through), then recency (the latest
    occurrence first). Node score = frequency / number of occurrences (the empirical probability that
    an earlier occurrence continued this way). If the trie exceeds ``max_nodes`` it keeps the best by
    (frequency, recency, shallower), which is ancestor-closed. No match: an empty tree.
    ``draws="deterministic"``, ``q=None``. Defaults: ``max_ngram``/``min_ngram`` those of
    :class:`~spade_lib.decoding.drafts.drafters.NGramDrafter` (the chain drafter, which proposes the latest
    occurrence only), ``depth=10`` prompt lookup's ``num_pred_tokens``, ``max_nodes=59`` the budget
    of :func:`eagle2_tree`. A pure function, ``O(len(context) n)``.
    """
    ctx = check_token_ids("context", context)
    min_ngram = check_int("min_ngram", min_ngram, min=1)
    max_ngram = check_int("max_ngram", max_ngram, min=min_ngram)
    max_nodes = check_int("max_nodes", max_nodes, min=0)
    depth = check_int("depth", depth, min=1)
    L = len(ctx)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        tail = ctx[L - n:]
        starts = [j for j in range(L - n) if ctx[j:j + n] == tail]  # j + n < L: a continuation exists
        if starts:
            return _trie_shape([(ctx[j + n:j + n + depth], j) for j in starts], max_nodes)
    return _trie_shape([], max_nodes)


class _TrieNode:
    __slots__ = ("token", "depth", "count", "last", "children")

    def __init__(self, token: int, depth: int):
        self.token = token
        self.depth = depth
        self.count = 0  # occurrences of this node's string (suffix starts passing through or ending here)
        self.last = -1  # the latest start stamp among those occurrences (recency)
        self.children: dict[int, _TrieNode] = {}


class SuffixIndex:
    """A SuffixDecoding drafter core (Oliaro et al. 2024; ArcticInference's ``SuffixTree``): every
    substring of up to ``max_depth`` tokens of the stored sequences, in a trie with counts.

    ``count(w)`` is the number of occurrences of the string ``w`` (``len(w) <= max_depth``) in the
    stored sequences; occurrences never cross from one sequence into another. :meth:`extend` appends
    committed tokens to a sequence (the prompt, then the output as it is accepted; earlier outputs
    under their own ids), in ``O(max_depth)`` per token: the trie nodes of the sequence's current
    suffixes are kept and each is extended by the new token.

    :meth:`speculate` (ArcticInference's ``speculate`` with ``use_tree_spec``): for each match length
    ``m = 1, 2, ...`` while the context's last ``m`` tokens ``w`` occur, grow a candidate trie below
    ``w`` best-first by the empirical continuation probability ``P(c | w) = count(w c) / count(w)``
    (a product of ``count(child) / count(node)`` along the path), children below ``min_token_prob``
    not grown, up to ``min(max_nodes, floor(m max_spec_factor + max_spec_offset))`` nodes; the draft
    whose summed probability (its expected accepted length under ``P``) is largest wins (ties: the
    longer match). Tie-breaks within a draft: the more recent occurrence, then the lower token id.

    **Simplifications.** An uncompressed trie bounded at ``max_depth`` (ArcticInference compresses
    unary chains into segments: the same counts, less memory); no removal of sequences; one index
    (SuffixDecoding keeps a global tree of earlier outputs and a per-request tree and takes the better
    draft -- two :class:`SuffixIndex` objects do that). As in ArcticInference, ``count(w)`` includes
    the context's own trailing occurrence when the context is stored, which has no continuation yet.
    Defaults: ``max_depth=24``, ``max_spec_factor=1``, ``max_spec_offset=0``, ``min_token_prob=0.1``
    (vLLM's / ArcticInference's), ``max_nodes=59`` (:func:`eagle2_tree`'s budget).
    """

    def __init__(self, max_depth: int = 24):
        self.max_depth = check_int("max_depth", max_depth, min=1)
        self._root = _TrieNode(-1, 0)
        self._seqs: dict[Hashable, list[int]] = {}
        self._active: dict[Hashable, list[tuple[_TrieNode, int]]] = {}  # (node of a current suffix, its start stamp)
        self._clock = 0  # one stamp per appended token, across sequences

    def extend(self, seq_id: Hashable, tokens: Sequence[int] | torch.Tensor) -> None:
        """Append ``tokens`` to the sequence ``seq_id`` (a new sequence if unseen)."""
        for t in check_token_ids("tokens", tokens):
            self._append(seq_id, t)

    def _append(self, seq_id: Hashable, t: int) -> None:
        self._seqs.setdefault(seq_id, []).append(t)
        stamp = self._clock
        self._clock += 1
        self._root.count += 1
        grown = []
        for node, start in [(self._root, stamp)] + self._active.get(seq_id, []):
            child = node.children.get(t)
            if child is None:
                child = node.children[t] = _TrieNode(t, node.depth + 1)
            child.count += 1
            child.last = max(child.last, start)
            if child.depth < self.max_depth:
                grown.append((child, start))
        self._active[seq_id] = grown

    def sequence(self, seq_id: Hashable) -> list[int]:
        """The tokens stored under ``seq_id`` (a copy)."""
        return list(self._seqs[seq_id])

    def _find(self, pattern: Sequence[int]) -> _TrieNode | None:
        node = self._root
        for t in pattern:
            node = node.children.get(t)
            if node is None:
                return None
        return node

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` in the stored sequences (``len(pattern) <= max_depth``; ``[]``:
        the number of stored tokens)."""
        pattern = check_token_ids("pattern", pattern)
        if len(pattern) > self.max_depth:
            raise ValueError(f"pattern: at most max_depth={self.max_depth} tokens, got {len(pattern)}")
        node = self._find(pattern)
        return 0 if node is None else node.count

    def speculate(self, context: Sequence[int] | torch.Tensor, *, max_nodes: int = 59,
                  max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
                  min_token_prob: float = 0.1) -> TreeShape:
        """The candidate trie for ``context`` (see the class docstring); ``score`` = ``P(path | w)``,
        ``draws="deterministic"``, ``q=None``. An empty tree when nothing matches."""
        ctx = check_token_ids("context", context)
        max_nodes = check_int("max_nodes", max_nodes, min=0)
        max_spec_factor = check_float("max_spec_factor", max_spec_factor, min=0.0)
        max_spec_offset = check_float("max_spec_offset", max_spec_offset)
        min_token_prob = check_float("min_token_prob", min_token_prob, min=0.0, max=1.0)
        best: tuple[float, list] | None = None
        for m in range(1, min(len(ctx), self.max_depth) + 1):
            node = self._find(ctx[len(ctx) - m:])
            if node is None:
                break
            budget = max(0, min(max_nodes, int(m * max_spec_factor + max_spec_offset + 1e-6)))
            draft = self._grow(node, budget, min_token_prob)
            total = sum(prob for _, _, prob, _ in draft)
            if best is None or total >= best[0]:
                best = (total, draft)
        draft = best[1] if best is not None else []
        parent = [par for par, _, _, _ in draft]
        token = [tok for _, tok, _, _ in draft]
        key = [(-prob, -last, tok) for _, tok, prob, last in draft]
        return _assemble(parent, token, key, range(len(draft)), "deterministic",
                         score=[prob for _, _, prob, _ in draft])

    @staticmethod
    def _grow(node: _TrieNode, budget: int, min_token_prob: float) -> list[tuple[int, int, float, int]]:
        """Best-first below ``node``: ``(parent id, token, P, recency)`` per drafted node, in the order
        drafted (``P`` and recency never increase along a path, so this is the global order)."""
        out: list[tuple[int, int, float, int]] = []
        heap: list = []
        tick = 0

        def push(below: _TrieNode, prob: float, par: int) -> None:
            nonlocal tick
            for child in below.children.values():
                pc = prob * child.count / below.count
                if pc >= min_token_prob:
                    heapq.heappush(heap, (-pc, -child.last, child.token, tick, child, par))
                    tick += 1

        push(node, 1.0, -1)
        while heap and len(out) < budget:
            neg_p, neg_last, tok, _, child, par = heapq.heappop(heap)
            out.append((par, tok, -neg_p, -neg_last))
            push(child, -neg_p, len(out) - 1)
        return out


# ----------------------------------------------------------------------------------------------
# tree statistics


class TreeAcceptance(NamedTuple):
    """Where the accepted path goes, exactly (see :func:`path_probabilities`)."""

    reach: torch.Tensor              # [..., N]: P(node i is judged): its parent on the path, every earlier sibling rejected
    on_path: torch.Tensor            # [..., N]: P(node i is accepted), i.e. on the path
    ends: torch.Tensor               # [..., N+1]: P(the path ends at the root (slot 0) / at node i (slot i+1))
    expected_accepted: torch.Tensor  # [...]: E[accepted nodes] = sum_i on_path[i] (+1 for the emitted token)


def path_probabilities(parents: torch.Tensor, accept_prob: torch.Tensor) -> TreeAcceptance:
    """Each node's probability of being on the accepted path, by recursion over the tree.

    ``accept_prob [..., N]``: ``a_i``, the probability that node ``i`` is accepted *when judged* --
    a number fixed by the tree, ``p`` and ``q`` (verify_tree's ``accept_prob``; for deterministic
    children under the exact rule, :func:`deterministic_accept_prob`). Then, with the acceptance
    draws independent (verify_tree's ``u_i``), siblings judged in index order and slot ``s`` the
    root (0) or node ``s - 1``::

        reach_i   = P(parent on path) prod_{earlier siblings j} (1 - a_j)
        on_path_i = reach_i a_i,     ends_s = P(s on path) - sum_{children c of s} on_path_c

    computed in one pass over the nodes (``ends_s`` is what is left of ``s``'s mass after its
    children took theirs). ``parents`` is ``[N]`` or ``[..., N]``; ``a_i`` may be NaN where
    ``reach_i = 0`` (verify_tree's unreached nodes).
    """
    a = accept_prob.double()
    if a.ndim < 1:
        raise ValueError(f"accept_prob: must have shape [..., N], got {tuple(a.shape)}")
    par = parents.to(torch.long).expand(a.shape)
    N = a.shape[-1]
    if N and (bool((par < -1).any()) or bool((par >= torch.arange(N)).any())):
        raise ValueError("parents: each must be -1 or an earlier node")
    open_ = torch.zeros(*a.shape[:-1], N + 1, dtype=torch.float64)
    open_[..., 0] = 1.0
    reach = torch.zeros_like(a)
    on_path = torch.zeros_like(a)
    for i in range(N):
        slot = (par[..., i] + 1).unsqueeze(-1)
        r = open_.gather(-1, slot).squeeze(-1)
        on = torch.where(r > 0, r * a[..., i], torch.zeros_like(r))
        reach[..., i] = r
        on_path[..., i] = on
        open_.scatter_add_(-1, slot, -on.unsqueeze(-1))
        open_[..., i + 1] = on
    return TreeAcceptance(reach, on_path, open_, on_path.sum(-1))


def deterministic_accept_prob(p: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """``a_i = r_i(x_i)`` for deterministic children under the exact rule (verify_tree's ``"exact"``
    or ``"eagle"`` with ``draws="deterministic"``): ``r_i`` is the target at the parent, ``p[..., s]``
    (``s = parents[i] + 1``), with every earlier sibling's token removed one at a time
    (``r(x_j) <- 0``, renormalise; a removal that would leave no mass keeps ``r``, as verify_tree
    does). Shapes: ``p [..., N+1, V]``, ``tokens`` and ``parents`` ``[N]`` or ``[..., N]``; returns
    ``[..., N]`` float64.
    """
    if p.ndim < 2:
        raise ValueError(f"p: must have shape [..., N+1, V], got {tuple(p.shape)}")
    r = p.double().clone()
    N = r.shape[-2] - 1
    tok = tokens.to(torch.long).expand(*r.shape[:-2], N)
    par = parents.to(torch.long).expand(*r.shape[:-2], N)
    a = torch.zeros(*r.shape[:-2], N, dtype=torch.float64)
    V = r.shape[-1]
    for i in range(N):
        slot = (par[..., i] + 1)[..., None, None].expand(*r.shape[:-2], 1, V)
        r_s = r.gather(-2, slot).squeeze(-2)                    # [..., V]
        x = tok[..., i : i + 1]
        a[..., i] = r_s.gather(-1, x).squeeze(-1)
        w = r_s.scatter(-1, x, 0.0)
        mass = w.sum(-1, keepdim=True)
        r_new = torch.where(mass > 0, w / mass.clamp(min=torch.finfo(torch.float64).tiny), r_s)
        r.scatter_(-2, slot, r_new.unsqueeze(-2))
    return a
