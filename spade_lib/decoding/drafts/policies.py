"""Draft-length policies: how many tokens the drafter proposes before the target verifies.

A policy is consulted after each drafted token ``x_i`` with two signals of the draft's *temperature-1* distribution
there, ``q_raw = softmax(draft logits)``: ``q_top_prob = max_v q_raw(v)`` (confidence) and ``h_q = -sum_v q_raw(v) log
q_raw(v)`` (entropy, nats), and answers whether to draft ``x_{i+1}`` (``keep_drafting``). The token just drafted is
always kept (as in HF assisted generation). Every policy has a ``max_gamma``; the decoder may cap the block further
(``max_new_tokens``, context limit). Policies are frozen dataclasses; a step's length depends only on that step's draft
distributions and, for a *stateful* policy, on earlier steps' outcomes, never on the target's verdict on the current
block, so speculative sampling stays lossless for any policy (Leviathan et al. 2023, Theorem 1 holds for any block
length chosen before verification). The decoder logs ``gamma`` and both signals every step.

**Per-generation state.** :meth:`Policy.start` (once per generation, per row when batched) returns ``None`` (stateless:
up to ``max_gamma`` every step) or a fresh :class:`PolicyState`, whose :meth:`~PolicyState.gamma` gives each step's cap
in ``[1, max_gamma]`` (then the budget; ``keep_drafting`` may stop earlier) and whose :meth:`~PolicyState.observe` is
told ``(gamma, n_accepted)`` after verification (``gamma = 0``: a plain target step); :func:`step_cap` is that rule,
:class:`spade_lib.decoding.drafts.adaptive.AdaptiveGamma` (``"adaptive"``) the built-in stateful policy.

**Registry**: ``get_policy("confidence", threshold=0.3)`` (the runner's ``RunConfig.policy`` + ``policy_options``);
:func:`register_policy` adds one. **Replay** (:mod:`spade_lib.whatif.replay`): :meth:`Policy.keep_mask` answers
``keep_drafting`` for every trace row at once (columns ``q_top_prob``, ``h_q_raw``: the same signals; a policy defining
only ``keep_drafting`` gets a slower row-by-row one) and :meth:`Policy.replay_gamma` gives each recorded step's ``g =
min(1 + #leading kept positions, max_gamma, recorded gamma)``; a stateful policy has no replay form (its caps depend on
outcomes the trace may not hold): ``replay_gamma`` refuses.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from spade_lib.decoding.records import STEP_KEYS
from spade_lib.validate import check_float, check_gamma
import numpy as np

__all__ = ["Policy", "PolicyState", "step_cap", "FixedGamma", "ConfidenceThreshold", "EntropyThreshold", "as_policy",
           "register_policy", "get_policy", "policy_names", "SIGNAL_COLUMNS"]

SIGNAL_COLUMNS = ("q_top_prob", "h_q_raw")  # trace columns holding keep_drafting's two signals


def _check_max_gamma(value: int, name: str = "max_gamma") -> None:
    check_gamma(name, value)  # an integer in [1, validate.MAX_GAMMA]


class PolicyState:
    """One generation's state of a stateful policy (:meth:`Policy.start`): :meth:`gamma` before each step
    (that step's cap), :meth:`observe` after it. Subclasses override both."""

    def gamma(self) -> int:
        """This step's draft cap, an integer in ``[1, policy.max_gamma]``, from the steps observed so far."""
        raise NotImplementedError

    def observe(self, gamma: int, n_accepted: int) -> None:
        """A step drafted ``gamma`` tokens (``0``: a plain target step) and accepted ``n_accepted``."""
        raise NotImplementedError


class Policy:
    """Interface: ``max_gamma``, ``keep_drafting`` and ``start``; subclasses are frozen dataclasses."""

    max_gamma: int
    needs_signals: bool = False  # True when keep_drafting reads the signals (one host sync per token)
    NAME: ClassVar[str] = ""     # the registry name (set by register_policy)

    def keep_drafting(self, q_top_prob: float, h_q: float) -> bool:
        """After drafting a token whose draft distribution has these signals: draft another one?"""
        return True

    def start(self) -> PolicyState | None:
        """Fresh per-generation state, or ``None`` (this default: a stateless policy). The decoders call
        it once per generation (once per row of a batch) and then use it as :func:`step_cap` says."""
        return None

    @property
    def name(self) -> str:
        return self.NAME or type(self).__name__

    @property
    def label(self) -> str:
        """A short human-readable name with the options, e.g. ``"confidence 0.4 (<= 8)"``."""
        def fmt(v) -> str:
            return f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else repr(v)

        opts = " ".join(f"{f.name}={fmt(getattr(self, f.name))}" for f in dataclasses.fields(self)) \
            if dataclasses.is_dataclass(self) else ""
        return f"{self.name} {opts}".strip()

    def keep_mask(self, trace) -> np.ndarray:
        """Vectorised :meth:`keep_drafting` over the rows of a trace (columns ``q_top_prob``, ``h_q_raw``).

        This base version asks :meth:`keep_drafting` row by row; built-in policies override it with
        one NumPy comparison."""
        if not self.needs_signals:
            return np.ones(len(trace), dtype=bool)
        _require_signals(trace, self.name)
        return np.fromiter((self.keep_drafting(float(t), float(h)) for t, h in
                            zip(trace["q_top_prob"].to_numpy(), trace["h_q_raw"].to_numpy())),
                           dtype=bool, count=len(trace))

    def replay_gamma(self, trace) -> np.ndarray:
        """Draft length ``g`` of every step of ``trace`` (steps in ``(prompt_id, sample, step)`` order),
        for a trace recorded with a fixed ``gamma``: ``min(1 + #leading kept positions, max_gamma,
        recorded gamma)``. Blocks shorter than the trace's gamma (end-of-generation caps) stay capped.
        Exact per block: position ``i``'s signals depend on earlier positions only. Refused for a
        stateful policy (:meth:`start` not ``None``)."""
        if self.start() is not None:
            raise ValueError(f"policy {self.name!r} is stateful (its gamma depends on earlier steps' outcomes); "
                             "it has no stop-rule replay")
        df = trace.sort_values([*STEP_KEYS, "pos"], kind="stable")
        step_id = df.groupby(STEP_KEYS, sort=False).ngroup().to_numpy()
        recorded = df.groupby(STEP_KEYS, sort=False)["gamma"].first().to_numpy().astype(int)
        pos = df["pos"].to_numpy().astype(int)
        mat = np.zeros((len(recorded), int(recorded.max()) if len(recorded) else 0))
        mat[step_id, pos] = self.keep_mask(df)
        leading = np.cumprod(mat, axis=1).sum(axis=1)
        return np.minimum(np.minimum(leading + 1, self.max_gamma), recorded).astype(int)


def step_cap(policy: Policy, state: PolicyState | None) -> int:
    """The most tokens ``policy`` lets the next step draft: ``max_gamma`` when ``state`` (from
    ``policy.start()``) is ``None``, else ``state.gamma()``, checked to lie in ``[1, max_gamma]``."""
    if state is None:
        return policy.max_gamma
    g = state.gamma()
    if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or not 1 <= g <= policy.max_gamma:
        raise ValueError(f"policy {policy.name!r}: its state's gamma() must be an integer in "
                         f"[1, {policy.max_gamma}], got {g!r}")
    return int(g)


def _require_signals(trace, what: str, columns: tuple[str, ...] = SIGNAL_COLUMNS) -> None:
    missing = [c for c in columns if c not in trace.columns]
    if missing:
        raise ValueError(f"trace lacks columns {missing} needed for the {what} stop rule")


_REGISTRY: dict[str, type[Policy]] = {}


def register_policy(name: str, *, replace: bool = False):
    """Class decorator: register a :class:`Policy` subclass (a frozen dataclass) under ``name``."""
    def add(cls: type[Policy]) -> type[Policy]:
        if not (isinstance(cls, type) and issubclass(cls, Policy)):
            raise TypeError(f"register_policy: expected a Policy subclass, got {cls!r}")
        if name in _REGISTRY and not replace:
            raise ValueError(f"policy: {name!r} is already registered (pass replace=True)")
        cls.NAME = name
        _REGISTRY[name] = cls
        return cls
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: must be a non-empty string, got {name!r}")
    return add


def unregister_policy(name: str) -> None:
    _REGISTRY.pop(name, None)


def policy_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def policy_class(name: str) -> type[Policy]:
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"policy: must be one of {policy_names()}, got {name!r}")
    return _REGISTRY[name]


def policy_options(name: str) -> tuple[str, ...]:
    """The option names (dataclass fields) of the policy ``name``."""
    return tuple(f.name for f in dataclasses.fields(policy_class(name)))


def get_policy(name: str, **options) -> Policy:
    """The policy registered as ``name`` with ``options`` (its dataclass fields; the rest default)."""
    allowed = policy_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"policy_options: policy {name!r} takes {list(allowed)}, got unknown {unknown}")
    return policy_class(name)(**options)


@register_policy("fixed")
@dataclass(frozen=True)
class FixedGamma(Policy):
    """Always draft ``gamma`` tokens (the classic constant schedule)."""

    gamma: int = 4  # draft length

    def __post_init__(self) -> None:
        _check_max_gamma(self.gamma, "gamma")

    @property
    def max_gamma(self) -> int:  # type: ignore[override]
        return self.gamma

    @property
    def label(self) -> str:
        return f"fixed g={self.gamma}"


@register_policy("confidence")
@dataclass(frozen=True)
class ConfidenceThreshold(Policy):
    """Stop drafting once the draft's top probability falls below ``threshold`` (HF's default 0.4)."""

    threshold: float = 0.4  # in [0, 1]; 0 never stops early
    max_gamma: int = 20     # HF assisted generation's default num_assistant_tokens

    needs_signals = True

    def __post_init__(self) -> None:
        _check_max_gamma(self.max_gamma)
        check_float("threshold", self.threshold)
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold: must be in [0, 1], got {self.threshold!r}")

    def keep_drafting(self, q_top_prob: float, h_q: float) -> bool:
        return q_top_prob >= self.threshold

    def keep_mask(self, trace) -> np.ndarray:
        _require_signals(trace, self.name, ("q_top_prob",))
        return trace["q_top_prob"].to_numpy(np.float64) >= self.threshold

    @property
    def label(self) -> str:
        return f"{self.name} {self.threshold:.3g} (<= {self.max_gamma})"


@register_policy("entropy")
@dataclass(frozen=True)
class EntropyThreshold(Policy):
    """Stop drafting once the draft's entropy (nats) exceeds ``threshold``."""

    threshold: float = 1.0  # nats, >= 0; inf never stops early
    max_gamma: int = 20

    needs_signals = True

    def __post_init__(self) -> None:
        _check_max_gamma(self.max_gamma)
        check_float("threshold", self.threshold, finite=False)  # +inf: never stop early
        if not self.threshold >= 0.0 or math.isnan(self.threshold):
            raise ValueError(f"threshold: must be >= 0 nats, got {self.threshold!r}")

    def keep_drafting(self, q_top_prob: float, h_q: float) -> bool:
        return h_q <= self.threshold

    def keep_mask(self, trace) -> np.ndarray:
        _require_signals(trace, self.name, ("h_q_raw",))
        return trace["h_q_raw"].to_numpy(np.float64) <= self.threshold

    @property
    def label(self) -> str:
        return f"{self.name} {self.threshold:.3g} (<= {self.max_gamma})"


def as_policy(gamma: int | None = None, policy: Policy | None = None) -> Policy:
    """Exactly one of ``gamma`` (→ :class:`FixedGamma`) or ``policy``."""
    if (gamma is None) == (policy is None):
        raise ValueError("gamma/policy: give exactly one of gamma=<int> or policy=<Policy>")
    if policy is not None:
        if not isinstance(policy, Policy):
            raise ValueError(f"policy: expected a spade_lib.decoding.drafts.policies.Policy, got {type(policy).__name__}")
        return policy
    return FixedGamma(gamma=gamma)

