"""Draft-length policies: how many tokens the drafter proposes before the target verifies.

A policy is consulted after each drafted token ``x_i`` (``i = 0, 1, ...``) with two signals of the
draft's *temperature-1* distribution at that position, ``q_raw = softmax(draft logits)``:

- ``q_top_prob = max_v q_raw(v)`` (the draft's confidence), and
- ``h_q = -sum_v q_raw(v) log q_raw(v)`` (its entropy, nats),

and answers whether to draft ``x_{i+1}``. The token just drafted is always kept (as in HF assisted
generation: a low-confidence token is verified, drafting just stops after it). Every policy has a
``max_gamma``; the decoder may cap the block further (``max_new_tokens``, the context limit).

Policies are frozen dataclasses with no state: a step's draft length depends only on that step's draft
distributions, so the choice never peeks at the target and speculative sampling stays lossless for
any policy (Leviathan et al. 2023, Theorem 1 holds for every block length chosen before verification).
The decoder logs the draft length (``gamma``) and both signals for every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .validate import check_float, check_gamma

__all__ = ["Policy", "FixedGamma", "ConfidenceThreshold", "EntropyThreshold", "as_policy"]


def _check_max_gamma(value: int, name: str = "max_gamma") -> None:
    check_gamma(name, value)  # an integer in [1, validate.MAX_GAMMA]


class Policy:
    """Interface: ``max_gamma`` and ``keep_drafting``; subclasses are frozen dataclasses."""

    max_gamma: int
    needs_signals: bool = False  # True when keep_drafting reads the signals (one host sync per token)

    def keep_drafting(self, q_top_prob: float, h_q: float) -> bool:
        """After drafting a token whose draft distribution has these signals: draft another one?"""
        return True

    @property
    def name(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class FixedGamma(Policy):
    """Always draft ``gamma`` tokens (the classic constant schedule)."""

    gamma: int = 4  # draft length

    def __post_init__(self) -> None:
        _check_max_gamma(self.gamma, "gamma")

    @property
    def max_gamma(self) -> int:  # type: ignore[override]
        return self.gamma


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


def as_policy(gamma: int | None = None, policy: Policy | None = None) -> Policy:
    """Exactly one of ``gamma`` (→ :class:`FixedGamma`) or ``policy``."""
    if (gamma is None) == (policy is None):
        raise ValueError("gamma/policy: give exactly one of gamma=<int> or policy=<Policy>")
    if policy is not None:
        if not isinstance(policy, Policy):
            raise ValueError(f"policy: expected a spade_lib.policies.Policy, got {type(policy).__name__}")
        return policy
    return FixedGamma(gamma=gamma)
