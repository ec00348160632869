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
next-token draw (one uniform per row, inverse-CDF sampling, cumulative sums in float64) comes from
``residual_generator`` (default: ``generator``). Both are returned; passing them back as
``uniforms=`` / ``next_uniforms=`` reproduces the decision bit for bit. Deterministic modes record
NaN uniforms.

Everything is vectorised over ``B`` and ``gamma``; only the ``gamma`` drafted probabilities and one
``V``-row per batch row (the rejection or bonus position) are read, so with ``validate=False`` the
cost is ``O(B * (gamma + V))``. ``validate=True`` (default) adds two reads of ``p`` and ``q``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .measures import entropy

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
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number, got {value!r}")
    if mode == "lenience" and not 0.0 < merged["lenience"] <= 1.0:
        raise ValueError(f"lenience must be in (0, 1], got {merged['lenience']!r}")
    if mode == "typical" and not (merged["eps"] > 0 and merged["delta"] > 0):
        raise ValueError(f"typical needs eps > 0 and delta > 0, got eps={merged['eps']!r}, delta={merged['delta']!r}")
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


def _check_uniforms(name: str, u: torch.Tensor, shape: tuple[int, ...]) -> None:
    if not isinstance(u, torch.Tensor) or not u.is_floating_point():
        raise ValueError(f"{name} must be a floating-point torch.Tensor")
    if tuple(u.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {tuple(u.shape)}")
    finite = u[~torch.isnan(u)]
    if finite.numel() and (finite.amin() < 0 or finite.amax() >= 1):
        raise ValueError(f"{name} must lie in [0, 1)")


# ----------------------------------------------------------------------------------------------
# sampling helpers


def sample_inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index ``t`` with ``C(t-1) <= u * C(V-1) < C(t)``, ``C`` the float64 cumulative sum of ``weights``.

    ``weights [..., V]`` are non-negative (need not be normalised), ``u [...]`` in ``[0, 1)``. A
    token of zero weight is never returned (the chosen ``t`` has ``C(t) > C(t-1)``).
    """
    c = weights.to(torch.float64).cumsum(dim=-1)
    total = c[..., -1:]
    target = u.to(torch.float64).unsqueeze(-1) * total
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(c.contiguous(), target.contiguous(), right=True).squeeze(-1)
    return idx.clamp_(max=weights.shape[-1] - 1)


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
        _check_distribution("p", p, sum_tol)
        _check_distribution("q", q, sum_tol)
        if draft_tokens.numel() and (draft_tokens.min() < 0 or draft_tokens.max() >= V):
            raise ValueError(f"draft_tokens must lie in [0, V={V}), got range "
                             f"[{int(draft_tokens.min())}, {int(draft_tokens.max())}]")
        if uniforms is not None:
            _check_uniforms("uniforms", uniforms, (B, gamma))
        if next_uniforms is not None:
            _check_uniforms("next_uniforms", next_uniforms, (B,))
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

    if mode in ("exact", "lenience"):
        scale = 1.0 if mode == "exact" else opts["lenience"]
        weights = torch.clamp(p_next - scale * q[rows, at], min=0.0)
    elif mode in ("one_hot_q", "sample_match"):
        weights = p_next.scatter(-1, x[rows, at].unsqueeze(-1), 0.0)
    else:  # typical: sample the target itself
        weights = p_next
    weights = torch.where(bonus.unsqueeze(-1), p_next, weights)
    mass = weights.sum(dim=-1, keepdim=True)
    # a rejection with an empty residual has probability 0 in exact arithmetic; fall back to p
    weights = torch.where(mass > 0, weights, p_next)
    next_dist = weights / weights.sum(dim=-1, keepdim=True)
    next_token = sample_inverse_cdf(weights, u_next)
    if sampled is not None:  # sample_match emits the target's own sample at the rejection
        next_token = torch.where(bonus, next_token, sampled[rows, at])
    return VerifyResult(n_accepted, next_token, accept_prob, u, accepted, reached, p_x, q_x,
                        u_next, next_dist, mode)
