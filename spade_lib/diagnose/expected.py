"""Expected vs realised acceptance: a test of the sampler itself (:func:`expected_vs_realised`).

At a reached position the acceptance probability is known exactly, on two bases: ``pi = min(1, p(x) / q(x))`` given
the drafted ``x`` (``accept_prob``), ``pi = 1 - TV(p, q)`` before it is drawn (``tv``). A group's flags ``A_i`` are
independent Bernoulli(``pi_i``) given their contexts, so ``S = sum A_i`` is Poisson-binomial, ``E S = sum pi_i``,
``Var S = sum pi_i (1 - pi_i)``; the table reports ``z = (S - E S) / sqrt(Var S)``, its two-sided normal p-value and a
Bonferroni-adjusted one over its rows. Under an exact sampler z is standard normal (unbiased: ``S - E S`` is a
martingale over reached positions, ``E z = 0`` up to ``O(n^-1/2)``; ``tests/test_expected.py``); a significant gap
means the sampler or its records are wrong (mismatched ``q``, wrong warper, off-by-one positions). ``accept_prob`` is
the sharper test, ``tv`` also checks the residual bookkeeping; greedy traces (``pi`` in {0, 1}): any mismatch, p = 0.

**The two bases judge the same flags.** With ``a_i = min(1, p/q)``, ``t_i = 1 - TV_i`` and ``s^2 = sum pi (1 - pi)``
per basis, ``z_a = (S - sum a) / s_a`` and ``z_t = (S - sum t) / s_t`` share ``S - sum a`` (uncorrelated with
``sum a - sum t``), so under an exact sampler ``corr(z_a, z_t) = rho = s_a / s_t`` and
``P(both > 0) = 1/4 + asin(rho) / (2 pi)`` (:func:`basis_agreement`). ``G`` drafts (independent runs) give all ``2 G``
z positive w.p. ``prod_g (1/4 + asin(rho_g) / (2 pi))``, one shared sign w.p. twice that (:func:`same_sign_chance`).

**The planted bug.** :func:`rejudge_wrong_q` re-decides a sampled trace's uniforms against
``pi' = min(1, p(x) / ((1 + w) q(x)))`` (a stale or mis-scaled ``q``; a position after a new rejection is no longer
reached; the expectation keeps the recorded ``pi``): it bites only where ``p(x)/q(x) < 1 + w``. :func:`wrong_q_power`
gives the ``shift`` (in SDs) and the power at ``level``: with ``mu_0 = sum pi``, ``s_0^2 = sum pi (1 - pi)``,
``mu_1 = sum pi'``, ``s_1^2 = sum pi' (1 - pi')`` over positions reached under the bug, ``c = Phi^-1(1 - level / 2)``,
``power = Phi((-c s_0 - (mu_1 - mu_0)) / s_1) + 1 - Phi((c s_0 - (mu_1 - mu_0)) / s_1)`` (``s_0 = 0``: 1 if the
expectation moves by half a token or more, else 0). :func:`wrong_q_study` runs it on synthetic traces with the run's
per-position acceptance (>= 100x the run's steps) and on the run itself re-judged, the power beside each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from spade_lib.diagnose.frame import By, Groups, TraceLike, as_trace, group_keys
from scipy import stats
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


# the columns that identify one verification step (a block) of a trace, where present
STEP_COLUMNS = ("run", "draft", "prompt_id", "sample", "step")


def rejudge_wrong_q(trace: TraceLike, wrong_q: float) -> pd.DataFrame:
    """The reached, sampled positions of a chain trace re-decided by a verifier that divides by
    ``(1 + wrong_q) q(x)`` (module docstring): ``accepted`` and ``reached`` as that verifier would have
    left them with the recorded uniforms, ``accept_prob`` (the expectation) as recorded, and the
    column ``accept_prob_wrong`` (``pi'``). Rows no longer reached are dropped."""
    if isinstance(wrong_q, bool) or not isinstance(wrong_q, (int, float)) or not wrong_q > 0:
        raise ValueError(f"wrong_q: must be a number > 0, got {wrong_q!r}")
    df = as_trace(trace, ("pos", "reached", "accepted", "uniform", "p_x", "q_x", "accept_prob"))
    if "depth" in df.columns and (df["depth"].to_numpy() != df["pos"].to_numpy()).any():
        raise ValueError("trace: rejudge_wrong_q needs chain traces (depth == pos); this one holds a tree")
    df = df[df["reached"].to_numpy(dtype=bool) & df["uniform"].notna().to_numpy()]
    if df.empty:
        raise ValueError("trace: no reached position with a recorded uniform (a greedy trace draws none)")
    keys = [c for c in STEP_COLUMNS if c in df.columns]
    df = df.sort_values([*keys, "pos"], kind="stable").copy()
    ratio = df["p_x"].to_numpy(np.float64) / df["q_x"].to_numpy(np.float64)
    df["accept_prob_wrong"] = np.minimum(1.0, ratio / (1.0 + wrong_q)).astype(np.float32)
    flag = df["uniform"].to_numpy() < df["accept_prob_wrong"].to_numpy()
    # reached' = every earlier position of the block accepted by the wrong verifier
    fail = pd.Series((~flag).astype(np.int64), index=df.index)
    before = fail.groupby([df[k] for k in keys], observed=True, sort=False).cumsum() - fail if keys else fail.cumsum() - fail
    reached = before.to_numpy() == 0
    df["accepted"] = flag
    df["reached"] = True
    return df[reached]


def wrong_q_power(rejudged: pd.DataFrame, by: By = None, *, level: float = 1e-3) -> pd.DataFrame:
    """Per ``by`` group of a :func:`rejudge_wrong_q` frame: ``n``, the expected ``shift`` of z under the
    bug, ``(mu_1 - mu_0) / s_0``, and the ``power`` of the two-sided level-``level`` test to flag it
    (module docstring), beside the realised ``z`` of :func:`expected_vs_realised`."""
    if not 0 < level < 1:
        raise ValueError(f"level: must lie in (0, 1), got {level!r}")
    if "accept_prob_wrong" not in rejudged.columns:
        raise ValueError("rejudged: needs the accept_prob_wrong column of rejudge_wrong_q")
    keys = group_keys(by, rejudged)
    pi = rejudged["accept_prob"].to_numpy(np.float64)
    pw = rejudged["accept_prob_wrong"].to_numpy(np.float64)
    parts = pd.DataFrame({"mu0": pi, "v0": pi * (1 - pi), "mu1": pw, "v1": pw * (1 - pw)}, index=rejudged.index)
    if keys:
        g = parts.groupby([rejudged[k] for k in keys], observed=True).sum().reset_index()
        n = rejudged.groupby(keys, observed=True).size().to_numpy()
    else:
        g, n = parts.sum().to_frame().T, np.array([len(parts)])
    c = stats.norm.isf(level / 2)
    s0, s1, d = np.sqrt(g["v0"]), np.sqrt(g["v1"]), g["mu1"] - g["mu0"]
    with np.errstate(invalid="ignore", divide="ignore"):
        g["shift"] = d / s0
        g["power"] = stats.norm.cdf((-c * s0 - d) / s1) + stats.norm.sf((c * s0 - d) / s1)
    # zero variance (every pi in {0, 1}): z is 0 or infinite, so the bug is flagged iff it changes pi
    flat = (s0 <= 1e-12).to_numpy()
    moved = (np.abs(d) > 0.5).to_numpy()
    g.loc[flat, "shift"] = np.where(moved[flat], np.sign(d[flat]) * np.inf, 0.0)
    g.loc[flat, "power"] = moved[flat].astype(float)
    g.insert(len(keys), "n", n)
    g["level"] = level
    z = expected_vs_realised(rejudged, by=keys or None, bases=("accept_prob",))
    g["z"] = z["z"].to_numpy()
    g["p_value"] = z["p_value"].to_numpy()
    return g[[*keys, "n", "shift", "power", "level", "z", "p_value"]]


def basis_agreement(table: pd.DataFrame, by: By = None) -> pd.DataFrame:
    """Per ``by`` group of an :func:`expected_vs_realised` table with both bases: ``z_accept_prob``,
    ``z_tv``, their correlation under an exact sampler ``rho = s_a / s_t`` (module docstring; clipped to
    [0, 1], NaN where a variance is 0) and ``p_both_positive = 1/4 + asin(rho) / (2 pi)``, the chance that
    both z come out positive (as likely as both negative)."""
    missing = [b for b in BASES if b not in set(table["basis"])] if "basis" in table.columns else list(BASES)
    if missing:
        raise ValueError(f"table: needs rows of both bases {list(BASES)} (expected_vs_realised's), missing {missing}")
    keys = group_keys(by, table)
    cols = ["z", "variance"]
    a = table[table["basis"] == "accept_prob"].set_index(keys)[cols] if keys else \
        table[table["basis"] == "accept_prob"][cols].reset_index(drop=True)
    t = table[table["basis"] == "tv"].set_index(keys)[cols] if keys else \
        table[table["basis"] == "tv"][cols].reset_index(drop=True)
    if len(a) != len(t) or (keys and not a.index.equals(t.index)):
        raise ValueError("table: the two bases must have the same groups")
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.sqrt(a["variance"].to_numpy(np.float64) / t["variance"].to_numpy(np.float64))
    rho = np.where((a["variance"].to_numpy() > 1e-12) & (t["variance"].to_numpy() > 1e-12), np.clip(rho, 0, 1), np.nan)
    out = pd.DataFrame({"z_accept_prob": a["z"].to_numpy(), "z_tv": t["z"].to_numpy(), "rho": rho,
                        "p_both_positive": 0.25 + np.arcsin(rho) / (2 * np.pi)}, index=a.index)
    return out.reset_index() if keys else out


def same_sign_chance(agreement: pd.DataFrame) -> float:
    """The chance under an exact sampler that every z of a :func:`basis_agreement` table shares one sign,
    its groups being independent runs: ``2 prod_g p_both_positive_g`` (NaN if a group's ``rho`` is)."""
    if "p_both_positive" not in agreement.columns or agreement.empty:
        raise ValueError("agreement: needs the rows of basis_agreement")
    return float(2.0 * np.prod(agreement["p_both_positive"].to_numpy(np.float64)))


@dataclass
class WrongQStudy:
    """The planted bug on synthetic traces and on a run (:func:`wrong_q_study`)."""

    synthetic: dict[float, pd.DataFrame]   # w -> a synthetic trace sampled with (1 + w) q (0.0: the exact sampler)
    table: pd.DataFrame                    # expected_vs_realised of each, a ``trace`` column naming it
    power: pd.DataFrame | None             # wrong_q_power of the run re-judged (None: no sampled chain trace)


def wrong_q_study(trace: TraceLike, alpha_by_pos: pd.Series, gamma: int, wrong_q: float, *, n_prompts: int,
                  by: str = "draft", seed: int = 0, level: float = 1e-3) -> WrongQStudy:
    """The expected-vs-realised test against a sampler that divides by ``(1 + wrong_q) q(x)``, twice.

    1. Synthetic: :func:`spade_lib.diagnose.synthetic.synthetic_trace` with ``gamma`` positions accepted with
       ``alpha_by_pos`` (conditional acceptance indexed by position, e.g. a draft's ``alpha_cond`` of
       :func:`~spade_lib.diagnose.position.position_acceptance`; missing positions 0.5, every one clipped to
       ``[0.3, 0.95]`` so a degenerate, e.g. greedy, run still gets a test), ``max(100 x steps of trace, 20,000)``
       steps over ``n_prompts`` prompts, once exact (``0.0``) and once with ``wrong_q``; each tested on both
       bases (:func:`expected_vs_realised`).
    2. The run: the groups of ``by`` whose trace is a sampled chain (uniforms recorded, ``depth == pos``)
       re-judged block by block (:func:`rejudge_wrong_q`) and tested on the ``accept_prob`` basis, with
       :func:`wrong_q_power` at ``level``.

    ``table`` stacks the tests with a column ``trace`` (``"synthetic, wrong_q=<w>"``, ``"this run re-judged,
    wrong_q=<w>"``). ``trace``: the run's rows (``pos``, ``depth``, ``uniform``, ``by`` and the trace columns
    the tests read)."""
    df = as_trace(trace)
    alpha_hat = alpha_by_pos.reindex(range(gamma)).fillna(0.5).clip(0.3, 0.95).to_numpy()
    n_steps = max(int((df.pos == 0).sum()) * 100, 20_000)
    from spade_lib.diagnose.synthetic import synthetic_trace

    synthetic = {w: synthetic_trace(n_steps, gamma, alpha_hat, n_prompts=n_prompts, wrong_q=w, seed=seed)
                 for w in (0.0, wrong_q)}
    tables = [expected_vs_realised(t).assign(trace=f"synthetic, wrong_q={w:g}") for w, t in synthetic.items()]
    chains = [g for g, t in df.groupby(by, observed=True, sort=False)
              if t["uniform"].notna().any() and (t["depth"] == t["pos"]).all()]
    power = None
    if chains:
        rejudged = rejudge_wrong_q(df[df[by].isin(chains)], wrong_q)
        power = wrong_q_power(rejudged, by=by, level=level)
        tables.append(expected_vs_realised(rejudged, by=by, bases=("accept_prob",)).assign(
            trace=f"this run re-judged, wrong_q={wrong_q:g}"))
    return WrongQStudy(synthetic=synthetic, table=pd.concat(tables, ignore_index=True), power=power)
