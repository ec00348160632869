"""Proof tools for acceptance rules: exact enumeration, Monte-Carlo chi-square checks, a loop reference.

Used by the tests (``tests/test_verify.py``) and by M2's acceptance-math notebook; kept out of the hot-path module
:mod:`spade_lib.verify`. Notation (Leviathan et al. 2023): ``p`` target, ``q`` draft, ``gamma`` draft length.

- :func:`draft_tree` + :func:`block_law_error`: the exact law of the emitted block by enumeration of every draft block
  over a small vocabulary and every acceptance cut (no sampling; fp64); :func:`proposal_law_error` the same for any law
  of proposals (a cross-vocabulary draft's re-encoded blocks), both on :func:`forced_cuts` (every cut of a verification
  with its exact probability); :func:`draft_text_law` the exact law of the text a draft writes, over every tokenization
  of it (the reference for SLRS's law over target tokens);
- :func:`monte_carlo_check` + :func:`chi_square_pvalue`: first and second emitted tokens against ``p`` by Pearson
  chi-square (a stated p-value);
- :data:`MC_CONFIGS` / :func:`warped_pair`: the Monte-Carlo configurations (sampling warpers, vocabulary, gamma, seed)
  the tests and the notebook both check;
- :func:`verify_reference`: Leviathan Alg. 1 as written, row by row (``"exact"`` only).

Draft trees (:func:`spade_lib.verify.verify_tree`, tests in ``tests/test_verify_tree.py``):

- :func:`tree_case` + :func:`tree_law_error`: every assignment of sibling tokens of a small tree with its probability
  under ``draws`` (iid, without replacement, deterministic top-k), every accept/reject pattern, the exact law of each
  emitted token level against ``p`` (fp64);
- :func:`tree_monte_carlo_check`: trees drawn by :func:`sample_tree`, verified by the real vectorised ``verify_tree``,
  first and second emitted tokens chi-square-tested against ``p``;
- :func:`verify_tree_reference`: the walk written from the definitions, row by row, node by node (with ``"eagle"``
  ported from EAGLE's ``evaluate_posterior``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spade_lib.rules import DRAWS, get_rule, get_tree_rule
from spade_lib.sampling import SamplingConfig, adjust
from spade_lib.validate import check_choice
from spade_lib.verify import VerifyResult, sample_inverse_cdf, verify, verify_tree

__all__ = ["verify_reference", "draft_tree", "block_law_error", "forced_cuts", "proposal_law_error", "draft_text_law", "chi_square_pvalue", "monte_carlo_check",
           "MC_CONFIGS", "warped_pair", "TREE_KINDS", "tree_tables", "prefix_ids", "TreeCase", "tree_case",
           "tree_law_error", "sample_tree", "tree_monte_carlo_check", "verify_tree_reference", "BLOCK_KINDS",
           "EXACTNESS_COLUMNS", "exactness_table", "overlap_pair", "simulated_tokens"]

MC_CONFIGS: list[tuple[float, int, float, int, int, int]] = [  # (temperature, top_k, top_p, vocab, gamma, seed)
    (1.0, 0, 1.0, 12, 3, 0),
    (0.7, 0, 1.0, 12, 3, 1),
    (1.3, 0, 1.0, 16, 2, 2),
    (1.0, 5, 1.0, 12, 3, 3),
    (1.0, 0, 0.8, 12, 3, 4),
    (0.8, 6, 0.9, 20, 4, 5),
    (0.5, 3, 1.0, 10, 2, 6),
    (1.5, 8, 0.95, 24, 3, 7),
    (1.0, 0, 0.5, 16, 3, 20),
    (0.9, 10, 0.7, 32, 2, 9),
    (2.0, 0, 1.0, 8, 5, 10),
    (0.6, 4, 0.6, 12, 3, 17),
]


def warped_pair(temperature: float, top_k: int, top_p: float, vocab: int, gamma: int, seed: int,
                noise: float = 0.8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(p [gamma+1, V], q [gamma, V], z_q)``: target and draft logits (the draft a noisy copy,
    ``z_q`` its raw logits), warped by the same :class:`~spade_lib.sampling.SamplingConfig`."""
    gen = torch.Generator().manual_seed(1000 + seed)
    z_p = 2.0 * torch.randn(gamma + 1, vocab, generator=gen, dtype=torch.float64)
    z_q = z_p[:gamma] + noise * torch.randn(gamma, vocab, generator=gen, dtype=torch.float64)
    cfg = SamplingConfig(temperature, top_k, top_p)
    return adjust(z_p, cfg, torch.float64), adjust(z_q, cfg, torch.float64), z_q


def verify_reference(
    p: torch.Tensor,
    q: torch.Tensor,
    draft_tokens: torch.Tensor,
    uniforms: torch.Tensor,
    next_uniforms: torch.Tensor,
) -> tuple[list[int], list[int]]:
    """Plain per-row, per-position ``"exact"`` verification (Leviathan Alg. 1 as written).

    The reference :func:`verify` is tested against and benchmarked against: Python loops over rows
    and positions, Python floats for the acceptance test, one residual per row. Returns
    ``(n_accepted, next_token)`` as lists.
    """
    B, gamma = draft_tokens.shape
    n_accepted, next_token = [], []
    for b in range(B):
        n = 0
        for i in range(gamma):
            x = int(draft_tokens[b, i])
            p_x, q_x = float(p[b, i, x]), float(q[b, i, x])
            a = min(1.0, p_x / q_x) if q_x > 0 else float(p_x > 0)
            if not float(uniforms[b, i]) < a:
                break
            n += 1
        if n == gamma:
            weights = p[b, gamma]
        else:
            weights = torch.clamp(p[b, n] - q[b, n], min=0.0)
            if not float(weights.sum()) > 0:
                weights = p[b, n]
        n_accepted.append(n)
        next_token.append(int(sample_inverse_cdf(weights, next_uniforms[b])))
    return n_accepted, next_token


def draft_tree(
    vocab: int,
    gamma: int,
    kind: str = "random",
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every draft block over a small vocabulary, with context-dependent ``p`` and ``q``.

    Returns ``(p [N, gamma+1, V], q [N, gamma, V], draft_tokens [N, gamma])`` for the ``N = V^gamma``
    blocks in lexicographic order, where ``p[b, i]`` and ``q[b, i]`` depend only on the block's
    prefix ``x_<i`` (as an autoregressive model's would). ``kind``: ``"random"`` (Dirichlet-like
    random rows), ``"disjoint"`` (``p`` and ``q`` on disjoint supports, alpha = 0), ``"identical"``
    (``p = q``), ``"one_hot"`` (both one-hot, often at different tokens), ``"q_zeros"`` (``q`` is 0
    on half of the tokens where ``p`` is positive).
    """
    kinds = ("random", "disjoint", "identical", "one_hot", "q_zeros")
    if kind not in kinds:
        raise ValueError(f"kind must be one of {kinds}, got {kind!r}")
    if vocab < 2 or gamma < 1:
        raise ValueError(f"need vocab >= 2 and gamma >= 1, got vocab={vocab}, gamma={gamma}")
    gen = torch.Generator().manual_seed(seed)
    n_prefixes = sum(vocab ** i for i in range(gamma + 1))  # one row per prefix of length 0..gamma

    def rows(support: torch.Tensor | None = None) -> torch.Tensor:
        w = -torch.log(torch.rand(n_prefixes, vocab, generator=gen, dtype=torch.float64))  # Exp(1)
        w = w ** 2  # peakier than uniform Dirichlet
        if support is not None:
            w = w * support
        return w / w.sum(-1, keepdim=True)

    if kind == "random":
        p_rows, q_rows = rows(), rows()
    elif kind == "identical":
        p_rows = rows()
        q_rows = p_rows.clone()
    elif kind == "disjoint":
        half = torch.arange(vocab) < vocab // 2
        p_rows, q_rows = rows(half.double()), rows((~half).double())
    elif kind == "one_hot":
        p_rows = torch.nn.functional.one_hot(torch.randint(vocab, (n_prefixes,), generator=gen), vocab).double()
        q_rows = torch.nn.functional.one_hot(torch.randint(vocab, (n_prefixes,), generator=gen), vocab).double()
    else:  # q_zeros
        p_rows = rows()
        q_rows = rows((torch.arange(vocab) % 2 == 0).double())

    blocks = torch.cartesian_prod(*[torch.arange(vocab)] * gamma).reshape(-1, gamma)
    # prefix id of x_<i: offset of length-i prefixes + the base-V number x_0 .. x_{i-1}
    ids = torch.zeros(blocks.shape[0], gamma + 1, dtype=torch.long)
    offset, number = 0, torch.zeros(blocks.shape[0], dtype=torch.long)
    for i in range(gamma + 1):
        ids[:, i] = offset + number
        offset += vocab ** i
        if i < gamma:
            number = number * vocab + blocks[:, i]
    return p_rows[ids].to(dtype), q_rows[ids[:, :gamma]].to(dtype), blocks


def block_law_error(
    p: torch.Tensor,
    q: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    mode: str = "exact",
    **mode_options: float,
) -> dict[str, float]:
    """Exact law of the emitted block versus the target's, by enumeration (no sampling).

    Input is a full :func:`draft_tree`: every draft block once. Each block has probability
    ``prod_i q_i(x_i)``; for each cut ``k`` (number accepted) :func:`verify` is run with uniforms
    that force that outcome, and the path gets probability ``prod_{i<k} a_i * (1 - a_k)`` from the
    verifier's own ``accept_prob``; the next token follows the verifier's own ``next_dist``.
    Deterministic modes are run once per block. The emitted tokens ``Y_0, Y_1, ...`` must satisfy,
    for every ``j`` and prefix ``y_<j``:
    ``P(Y_<j = y_<j, n >= j, Y_j = y) = P(Y_<j = y_<j, n >= j) * p_j(y | y_<j)``.

    Returns ``{"max_abs_error": ..., "first_token_error": ..., "total_mass_error": ...,
    "alpha_enumerated": ...}`` (the last: mean accepted fraction at position 0).
    """
    rule = get_rule(mode)
    if rule.samples_target:
        raise ValueError(f"mode {mode!r} draws its own target samples; check it by Monte-Carlo")
    B, gamma = draft_tokens.shape
    V = p.shape[-1]
    x = draft_tokens.long()
    q_path = q.gather(-1, x.unsqueeze(-1)).squeeze(-1).prod(dim=-1)
    keep = q_path > 0
    p, q, x, q_path = p[keep], q[keep], x[keep], q_path[keep]
    B = x.shape[0]

    # prefix ids (base-V numbers of x_<j) for every level j
    pid = torch.zeros(B, gamma + 1, dtype=torch.long)
    for j in range(1, gamma + 1):
        pid[:, j] = pid[:, j - 1] * V + x[:, j - 1]
    law = [torch.zeros(V ** j, V, dtype=torch.float64) for j in range(gamma + 1)]
    target = [torch.zeros(V ** j, V, dtype=torch.float64) for j in range(gamma + 1)]
    for j in range(gamma + 1):
        target[j][pid[:, j]] = p[:, j].double()

    def add(result: VerifyResult, weight: torch.Tensor) -> None:
        n, live = result.n_accepted, weight > 0
        for j in range(gamma + 1):
            if j < gamma:  # accepted draft tokens are emitted as they are
                acc = live & (n > j)
                law[j].index_put_((pid[acc, j], x[acc, j]), weight[acc], accumulate=True)
            here = live & (n == j)  # the first rejection (or the bonus) emits from next_dist
            law[j].index_add_(0, pid[here, j], weight[here, None] * result.next_dist[here].double())

    if rule.deterministic:
        res = verify(p, q, x, mode=mode, **mode_options)
        add(res, q_path.double())
        alpha0 = float((q_path.double() * res.accepted[:, 0].double()).sum() / q_path.double().sum())
    else:
        for k, res, weight in forced_cuts(p, q, x, q_path.double(), mode=mode, **mode_options):
            add(res, weight)
            if k == 0:  # the mass rejected at position 0 is sum_b w_b (1 - a_0)
                alpha0 = 1.0 - float(weight.sum() / q_path.double().sum())

    reach0 = law[0].sum()
    errors = []
    for j in range(gamma + 1):
        reach = law[j].sum(dim=-1, keepdim=True)
        errors.append(float((law[j] - reach * target[j]).abs().max()))
    return {"max_abs_error": max(errors), "first_token_error": errors[0],
            "total_mass_error": float(abs(reach0 - 1)), "alpha_enumerated": alpha0}


def forced_cuts(p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor, weights: torch.Tensor | None = None,
                *, mode: str = "exact", **mode_options: float):
    """Every outcome of verifying the blocks ``draft_tokens [B, g]`` under a sampling rule, with its exact
    probability: yields ``(k, result, weight)`` for ``k = 0 .. g``, where :func:`verify` ran with uniforms
    that force ``k`` acceptances (``u_k`` just below 1, the others 0) and ``weight [B] = weights * prod_{i<k}
    a_i * (1 - a_k)`` (no last factor at ``k = g``), ``a`` the rule's own ``accept_prob``. A block whose weight
    is positive must have accepted exactly ``k`` (an ``AssertionError`` otherwise). The one enumeration of
    verification cuts behind :func:`block_law_error` and :func:`proposal_law_error`."""
    B, g = draft_tokens.shape
    zero_u, zero_next = torch.zeros(B, g, dtype=p.dtype), torch.zeros(B, dtype=p.dtype)
    a = verify(p, q, draft_tokens, mode=mode, uniforms=zero_u, next_uniforms=zero_next,
               **mode_options).accept_prob.double()
    w0 = torch.ones(B, dtype=torch.float64) if weights is None else weights.double()
    below_one = torch.nextafter(torch.ones((), dtype=p.dtype), torch.zeros((), dtype=p.dtype))
    for k in range(g + 1):
        u = zero_u.clone()
        weight = w0 * a[:, :k].prod(dim=-1)
        if k < g:
            u[:, k] = below_one
            weight = weight * (1 - a[:, k])
        res = verify(p, q, draft_tokens, mode=mode, uniforms=u, next_uniforms=zero_next, **mode_options)
        live = weight > 0
        if not torch.equal(res.n_accepted[live], torch.full_like(res.n_accepted[live], k)):
            raise AssertionError(f"forced uniforms did not produce {k} acceptances")
        yield k, res, weight


def proposal_law_error(proposals: list[tuple[int, ...]], weights: list[float], p_of, *, mode: str = "one_hot_q",
                       q_of=None) -> float:
    """How far one verification step of a *random* proposal is from the target's law, exactly (fp64).

    ``proposals[k]`` (target ids, possibly empty) is proposed with probability ``weights[k]``;
    ``p_of(prefix) -> [V]`` is the target's distribution after the committed text and ``prefix`` (a
    tuple). Each block is verified by :func:`spade_lib.verify.verify` under ``mode`` at every cut
    (:func:`forced_cuts`): the path has probability ``w_k prod_{i<n} a_i (1 - a_n)`` and emits ``x_<n`` then
    a token from the verifier's ``next_dist``; an empty block is a plain target step (``Y_0 ~ p``).
    ``q_of(k) -> [g, V]`` is the ``q`` the rule is told (default ``one_hot(x)``, the deterministic proposal:
    a cross-vocabulary draft's re-encoded text, ``spade_lib.decoding.drafts.crossvocab``). Returns
    ``max_y |P(Y_<j = y, Y_j = .) - P(Y_<j = y, Y_j emitted) p(. | y)|`` over every emitted prefix ``y``
    (``Y_j`` emitted: the step reached position ``j``): 0 exactly when every emitted token follows ``p``.
    """
    if len(proposals) != len(weights) or not proposals:
        raise ValueError(f"weights: need one weight per proposal, got {len(weights)} for {len(proposals)}")
    law: dict[tuple[int, ...], torch.Tensor] = {}

    def add(prefix: tuple[int, ...], mass: torch.Tensor) -> None:
        law[prefix] = law.get(prefix, 0) + mass

    for k, (x, w) in enumerate(zip(proposals, weights)):
        x = tuple(int(t) for t in x)
        if w <= 0:
            continue
        if not x:
            add((), w * p_of(()).double())
            continue
        g = len(x)
        p = torch.stack([p_of(x[:i]).double() for i in range(g + 1)])[None]       # [1, g+1, V]
        xt = torch.tensor([x])
        q = torch.zeros(1, g, p.shape[-1], dtype=torch.float64).scatter_(-1, xt[..., None], 1.0) \
            if q_of is None else q_of(k).double()[None]                          # [1, g, V]
        for n, res, weight in forced_cuts(p, q, xt, torch.tensor([float(w)], dtype=torch.float64), mode=mode):
            if float(weight[0]) <= 0:
                continue
            for j in range(n):
                add(x[:j], weight[0] * torch.nn.functional.one_hot(torch.tensor(x[j]), p.shape[-1]).double())
            add(x[:n], weight[0] * res.next_dist[0].double())
    return max(float((m - m.sum() * p_of(y).double()).abs().max()) for y, m in law.items())


def draft_text_law(draft_strings, next_law, n_tokens: int) -> dict[str, float]:
    """The exact law of the text a draft writes in ``n_tokens`` draws, by enumerating every sequence of its
    ids (fp64): ``{text: probability}``, summed over every sequence (every tokenization) spelling it.

    ``draft_strings[d]``: the text of draft id ``d``, ``None`` where it is not text (the text ends there and
    nothing more is drawn); ``next_law(prefix) -> [Vd]``: the draft's distribution after the ids ``prefix``
    (a tuple). Knows nothing of any target vocabulary: the reference that a cross-vocabulary rule's law over
    target tokens is checked against (:func:`spade_lib.decoding.drafts.crossvocab.slrs_law`). ``Vd ** n_tokens`` leaves."""
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
        raise ValueError(f"n_tokens: must be an int >= 1, got {n_tokens!r}")
    law: dict[str, float] = {}

    def grow(prefix: tuple[int, ...], text: str, w: float) -> None:
        if len(prefix) == n_tokens:
            law[text] = law.get(text, 0.0) + w
            return
        r = next_law(prefix).double()
        r = r / r.sum()
        for d, rd in enumerate(r.tolist()):
            if rd <= 0:
                continue
            if draft_strings[d] is None:
                law[text] = law.get(text, 0.0) + w * rd
            else:
                grow(prefix + (d,), text + draft_strings[d], w * rd)

    grow((), "", 1.0)
    return law


def counts_chi_square_pvalue(counts, probs, min_expected: float = 5.0) -> float:
    """Pearson chi-square p-value of observed ``counts [K]`` (a tensor or array) against the
    distribution ``probs [K]``.

    Counts in a cell of probability 0 give ``0.0``. Cells with expected count below ``min_expected`` are
    pooled into one (so the chi-square approximation holds).
    """
    from scipy.stats import chisquare

    counts = torch.as_tensor(counts).double().cpu()
    probs = torch.as_tensor(probs).double().cpu()
    n = float(counts.sum())
    if n == 0:
        raise ValueError("counts: no samples")
    if counts[probs <= 0].sum() > 0:
        return 0.0
    expected = probs * n
    big = expected >= min_expected
    obs = counts[big].tolist()
    exp = expected[big].tolist()
    small_exp = float(expected[~big & (probs > 0)].sum())
    if small_exp > 0:
        obs.append(float(counts[~big & (probs > 0)].sum()))
        exp.append(small_exp)
    if len(obs) < 2:
        return 1.0
    scale = sum(obs) / sum(exp)  # remove float round-off in the totals
    return float(chisquare(obs, [e * scale for e in exp]).pvalue)


def chi_square_pvalue(tokens: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson chi-square p-value of the samples ``tokens`` against the distribution ``probs [V]``
    (:func:`counts_chi_square_pvalue` of their counts)."""
    if tokens.numel() == 0:
        raise ValueError("tokens must not be empty")
    counts = torch.bincount(tokens.cpu().long(), minlength=int(probs.numel()))
    return counts_chi_square_pvalue(counts, probs, min_expected)


@torch.no_grad()
def sequence_law(model, prompt: list[int], sampling, n_tokens: int) -> torch.Tensor:
    """The exact law of the first ``n_tokens`` tokens of plain sampling from ``model`` after ``prompt``
    (each ``~ adjust(logits, sampling)``), by enumeration: ``P(t)`` for every ``t`` in ``V^n``, row-major
    (``t_0`` most significant), ``[V ** n]`` float64. The reference a sampled decoder's output
    frequencies are tested against (``V ** n`` forwards of batch 1 .. ``V ** (n-1)``: tiny models only)."""
    from spade_lib.sampling import adjust

    probs = torch.ones(1, dtype=torch.float64)
    seqs = torch.tensor([list(prompt)])
    for _ in range(n_tokens):
        p = adjust(model(seqs).logits[:, -1], sampling, dtype=torch.float64)
        V = p.shape[-1]
        probs = (probs[:, None] * p).flatten()
        seqs = torch.cat([seqs.repeat_interleave(V, 0), torch.arange(V).repeat(len(seqs))[:, None]], 1)
    return probs


def monte_carlo_check(
    p: torch.Tensor,
    q: torch.Tensor,
    *,
    q_draft: torch.Tensor | None = None,
    n: int = 20_000,
    mode: str = "exact",
    seed: int = 0,
    **mode_options: float,
) -> dict[str, float]:
    """Sample ``n`` blocks with drafts from ``q_draft`` (default ``q``), verify, chi-square-test.

    ``p [gamma+1, V]`` and ``q [gamma, V]`` are fixed per position. Tests the first emitted token
    against ``p[0]`` and, among blocks that accepted position 0, the second emitted token against
    ``p[1]``. A ``q_draft`` different from the ``q`` given to the verifier models a sampler bug
    (drafts drawn from another distribution than the verifier assumes) and should be detected.
    Returns ``{"p_first", "p_second", "n_second", "alpha_hat"}``.
    """
    if p.ndim != 2 or q.ndim != 2 or p.shape[0] != q.shape[0] + 1 or p.shape[1] != q.shape[1]:
        raise ValueError(f"p must be [gamma+1, V] and q [gamma, V], got {tuple(p.shape)} and {tuple(q.shape)}")
    gamma, V = q.shape
    q_draft = q if q_draft is None else q_draft
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.stack([torch.multinomial(q_draft[i], n, replacement=True, generator=gen)
                          for i in range(gamma)], dim=1)
    res = verify(p.expand(n, -1, -1), q.expand(n, -1, -1), drafts, mode=mode, generator=gen,
                 validate=False, **mode_options)
    first = torch.where(res.n_accepted > 0, drafts[:, 0], res.next_token)
    went_on = res.n_accepted > 0
    if gamma > 1:
        second = torch.where(res.n_accepted[went_on] > 1, drafts[went_on, 1], res.next_token[went_on])
    else:
        second = res.next_token[went_on]
    p_second = chi_square_pvalue(second, p[1]) if second.numel() else float("nan")
    return {"p_first": chi_square_pvalue(first, p[0]), "p_second": p_second,
            "n_second": int(second.numel()), "alpha_hat": float(res.accepted[:, 0].double().mean())}


# ----------------------------------------------------------------------------------------------
# draft trees: enumeration of every sibling assignment, Monte-Carlo through the real verify_tree

TREE_KINDS: tuple[str, ...] = ("random", "identical", "q_zeros", "greedy_target")


def _depths(parents: list[int]) -> list[int]:
    depth = []
    for i, a in enumerate(parents):
        if not -1 <= a < i:
            raise ValueError(f"parents: parents[{i}] must be -1 or an earlier node in [0, {i}), got {a}")
        depth.append(1 if a < 0 else depth[a] + 1)
    return depth


def tree_tables(parents: list[int], vocab: int, kind: str = "random", *, seed: int = 0,
                dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """``(p_table, q_table)``, each ``[n_prefixes, V]``: the target and the draft after every prefix
    of length ``0 .. D`` (``D`` the tree's depth), as an autoregressive pair's would be.

    Prefix ids: the prefix ``(y_0 .. y_{k-1})`` has id ``sum_{i<k} V^i + (y_0 .. y_{k-1} in base V)``
    (:func:`prefix_ids`). ``kind``: ``"random"`` (peaky random ``p``, ``q = norm(p * noise)``),
    ``"identical"`` (``p = q``), ``"q_zeros"`` (``q(0) = 0 < p(0)``), ``"greedy_target"`` (``p``
    one-hot, ``q`` half ``p``, half random).
    """
    if kind not in TREE_KINDS:
        raise ValueError(f"kind: must be one of {list(TREE_KINDS)}, got {kind!r}")
    if vocab < 2:
        raise ValueError(f"vocab: must be >= 2, got {vocab}")
    D = max(_depths(parents), default=0)
    n = sum(vocab ** k for k in range(D + 1))
    gen = torch.Generator().manual_seed(seed)

    def rows() -> torch.Tensor:
        w = (-torch.log(torch.rand(n, vocab, generator=gen, dtype=torch.float64))) ** 2
        return w / w.sum(-1, keepdim=True)

    p_rows = rows()
    q_rows = p_rows * rows()  # correlated with p (so that paths are accepted), any ratio q/p
    q_rows = q_rows / q_rows.sum(-1, keepdim=True)
    if kind == "identical":
        q_rows = p_rows.clone()
    elif kind == "q_zeros":
        q_rows[:, 0] = 0.0
        q_rows = q_rows / q_rows.sum(-1, keepdim=True)
    elif kind == "greedy_target":  # q leans towards p's token, so that paths are accepted
        p_rows = torch.nn.functional.one_hot(torch.randint(vocab, (n,), generator=gen), vocab).double()
        q_rows = 0.5 * p_rows + 0.5 * q_rows
    return p_rows.to(dtype), q_rows.to(dtype)


def prefix_ids(tokens: torch.Tensor, parents: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[M, N]``: the prefix id (see :func:`tree_tables`) of the path root -> node ``i`` (inclusive)."""
    M, N = tokens.shape
    ids = torch.zeros(M, N, dtype=torch.long)
    number = torch.zeros(M, N, dtype=torch.long)
    offset = torch.zeros(M, N, dtype=torch.long)   # sum_{i<k} V^i for the node's prefix length k
    for i in range(N):
        a = parents[:, i]
        up = a.clamp(min=0)
        root = a < 0
        base_num = torch.where(root, 0, number.gather(1, up[:, None]).squeeze(1))
        base_off = torch.where(root, 0, offset.gather(1, up[:, None]).squeeze(1))
        depth_pow = torch.where(root, 1, (base_off * (vocab - 1) + 1))  # V^k from offset (V^k - 1)/(V - 1)
        number[:, i] = base_num * vocab + tokens[:, i]
        offset[:, i] = base_off + depth_pow
        ids[:, i] = offset[:, i] + number[:, i]
    return ids


@dataclass
class TreeCase:
    """Every sibling assignment of one tree shape, with its probability under ``draws``."""

    p: torch.Tensor          # [M, N+1, V]: target at the root and after each node
    q: torch.Tensor          # [M, N, V]: the parent's draft distribution (before any removal)
    tokens: torch.Tensor     # [M, N] long
    parents: torch.Tensor    # [M, N] long (the same shape in every row)
    weight: torch.Tensor     # [M] float64: P(assignment) under draws (sums to 1)
    p_table: torch.Tensor    # [n_prefixes, V]: the target after each prefix
    draws: str


def _draw_prob(q_rows: torch.Tensor, x: torch.Tensor, removed: torch.Tensor | None) -> torch.Tensor:
    if removed is None:
        return q_rows.gather(-1, x[:, None]).squeeze(-1)
    kept = q_rows.masked_fill(removed, 0.0)
    mass = kept.sum(-1)
    px = kept.gather(-1, x[:, None]).squeeze(-1)
    return torch.where(mass > 0, px / mass.clamp(min=1e-300), torch.zeros_like(px))


def tree_case(parents: list[int], vocab: int, draws: str, kind: str = "random", *, seed: int = 0,
              tokens: list[int] | None = None) -> TreeCase:
    """Enumerate every assignment of tokens to the nodes of the tree ``parents`` (a list, ``-1`` for a
    child of the root) with its probability: the children of a node with prefix ``s`` are drawn from
    ``q(. | s)`` -- ``"iid"``: independently (``V^N`` assignments); ``"without_replacement"``: in
    order, each from ``q`` without the earlier siblings' tokens, renormalised; ``"deterministic"``:
    one assignment, the ``tokens`` given, else each node's token is the ``(sibling rank)``-th most
    likely token of ``q(. | s)`` (top-k children; ties to the lower index). Zero-probability
    assignments are dropped."""
    draws = check_choice("draws", draws, DRAWS)
    p_table, q_table = tree_tables(parents, vocab, kind, seed=seed)
    N = len(parents)
    par1 = torch.tensor(parents, dtype=torch.long)
    rank = [sum(parents[j] == parents[i] for j in range(i)) for i in range(N)]
    if draws == "deterministic":
        if tokens is None:
            tok = torch.zeros(1, N, dtype=torch.long)
            for i in range(N):
                pid_par = 0 if parents[i] < 0 else int(prefix_ids(tok, par1[None], vocab)[0, parents[i]])
                order = torch.sort(q_table[pid_par], descending=True, stable=True).indices
                tok[0, i] = order[rank[i]]
        else:
            if len(tokens) != N:
                raise ValueError(f"tokens: must have one token per node ({N}), got {len(tokens)}")
            tok = torch.tensor([tokens], dtype=torch.long)
    else:
        if tokens is not None:
            raise ValueError("tokens: only for draws='deterministic' (sampled draws are enumerated)")
        tok = torch.cartesian_prod(*[torch.arange(vocab)] * N).reshape(-1, N) if N else torch.zeros(1, 0).long()
    M = tok.shape[0]
    par = par1.expand(M, N)
    pid = prefix_ids(tok, par, vocab)
    pid_parent = torch.where(par >= 0, pid.gather(1, par.clamp(min=0)), 0)
    p = torch.cat([p_table[torch.zeros(M, 1, dtype=torch.long)], p_table[pid]], dim=1)
    q = q_table[pid_parent]
    weight = torch.ones(M, dtype=torch.float64)
    if draws != "deterministic":
        for i in range(N):
            removed = None
            if draws == "without_replacement":
                removed = torch.zeros(M, vocab, dtype=torch.bool)
                for j in range(i):
                    if parents[j] == parents[i]:
                        removed[torch.arange(M), tok[:, j]] = True
            weight = weight * _draw_prob(q[:, i].double(), tok[:, i], removed)
    keep = weight > 0
    return TreeCase(p[keep], q[keep], tok[keep], par[keep], weight[keep], p_table, draws)


def tree_law_error(case: TreeCase, mode: str = "exact", *, draws: str | None = None,
                   **mode_options: float) -> dict[str, float]:
    """Exact law of the tokens one :func:`verify_tree` step emits, versus the target's (no sampling).

    Every assignment of ``case`` is verified under every accept/reject pattern: node ``i``'s uniform
    is ``0`` (accept iff ``a > 0``) or just below 1 (reject iff ``a < 1``). A pattern counts only if
    every node the walk did not reach has uniform 0 (so each walk is counted once), with weight
    ``P(assignment) * prod_{reached} (a if accepted else 1 - a)`` from the verifier's own
    ``accept_prob``; the emitted next token follows the verifier's own ``next_dist``. ``draws``
    (default ``case.draws``) is what the verifier is *told*: a value other than the one the case was
    drawn with models a caller's mistake. The emitted tokens ``Y_0, Y_1, ...`` must satisfy, for every
    level ``j`` and prefix ``y_<j``: ``P(Y_<j = y_<j, n >= j, Y_j = y) = P(Y_<j = y_<j, n >= j) p(y | y_<j)``.

    Returns ``{"max_abs_error", "tv_first", "tv_max", "total_mass_error", "mean_accepted",
    "reach_deepest"}`` (the last: ``P(n >= D)``, that the deepest level was reached at all):
    ``tv_first = TV(law of Y_0, p(. | root))``; ``tv_max`` the largest over levels ``j`` of
    ``1/2 sum_{y_<j, y} |P(Y_<j = y_<j, n >= j, Y_j = y) - P(Y_<j = y_<j, n >= j) p(y | y_<j)|``.
    """
    rule = get_tree_rule(mode).chain_rule
    draws = case.draws if draws is None else draws
    M, N = case.tokens.shape
    V = case.p.shape[-1]
    if rule.deterministic or N == 0:
        bits = torch.zeros(1, N, dtype=torch.bool)
    else:
        bits = torch.cartesian_prod(*[torch.tensor([False, True])] * N).reshape(-1, N)
    P = bits.shape[0]
    rep = torch.arange(M).repeat_interleave(P)
    b = bits.repeat(M, 1)
    below_one = torch.nextafter(torch.ones((), dtype=case.p.dtype), torch.zeros((), dtype=case.p.dtype))
    u = None if rule.deterministic else torch.where(b, below_one, torch.zeros((), dtype=case.p.dtype))
    res = verify_tree(case.p[rep], case.q[rep], case.tokens[rep], case.parents[rep], mode=mode, draws=draws,
                      uniforms=u, next_uniforms=torch.zeros(M * P, dtype=case.p.dtype), validate=False,
                      **mode_options)
    a = res.accept_prob.double()
    if rule.deterministic:
        factor = torch.ones(M * P, dtype=torch.float64)
        canonical = torch.ones(M * P, dtype=torch.bool)
    else:
        factor = torch.where(res.reached, torch.where(b, 1 - a, a), torch.ones_like(a)).prod(-1)
        canonical = ~(b & ~res.reached).any(-1)
    weight = case.weight[rep] * factor * canonical
    live = weight > 0
    if not rule.deterministic and bool((res.accepted != (res.reached & ~b))[live].any()):
        raise AssertionError("forced uniforms did not produce the pattern's decisions")

    pid = prefix_ids(case.tokens[rep], case.parents[rep], V)
    D = int(res.depth.max()) + 1 if N else 0  # levels of the tree (depth is 0 at the root's children)
    n = res.n_accepted
    law = [torch.zeros(case.p_table.shape[0], V, dtype=torch.float64) for _ in range(D + 1)]
    rows = torch.arange(M * P)
    for j in range(D + 1):
        if j == 0:
            prefix = torch.zeros(M * P, dtype=torch.long)
        else:
            prefix = pid[rows, res.path[:, j - 1].clamp(min=0)]
        if j < N:  # accepted nodes at level j are emitted as they are
            acc = live & (n > j)
            node = res.path[acc, j]
            law[j].index_put_((prefix[acc], case.tokens[rep][acc, node]), weight[acc], accumulate=True)
        here = live & (n == j)
        law[j].index_add_(0, prefix[here], weight[here, None] * res.next_dist[here].double())
    errors, tvs = [], []
    for j in range(D + 1):
        reach = law[j].sum(-1, keepdim=True)
        diff = law[j] - reach * case.p_table.double()
        errors.append(float(diff.abs().max()))
        tvs.append(0.5 * float(diff.abs().sum()))
    return {"max_abs_error": max(errors), "tv_first": tvs[0], "tv_max": max(tvs),
            "total_mass_error": abs(float(law[0].sum()) - 1.0),
            "mean_accepted": float((weight * n.double()).sum()),
            "reach_deepest": float(law[D].sum()) if D else 1.0}


def sample_tree(parents: list[int], q_table: torch.Tensor, draws: str, n: int,
                generator: torch.Generator) -> torch.Tensor:
    """``tokens [n, N]``: ``n`` draft trees of shape ``parents`` drawn from ``q_table`` (prefix ids as
    :func:`tree_tables`) under ``draws`` -- the children of a node one at a time, in index order."""
    N, V = len(parents), q_table.shape[-1]
    par = torch.tensor(parents, dtype=torch.long).expand(n, N)
    tok = torch.zeros(n, N, dtype=torch.long)
    rows = torch.arange(n)
    for i in range(N):
        pid_par = torch.zeros(n, dtype=torch.long) if parents[i] < 0 else prefix_ids(tok, par, V)[:, parents[i]]
        w = q_table[pid_par].double()
        earlier = [j for j in range(i) if parents[j] == parents[i]]
        if draws == "deterministic":
            tok[:, i] = torch.sort(w, descending=True, stable=True).indices[:, len(earlier)]
            continue
        if draws == "without_replacement":
            for j in earlier:
                w[rows, tok[:, j]] = 0.0
        tok[:, i] = torch.multinomial(w, 1, generator=generator).squeeze(-1)
    return tok


def _grouped_chi_square_pvalue(groups: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor,
                               min_expected: float = 5.0) -> float:
    """Pearson chi-square p-value that, within each group ``g``, ``tokens`` follow ``probs[g]``
    (statistics and degrees of freedom summed over groups; bins with expected count below
    ``min_expected`` pooled per group; a token outside its group's support gives ``0.0``)."""
    from scipy.stats import chi2

    stat, dof = 0.0, 0
    for g in groups.unique().tolist():
        t = tokens[groups == g]
        pr = probs[g].double()
        counts = torch.bincount(t, minlength=pr.numel()).double()
        if counts[pr <= 0].sum() > 0:
            return 0.0
        expected = pr * t.numel()
        big = expected >= min_expected
        obs, exp = counts[big].tolist(), expected[big].tolist()
        small = ~big & (pr > 0)
        if float(expected[small].sum()) > 0:
            obs.append(float(counts[small].sum()))
            exp.append(float(expected[small].sum()))
        if len(obs) < 2:
            continue
        stat += sum((o - e) ** 2 / e for o, e in zip(obs, exp))
        dof += len(obs) - 1
    return 1.0 if dof == 0 else float(chi2.sf(stat, dof))


def tree_monte_carlo_check(parents: list[int], vocab: int, draws: str, kind: str = "random", *,
                           mode: str = "exact", verify_draws: str | None = None, n: int = 20_000,
                           seed: int = 0, **mode_options: float) -> dict[str, float]:
    """Draw ``n`` trees under ``draws`` (:func:`sample_tree`), verify them with the real, vectorised
    :func:`verify_tree` (told ``verify_draws``, default ``draws``), chi-square-test the emitted tokens.

    Returns ``{"p_first", "p_second", "n_second", "mean_accepted"}``: the p-value of the first
    emitted token against ``p(. | root)``, and of the second (over the steps that accepted a node)
    against ``p(. | y_0)`` within each first token ``y_0`` (:func:`_grouped_chi_square_pvalue`).
    """
    p_table, q_table = tree_tables(parents, vocab, kind, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    tok = sample_tree(parents, q_table, draws, n, gen)
    N = len(parents)
    par = torch.tensor(parents, dtype=torch.long).expand(n, N)
    pid = prefix_ids(tok, par, vocab)
    pid_parent = torch.where(par >= 0, pid.gather(1, par.clamp(min=0)), 0)
    p = torch.cat([p_table[torch.zeros(n, 1, dtype=torch.long)], p_table[pid]], dim=1)
    res = verify_tree(p, q_table[pid_parent], tok, par, mode=mode, draws=verify_draws or draws, generator=gen,
                      validate=False, **mode_options)
    rows = torch.arange(n)
    first_node = res.path[:, 0].clamp(min=0)
    went_on = res.n_accepted > 0
    first = torch.where(went_on, tok[rows, first_node], res.next_token)
    second_node = res.path[:, 1].clamp(min=0) if N > 1 else first_node
    second = torch.where(res.n_accepted > 1, tok[rows, second_node], res.next_token)[went_on]
    y0_prefix = pid[rows, first_node][went_on]
    p_second = _grouped_chi_square_pvalue(y0_prefix, second, p_table) if second.numel() else float("nan")
    return {"p_first": chi_square_pvalue(first, p_table[0]), "p_second": p_second,
            "n_second": int(second.numel()), "mean_accepted": float(res.n_accepted.double().mean())}


def verify_tree_reference(
    p: torch.Tensor,
    q: torch.Tensor | None,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    uniforms: torch.Tensor,
    next_uniforms: torch.Tensor,
    *,
    mode: str = "exact",
    draws: str = "iid",
    eps: float = 0.09,
    delta: float = 0.3,
) -> tuple[list[list[int]], list[int]]:
    """Plain per-row, per-node tree verification, written from the definitions (Python floats).

    The reference :func:`verify_tree` is tested against: ``"exact"`` (recursive rejection sampling with
    the draw distribution of each sibling), ``"greedy"``, ``"typical"``, and ``"eagle"`` ported from
    EAGLE's ``evaluate_posterior`` (sampling branch: a repeated sibling token is skipped, ``qx = 1``,
    a rejected token's ``p`` is set to 0 and renormalised). Returns ``(paths, next_tokens)``.
    """
    import math

    B, N = tokens.shape
    V = p.shape[-1]
    paths, next_tokens = [], []
    for b in range(B):
        r = [float(v) for v in p[b, 0]]
        cur, path, tried = -1, [], []  # tried: tokens of the current node's children judged so far
        for i in range(N):
            if int(parents[b, i]) != cur:
                continue
            x = int(tokens[b, i])
            q_c = None
            if mode == "eagle":
                if x in tried:  # EAGLE: `if xi in candidates_set: continue`
                    continue
                ok = float(uniforms[b, i]) < r[x]
            elif mode == "exact":
                if draws == "deterministic":
                    q_c = [float(v == x) for v in range(V)]
                else:
                    q_c = [float(w) for w in q[b, i]]
                    if draws == "without_replacement":
                        q_c = [0.0 if v in tried else w for v, w in enumerate(q_c)]
                        total = sum(q_c)
                        q_c = [w / total for w in q_c]
                a = min(1.0, r[x] / q_c[x]) if q_c[x] > 0 else float(r[x] > 0)
                ok = float(uniforms[b, i]) < a
            elif mode == "greedy":
                ok = x == r.index(max(r))
            elif mode == "typical":
                h = -sum(v * math.log(v) for v in r if v > 0)
                ok = r[x] > min(eps, delta * math.exp(-h))
            else:
                raise ValueError(f"mode: the reference knows exact, eagle, greedy, typical; got {mode!r}")
            tried.append(x)
            if ok:
                path.append(i)
                cur, tried = i, []
                r = [float(v) for v in p[b, i + 1]]
                continue
            if mode == "eagle":
                r[x] = 0.0
                total = sum(r)
                r = [v / total for v in r] if total > 0 else r
            elif mode == "exact":
                w = [max(0.0, rv - qv) for rv, qv in zip(r, q_c)]
                total = sum(w)
                r = [v / total for v in w] if total > 0 else r
        paths.append(path)
        if mode == "greedy":
            next_tokens.append(r.index(max(r)))
        else:
            next_tokens.append(int(sample_inverse_cdf(torch.tensor(r, dtype=torch.float64), next_uniforms[b])))
    return paths, next_tokens


# ----------------------------------------------------------------------------------------------
# the tables notebook 02 shows: every rule's exactness, and E[tokens] simulated through verify

BLOCK_KINDS: tuple[str, ...] = ("random", "disjoint", "identical", "one_hot", "q_zeros")  # draft_tree's kinds
EXACTNESS_COLUMNS = ["check", "configuration", "mode", "lossless", "alpha", "max abs error", "chi2 p (1st)",
                     "chi2 p (2nd)"]


def exactness_table(vocab: int, gamma: int, mc_samples: int, seed: int = 0):
    """Every registered acceptance rule against the target's law, one row per check (:data:`EXACTNESS_COLUMNS`).

    - ``check == "enumeration"``: :func:`block_law_error` on every :func:`draft_tree` kind
      (:data:`BLOCK_KINDS`, ``vocab``, ``gamma``, ``seed``) for each rule of :func:`spade_lib.rules.rule_names`
      with its default options -- except a rule that draws its own target samples (``samples_target``: checked
      by Monte-Carlo only) and ``greedy``, exact for a one-hot target only (so enumerated on ``one_hot`` alone);
      ``max abs error`` is the largest ``|P(Y_j = y | prefix) - p_j(y | prefix)|``, ``alpha`` the enumerated rate.
    - ``check == "monte carlo"``: :func:`monte_carlo_check` with ``mc_samples`` blocks on each configuration of
      :data:`MC_CONFIGS` (its seed shifted by ``1000 * seed``) for ``exact``, and every third for ``one_hot_q``
      and ``sample_match``; then the sampler bug (drafts from the raw draft distribution, the verifier told the
      warped one; ``lossless`` False: it must fail) and the lossy ``typical`` and ``lenience=0.5`` rules;
      ``chi2 p (1st)`` / ``(2nd)`` are the first and second emitted tokens' p-values, ``alpha`` the estimate.

    ``lossless`` comes from the rule registry (:func:`spade_lib.rules.lossless_map`). A pandas ``DataFrame``."""
    import pandas as pd

    from spade_lib.rules import lossless_map, rule_names

    for name, v, low in (("vocab", vocab, 2), ("gamma", gamma, 1), ("mc_samples", mc_samples, 1), ("seed", seed, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name}: must be an integer >= {low}, got {v!r}")
    lossless = lossless_map()
    rows = []
    for kind in BLOCK_KINDS:
        p_t, q_t, x_t = draft_tree(vocab, gamma, kind, seed=seed)
        for mode in rule_names():
            rule = get_rule(mode)
            opts = rule.defaults
            if rule.samples_target or (mode == "greedy" and kind != "one_hot"):
                continue
            err = block_law_error(p_t, q_t, x_t, mode=mode, **opts)
            rows.append({"check": "enumeration", "configuration": f"{kind} tree, V={vocab}, gamma={gamma}",
                         "mode": " ".join([mode, *(f"{k}={v:g}" for k, v in opts.items())]),
                         "lossless": lossless[mode], "alpha": err["alpha_enumerated"],
                         "max abs error": err["max_abs_error"], "chi2 p (1st)": float("nan"),
                         "chi2 p (2nd)": float("nan")})

    def mc_row(label, mode, p_, q_, **kwargs):
        r = monte_carlo_check(p_, q_, n=mc_samples, mode=mode, seed=seed, **kwargs)
        return {"check": "monte carlo", "configuration": label, "mode": mode, "lossless": lossless[mode],
                "alpha": r["alpha_hat"], "max abs error": float("nan"), "chi2 p (1st)": r["p_first"],
                "chi2 p (2nd)": r["p_second"]}

    for i, (T, k, tp, V, g, off) in enumerate(MC_CONFIGS):
        p_m, q_m, _ = warped_pair(T, k, tp, V, g, off + 1000 * seed)
        label = f"T={T}, top_k={k}, top_p={tp}, V={V}, gamma={g}"
        rows.append(mc_row(label, "exact", p_m, q_m))
        if i % 3 == 0:
            rows.append(mc_row(label, "one_hot_q", p_m, q_m))
            rows.append(mc_row(label, "sample_match", p_m, q_m))
    p_m, q_m, z_q = warped_pair(*MC_CONFIGS[1][:5], MC_CONFIGS[1][5] + 1000 * seed)
    wrong = mc_row(f"drafts from raw q, verifier told warped q (T={MC_CONFIGS[1][0]:g})", "exact", p_m, q_m,
                   q_draft=adjust(z_q, SamplingConfig(), torch.float64))
    rows.append({**wrong, "lossless": False})
    p_m, q_m, _ = warped_pair(*MC_CONFIGS[0][:5], MC_CONFIGS[0][5] + 1000 * seed)
    label = f"T={MC_CONFIGS[0][0]}, V={MC_CONFIGS[0][3]}, gamma={MC_CONFIGS[0][4]}"
    rows.append(mc_row(label, "typical", p_m, q_m))
    rows.append(mc_row(label, "lenience", p_m, q_m, lenience=0.5))
    return pd.DataFrame(rows, columns=EXACTNESS_COLUMNS)


def overlap_pair(alpha: float, gamma: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``p = (alpha, 1 - alpha, 0)`` and ``q = (alpha, 0, 1 - alpha)`` at every position of ``n`` blocks:
    ``sum_x min(p(x), q(x)) = alpha`` exactly (fp64). Returns ``(p [n, gamma+1, 3], q [n, gamma, 3])``."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha: must lie in [0, 1], got {alpha!r}")
    p = torch.tensor([alpha, 1 - alpha, 0.0], dtype=torch.float64).expand(n, gamma + 1, 3)
    q = torch.tensor([alpha, 0.0, 1 - alpha], dtype=torch.float64).expand(n, gamma, 3)
    return p, q


def simulated_tokens(alphas, gammas, n: int, seed: int = 0):
    """Leviathan Eq. 1 against simulation through :func:`spade_lib.verify.verify`: for each ``alpha`` and
    ``gamma`` (in that order, one generator seeded with ``seed`` for all), ``n`` steps on :func:`overlap_pair`
    (drafts drawn from ``q``), ``tokens = n_accepted + 1`` per step. Returns a ``DataFrame`` with ``alpha,
    gamma, simulated`` (mean tokens), ``std err``, ``closed form`` (:func:`spade_lib.theory.expected_tokens`)
    and ``z = (simulated - closed form) / std err``."""
    import pandas as pd

    from spade_lib.theory import expected_tokens

    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n: must be an integer >= 2 (a standard error needs two steps), got {n!r}")
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for a in alphas:
        for g in gammas:
            p_s, q_s = overlap_pair(a, g, n)
            drafts = torch.multinomial(q_s[0, 0], n * g, replacement=True, generator=gen).view(n, g)
            res = verify(p_s, q_s, drafts, generator=gen, validate=False)
            tokens = (res.n_accepted + 1).double()
            rows.append({"alpha": a, "gamma": g, "simulated": tokens.mean().item(),
                         "std err": (tokens.std() / n ** 0.5).item(), "closed form": expected_tokens(a, g)})
    table = pd.DataFrame(rows)
    table["z"] = (table["simulated"] - table["closed form"]) / table["std err"]
    return table
