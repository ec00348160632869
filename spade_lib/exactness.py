"""Proof tools for acceptance rules: exact enumeration, Monte-Carlo chi-square checks, a loop reference.

Used by the tests (``tests/test_verify.py``) and by M2's acceptance-math notebook; kept out of the
hot-path module :mod:`spade_lib.verify`. Notation (Leviathan et al. 2023): ``p`` target, ``q`` draft,
``gamma`` draft length.

- :func:`draft_tree` + :func:`block_law_error`: the exact law of the emitted block by enumeration of
  every draft block over a small vocabulary and every acceptance cut (no sampling; fp64);
- :func:`monte_carlo_check` + :func:`chi_square_pvalue`: first and second emitted tokens against
  ``p`` by Pearson chi-square (a stated p-value);
- :data:`MC_CONFIGS` / :func:`warped_pair`: the Monte-Carlo configurations (sampling warpers,
  vocabulary, gamma, seed) the tests and the notebook both check;
- :func:`verify_reference`: Leviathan Alg. 1 as written, row by row (``"exact"`` only).
"""

from __future__ import annotations

import torch

from spade_lib.rules import get_rule
from spade_lib.sampling import SamplingConfig, adjust
from spade_lib.verify import VerifyResult, sample_inverse_cdf, verify

__all__ = ["verify_reference", "draft_tree", "block_law_error", "chi_square_pvalue", "monte_carlo_check",
           "MC_CONFIGS", "warped_pair"]

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
        probe = verify(p, q, x, mode=mode, uniforms=torch.zeros(B, gamma, dtype=p.dtype),
                       next_uniforms=torch.zeros(B, dtype=p.dtype), **mode_options)
        a = probe.accept_prob.double()
        alpha0 = float((q_path.double() * a[:, 0]).sum() / q_path.double().sum())
        below_one = torch.nextafter(torch.ones((), dtype=p.dtype), torch.zeros((), dtype=p.dtype))
        for k in range(gamma + 1):
            u = torch.zeros(B, gamma, dtype=p.dtype)
            weight = q_path.double() * a[:, :k].prod(dim=-1)
            if k < gamma:
                u[:, k] = below_one
                weight = weight * (1 - a[:, k])
            res = verify(p, q, x, mode=mode, uniforms=u, next_uniforms=torch.zeros(B, dtype=p.dtype),
                         **mode_options)
            live = weight > 0
            if not torch.equal(res.n_accepted[live], torch.full_like(res.n_accepted[live], k)):
                raise AssertionError(f"forced uniforms did not produce {k} acceptances")
            add(res, weight)

    reach0 = law[0].sum()
    errors = []
    for j in range(gamma + 1):
        reach = law[j].sum(dim=-1, keepdim=True)
        errors.append(float((law[j] - reach * target[j]).abs().max()))
    return {"max_abs_error": max(errors), "first_token_error": errors[0],
            "total_mass_error": float(abs(reach0 - 1)), "alpha_enumerated": alpha0}


def chi_square_pvalue(tokens: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson chi-square p-value of the samples ``tokens`` against the distribution ``probs [V]``.

    Tokens outside the support of ``probs`` give ``0.0``. Bins with expected count below
    ``min_expected`` are pooled into one (so the chi-square approximation holds).
    """
    from scipy.stats import chisquare

    n = tokens.numel()
    if n == 0:
        raise ValueError("tokens must not be empty")
    probs = probs.double().cpu()
    counts = torch.bincount(tokens.cpu().long(), minlength=probs.numel()).double()
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
