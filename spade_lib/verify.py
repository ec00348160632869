"""Batched speculative verification: decide which drafted tokens to keep and what token comes next.

Notation (Leviathan et al. 2023): for each of ``B`` rows the draft proposed ``gamma`` tokens
``x_0 .. x_{gamma-1}``; ``q[b, i]`` is the (adjusted) draft distribution ``x_i`` was drawn from,
``p[b, i]`` the (adjusted) target distribution at the same position and ``p[b, gamma]`` the target's
distribution after the whole block (the bonus position). Shapes: ``p [B, gamma+1, V]``,
``q [B, gamma, V]``, ``draft_tokens [B, gamma]``.

Exact speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023), mode ``"exact"``:

- accept ``x_i`` with probability ``a_i = min(1, p_i(x_i) / q_i(x_i))``: draw ``u_i ~ U[0, 1)`` and
  accept iff ``u_i < a_i``; keep the accepted *prefix* (everything before the first rejection);
- at the first rejection ``n`` emit ``t ~ norm(max(0, p_n - q_n))`` (the residual); when all
  ``gamma`` are accepted emit the bonus ``t ~ p_gamma``.

Then every emitted token is distributed exactly as the target's: ``P(emit y at i | reached i) =
q_i(y) a_i(y) + (1 - alpha_i) r_i(y) = min(p_i, q_i)(y) + max(0, p_i - q_i)(y) = p_i(y)``.

Modes (``lossless`` = the emitted tokens follow ``p`` exactly, whatever ``q`` the drafts came from;
``lossy`` = they do not, by design):

========================  ========  ===================================================================
mode                      kind      acceptance at position i; token at the first rejection
========================  ========  ===================================================================
``"exact"``               lossless  ``u < min(1, p(x)/q(x))``; residual ``norm(max(0, p - q))``
``"greedy"``              lossless  ``x == argmax p`` (no randomness); ``argmax p``. Lossless for
                          (greedy)  greedy decoding of the target (``p`` one-hot), i.e. argmax-prefix
                                    matching
``"one_hot_q"``           lossless  draft treated as deterministic (vLLM V1's ngram/EAGLE greedy-draft
                                    path): ``u < p(x)``; residual ``norm(p`` with ``x`` removed``)``.
                                    Exact for any draft; acceptance ``sum p q <= sum min(p, q)``
``"sample_match"``        lossless  sample ``y ~ p`` by inverse CDF with ``u``; accept iff ``y == x``;
                                    emit ``y``. Same law as ``one_hot_q``, different randomness
``"typical"``             lossy     Medusa's typical acceptance (Cai et al. 2024):
                                    ``p(x) > min(eps, delta * exp(-H(p)))`` (deterministic);
                                    ``t ~ p`` (no residual). Options ``eps=0.09, delta=0.3``
``"lenience"``            lossy     Leviathan et al. App. A.5: ``u < min(1, p(x) / (l q(x)))`` with
                                    lenience ``l`` in (0, 1]; residual ``norm(max(0, p - l q))``.
                                    ``l = 1`` is ``"exact"``. Option ``lenience=0.5``
========================  ========  ===================================================================

Randomness and replay: acceptance uniforms (``B * gamma`` of them, drawn for every position whether
or not it is reached, so the stream never depends on the outcome) come from ``generator``; the
next-token draw (one uniform per row, inverse-CDF sampling by :func:`sample_inverse_cdf`) comes from
``residual_generator`` (default: ``generator``). Both are returned; passing them back as
``uniforms=`` / ``next_uniforms=`` reproduces the decision bit for bit. Deterministic modes record
NaN uniforms.

Everything is vectorised over ``B`` and ``gamma``; only the ``gamma`` drafted probabilities and one
``V``-row per batch row (the rejection or bonus position) are read, so with ``validate=False`` the
cost is ``O(B * (gamma + V))`` (``sample_match`` samples the target at every position: ``O(B * gamma * V)``).
``validate=True`` (default) adds two reads of ``p`` and ``q`` (row sums and the minimum).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .measures import entropy
from .validate import check_float

MODES: tuple[str, ...] = ("exact", "greedy", "sample_match", "one_hot_q", "typical", "lenience")
LOSSLESS: dict[str, bool] = {
    "exact": True, "greedy": True, "sample_match": True, "one_hot_q": True,
    "typical": False, "lenience": False,
}
DETERMINISTIC_MODES = frozenset({"greedy", "typical"})
_MODE_DEFAULTS: dict[str, dict[str, float]] = {
    "exact": {}, "greedy": {}, "sample_match": {}, "one_hot_q": {},
    "typical": {"eps": 0.09, "delta": 0.3},  # Medusa's posterior_threshold and posterior_alpha
    "lenience": {"lenience": 0.5},
}


@dataclass
class VerifyResult:
    """Outcome of one batched verification step (shapes for ``B`` rows and draft length ``gamma``)."""

    n_accepted: torch.Tensor    # [B] long: accepted draft tokens (length of the accepted prefix)
    next_token: torch.Tensor    # [B] long: residual sample at the first rejection, or the bonus
    accept_prob: torch.Tensor   # [B, gamma]: probability position i would be accepted if reached
    uniforms: torch.Tensor      # [B, gamma]: acceptance draws used (NaN for deterministic modes)
    accepted: torch.Tensor      # [B, gamma] bool: prefix-accepted (reached and accepted)
    reached: torch.Tensor       # [B, gamma] bool: all earlier positions accepted, so i was judged
    p_x: torch.Tensor           # [B, gamma]: p_i(x_i)
    q_x: torch.Tensor           # [B, gamma]: q_i(x_i)
    next_uniforms: torch.Tensor  # [B]: the uniform of the next-token draw (NaN for greedy)
    next_dist: torch.Tensor     # [B, V]: the distribution next_token was drawn from
    mode: str

    @property
    def gamma(self) -> int:
        return self.accepted.shape[1]

    @property
    def all_accepted(self) -> torch.Tensor:
        """[B] bool: the whole block was accepted and ``next_token`` is the bonus token."""
        return self.n_accepted == self.gamma

    def emitted(self, draft_tokens: torch.Tensor) -> list[list[int]]:
        """Per row, the tokens this step appends: the accepted prefix then ``next_token``."""
        n = self.n_accepted.tolist()
        nxt = self.next_token.tolist()
        rows = draft_tokens.tolist()
        return [rows[b][: n[b]] + [nxt[b]] for b in range(len(n))]


# ----------------------------------------------------------------------------------------------
# validation


def _mode_options(mode: str, options: dict) -> dict[str, float]:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    allowed = _MODE_DEFAULTS[mode]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"mode {mode!r} takes options {sorted(allowed) or 'none'}, got unknown {unknown}")
    merged = {**allowed, **options}
    for name, value in merged.items():
        check_float(name, value)  # a finite number, never NaN
    if mode == "lenience":
        check_float("lenience", merged["lenience"], min=0.0, max=1.0, min_open=True)
    if mode == "typical":
        check_float("eps", merged["eps"], min=0.0, min_open=True)
        check_float("delta", merged["delta"], min=0.0, min_open=True)
    return merged


def _check_shapes(p, q, draft_tokens) -> tuple[int, int, int]:
    for name, t in (("p", p), ("q", q)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point torch.Tensor")
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.is_floating_point() \
            or draft_tokens.is_complex() or draft_tokens.dtype == torch.bool:
        raise ValueError("draft_tokens must be an integer torch.Tensor")
    if draft_tokens.ndim != 2:
        raise ValueError(f"draft_tokens must have shape [B, gamma], got {tuple(draft_tokens.shape)}")
    B, gamma = draft_tokens.shape
    if gamma < 1:
        raise ValueError(f"draft_tokens: gamma must be >= 1, got shape {tuple(draft_tokens.shape)}")
    if p.ndim != 3 or q.ndim != 3:
        raise ValueError(f"p and q must be 3-D ([B, gamma+1, V] and [B, gamma, V]), got "
                         f"{tuple(p.shape)} and {tuple(q.shape)}")
    V = p.shape[-1]
    if tuple(p.shape[:2]) != (B, gamma + 1):
        raise ValueError(f"p must have shape [B, gamma+1, V] = [{B}, {gamma + 1}, V], got {tuple(p.shape)}")
    if tuple(q.shape[:2]) != (B, gamma):
        raise ValueError(f"q must have shape [B, gamma, V] = [{B}, {gamma}, V], got {tuple(q.shape)}")
    if q.shape[-1] != V:
        raise ValueError(f"vocabulary mismatch: p has V={V}, q has V={q.shape[-1]}")
    if V < 1:
        raise ValueError("p: vocabulary size V must be >= 1")
    if p.dtype != q.dtype:
        raise ValueError(f"p and q must have the same dtype, got {p.dtype} and {q.dtype}")
    return B, gamma, V


def _check_distribution(name: str, t: torch.Tensor, sum_tol: float) -> None:
    sums = t.sum(dim=-1)  # NaN or inf anywhere in a row makes its sum non-finite
    if not torch.isfinite(sums).all():
        what = "NaN" if torch.isnan(t).any() else "inf"
        raise ValueError(f"{name} contains {what}")
    if t.numel() and t.amin() < 0:
        raise ValueError(f"{name} has negative entries (min {t.amin().item():.3g})")
    err = (sums - 1).abs()
    if err.numel() and err.max() > sum_tol:
        worst = int(err.argmax())
        raise ValueError(f"{name} rows must sum to 1 (tolerance {sum_tol:g}); a row sums to "
                         f"{sums.flatten()[worst].item():.6g}")


def _check_uniforms(name: str, u: torch.Tensor, shape: tuple[int, ...], allow_nan: bool = True) -> None:
    if not isinstance(u, torch.Tensor) or not u.is_floating_point():
        raise ValueError(f"{name} must be a floating-point torch.Tensor")
    if tuple(u.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {tuple(u.shape)}")
    if not allow_nan and torch.isnan(u).any():  # NaN < a is False: a NaN would silently reject
        raise ValueError(f"{name}: NaN uniforms (recorded by a deterministic mode?) cannot replay a random draw")
    finite = u[~torch.isnan(u)]
    if finite.numel() and (finite.amin() < 0 or finite.amax() >= 1):
        raise ValueError(f"{name} must lie in [0, 1)")


# ----------------------------------------------------------------------------------------------
# sampling helpers


_BLOCK = 256  # inverse-CDF sampling searches block sums first, then one block


def sample_inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index ``t`` with ``C(t-1) <= u * C(V-1) < C(t)``, ``C`` the cumulative sum of ``weights``.

    ``weights [..., V]`` are non-negative (need not be normalised), ``u [...]`` in ``[0, 1)``. The
    search is two-level and allocates nothing of size ``V``: cumulative sums (float64) of
    ``_BLOCK``-token block sums locate the block, a float64 cumulative sum inside that block locates
    the token. A token of zero weight is never returned.
    """
    V = weights.shape[-1]
    lead = weights.shape[:-1]
    n_full, tail = divmod(V, _BLOCK)
    parts = []
    if n_full:
        parts.append(weights[..., : n_full * _BLOCK].reshape(*lead, n_full, _BLOCK).sum(dim=-1))
    if tail:
        parts.append(weights[..., n_full * _BLOCK:].sum(dim=-1, keepdim=True))
    block_mass = torch.cat(parts, dim=-1).to(torch.float64)      # [..., n_blocks]
    c = block_mass.cumsum(dim=-1)
    total = c[..., -1:]
    target = u.to(torch.float64).unsqueeze(-1) * total
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(c.contiguous(), target.contiguous(), right=True)
    block = block.clamp_(max=c.shape[-1] - 1)                    # [..., 1]
    rest = target - (c.gather(-1, block) - block_mass.gather(-1, block))
    idx = block * _BLOCK + torch.arange(_BLOCK, device=weights.device)
    inside = idx < V
    w = weights.gather(-1, idx.clamp(max=V - 1)).to(torch.float64) * inside
    cw = w.cumsum(dim=-1)
    rest = torch.minimum(rest.clamp(min=0.0), torch.nextafter(cw[..., -1:], torch.zeros_like(rest)))
    j = torch.searchsorted(cw.contiguous(), rest.contiguous(), right=True).clamp_(max=_BLOCK - 1)
    return (block * _BLOCK + j).squeeze(-1)


def _draw(shape: tuple[int, ...], generator, like: torch.Tensor) -> torch.Tensor:
    return torch.rand(shape, generator=generator, dtype=like.dtype, device=like.device)


# ----------------------------------------------------------------------------------------------
# verification


def verify(
    p: torch.Tensor,
    q: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    mode: str = "exact",
    generator: torch.Generator | None = None,
    residual_generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    next_uniforms: torch.Tensor | None = None,
    validate: bool = True,
    sum_tol: float = 1e-4,
    **mode_options: float,
) -> VerifyResult:
    """Verify ``B`` drafted blocks at once; see the module docstring for the math of each mode.

    ``p [B, gamma+1, V]`` and ``q [B, gamma, V]`` are adjusted distributions (:func:`spade_lib.sampling.adjust`),
    ``draft_tokens [B, gamma]`` the drafts. ``uniforms [B, gamma]`` / ``next_uniforms [B]`` replay
    recorded draws instead of drawing from ``generator`` / ``residual_generator``. ``validate=False``
    skips the ``O(B * gamma * V)`` input checks (shapes are still checked) for the decoder's hot path.
    """
    opts = _mode_options(mode, mode_options)
    B, gamma, V = _check_shapes(p, q, draft_tokens)
    if validate:
        sum_tol = check_float("sum_tol", sum_tol, min=0.0)
        _check_distribution("p", p, sum_tol)
        _check_distribution("q", q, sum_tol)
        if draft_tokens.numel() and (draft_tokens.min() < 0 or draft_tokens.max() >= V):
            raise ValueError(f"draft_tokens must lie in [0, V={V}), got range "
                             f"[{int(draft_tokens.min())}, {int(draft_tokens.max())}]")
        if uniforms is not None:
            _check_uniforms("uniforms", uniforms, (B, gamma), allow_nan=mode in DETERMINISTIC_MODES)
        if next_uniforms is not None:
            _check_uniforms("next_uniforms", next_uniforms, (B,), allow_nan=mode == "greedy")
    if residual_generator is None:
        residual_generator = generator

    x = draft_tokens.to(device=p.device, dtype=torch.long)
    p_draft = p[:, :gamma]
    p_x = p_draft.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    q_x = q.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    if validate and mode in ("exact", "lenience") and (q_x <= 0).any():
        raise ValueError("draft_tokens: a drafted token has q(x) = 0, so it cannot have been sampled from q")

    nan = torch.full((B, gamma), float("nan"), dtype=p.dtype, device=p.device)
    if mode in DETERMINISTIC_MODES:
        u = nan
    elif uniforms is not None:
        u = uniforms.to(device=p.device, dtype=p.dtype)
    else:
        u = _draw((B, gamma), generator, p)

    sampled = None  # sample_match: the target's own sample at each draft position
    if mode in ("exact", "lenience"):
        scale = 1.0 if mode == "exact" else opts["lenience"]
        ratio = p_x / (scale * q_x)
        accept_prob = torch.where(q_x > 0, ratio.clamp(max=1.0), (p_x > 0).to(p.dtype))
        ok = u < accept_prob
    elif mode == "one_hot_q":
        accept_prob = p_x
        ok = u < accept_prob
    elif mode == "sample_match":
        accept_prob = p_x
        sampled = sample_inverse_cdf(p_draft, u)
        ok = sampled == x
    elif mode == "greedy":
        ok = p_draft.argmax(dim=-1) == x
        accept_prob = ok.to(p.dtype)
    else:  # typical
        threshold = torch.clamp(opts["delta"] * torch.exp(-entropy(p_draft)), max=opts["eps"])
        ok = p_x > threshold
        accept_prob = ok.to(p.dtype)

    accepted = torch.cummin(ok.to(torch.uint8), dim=-1).values.bool()
    n_accepted = accepted.sum(dim=-1)
    reached = torch.ones_like(accepted)
    reached[:, 1:] = accepted[:, :-1]

    rows = torch.arange(B, device=p.device)
    p_next = p[rows, n_accepted]                           # [B, V] target at the decision position
    bonus = n_accepted == gamma
    at = n_accepted.clamp(max=gamma - 1)                   # the rejected position (if any)
    if mode == "greedy":
        next_token = p_next.argmax(dim=-1)
        next_dist = torch.zeros_like(p_next).scatter_(-1, next_token.unsqueeze(-1), 1.0)
        u_next = torch.full((B,), float("nan"), dtype=p.dtype, device=p.device)
        return VerifyResult(n_accepted, next_token, accept_prob, u, accepted, reached, p_x, q_x,
                            u_next, next_dist, mode)

    if next_uniforms is not None:
        u_next = next_uniforms.to(device=p.device, dtype=p.dtype)
    else:
        u_next = _draw((B,), residual_generator, p)

    # weights of the next-token draw, built in place in fresh [B, V] copies (large temporaries are
    # costly: each is a page-faulting allocation)
    if mode in ("exact", "lenience"):
        weights = q[rows, at]
        if mode == "lenience":
            weights.mul_(opts["lenience"])
        torch.sub(p_next, weights, out=weights).clamp_(min=0.0)   # max(0, p - q)
    elif mode in ("one_hot_q", "sample_match"):
        weights = p_next.clone().scatter_(-1, x[rows, at].unsqueeze(-1), 0.0)
    else:  # typical: sample the target itself
        weights = p_next
    mass = weights.sum(dim=-1, keepdim=True)
    # the bonus samples p_gamma; a rejection with an empty residual has probability 0 in exact
    # arithmetic, and falls back to p
    use_p = bonus | (mass.squeeze(-1) <= 0)
    if weights is not p_next and bool(use_p.any()):
        weights[use_p] = p_next[use_p]
        mass = weights.sum(dim=-1, keepdim=True)
    next_token = sample_inverse_cdf(weights, u_next)
    next_dist = weights.div_(mass)
    if sampled is not None:  # sample_match emits the target's own sample at the rejection
        next_token = torch.where(bonus, next_token, sampled[rows, at])
    return VerifyResult(n_accepted, next_token, accept_prob, u, accepted, reached, p_x, q_x,
                        u_next, next_dist, mode)


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


# ----------------------------------------------------------------------------------------------
# proof of exactness: exact enumeration and Monte-Carlo chi-square checks (used by tests and M2's
# acceptance-math notebook)


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
    if mode == "sample_match":
        raise ValueError("mode 'sample_match' draws its own target samples; check it by Monte-Carlo")
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

    if mode in DETERMINISTIC_MODES:
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
