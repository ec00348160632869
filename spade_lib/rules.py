"""Acceptance rules: the one registry that ``verify``, the decoder, ``RunConfig`` and ``replay`` read.

Notation (Leviathan et al. 2023): ``p`` target, ``q`` draft, ``x ~ q`` drafted at a reached position. A :class:`Rule` is
an **accept probability** ``a(x)`` of named inputs, the trace columns (``p_x`` = ``p(x)``, ``q_x`` = ``q(x)``, ``h_p`` =
``H(p)`` in nats, ``draft_token`` = ``x``, ``p_top1`` = ``argmax p``), the *same* function in ``verify`` and
``whatif.replay``; a **decision** (accept iff ``u < a``, ``u ~ U[0, 1)`` recorded; deterministic rules: iff ``a = 1``);
a **residual** (weights at the first rejection; the bonus after ``gamma`` accepts samples ``p``); flags ``lossless``
(emitted tokens ~ ``p`` whatever ``q``), ``deterministic``; **options** (defaults, ranges: ``verify(..., **options)``,
``RunConfig.mode_options``); replay's ``needs`` (trace columns) and ``exactness``. Built-ins (lossless unless marked):

================  =========================================================================  =========================
``exact``         ``min(1, p(x) / q(x))``                                                    ``norm(max(0, p - q))``
``greedy``        ``1[x == argmax p]`` (greedy target)                                       ``argmax p``
``sample_match``  ``p(x)``; pathwise ``y ~ p`` (inverse CDF at ``u``), accept iff ``y == x``  ``y`` itself
``one_hot_q``     ``p(x)`` (``q`` treated as one-hot at ``x``)                               ``norm(p`` without ``x)``
``typical``       lossy: ``1[p(x) > min(eps, delta exp(-H(p)))]`` (Medusa)                   ``p`` (no residual)
``lenience``      lossy: ``min(1, p(x) / (l q(x)))``, ``l`` in (0, 1]                        ``norm(max(0, p - l q))``
``reject``        ``0``: every draft rejected (the null-draft control, one token ``~ p``)    ``p``
================  =========================================================================  =========================

One :func:`register_rule` call adds a rule (``a`` non-decreasing in ``p_x``, so top-k replay can bound it; residual
optional) to every layer: ``verify(mode=name)``, ``SpeculativeDecoder(mode=name)``, ``RunConfig.mode`` /
``mode_options``, replay (:func:`rule_names`, :func:`get_rule`). Tree rules (:class:`TreeRule`, ``verify_tree``) reuse
a chain rule per sibling: ``exact`` (recursive rejection sampling), ``eagle`` (``one_hot_q``), ``greedy``, ``typical``,
each lossless under the ``draws`` (how siblings were drawn) it states, measured by enumeration in the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

__all__ = ["Option", "Rule", "register_rule", "unregister_rule", "get_rule", "rule_names", "lossless_map", "INPUTS",
           "DRAWS", "TreeRule", "register_tree_rule", "unregister_tree_rule", "get_tree_rule", "tree_rule_names"]

# named inputs an accept probability may read: also trace columns (spade_lib.decoding.records)
INPUTS: tuple[str, ...] = ("p_x", "q_x", "h_p", "draft_token", "p_top1")


@dataclass(frozen=True)
class Option:
    """A numeric option of a rule: default and allowed range (``None`` = unbounded)."""

    name: str
    default: float
    min: float | None = None
    max: float | None = None
    min_open: bool = False  # True: value must be > min (else >= min)
    max_open: bool = False  # True: value must be < max (else <= max)
    doc: str = ""

    def check(self, value) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"{self.name}: must be a number, got {value!r}")
        lo_bad = self.min is not None and (value <= self.min if self.min_open else value < self.min)
        hi_bad = self.max is not None and (value >= self.max if self.max_open else value > self.max)
        if lo_bad or hi_bad:
            lo = "-inf" if self.min is None else f"{self.min:g}"
            hi = "inf" if self.max is None else f"{self.max:g}"
            raise ValueError(f"{self.name}: must be in {'(' if self.min_open else '['}{lo}, "
                             f"{hi}{')' if self.max_open else ']'}, got {value!r}")
        return float(value)


Inputs = Mapping[str, torch.Tensor]
AcceptFn = Callable[..., torch.Tensor]          # (inputs, **options) -> a, same shape as inputs["p_x"]
# (p_next [B, V], q_at [B, V], x_at [B], **options) -> non-negative weights [B, V] (need not sum to 1).
# q_at and x_at are fresh copies the residual may overwrite; p_next must not be modified (return it
# unchanged to mean "sample p").
ResidualFn = Callable[..., torch.Tensor]


def residual_max0(p_next: torch.Tensor, q_at: torch.Tensor, x_at: torch.Tensor, *, scale: float = 1.0,
                  **options: float) -> torch.Tensor:
    """``max(0, p - scale q)``, built in place in ``q_at`` (large temporaries are costly: each is a
    page-faulting allocation)."""
    weights = q_at if scale == 1.0 else q_at.mul_(scale)
    return torch.sub(p_next, weights, out=weights).clamp_(min=0.0)


def residual_without_x(p_next: torch.Tensor, q_at: torch.Tensor, x_at: torch.Tensor, **options: float) -> torch.Tensor:
    """``p`` with the rejected token ``x`` removed (the residual of a one-hot ``q``)."""
    return p_next.clone().scatter_(-1, x_at.unsqueeze(-1), 0.0)


def residual_p(p_next: torch.Tensor, q_at: torch.Tensor, x_at: torch.Tensor, **options: float) -> torch.Tensor:
    """``p`` itself (lossy rules that do not correct at a rejection). Returns ``p_next`` unchanged."""
    return p_next


@dataclass(frozen=True)
class Rule:
    """One acceptance rule (see the module docstring). ``accept(inputs, **options)`` must only read
    the names in ``inputs_needed`` and work on torch tensors of any shape (broadcasting)."""

    name: str
    accept: AcceptFn
    inputs_needed: tuple[str, ...]
    lossless: bool
    deterministic: bool = False
    residual: ResidualFn = residual_max0       # (p_next, q_at, x_at, **options) -> weights (p_next: sample p)
    options: tuple[Option, ...] = ()
    requires_q_support: bool = False           # q(x) = 0 for a drafted x is an error (x cannot come from q)
    stored_accept: bool = False                # the trace's accept_prob column is this rule's a (replay reads it)
    pathwise_replay: bool = True               # a trace's uniforms decide it (False: expected values only)
    argmax_next: bool = False                  # next token = argmax p (greedy), no next-token uniform
    samples_target: bool = False               # pathwise: y ~ p by inverse CDF at u, accept iff y == x, emit y
    exactness: str = ""                        # how exact a replay of this rule on a trace is
    doc: str = ""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.inputs_needed) - set(INPUTS))
        if unknown:
            raise ValueError(f"inputs_needed: {unknown} are not named inputs {INPUTS}")
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"name: must be a non-empty string, got {self.name!r}")

    @property
    def defaults(self) -> dict[str, float]:
        return {o.name: o.default for o in self.options}

    def check_options(self, options: Mapping[str, float] | None = None) -> dict[str, float]:
        """Defaults merged with ``options``, each checked against its range; unknown names rejected."""
        options = dict(options or {})
        known = {o.name: o for o in self.options}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"mode {self.name!r} takes options {sorted(known) or 'none'}, got unknown {unknown}")
        return {name: opt.check(options.get(name, opt.default)) for name, opt in known.items()}

    @property
    def needs(self) -> tuple[str, ...]:
        """Trace columns a replay of this rule reads."""
        cols = ("accept_prob",) if self.stored_accept else self.inputs_needed
        if self.pathwise_replay and not self.deterministic:
            cols = (*cols, "uniform")
        return cols


_REGISTRY: dict[str, Rule] = {}


def register_rule(rule: Rule, *, replace: bool = False) -> Rule:
    """Add ``rule`` to the registry (every layer then accepts ``rule.name``); returns it."""
    if not isinstance(rule, Rule):
        raise TypeError(f"rule: expected a spade_lib.rules.Rule, got {type(rule).__name__}")
    if rule.name in _REGISTRY and not replace:
        raise ValueError(f"rule: {rule.name!r} is already registered (pass replace=True)")
    _REGISTRY[rule.name] = rule
    return rule


def unregister_rule(name: str) -> None:
    """Remove a rule (tests that register toy rules clean up with this)."""
    _REGISTRY.pop(name, None)


def get_rule(name: str) -> Rule:
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"mode: must be one of {rule_names()}, got {name!r}")
    return _REGISTRY[name]


def rule_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


# ------------------------------------------------------------------------------------------------
# built-in rules


def _ratio(inputs: Inputs, scale: float = 1.0) -> torch.Tensor:
    p_x, q_x = inputs["p_x"], inputs["q_x"]
    ratio = p_x / (scale * q_x)
    return torch.where(q_x > 0, ratio.clamp(max=1.0), (p_x > 0).to(p_x.dtype))


def _exact(inputs: Inputs) -> torch.Tensor:
    return _ratio(inputs)


def _lenience(inputs: Inputs, lenience: float) -> torch.Tensor:
    return _ratio(inputs, lenience)


def _p_x(inputs: Inputs) -> torch.Tensor:
    return inputs["p_x"]


def _greedy(inputs: Inputs) -> torch.Tensor:
    return (inputs["draft_token"] == inputs["p_top1"]).to(torch.float64)


def _typical(inputs: Inputs, eps: float, delta: float) -> torch.Tensor:
    p_x = inputs["p_x"]
    threshold = torch.clamp(delta * torch.exp(-inputs["h_p"]), max=eps)
    return (p_x > threshold).to(p_x.dtype)


_PATHWISE = "exact, pathwise (recorded uniforms)"

register_rule(Rule(
    "exact", _exact, ("p_x", "q_x"), lossless=True, requires_q_support=True, stored_accept=True,
    exactness=_PATHWISE, doc="Leviathan et al. Alg. 1: u < min(1, p(x)/q(x)); residual norm(max(0, p - q))"))
register_rule(Rule(
    "greedy", _greedy, ("draft_token", "p_top1"), lossless=True, deterministic=True, argmax_next=True,
    exactness="exact, deterministic (given the recorded, sampled drafts)",
    doc="argmax-prefix matching: x == argmax p; next token argmax p (lossless for greedy decoding)"))
register_rule(Rule(
    "sample_match", _p_x, ("p_x",), lossless=True, residual=residual_without_x, pathwise_replay=False,
    samples_target=True,
    exactness="exact in expectation (a = p(x), the law of one_hot_q); pathwise needs p's CDF, not stored",
    doc="y ~ p by inverse CDF with u; accept iff y == x; emit y (same law as one_hot_q)"))
register_rule(Rule(
    "one_hot_q", _p_x, ("p_x",), lossless=True, residual=residual_without_x, exactness=_PATHWISE,
    doc="draft treated as one-hot (vLLM's greedy-draft path): u < p(x); residual norm(p without x)"))
register_rule(Rule(
    "typical", _typical, ("p_x", "h_p"), lossless=False, deterministic=True, residual=residual_p,
    options=(Option("eps", 0.09, 0.0, None, min_open=True, doc="hard threshold (Medusa's posterior_threshold)"),
             Option("delta", 0.3, 0.0, None, min_open=True, doc="entropy-scaled threshold (Medusa's posterior_alpha)")),
    exactness="exact, deterministic",
    doc="Medusa's typical acceptance (Cai et al. 2024): p(x) > min(eps, delta exp(-H(p))); next token ~ p"))
register_rule(Rule(
    "lenience", _lenience, ("p_x", "q_x"), lossless=False,
    residual=lambda p_next, q_at, x_at, lenience: residual_max0(p_next, q_at, x_at, scale=lenience),
    options=(Option("lenience", 0.5, 0.0, 1.0, min_open=True, doc="l in (0, 1]; l = 1 is exact"),),
    requires_q_support=True, exactness=_PATHWISE,
    doc="Leviathan et al. App. A.5: u < min(1, p(x)/(l q(x))); residual norm(max(0, p - l q))"))

register_rule(Rule(
    "reject", lambda inputs: torch.zeros_like(inputs["p_x"]), ("p_x",), lossless=True, deterministic=True,
    residual=residual_p, exactness="exact, deterministic",
    doc="the null-draft control: a(x) = 0, next token ~ p. A step verifies gamma + 1 tokens and keeps one, "
        "so its speedup over autoregressive decoding is 1 / r(gamma) <= 1 (spade_lib.decoding.drafts.drafters.NullDrafter)"))

BUILTIN_RULES: tuple[str, ...] = rule_names()  # a snapshot; rule_names() is the live registry


def lossless_map() -> dict[str, bool]:
    """``{name: lossless}`` of every registered rule."""
    return {name: rule.lossless for name, rule in _REGISTRY.items()}


def deterministic_names() -> frozenset[str]:
    return frozenset(name for name, rule in _REGISTRY.items() if rule.deterministic)


# ------------------------------------------------------------------------------------------------
# tree rules: a chain rule applied to the siblings of a draft tree in turn


DRAWS: tuple[str, ...] = ("iid", "without_replacement", "deterministic")
"""How the siblings of a draft tree were drawn (see :func:`spade_lib.verify.verify_tree`)."""

PROPOSALS: tuple[str, ...] = ("drawn", "one_hot", "ignored")


@dataclass(frozen=True)
class TreeRule:
    """One rule of :func:`spade_lib.verify.verify_tree`: the chain rule ``chain`` applied to siblings in turn.

    At a reached node with residual ``r`` (the target ``p`` at the node before any child is judged),
    child ``c`` (token ``x``) is judged with the chain rule's accept probability, read at ``p_x = r(x)``,
    ``q_x = q_c(x)``, ``h_p = H(r)``, ``p_top1 = argmax r``, ``draft_token = x``; on a rejection the
    next sibling sees ``r <- norm(residual(r, q_c, x))`` (the chain rule's residual). ``proposal``
    says what ``q_c`` is:

    - ``"drawn"``: the distribution ``x`` was actually drawn from, given ``draws`` (the SpecInfer /
      recursive rejection sampling rule);
    - ``"one_hot"``: one-hot at ``x`` whatever ``draws`` (EAGLE's ``qx = 1.0``);
    - ``"ignored"``: ``q`` is not read and ``r`` stays the target at the node (deterministic rules).

    ``lossless`` is the set of ``draws`` under which the emitted tokens follow ``p`` exactly for every
    ``p`` and ``q`` (``target="greedy"``: for every one-hot ``p``, i.e. greedy decoding). It is a
    claim, and ``tests/test_verify_tree.py`` measures it: an exact enumeration for every registered
    rule and every ``draws`` must find the emitted law equal to ``p`` (to 1e-9) exactly when ``draws``
    is in ``lossless``, and far from it otherwise.
    """

    name: str
    chain: str                   # the chain rule (this module's registry) whose accept, options, flags it uses
    proposal: str                # "drawn" | "one_hot" | "ignored"
    lossless: frozenset[str]     # the draws under which it is lossless (measured by the tests)
    target: str = "any"          # "greedy": lossless only claimed for one-hot p
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"name: must be a non-empty string, got {self.name!r}")
        if self.proposal not in PROPOSALS:
            raise ValueError(f"proposal: must be one of {list(PROPOSALS)}, got {self.proposal!r}")
        unknown = sorted(set(self.lossless) - set(DRAWS))
        if unknown:
            raise ValueError(f"lossless: {unknown} are not draws {list(DRAWS)}")
        if self.target not in ("any", "greedy"):
            raise ValueError(f"target: must be 'any' or 'greedy', got {self.target!r}")
        if self.chain_rule.samples_target:
            raise ValueError(f"chain: {self.chain!r} samples the target itself; a tree cannot reuse its sample")

    @property
    def chain_rule(self) -> Rule:
        return get_rule(self.chain)


_TREE_REGISTRY: dict[str, TreeRule] = {}


def register_tree_rule(rule: TreeRule, *, replace: bool = False) -> TreeRule:
    """Add ``rule`` to the tree registry (``verify_tree(mode=rule.name)`` then runs it); returns it."""
    if not isinstance(rule, TreeRule):
        raise TypeError(f"rule: expected a spade_lib.rules.TreeRule, got {type(rule).__name__}")
    if rule.name in _TREE_REGISTRY and not replace:
        raise ValueError(f"rule: tree rule {rule.name!r} is already registered (pass replace=True)")
    _TREE_REGISTRY[rule.name] = rule
    return rule


def unregister_tree_rule(name: str) -> None:
    """Remove a tree rule (tests that register toy rules clean up with this)."""
    _TREE_REGISTRY.pop(name, None)


def get_tree_rule(name: str) -> TreeRule:
    if not isinstance(name, str) or name not in _TREE_REGISTRY:
        raise ValueError(f"mode: must be one of the tree rules {tree_rule_names()}, got {name!r}")
    return _TREE_REGISTRY[name]


def tree_rule_names() -> tuple[str, ...]:
    return tuple(_TREE_REGISTRY)


register_tree_rule(TreeRule(
    "exact", "exact", "drawn", lossless=frozenset(DRAWS),
    doc="recursive rejection sampling (SpecInfer, Miao et al. 2024; without replacement: Jeon et al. 2024): "
        "u < min(1, r(x)/q_c(x)); on rejection r <- norm(max(0, r - q_c)); emit from r"))
register_tree_rule(TreeRule(
    "eagle", "one_hot_q", "one_hot", lossless=frozenset(DRAWS),
    doc="EAGLE's sampling-mode evaluate_posterior (Li et al. 2024): u < r(x) (q treated as one-hot); "
        "on rejection r <- norm(r without x); emit from r"))
register_tree_rule(TreeRule(
    "greedy", "greedy", "ignored", lossless=frozenset(DRAWS), target="greedy",
    doc="follow the first child equal to argmax p at each node; emit argmax p at the path's end"))
register_tree_rule(TreeRule(
    "typical", "typical", "ignored", lossless=frozenset(),
    doc="Medusa's typical acceptance (Cai et al. 2024), sibling-order walk: follow the first child with "
        "p(x) > min(eps, delta exp(-H(p))); emit from p at the path's end"))
