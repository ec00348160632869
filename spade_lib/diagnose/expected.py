"""Expected vs realised acceptance: a test of the sampler itself.

At a reached position the verifier's acceptance probability is known exactly, twice over:

- given the drafted ``x``: ``pi = min(1, p(x) / q(x))`` (``accept_prob``), and
- before ``x`` is drawn: ``pi = 1 - TV(p, q)`` (``tv``; averaging ``min(1, p/q)`` over ``x ~ q``).

Either way the flags ``A_i`` of a group of reached positions are independent Bernoulli(``pi_i``) given
their contexts, so ``S = sum A_i`` is Poisson-binomial with ``E S = sum pi_i`` and
``Var S = sum pi_i (1 - pi_i)``. The table reports ``z = (S - E S) / sqrt(Var S)`` and its two-sided
normal p-value (plus a Bonferroni-adjusted one over the rows of the table). With an exact sampler z is
standard normal; a significant gap means the sampler, or what it recorded, is wrong (a mismatched
``q``, a wrong warper, an off-by-one in the draft positions). The ``accept_prob`` basis has the
smaller variance and is the sharper test; the ``tv`` basis also checks the residual bookkeeping of
the distributions. Greedy (deterministic) traces have ``pi`` in {0, 1}: any mismatch gives p = 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from spade_lib.diagnose.frame import By, Groups, TraceLike, as_trace, group_keys
from spade_lib.diagnose.stats import poisson_binomial_z

BASES = {"accept_prob": "min(1, p(x)/q(x))", "tv": "1 - TV(p, q)"}


def expected_vs_realised(trace: TraceLike, by: By = None, *,
                         bases: Sequence[str] = ("accept_prob", "tv")) -> pd.DataFrame:
    """Per ``basis`` and ``by`` group (e.g. ``"pos"``, ``"category"``; ``None``: the whole trace):
    ``n`` reached positions, ``realised`` accepts, ``expected`` (``sum pi``), ``variance``,
    ``realised_rate``, ``expected_rate``, ``gap = realised_rate - expected_rate``, ``z``, ``p_value``,
    ``p_bonferroni``."""
    unknown = [b for b in bases if b not in BASES]
    if unknown or not bases:
        raise ValueError(f"bases must be a non-empty subset of {list(BASES)}, got {list(bases)}")
    df = as_trace(trace, ("reached", "accepted", *bases))
    g = Groups.of(df, group_keys(by, df), mask=df["reached"].to_numpy(dtype=bool))
    acc = g.take(df["accepted"]).astype(bool)
    realised = g.sum(acc).astype(np.int64)
    parts = []
    for basis in bases:
        x = g.take(df[basis])  # float32 in a trace: the per-row arithmetic stays in float32
        pi = x.copy() if basis == "accept_prob" else 1 - x
        np.clip(pi, 0, 1, out=pi)
        t = g.frame()
        t.insert(0, "basis", basis)
        t["n"] = g.sum()
        t["realised"] = realised
        t["expected"] = g.sum(pi)
        t["variance"] = g.sum(pi * (1.0 - pi))
        parts.append(t)
    out = pd.concat(parts, ignore_index=True)
    n = out["n"].to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["realised_rate"] = out["realised"] / n
        out["expected_rate"] = out["expected"] / n
    out["gap"] = out["realised_rate"] - out["expected_rate"]
    out["z"], out["p_value"] = poisson_binomial_z(out["realised"], out["expected"], out["variance"])
    out["p_bonferroni"] = np.minimum(1.0, out["p_value"] * len(out))
    return out
