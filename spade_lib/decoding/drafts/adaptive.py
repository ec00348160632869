"""Adaptive draft length: choose ``gamma`` before each step from the acceptance seen so far and the costs.

Before step ``t`` the policy holds an estimate ``alpha_hat`` of the per-token acceptance rate from the
steps ``< t`` only, and drafts

    gamma_t = argmax_{1 <= g <= max_gamma} E[tokens](alpha_hat, g) / (g c + r(g))

(:func:`spade_lib.theory.optimal_gamma`; ``E[tokens] = (1 - alpha^(g+1)) / (1 - alpha)``, ``c`` the
draft/target cost ratio per token, ``r(g)`` the cost of a ``g+1``-token target forward over a 1-token
one). The estimate is the posterior mean of a Beta(``prior_alpha * prior_weight``,
``(1 - prior_alpha) * prior_weight``) prior updated with each step's outcome, discounted by ``decay``
per step so that it follows the text: a step that accepted ``n`` of ``g`` drafts adds ``n`` successes and,
if ``n < g``, one failure (the i.i.d. model of Leviathan et al. 2023, Section 3.1).

Lossless: ``gamma_t`` is a function of earlier steps only, fixed before step ``t`` drafts or verifies,
and speculative sampling returns a token distributed as ``p`` for every block length chosen that way
(Theorem 1 holds conditionally on the history). Deterministic: the costs are configuration numbers
(measured beforehand), never timed online, so the same seed replays the same gammas and tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spade_lib.decoding.drafts.policies import Policy, PolicyState, register_policy
from spade_lib.theory import optimal_gamma

__all__ = ["AdaptiveGamma", "AdaptiveState"]

_GRID = 401  # alpha values tabulated in [0, 1] for the optimal-gamma lookup


@register_policy("adaptive")
@dataclass(frozen=True)
class AdaptiveGamma(Policy):
    """Pick each step's gamma by the cost model at the running acceptance estimate (module docstring).

    Stateful: :meth:`start` gives each generation (each row of a batch) its own :class:`AdaptiveState`.
    Registered as ``"adaptive"`` (``RunConfig(policy="adaptive", policy_options={"c": ..., ...})``)."""

    c: float = 0.05                 # draft cost per token / target cost per token (>= 0)
    verify_cost: float | tuple[float, ...] = 1.0  # r: a number, or r(g) for g = 1 .. max_gamma
    max_gamma: int = 8              # longest block
    prior_alpha: float = 0.6        # prior mean of the acceptance rate
    prior_weight: float = 4.0       # prior strength in pseudo-observations (> 0)
    decay: float = 0.9              # discount of past evidence per step, in (0, 1]

    def __post_init__(self) -> None:
        if isinstance(self.max_gamma, bool) or not isinstance(self.max_gamma, int) or self.max_gamma < 1:
            raise ValueError(f"max_gamma: must be an integer >= 1, got {self.max_gamma!r}")
        if isinstance(self.verify_cost, list):  # JSON (policy_options) gives lists; keep the policy hashable
            object.__setattr__(self, "verify_cost", tuple(self.verify_cost))
        if not (np.isfinite(self.c) and self.c >= 0):
            raise ValueError(f"c: must be finite and >= 0, got {self.c!r}")
        r = np.asarray(self.verify_cost, dtype=np.float64)
        if r.ndim > 1 or (r.ndim == 1 and r.shape[0] < self.max_gamma) or not np.all(np.isfinite(r)) \
                or np.any(r <= 0):
            raise ValueError(f"verify_cost: must be a number > 0 or >= max_gamma ({self.max_gamma}) such numbers, "
                             f"got {self.verify_cost!r}")
        if not 0.0 <= self.prior_alpha <= 1.0:
            raise ValueError(f"prior_alpha: must be in [0, 1], got {self.prior_alpha!r}")
        if not self.prior_weight > 0:
            raise ValueError(f"prior_weight: must be > 0, got {self.prior_weight!r}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay: must be in (0, 1], got {self.decay!r}")
        grid = np.linspace(0.0, 1.0, _GRID)
        table = tuple(optimal_gamma(float(a), float(self.c), self.max_gamma, verify_cost=self.verify_cost)
                      for a in grid)
        object.__setattr__(self, "_table", table)

    def gamma_at(self, alpha: float) -> int:
        """The optimal gamma at acceptance ``alpha`` (tabulated on a 401-point grid)."""
        return self._table[int(round(min(max(alpha, 0.0), 1.0) * (_GRID - 1)))]

    def start(self) -> "AdaptiveState":
        """Fresh per-generation state (the decoders call this once per generation, once per batch row)."""
        return AdaptiveState(self)


class AdaptiveState(PolicyState):
    """The running estimate of one generation: ``gamma()`` before a step, ``observe(g, n)`` after it."""

    def __init__(self, policy: AdaptiveGamma):
        self.policy = policy
        self.successes = policy.prior_alpha * policy.prior_weight
        self.failures = (1.0 - policy.prior_alpha) * policy.prior_weight
        self.history: list[int] = []  # gammas chosen

    @property
    def alpha(self) -> float:
        return self.successes / (self.successes + self.failures)

    def gamma(self) -> int:
        return self.policy.gamma_at(self.alpha)

    def observe(self, gamma: int, n_accepted: int) -> None:
        if gamma <= 0:  # a plain target step tells nothing about the draft
            return
        d = self.policy.decay
        self.successes = d * self.successes + n_accepted
        self.failures = d * self.failures + (1.0 if n_accepted < gamma else 0.0)
        self.history.append(gamma)


def costs_from(c: float, r: Sequence[float] | float, max_gamma: int) -> dict:
    """Keyword arguments for :class:`AdaptiveGamma` from measured ``c`` and ``r`` (number or per gamma)."""
    rr = r if np.ndim(r) == 0 else tuple(float(v) for v in r)[:max_gamma]
    return {"c": float(c), "verify_cost": rr, "max_gamma": int(max_gamma)}
