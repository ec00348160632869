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

Other modes (``greedy``, ``one_hot_q``, ``sample_match``, and the lossy ``typical`` and ``lenience``)
are rules of the registry :mod:`spade_lib.rules`, which holds each rule's accept probability,
residual, options and flags (``lossless``: the emitted tokens follow ``p`` exactly whatever ``q`` the
drafts came from); ``verify(mode=name, **options)`` runs any registered rule. The proof tools
(enumeration, Monte-Carlo checks, the loop reference) live in :mod:`spade_lib.exactness`.

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

from . import rules
from spade_lib.measures import entropy
from spade_lib.validate import check_float


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
    width = min(_BLOCK, V)  # a vocabulary smaller than a block is one block of width V
    idx = block * _BLOCK + torch.arange(width, device=weights.device)
    inside = idx < V
    w = weights.gather(-1, idx.clamp(max=V - 1)).to(torch.float64) * inside
    cw = w.cumsum(dim=-1)
    rest = torch.minimum(rest.clamp(min=0.0), torch.nextafter(cw[..., -1:], torch.zeros_like(rest)))
    j = torch.searchsorted(cw.contiguous(), rest.contiguous(), right=True).clamp_(max=width - 1)
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
    """Verify ``B`` drafted blocks at once under the rule ``mode`` (:mod:`spade_lib.rules`) with its options.

    ``p [B, gamma+1, V]`` and ``q [B, gamma, V]`` are adjusted distributions (:func:`spade_lib.sampling.adjust`),
    ``draft_tokens [B, gamma]`` the drafts. ``uniforms [B, gamma]`` / ``next_uniforms [B]`` replay
    recorded draws instead of drawing from ``generator`` / ``residual_generator``. ``validate=False``
    skips the ``O(B * gamma * V)`` input checks (shapes are still checked) for the decoder's hot path.
    """
    rule = rules.get_rule(mode)
    opts = rule.check_options(mode_options)
    B, gamma, V = _check_shapes(p, q, draft_tokens)
    if validate:
        sum_tol = check_float("sum_tol", sum_tol, min=0.0)
        _check_distribution("p", p, sum_tol)
        _check_distribution("q", q, sum_tol)
        if draft_tokens.numel() and (draft_tokens.min() < 0 or draft_tokens.max() >= V):
            raise ValueError(f"draft_tokens must lie in [0, V={V}), got range "
                             f"[{int(draft_tokens.min())}, {int(draft_tokens.max())}]")
        if uniforms is not None:
            _check_uniforms("uniforms", uniforms, (B, gamma), allow_nan=rule.deterministic)
        if next_uniforms is not None:
            _check_uniforms("next_uniforms", next_uniforms, (B,), allow_nan=mode == "greedy")
    if residual_generator is None:
        residual_generator = generator

    x = draft_tokens.to(device=p.device, dtype=torch.long)
    p_draft = p[:, :gamma]
    p_x = p_draft.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    q_x = q.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    if validate and rule.requires_q_support and (q_x <= 0).any():
        raise ValueError("draft_tokens: a drafted token has q(x) = 0, so it cannot have been sampled from q")

    if rule.deterministic:
        u = torch.full((B, gamma), float("nan"), dtype=p.dtype, device=p.device)
    elif uniforms is not None:
        u = uniforms.to(device=p.device, dtype=p.dtype)
    else:
        u = _draw((B, gamma), generator, p)

    # the rule's named inputs (the trace's column names), computed only when the rule reads them
    inputs = {"p_x": p_x, "q_x": q_x}
    for name in rule.inputs_needed:
        if name == "h_p":
            inputs[name] = entropy(p_draft)
        elif name == "p_top1":
            inputs[name] = p_draft.argmax(dim=-1)
        elif name == "draft_token":
            inputs[name] = x
    accept_prob = rule.accept(inputs, **opts).to(p.dtype)
    sampled = None  # samples_target: the target's own sample at each draft position
    if rule.samples_target:
        sampled = sample_inverse_cdf(p_draft, u)
        ok = sampled == x
    elif rule.deterministic:
        ok = accept_prob > 0.5
    else:
        ok = u < accept_prob

    accepted = torch.cummin(ok.to(torch.uint8), dim=-1).values.bool()
    n_accepted = accepted.sum(dim=-1)
    reached = torch.ones_like(accepted)
    reached[:, 1:] = accepted[:, :-1]

    rows = torch.arange(B, device=p.device)
    p_next = p[rows, n_accepted]                           # [B, V] target at the decision position
    bonus = n_accepted == gamma
    at = n_accepted.clamp(max=gamma - 1)                   # the rejected position (if any)
    if rule.argmax_next:
        next_token = p_next.argmax(dim=-1)
        next_dist = torch.zeros_like(p_next).scatter_(-1, next_token.unsqueeze(-1), 1.0)
        u_next = torch.full((B,), float("nan"), dtype=p.dtype, device=p.device)
        return VerifyResult(n_accepted, next_token, accept_prob, u, accepted, reached, p_x, q_x,
                            u_next, next_dist, mode)

    if next_uniforms is not None:
        u_next = next_uniforms.to(device=p.device, dtype=p.dtype)
    else:
        u_next = _draw((B,), residual_generator, p)

    # weights of the next-token draw: the rule's residual, a fresh [B, V] tensor (or p_next itself)
    weights = rule.residual(p_next, q[rows, at], x[rows, at], **opts)
    mass = weights.sum(dim=-1, keepdim=True)
    # the bonus samples p_gamma; a rejection with an empty residual has probability 0 in exact
    # arithmetic, and falls back to p
    use_p = bonus | (mass.squeeze(-1) <= 0)
    if weights is not p_next and bool(use_p.any()):
        weights[use_p] = p_next[use_p]
        mass = weights.sum(dim=-1, keepdim=True)
    next_token = sample_inverse_cdf(weights, u_next)
    next_dist = weights.div_(mass)  # p_next is a copy (advanced indexing): dividing in place is safe
    if sampled is not None:  # samples_target emits the target's own sample at the rejection
        next_token = torch.where(bonus, next_token, sampled[rows, at])
    return VerifyResult(n_accepted, next_token, accept_prob, u, accepted, reached, p_x, q_x,
                        u_next, next_dist, mode)
