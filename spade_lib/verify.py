"""Batched speculative verification: decide which drafted tokens to keep and what token comes next.

Notation (Leviathan et al. 2023): per row ``b`` of ``B`` the draft proposed ``x_0 .. x_{gamma-1}``; ``q[b, i]`` is the
(adjusted) draft distribution ``x_i`` was drawn from, ``p[b, i]`` the (adjusted) target's at that position and
``p[b, gamma]`` the target's after the block (the bonus position). Shapes: ``p [B, gamma+1, V]``, ``q [B, gamma, V]``,
``draft_tokens [B, gamma]``. Exact speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023), ``"exact"``:

- accept ``x_i`` iff ``u_i < a_i = min(1, p_i(x_i) / q_i(x_i))``, ``u_i ~ U[0, 1)``; keep the prefix before the first
  rejection ``n``; emit ``t ~ r_n = norm(max(0, p_n - q_n))`` (residual) there, or the bonus ``t ~ p_gamma`` if none;
- so every emitted token follows the target: ``P(emit y at i | reached i) = q_i(y) a_i(y) + (1 - alpha_i) r_i(y) =
  min(p_i, q_i)(y) + max(0, p_i - q_i)(y) = p_i(y)``.

Other modes (``greedy``, ``one_hot_q``, ``sample_match``; lossy ``typical``, ``lenience``) are rules of the registry
:mod:`spade_lib.rules` (accept probability, residual, options, flags; ``lossless``: emitted tokens follow ``p`` exactly
whatever ``q``); ``verify(mode=name, **options)`` runs any of them. Proof tools: :mod:`spade_lib.exactness`.
**Replay**: ``B * gamma`` acceptance uniforms, drawn for every position reached or not (the stream never depends on the
outcome), come from ``generator``; the next-token draw (one uniform a row, :func:`sample_inverse_cdf`) from
``residual_generator`` (default ``generator``). Both are returned; passed back as ``uniforms=`` / ``next_uniforms=``
they reproduce the decision bit for bit (deterministic modes record NaN). **Trees**: :func:`verify_tree` verifies ``N``
nodes with parents (siblings in index order) under :mod:`spade_lib.rules`' tree rules (``exact``: recursive rejection
sampling, sibling draws ``iid`` / without replacement / deterministic; ``eagle``; ``greedy``; ``typical``); a chain
reproduces :func:`verify` bit for bit. **Cost**: vectorised over ``B`` and ``gamma``, reading the ``gamma`` drafted
probabilities and one ``V``-row per row: ``O(B (gamma + V))`` with ``validate=False`` (``sample_match``: ``O(B gamma
V)``); ``validate=True`` (default) adds two reads of ``p`` and ``q`` (row sums, minimum).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import rules
from spade_lib.measures import entropy
from spade_lib.validate import check_choice, check_float


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


def _mode_options(mode: str, rule: rules.Rule, options: dict) -> dict[str, float]:
    """``options`` checked against the rule the caller named as ``mode``: an unknown option is refused by its
    own name and ``mode``'s (a tree mode's chain rule, e.g. ``one_hot_q`` under ``eagle``, is an internal
    name the caller never wrote)."""
    known = sorted(o.name for o in rule.options)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown option of mode {mode!r} (its options: {', '.join(known) or 'none'}), "
                         "got " + ", ".join(f"{k}={options[k]!r}" for k in unknown))
    return rule.check_options(options)


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
    opts = _mode_options(mode, rule, mode_options)
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


# ----------------------------------------------------------------------------------------------
# tree verification
#
# Terms (used in every name below): a draft tree has N *nodes*; node i carries the drafted token
# x_i = tokens[b, i] and has a *parent* (parents[b, i]: -1 for a child of the *root*, the position
# right after the last emitted token, else an earlier node). A node's *depth* is 0 for a child of the
# root (as in DraftTree and a chain's ``pos``); its *sibling rank* is how many earlier nodes share its parent. Siblings are judged in index
# order. The *path* is the chain of accepted nodes from the root down; its end emits the next token.


@dataclass
class TreeVerifyResult:
    """Outcome of verifying ``B`` draft trees of ``N`` nodes at once (see :func:`verify_tree`)."""

    path: torch.Tensor           # [B, N] long: accepted node indices from the root down, -1 padded
    n_accepted: torch.Tensor     # [B] long: accepted nodes (the path's length)
    next_token: torch.Tensor     # [B] long: sampled (or argmax) from next_dist at the path's end
    next_dist: torch.Tensor      # [B, V]: the residual at the path's end (the target there if no child was rejected)
    reached: torch.Tensor        # [B, N] bool: judged (parent on the path, every earlier sibling rejected)
    accepted: torch.Tensor       # [B, N] bool: on the path
    accept_prob: torch.Tensor    # [B, N]: the accept probability when judged (NaN where not reached)
    uniforms: torch.Tensor       # [B, N]: acceptance draws, one per node (NaN for deterministic modes)
    next_uniforms: torch.Tensor  # [B]: the next-token draw (NaN for greedy)
    p_x: torch.Tensor            # [B, N]: p(x_i) at the parent, before any sibling's rejection
    r_x: torch.Tensor            # [B, N]: r(x_i), the residual when judged (NaN where not reached)
    q_x: torch.Tensor            # [B, N]: q_c(x_i), the proposal probability the rule used (NaN where not reached)
    depth: torch.Tensor          # [B, N] long: 0 for a child of the root
    sibling_rank: torch.Tensor   # [B, N] long: 0 for the first child of its parent
    mode: str
    draws: str

    def emitted(self, tokens: torch.Tensor) -> list[list[int]]:
        """Per row, the tokens this step appends: the path's tokens, then ``next_token``."""
        out = []
        for b, (n, nxt) in enumerate(zip(self.n_accepted.tolist(), self.next_token.tolist())):
            nodes = self.path[b, :n].tolist()
            out.append([int(tokens[b, i]) for i in nodes] + [nxt])
        return out


def _check_tree(p, q, tokens, parents, needs_q: bool) -> tuple[int, int, int]:
    if not isinstance(p, torch.Tensor) or not p.is_floating_point():
        raise ValueError("p: must be a floating-point torch.Tensor")
    for name, t in (("tokens", tokens), ("parents", parents)):
        if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"{name}: must be an integer torch.Tensor")
        if t.ndim != 2:
            raise ValueError(f"{name}: must have shape [B, N], got {tuple(t.shape)}")
    B, N = tokens.shape
    if tuple(parents.shape) != (B, N):
        raise ValueError(f"parents: must have the shape of tokens [B, N] = [{B}, {N}], got {tuple(parents.shape)}")
    if p.ndim != 3 or tuple(p.shape[:2]) != (B, N + 1):
        raise ValueError(f"p: must have shape [B, N+1, V] = [{B}, {N + 1}, V], got {tuple(p.shape)}")
    V = p.shape[-1]
    if V < 1:
        raise ValueError("p: vocabulary size V must be >= 1")
    if q is None:
        if needs_q:
            raise ValueError("q: required (the draw distributions of the nodes) for this mode and draws")
    else:
        if not isinstance(q, torch.Tensor) or not q.is_floating_point():
            raise ValueError("q: must be a floating-point torch.Tensor or None")
        if tuple(q.shape) != (B, N, V):
            raise ValueError(f"q: must have shape [B, N, V] = [{B}, {N}, {V}], got {tuple(q.shape)}")
        if q.dtype != p.dtype:
            raise ValueError(f"q: must have the dtype of p ({p.dtype}), got {q.dtype}")
    if N:
        if tokens.min() < 0 or tokens.max() >= V:
            raise ValueError(f"tokens: must lie in [0, V={V}), got range [{int(tokens.min())}, {int(tokens.max())}]")
        bad = (parents < -1) | (parents >= torch.arange(N, device=parents.device))
        if bad.any():
            b, i = (int(k) for k in bad.nonzero()[0])
            raise ValueError(f"parents: parents[b, i] must be -1 (a child of the root) or an earlier node in "
                             f"[0, i); got parents[{b}, {i}] = {int(parents[b, i])}")
    return B, N, V


def _earlier_siblings(parents: torch.Tensor) -> torch.Tensor:
    """[B, N, N] bool: ``[b, i, j]`` is true iff node ``j < i`` has the parent of node ``i``."""
    N = parents.shape[1]
    earlier = torch.ones(N, N, dtype=torch.bool, device=parents.device).tril(-1)
    return (parents[:, :, None] == parents[:, None, :]) & earlier


def verify_tree(
    p: torch.Tensor,
    q: torch.Tensor | None,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    *,
    mode: str = "exact",
    draws: str = "iid",
    generator: torch.Generator | None = None,
    residual_generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    next_uniforms: torch.Tensor | None = None,
    validate: bool = True,
    sum_tol: float = 1e-4,
    **mode_options: float,
) -> TreeVerifyResult:
    """Verify ``B`` draft trees of ``N`` nodes at once under the tree rule ``mode`` (:mod:`spade_lib.rules`).

    Shapes: ``tokens [B, N]`` and ``parents [B, N]`` long (``parents[b, i]`` is ``-1`` or a node
    ``< i``), ``p [B, N+1, V]`` (``p[:, 0]`` the target at the root, ``p[:, i+1]`` after node ``i``),
    ``q [B, N, V]`` the distribution node ``i``'s token was drawn from given its parent, *before* any
    removal of earlier siblings (``None`` allowed where the rule does not read it).

    **The walk.** Start at the root with residual ``r = p[:, 0]``. Judge the children of the current
    node in index order: child ``c`` (token ``x``) is accepted with probability ``a_c`` (``u_c < a_c``,
    ``u_c ~ U[0, 1)``; deterministic rules: ``a_c`` in {0, 1}); on acceptance descend to ``c`` with
    ``r = p[:, c+1]``; on rejection update ``r`` and judge the next sibling; when every child is
    rejected (or the node is a leaf) emit the next token from ``r``.

    **mode="exact"** (recursive rejection sampling, SpecInfer; Jeon et al. 2024 without replacement):
    ``a_c = min(1, r(x) / q_c(x))`` and on rejection ``r <- norm(max(0, r - q_c))``, where ``q_c`` is
    the distribution ``x`` was drawn from *given everything judged before it*:

    - ``draws="iid"``: ``q_c = q[:, c]`` (siblings drawn independently from the parent's ``q``);
    - ``draws="without_replacement"``: ``q_c = norm(q[:, c]`` with the earlier siblings' tokens set to
      0). Using ``q`` itself here is biased (measured in the tests): the proof below needs ``x ~ q_c``
      given the history, and the earlier siblings' tokens cannot recur. A rejected ``x`` has
      ``r(x) < q_c(x)``, so the new residual is 0 at every rejected token, consistent with ``q_c``;
    - ``draws="deterministic"`` (e.g. top-k children; ``q`` ignored): ``q_c`` = one-hot at ``x``, so
      ``a_c = r(x)`` and a rejection sets ``r(x) = 0`` and renormalises.

    Proof (one node): given the history, ``x ~ q_c``, so ``P(emit y here) = min(r, q_c)(y) +
    (1 - sum min(r, q_c)) norm(max(0, r - q_c))(y) = r(y)`` when the next sibling's outcome law is the
    new residual; the last sibling's rejection emits from its residual; by induction over siblings
    and depth every emitted token follows ``p``. Duplicated sibling tokens need nothing special
    (``draws="iid"`` draws them; a deterministic duplicate has ``r(x) = 0`` and is rejected); ``q(x) = 0
    < p(x)`` is covered by the residual.

    **mode="eagle"** (EAGLE's ``evaluate_posterior``, sampling branch): ``q_c`` = one-hot at ``x``
    whatever ``draws`` (so ``"exact"`` with ``draws="deterministic"``). For *any* fixed ``x``,
    ``r(x) 1[y = x] + (1 - r(x)) r(y) 1[y != x] / (1 - r(x)) = r(y)``, so it is lossless for every
    ``draws``; it only accepts less often than ``"exact"`` when ``q_c(x) < 1``.

    **mode="greedy"**: follow the first child whose token is ``argmax p`` at each node; emit ``argmax p``.
    **mode="typical"** (Medusa, lossy): follow the first child with ``p(x) > min(eps, delta exp(-H(p)))``
    (options ``eps``, ``delta``); emit ``~ p`` at the path's end. Medusa itself picks the *longest*
    typical path (ties: highest likelihood); this walk picks, at each node, the first typical child.

    **Degenerate residuals.** A rejection whose new residual has no mass (needs ``r <= q_c``
    everywhere, i.e. ``r = q_c``, when ``x`` is accepted with probability 1: only round-off reaches it)
    keeps ``r``. With ``validate=True`` a node whose token cannot have been drawn (``q_c(x) = 0`` under
    ``draws="iid"`` / ``"without_replacement"``, e.g. a repeated sibling without replacement) is an
    error for rules with ``proposal="drawn"``; with ``validate=False`` it is accepted iff ``r(x) > 0``.

    **Randomness.** ``generator`` gives the acceptance uniforms ``u [B, N]`` (``torch.rand((B, N))``,
    one per node in index order, drawn whether or not the node is reached, none for deterministic
    rules); then ``residual_generator`` (default ``generator``) gives the next-token uniform ``[B]``
    (inverse CDF, :func:`sample_inverse_cdf`; none for greedy). A chain tree (``parents = i - 1``)
    therefore uses the stream exactly as :func:`verify` does. ``uniforms`` / ``next_uniforms`` replay
    recorded draws.

    Python loops over the ``N`` nodes; each step is vectorised over ``B`` (``O(B V)``).
    """
    tree_rule = rules.get_tree_rule(mode)
    rule = tree_rule.chain_rule
    opts = _mode_options(mode, rule, mode_options)
    draws = check_choice("draws", draws, rules.DRAWS)
    drawn = tree_rule.proposal == "drawn" and draws != "deterministic"  # q_c is read from q
    B, N, V = _check_tree(p, q, tokens, parents, needs_q=drawn)
    x_all = tokens.to(device=p.device, dtype=torch.long)
    par = parents.to(device=p.device, dtype=torch.long)
    siblings = _earlier_siblings(par)                                     # [B, N, N]
    duplicate = (siblings & (x_all[:, :, None] == x_all[:, None, :])).any(-1)  # [B, N]
    if validate:
        sum_tol = check_float("sum_tol", sum_tol, min=0.0)
        _check_distribution("p", p, sum_tol)
        if drawn:
            _check_distribution("q", q, sum_tol)
        if uniforms is not None:
            _check_uniforms("uniforms", uniforms, (B, N), allow_nan=rule.deterministic)
        if next_uniforms is not None:
            _check_uniforms("next_uniforms", next_uniforms, (B,), allow_nan=rule.argmax_next)
        if drawn and N:
            q_tok = q.gather(-1, x_all.unsqueeze(-1)).squeeze(-1)
            cannot = q_tok <= 0
            if draws == "without_replacement":
                cannot = cannot | duplicate
            if cannot.any():
                b, i = (int(k) for k in cannot.nonzero()[0])
                why = "repeats an earlier sibling's token" if duplicate[b, i] and q_tok[b, i] > 0 else "has q(x) = 0"
                raise ValueError(f"tokens: node {i} of row {b} {why}, so it cannot have been drawn with "
                                 f"draws={draws!r}")
    if residual_generator is None:
        residual_generator = generator

    nan = float("nan")
    if rule.deterministic:
        u = torch.full((B, N), nan, dtype=p.dtype, device=p.device)
    elif uniforms is not None:
        u = uniforms.to(device=p.device, dtype=p.dtype)
    else:
        u = _draw((B, N), generator, p)

    # tree facts: depth, sibling rank, p(x) at the parent
    sibling_rank = siblings.sum(-1)
    depth = torch.zeros(B, N, dtype=torch.long, device=p.device)
    for i in range(N):
        up = par[:, i].clamp(min=0)
        depth[:, i] = torch.where(par[:, i] >= 0, depth.gather(1, up[:, None]).squeeze(1) + 1, 0)
    p_x = p.reshape(B, -1).gather(1, (par + 1) * V + x_all)

    r = p[:, 0].clone()                                     # [B, V] residual at the current node
    cur = torch.full((B,), -1, dtype=torch.long, device=p.device)
    removed = torch.zeros(B, V, dtype=torch.bool, device=p.device) if draws == "without_replacement" else None
    n_accepted = torch.zeros(B, dtype=torch.long, device=p.device)
    path = torch.full((B, N), -1, dtype=torch.long, device=p.device)
    reached = torch.zeros(B, N, dtype=torch.bool, device=p.device)
    accepted = torch.zeros_like(reached)
    accept_prob = torch.full((B, N), nan, dtype=p.dtype, device=p.device)
    r_x = torch.full_like(accept_prob, nan)
    q_x = torch.full_like(accept_prob, nan)

    for i in range(N):
        judged = par[:, i] == cur
        if not bool(judged.any()):
            continue
        x = x_all[:, i]
        rx = r.gather(-1, x[:, None]).squeeze(-1)
        q_c = None
        if drawn:
            q_c = q[:, i] if removed is None else q[:, i].masked_fill(removed, 0.0)
            mass = q_c.sum(-1, keepdim=True)
            q_c = torch.where(mass > 0, q_c / mass.clamp(min=torch.finfo(p.dtype).tiny), q_c)
            qx = q_c.gather(-1, x[:, None]).squeeze(-1)
        else:  # one-hot q_c: q_c(x) = 1 ("ignored" rules do not read it: recorded as NaN)
            qx = torch.full_like(rx, nan if tree_rule.proposal == "ignored" else 1.0)
        inputs = {"p_x": rx, "q_x": qx, "draft_token": x}
        if "h_p" in rule.inputs_needed:
            inputs["h_p"] = entropy(r)
        if "p_top1" in rule.inputs_needed:
            inputs["p_top1"] = r.argmax(dim=-1)
        a = rule.accept(inputs, **opts).to(p.dtype)
        ok = (a > 0.5) if rule.deterministic else (u[:, i] < a)
        ok = ok & judged
        reject = judged & ~ok
        reached[:, i] = judged
        accepted[:, i] = ok
        accept_prob[:, i] = torch.where(judged, a, accept_prob[:, i])
        r_x[:, i] = torch.where(judged, rx, r_x[:, i])
        q_x[:, i] = torch.where(judged, qx, q_x[:, i])
        if bool(ok.any()):
            at = ok.nonzero().squeeze(-1)
            path[at, n_accepted[at]] = i
            n_accepted[at] += 1
            cur[at] = i
            r[at] = p[at, i + 1]
            if removed is not None:
                removed[at] = False
        if tree_rule.proposal != "ignored" and bool(reject.any()):
            at = reject.nonzero().squeeze(-1)
            if q_c is None:  # one-hot at x
                q_at = torch.zeros(at.numel(), V, dtype=p.dtype, device=p.device)
                q_at.scatter_(-1, x[at, None], 1.0)
            else:
                q_at = q_c[at].clone()
            r_at = r[at]
            w = rule.residual(r_at, q_at, x[at].clone(), **opts)
            w_mass = w.sum(-1, keepdim=True)
            r[at] = torch.where(w_mass > 0, w / w_mass.clamp(min=torch.finfo(p.dtype).tiny), r_at)
            if removed is not None:
                removed[at, x[at]] = True

    if rule.argmax_next:
        next_token = r.argmax(dim=-1)
        next_dist = torch.zeros_like(r).scatter_(-1, next_token[:, None], 1.0)
        u_next = torch.full((B,), nan, dtype=p.dtype, device=p.device)
    else:
        if next_uniforms is not None:
            u_next = next_uniforms.to(device=p.device, dtype=p.dtype)
        else:
            u_next = _draw((B,), residual_generator, p)
        next_token = sample_inverse_cdf(r, u_next)
        next_dist = r / r.sum(-1, keepdim=True)
    return TreeVerifyResult(path, n_accepted, next_token, next_dist, reached, accepted, accept_prob, u, u_next,
                            p_x, r_x, q_x, depth, sibling_rank, mode, draws)
