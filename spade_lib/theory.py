"""Closed-form theory of speculative decoding (Leviathan et al. 2023, Sections 3.3-3.5).

Notation: ``alpha`` acceptance rate (``E[min(1, p(x)/q(x))]``, :func:`spade_lib.measures.alpha`),
``gamma`` draft length, ``c`` cost of one draft forward relative to one target forward,
``c_hat`` arithmetic-ops ratio of draft to target per token.

- expected tokens per verification step (Eq. 1; i.i.d. acceptance):
  ``E[tokens] = (1 - alpha^(gamma+1)) / (1 - alpha)``  ( = ``gamma + 1`` at ``alpha = 1``).
  With position-wise *conditional* acceptance rates ``alpha_1 .. alpha_gamma`` (``alpha_i`` = P(accept
  position i | positions before it accepted)): ``E[tokens] = 1 + sum_i prod_{j <= i} alpha_j``.
- walltime speedup (Thm. 3.8): ``E[tokens] / (gamma c + 1)``; with a measured verify-cost ratio ``r`` = (time of a
  ``gamma+1``-token target forward) / (time of a 1-token one): ``E[tokens] / (gamma c + r)``.
- optimal ``gamma``: argmax of the speedup over ``1 .. max_gamma`` (numeric search; ties -> smallest).
- total-ops overhead (Thm. 3.11): ``(1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1))``
  = ``(gamma c_hat + gamma + 1) / E[tokens]``.
- free-draft limit: as ``c -> 0`` and ``gamma -> inf`` the speedup tends to ``1 / (1 - alpha)``.
- cost of one step (target-forward units, :func:`step_cost`): ``C(gamma) = gamma c + r(gamma) + o``, ``r`` a number or
  a callable of ``gamma``, ``o`` the loop's own per-step cost beyond its forwards (``overhead``, default 0: the paper's
  model; measured by :func:`spade_lib.decoding.studies.costs.measure_loop_overhead`). :func:`verify_cost_curve` interpolates
  ``r(g)`` from measured points (piecewise linear through ``r(0) = 1``, extended linearly; :func:`linear_verify_cost`
  through one point; a pair's measured ``c``, ``r(g)``: :func:`spade_lib.runs.costs.pair_costs`). Every speedup in
  SPADE (``replay``, ``align``, notebooks) is ``tokens / C`` with this ``C``.

Scalar ``alpha`` broadcasts against array ``gamma``, ``c``, ``c_hat``, ``verify_cost`` (NumPy semantics); an ``alpha``
of one or more dimensions is a vector of position-wise rates along its last axis (``gamma`` defaults to its length).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from spade_lib.validate import ArgumentTypeError, check_float, check_gamma, check_int

ArrayLike = float | int | Sequence[float] | np.ndarray
VerifyCost = float | int | np.ndarray | Callable[[int], float]


def _check_numbers(name: str, value: ArrayLike, what: str = "a number or an array of numbers") -> None:
    """Refuse a str, a bool or a non-numeric array where numbers are expected (``np.asarray`` would
    silently turn ``'0.8'`` into 0.8 and ``True`` into 1)."""
    kind = "U" if isinstance(value, (str, bytes)) else np.asarray(value).dtype.kind
    if kind not in "iuf":
        raise ArgumentTypeError(f"{name}: must be {what}, got {value!r} "
                                f"({type(value).__name__})")


def _check_alpha(alpha: ArrayLike) -> np.ndarray:
    _check_numbers("alpha", alpha)
    a = np.asarray(alpha, dtype=np.float64)
    if a.size == 0:
        raise ValueError("alpha must not be empty")
    if not np.all(np.isfinite(a)) or np.any(a < 0) or np.any(a > 1):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    return a


def _check_gamma(gamma: ArrayLike, minimum: int = 1) -> np.ndarray:
    _check_numbers("gamma", gamma, f"an integer >= {minimum} or an array of them")
    g = np.asarray(gamma)
    if g.dtype.kind == "f" and np.all(np.isfinite(g)) and np.all(g == np.round(g)):
        g = g.astype(np.int64)
    if g.dtype.kind not in "iu" or np.any(g < minimum):
        raise ValueError(f"gamma must be an integer (or integer array) >= {minimum}, got {gamma!r}")
    return g


def _check_nonneg(name: str, value: ArrayLike, *, positive: bool = False) -> np.ndarray:
    _check_numbers(name, value)
    v = np.asarray(value, dtype=np.float64)
    bad = (v <= 0) if positive else (v < 0)
    if not np.all(np.isfinite(v)) or np.any(bad):
        raise ValueError(f"{name} must be finite and {'> 0' if positive else '>= 0'}, got {value!r}")
    return v


def _scalar(x: np.ndarray) -> float | np.ndarray:
    return float(x) if np.ndim(x) == 0 else x


def expected_tokens(alpha: ArrayLike, gamma: ArrayLike | None = None) -> float | np.ndarray:
    """Expected tokens emitted per verification step (accepted drafts plus the one target token).

    Scalar ``alpha``: ``(1 - alpha^(gamma+1)) / (1 - alpha)`` (``gamma + 1`` at ``alpha = 1``),
    broadcast over array ``gamma``; ``gamma = 0`` (a step that drafted nothing: one plain target step)
    gives 1. Vector ``alpha`` (position-wise conditional rates, last axis):
    ``1 + sum_{i <= gamma} prod_{j <= i} alpha_j``; ``gamma`` defaults to the vector's length.
    """
    a = _check_alpha(alpha)
    if a.ndim == 0:
        if gamma is None:
            raise ValueError("gamma is required when alpha is a scalar")
        g = _check_gamma(gamma, minimum=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            closed = (1.0 - a ** (g + 1)) / (1.0 - a)
        return _scalar(np.where(a == 1.0, g + 1.0, closed))
    length = a.shape[-1]
    g = length if gamma is None else _check_gamma(gamma, minimum=0)
    if np.ndim(g) != 0 or int(g) > length:
        raise ValueError(f"gamma must be a single integer <= len(alpha) = {length} for position-wise alpha, got {gamma!r}")
    reach = np.cumprod(a[..., : int(g)], axis=-1)
    return _scalar(1.0 + reach.sum(axis=-1))


def verify_cost_at(verify_cost: VerifyCost, gamma: ArrayLike) -> float | np.ndarray:
    """``r(gamma)``: ``verify_cost`` itself when it is a number (or array), else the callable applied
    to every ``gamma`` (element-wise); checked finite and ``> 0``."""
    _check_numbers("gamma", gamma, "an integer >= 1 or an array of them")
    if callable(verify_cost):
        g = np.asarray(gamma)
        r = np.vectorize(lambda x: float(verify_cost(int(x))), otypes=[np.float64])(g) if g.ndim \
            else float(verify_cost(int(g)))
    else:
        r = verify_cost
    return _scalar(_check_nonneg("verify_cost", r, positive=True))


def step_cost(gamma: ArrayLike, c: ArrayLike, verify_cost: VerifyCost = 1.0,
              overhead: ArrayLike = 0.0) -> float | np.ndarray:
    """Cost of one step in target-forward units: ``C(gamma) = gamma c + r(gamma) + o``, ``o = overhead``
    the loop's per-step cost beyond its forwards (>= 0; 0 is the paper's model)."""
    g = np.asarray(gamma, dtype=np.float64)
    return _scalar(g * _check_nonneg("c", c) + np.asarray(verify_cost_at(verify_cost, gamma))
                   + _check_nonneg("overhead", overhead))


def verify_cost_curve(points: Mapping[int, float]) -> Callable[[int], float]:
    """``r(g)``, the cost of verifying ``g`` drafted tokens (``g + 1`` positions) in one target forward relative
    to a 1-token forward, from measured points ``{g: r(g)}`` (e.g. the ``"r"`` table of
    :func:`spade_lib.decoding.studies.costs.measure_costs`; keys may be strings, as JSON gives them): the one
    interpolation of ``r`` in SPADE.

    Piecewise linear through ``(0, 1)`` -- a step that drafted nothing is one plain target forward -- and the
    measured points: ``r(g)`` is the measured value at a measured ``g``, linear between measured neighbours,
    and beyond the largest measured ``g`` the line through the last two points (with one measured point
    ``(G, R)``: ``r(g) = 1 + (R - 1) g / G``, memory-bound forwards growing slowly and about linearly in the
    tokens); ``r(g) = 1`` for ``g <= 0``."""
    if not isinstance(points, Mapping) or not points:
        raise ValueError(f"points: must be a non-empty mapping gamma -> r(gamma), got {points!r}")
    table = {}
    for g, v in points.items():
        gi = int(g)
        if gi < 1:
            raise ValueError(f"points: measured gammas must be >= 1, got {g!r}")
        table[gi] = check_float(f"points[{g!r}]", v, min=0.0, min_open=True)
    xs = np.array([0, *sorted(table)], dtype=np.float64)
    ys = np.array([1.0, *(table[int(x)] for x in xs[1:])])
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])

    def r(g) -> float:
        g = int(g)
        if g <= 0:
            return 1.0
        if g in table:
            return table[g]
        if g > xs[-1]:
            return float(ys[-1] + slope * (g - xs[-1]))
        return float(np.interp(g, xs, ys))

    return r


def linear_verify_cost(ratio: float, at_gamma: int) -> Callable[[int], float]:
    """:func:`verify_cost_curve` through the one measured point ``r(at_gamma) = ratio``:
    ``r(g) = 1 + (ratio - 1) g / at_gamma``."""
    check_float("ratio", ratio)
    check_int("at_gamma", at_gamma)
    if ratio < 1 or at_gamma < 1:
        raise ValueError(f"ratio must be >= 1 and at_gamma >= 1, got {ratio}, {at_gamma}")
    return verify_cost_curve({at_gamma: ratio})


def speedup(alpha: ArrayLike, gamma: ArrayLike | None, c: ArrayLike, verify_cost: VerifyCost = 1.0,
            overhead: ArrayLike = 0.0) -> float | np.ndarray:
    """Expected walltime improvement ``E[tokens] / (gamma c + r(gamma) + o)`` over plain decoding.

    ``verify_cost = 1`` and ``overhead = 0`` is Leviathan et al.'s Thm. 3.8; pass the measured ratio ``r``
    of a ``gamma+1``-token target forward to a 1-token one (a number, or a callable ``r(gamma)``) and the
    measured per-step loop cost ``o`` (in target steps, :func:`spade_lib.decoding.studies.costs.measure_loop_overhead`)
    for the realistic version.
    """
    tokens = expected_tokens(alpha, gamma)
    g = _check_gamma(np.shape(alpha)[-1] if (gamma is None and np.ndim(alpha) > 0) else gamma)
    return _scalar(np.asarray(tokens) / np.asarray(step_cost(g, c, verify_cost, overhead)))


def optimal_gamma(alpha: ArrayLike, c: float, max_gamma: int = 32, verify_cost: VerifyCost = 1.0,
                  overhead: float = 0.0) -> int:
    """The draft length in ``1 .. max_gamma`` that maximises :func:`speedup` (smallest on ties), with the
    per-step loop cost ``overhead`` in every step's cost.

    ``verify_cost`` is a number, a callable ``r(gamma)``, or an array of ``max_gamma`` values, the cost
    ratio for ``gamma = 1 .. max_gamma``. With position-wise ``alpha``, ``max_gamma`` is capped at its length.
    """
    if np.ndim(c) != 0:
        raise ValueError(f"c must be a single number, got {c!r}")
    max_gamma = check_gamma("max_gamma", max_gamma)  # an integer in [1, validate.MAX_GAMMA]
    a = _check_alpha(alpha)
    if a.ndim > 1:
        raise ValueError(f"alpha must be a scalar or a 1-D vector of position-wise rates, got shape {a.shape}")
    if a.ndim == 1:
        max_gamma = min(int(max_gamma), a.shape[0])
    gammas = np.arange(1, int(max_gamma) + 1)
    if callable(verify_cost):
        verify_cost = verify_cost_at(verify_cost, gammas)
    _check_numbers("verify_cost", verify_cost)
    r = np.asarray(verify_cost, dtype=np.float64)
    if r.ndim not in (0, 1) or (r.ndim == 1 and r.shape[0] < gammas.size):
        raise ValueError(f"verify_cost must be a number or an array of >= {gammas.size} values, got shape {r.shape}")
    r = r if r.ndim == 0 else r[: gammas.size]
    if a.ndim == 0:
        tokens = np.asarray(expected_tokens(a, gammas))
    else:
        tokens = 1.0 + np.cumsum(np.cumprod(a[: gammas.size]))
    c_arr = _check_nonneg("c", c)
    r = _check_nonneg("verify_cost", r, positive=True)
    if np.ndim(overhead) != 0:
        raise ValueError(f"overhead must be a single number, got {overhead!r}")
    o = _check_nonneg("overhead", overhead)
    return int(gammas[int(np.argmax(tokens / (gammas * c_arr + r + o)))])


def ops_overhead(alpha: ArrayLike, gamma: ArrayLike | None, c_hat: ArrayLike) -> float | np.ndarray:
    """Expected total arithmetic operations relative to plain decoding (Leviathan Thm. 3.11):
    ``(gamma c_hat + gamma + 1) / E[tokens]``."""
    ch = _check_nonneg("c_hat", c_hat)
    tokens = expected_tokens(alpha, gamma)
    g = _check_gamma(np.shape(alpha)[-1] if (gamma is None and np.ndim(alpha) > 0) else gamma)
    return _scalar((g * ch + g + 1.0) / np.asarray(tokens))


def free_draft_limit(alpha: ArrayLike) -> float | np.ndarray:
    """Speedup bound with a free draft and unbounded ``gamma``: ``1 / (1 - alpha)`` (inf at 1)."""
    a = _check_alpha(alpha)
    with np.errstate(divide="ignore"):
        return _scalar(np.where(a == 1.0, np.inf, 1.0 / (1.0 - a)))
