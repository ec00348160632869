"""Binomial confidence intervals: the one definition SPADE's tables use (the M3 diagnostics, the heads'
held-out agreement).

For ``k`` successes in ``n`` trials at level ``1 - a``, with ``z = Phi^-1(1 - a/2)``:

- *Wilson* (score interval): ``(k + z^2/2) / (n + z^2) +- z / (n + z^2) * sqrt(k (n - k) / n + z^2 / 4)``;
- *Clopper-Pearson* (exact): ``[B(a/2; k, n-k+1), B(1-a/2; k+1, n-k)]`` with ``B`` the Beta quantile.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

__all__ = ["CI_METHODS", "binomial_ci"]

CI_METHODS = ("wilson", "clopper-pearson")


def _z(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return float(stats.norm.ppf(0.5 + level / 2.0))


def binomial_ci(k, n, level: float = 0.95, method: str = "wilson") -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper confidence bounds of ``k / n`` (arrays; NaN where ``n == 0``)."""
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    if np.any(k < 0) or np.any(k > n):
        raise ValueError("k must satisfy 0 <= k <= n")
    with np.errstate(invalid="ignore", divide="ignore"):
        if method == "wilson":
            z = _z(level)
            z2 = z * z
            center = (k + z2 / 2.0) / (n + z2)
            half = z / (n + z2) * np.sqrt(k * (n - k) / n + z2 / 4.0)
            low, high = center - half, center + half
        elif method == "clopper-pearson":
            a = 1.0 - level
            _z(level)
            low = np.where(k > 0, stats.beta.ppf(a / 2.0, k, n - k + 1.0), 0.0)
            high = np.where(k < n, stats.beta.ppf(1.0 - a / 2.0, k + 1.0, n - k), 1.0)
        else:
            raise ValueError(f"method must be one of {CI_METHODS}, got {method!r}")
    empty = n <= 0
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = k / n
    low = np.where(empty, np.nan, np.clip(np.minimum(low, rate), 0.0, 1.0))  # rounding never excludes k/n
    high = np.where(empty, np.nan, np.clip(np.maximum(high, rate), 0.0, 1.0))
    return low, high
