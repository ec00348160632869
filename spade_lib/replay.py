"""What-if replay of a stored trace: other acceptance rules and other stop rules, without a model.

A trace (``spade_lib.trace``) keeps, for every drafted token ``x_i`` of every block, ``p(x_i)``,
``q(x_i)``, the uniform ``u_i`` the verifier drew, ``H(p)`` and the draft's confidence. That is
enough to re-decide each block under another rule. Notation: Leviathan et al. (2023).

**The replay assumption.** After a counterfactual change in acceptance, decoding would continue from
a different prefix and draft different blocks. What is replayable is the *per-step* outcome given the
*same drafted block*: the accepted length ``n`` of each recorded block, and the tokens it emits
(``n + 1``: the accepted drafts plus a residual or bonus token). Tau is then the mean over recorded
steps. This is exact for each block; as an estimate of a real run under the new rule it assumes the
blocks a real run would draft look like the recorded ones (same prompts, same kind of text).

**Acceptance rules** (``a_i`` is the probability of accepting a reached position; pathwise decisions
use the recorded ``u_i`` as common random numbers). What each needs, and how exact it is:

================  ==========================================  ============================  ==================
rule              accept ``x_i`` iff                          trace columns needed          replay is
================  ==========================================  ============================  ==================
``exact``         ``u < min(1, p(x)/q(x))``                   ``accept_prob``, ``uniform``  exact (pathwise)
``lenience``      ``u < min(1, p(x)/(l q(x)))``               ``p_x``, ``q_x``, ``uniform`` exact (pathwise)
``one_hot_q``     ``u < p(x)`` (q replaced by a point mass)   ``p_x``, ``uniform``          exact (pathwise)
``sample_match``  ``y == x`` for ``y ~ p`` (inverse CDF      ``p_x`` (``a = p(x)``)        exact in expectation;
                  of ``p`` at ``u``)                                                        pathwise needs ``p``'s
                                                                                            CDF at ``x``: not stored
``typical``       ``p(x) > min(eps, delta exp(-H(p)))``       ``p_x``, ``h_p``              exact (deterministic)
``greedy``        ``x == argmax p``                           ``draft_token``, ``p_top1``   exact (deterministic)
================  ==========================================  ============================  ==================

What the trace cannot replay: the *residual token* at a counterfactual rejection (it needs the full
``norm(max(0, p - q))``; the trace stores the recorded one only), the text after a changed step, and
rules that change *drafting* (a greedy draft instead of a sampled one: different blocks). The
per-position acceptance rate of a *fresh* draft under a rule, ``alpha_rule = sum_x q(x) a(x)``, needs
the full distributions; with top-k slices (``record_topk > 0``) :func:`rule_alpha_topk` bounds it:
the sum over ``q``'s slice ``S``, with ``p(x)`` bounded where ``x`` is outside ``p``'s slice, plus at
most ``q(outside S)``; exact when the slices hold all of the mass (e.g. ``top_k <= record_topk``
sampling). Pathwise replays need ``uniform`` at every position a rule reaches; where a trace stores
NaN (deterministic modes), only the expected values are given. ``one_hot_q`` and ``greedy`` replay the
*verification* rule on the recorded, sampled drafts; a real run in those modes may draft otherwise
(a deterministic drafter, greedy drafts).

The **expected** tokens of a block under a rule (Rao-Blackwellised over the uniforms, lower variance)
is ``E[n + 1] = sum_{k=0}^{gamma} prod_{i<k} a_i``.

**Stop rules.** From a trace recorded with a fixed, generous ``gamma = max_gamma``, a policy that
would have drafted only ``g <= max_gamma`` tokens of a block sees the same first ``g`` drafts, the
same ``p``, ``q`` and uniforms (the context of position ``i`` only holds earlier positions), so its
accepted length is exactly ``min(n, g)``:

- ``fixed``:      ``g = gamma``;
- ``confidence``: keep drafting while the draft's confidence ``q_top_prob`` (temperature 1) of the
  position just drafted is ``>= threshold``: ``g = 1 + #leading positions with q_top_prob >= threshold``
  (capped at ``max_gamma``);
- ``entropy``:    the same with ``h_q_raw <= threshold``.

Per block this is exact (same uniforms); a real run with another policy draws its uniforms in
another order, so it agrees in distribution, not token for token. A step costs ``C(g) = d(g) c + r(g)`` target-forward units, with ``d(g)`` draft forwards (``g``) and
``r(g)`` the cost of verifying ``g + 1`` tokens; the predicted speedup over plain decoding (1 token
per unit) is the ratio of totals ``sum_steps (min(n, g) + 1) / sum_steps C(g)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from spade_lib.validate import ArgumentTypeError, check_costs, check_float, check_gamma, check_int

RULES = ("exact", "lenience", "one_hot_q", "sample_match", "typical", "greedy")
POLICIES = ("fixed", "confidence", "entropy")

RULE_NEEDS: dict[str, tuple[str, ...]] = {
    "exact": ("accept_prob", "uniform"),
    "lenience": ("p_x", "q_x", "uniform"),
    "one_hot_q": ("p_x", "uniform"),
    "sample_match": ("p_x",),
    "typical": ("p_x", "h_p"),
    "greedy": ("draft_token", "p_top1"),
}
RULE_EXACTNESS: dict[str, str] = {
    "exact": "exact, pathwise (recorded uniforms)",
    "lenience": "exact, pathwise (recorded uniforms)",
    "one_hot_q": "exact, pathwise (recorded uniforms)",
    "sample_match": "exact in expectation (a = p(x), the law of one_hot_q); pathwise needs p's CDF, not stored",
    "typical": "exact, deterministic",
    "greedy": "exact, deterministic (given the recorded, sampled drafts)",
}
STEP_KEYS = ["prompt_id", "sample", "step"]


@dataclass(frozen=True)
class RuleParams:
    lenience: float = 0.5            # l in (0, 1]: accept w.p. min(1, p / (l q)); l = 1 is exact
    typical_eps: float = 0.09        # typical acceptance: hard threshold epsilon (Medusa's posterior_threshold)
    typical_delta: float = 0.3       # typical acceptance: entropy-scaled threshold delta (Medusa's posterior_alpha)

    def __post_init__(self) -> None:
        for name in ("lenience", "typical_eps", "typical_delta"):
            check_float(name, getattr(self, name))  # NaN or inf: refused
        if not 0 < self.lenience <= 1:
            raise ValueError(f"lenience must be in (0, 1], got {self.lenience}")
        if self.typical_eps < 0 or self.typical_delta < 0:
            raise ValueError(f"typical_eps and typical_delta must be >= 0, got {self.typical_eps}, {self.typical_delta}")


# --------------------------------------------------------------------------------------------------
# Per-position acceptance under a rule
# --------------------------------------------------------------------------------------------------

def _require(trace: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    missing = sorted(set(columns) - set(trace.columns))
    if missing:
        raise ValueError(f"trace lacks columns {missing} needed for {what}")


def rule_accept_prob(trace: pd.DataFrame, rule: str, params: RuleParams = RuleParams()) -> np.ndarray:
    """``a_i``: probability that ``rule`` accepts the drafted token of each row, were it reached."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    _require(trace, RULE_NEEDS[rule], f"rule {rule!r}")
    if rule == "exact":
        return trace["accept_prob"].to_numpy(np.float64)
    p_x = trace["p_x"].to_numpy(np.float64)
    if rule == "lenience":
        q_x = trace["q_x"].to_numpy(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(q_x > 0, np.minimum(1.0, p_x / (params.lenience * q_x)), 1.0)
    if rule in ("one_hot_q", "sample_match"):
        return p_x
    if rule == "typical":
        return _typical_accepts(trace, params).astype(np.float64)
    return (trace["draft_token"].to_numpy() == trace["p_top1"].to_numpy()).astype(np.float64)


def _typical_accepts(trace: pd.DataFrame, params: RuleParams) -> np.ndarray:
    p_x = trace["p_x"].to_numpy(np.float64)
    h_p = trace["h_p"].to_numpy(np.float64)
    return p_x > np.minimum(params.typical_eps, params.typical_delta * np.exp(-h_p))


def rule_accepts(trace: pd.DataFrame, rule: str, params: RuleParams = RuleParams()) -> np.ndarray:
    """Pathwise decision of ``rule`` for each row, were it reached (NaN where a uniform is missing).

    Stochastic rules compare the recorded uniform with ``a_i`` exactly as the verifier does
    (``u < a``, in float32 like the stored columns); deterministic rules ignore the uniform.
    """
    if rule in ("typical", "greedy"):
        return rule_accept_prob(trace, rule, params)
    if rule == "sample_match":  # needs y ~ p drawn by inverse CDF over the whole vocabulary: not stored
        return np.full(len(trace), np.nan)
    _require(trace, ("uniform",), f"a pathwise replay of rule {rule!r}")
    u = trace["uniform"].to_numpy(np.float32)
    if rule == "exact":
        a = trace["accept_prob"].to_numpy(np.float32)
    else:
        a = rule_accept_prob(trace, rule, params).astype(np.float32)
    out = (u < a).astype(np.float64)
    out[np.isnan(u)] = np.nan
    return out


# --------------------------------------------------------------------------------------------------
# Counterfactual re-verification
# --------------------------------------------------------------------------------------------------

def _blocks(trace: pd.DataFrame) -> pd.DataFrame:
    _require(trace, STEP_KEYS + ["pos", "category", "gamma", "n_accepted"], "replay")
    if len(trace) == 0:
        raise ValueError("trace is empty")
    return trace.sort_values(STEP_KEYS + ["pos"], kind="stable").reset_index(drop=True)


def _leading_run(values: np.ndarray, step_id: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Per step: number of leading positions whose ``values`` are 1; NaN if the first position that
    is not 1 is NaN (the run's length is then unknown). Positions beyond a block's length count as 0."""
    n_steps = int(step_id.max()) + 1
    width = int(pos.max()) + 1
    mat = np.zeros((n_steps, width + 1))
    mat[step_id, pos] = values
    first = np.argmax(mat != 1.0, axis=1)       # NaN != 1 is True, so a NaN also ends the run
    return np.where(np.isnan(mat[np.arange(n_steps), first]), np.nan, first.astype(np.float64))


def _expected_tokens(a: np.ndarray, step_id: np.ndarray, pos: np.ndarray, limit: np.ndarray | None = None) -> np.ndarray:
    """Per step: ``sum_{k=0}^{g} prod_{i<k} a_i`` with ``g`` = the block's length (or ``limit``)."""
    n_steps = int(step_id.max()) + 1
    width = int(pos.max()) + 1
    mat = np.zeros((n_steps, width))
    mat[step_id, pos] = a
    if limit is not None:
        mat = np.where(np.arange(width)[None, :] < limit[:, None], mat, 0.0)
    return 1.0 + np.cumprod(mat, axis=1).sum(axis=1)


def _step_index(df: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    steps = df[STEP_KEYS + ["category", "gamma", "n_accepted"]].drop_duplicates(STEP_KEYS).reset_index(drop=True)
    step_id = df.groupby(STEP_KEYS, sort=False).ngroup().to_numpy()
    return steps, step_id


def counterfactual_steps(trace: pd.DataFrame, rules: Sequence[str] = RULES,
                         params: RuleParams = RuleParams()) -> pd.DataFrame:
    """One row per recorded step and rule: the recorded ``n_accepted`` and, under the rule, the
    pathwise accepted length ``n_path`` (NaN where uniforms are missing) and the expected tokens
    ``tokens_expected = E[n + 1 | block]``."""
    df = _blocks(trace)
    steps, step_id = _step_index(df)
    pos = df["pos"].to_numpy().astype(int)
    frames = []
    for rule in rules:
        a = rule_accept_prob(df, rule, params)
        decided = rule_accepts(df, rule, params) if ("uniform" in df.columns or rule in ("typical", "greedy")) \
            else np.full(len(df), np.nan)
        out = steps.copy()
        out["rule"] = rule
        out["n_path"] = _leading_run(decided, step_id, pos)
        out["tokens_expected"] = _expected_tokens(a, step_id, pos)
        frames.append(out)
    return pd.concat(frames, ignore_index=True)


def counterfactual(trace: pd.DataFrame, rules: Sequence[str] = RULES, params: RuleParams = RuleParams(),
                   by: Sequence[str] = ()) -> pd.DataFrame:
    """Acceptance and tau under each rule, from one trace (optionally grouped, e.g. by ``category``).

    Columns: ``acceptance_path`` (accepted drafts / drafted tokens, pathwise), ``tau_path`` (mean
    ``n_path + 1`` over steps whose pathwise length is known), ``tau_expected`` (mean
    ``E[n + 1 | block]``), ``coverage_path`` (fraction of steps with a known pathwise length),
    ``needs`` and ``exactness`` (what the rule reads, and how exact its replay is).
    """
    per_step = counterfactual_steps(trace, rules, params)
    keys = ["rule", *by]
    rows = []
    for key, g in per_step.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        known = g["n_path"].notna()
        rule = key[0]
        row = dict(zip(keys, key))
        row.update({
            "steps": int(len(g)),
            "acceptance_path": float(g.loc[known, "n_path"].sum() / g.loc[known, "gamma"].sum()) if known.any() else math.nan,
            "tau_path": float((g.loc[known, "n_path"] + 1).mean()) if known.any() else math.nan,
            "tau_expected": float(g["tokens_expected"].mean()),
            "tau_recorded": float((g["n_accepted"] + 1).mean()),
            "coverage_path": float(known.mean()),
            "needs": ", ".join(RULE_NEEDS[rule]),
            "exactness": RULE_EXACTNESS[rule],
        })
        rows.append(row)
    return pd.DataFrame(rows)


def replay_decisions(trace: pd.DataFrame, rule: str = "exact", params: RuleParams = RuleParams()) -> pd.DataFrame:
    """Row-level replay: ``reached`` and ``accepted`` as ``rule`` would have decided them on the same
    blocks (``reached`` = every earlier position of the block accepted). Replaying the rule a trace
    was recorded with must give back its own ``reached``/``accepted``/``n_accepted`` columns."""
    df = _blocks(trace)
    steps, step_id = _step_index(df)
    pos = df["pos"].to_numpy().astype(int)
    decided = rule_accepts(df, rule, params)
    n = _leading_run(decided, step_id, pos)
    if np.isnan(n).any():
        raise ValueError(f"trace lacks uniforms at positions rule {rule!r} reaches; use counterfactual() for expected values")
    n_row = n[step_id]
    out = df[STEP_KEYS + ["pos"]].copy()
    out["reached"] = pos <= n_row
    out["accepted"] = pos < n_row
    out["n_accepted"] = n_row.astype(np.int16)
    return out


# --------------------------------------------------------------------------------------------------
# Rule acceptance of a fresh draft, from top-k slices
# --------------------------------------------------------------------------------------------------

def rule_alpha_topk(trace: pd.DataFrame, rule: str, params: RuleParams = RuleParams()) -> pd.DataFrame:
    """Per row: bounds on ``alpha_rule = sum_x q(x) a_rule(x)`` from the stored top-k slices.

    Over the slice ``S`` of ``q`` (``q_topk_ids``), ``p(x)`` is read from ``p``'s slice; a token
    outside ``p``'s slice has ``0 <= p(x) <= min(smallest stored p prob, 1 - p(slice))``. Every rule's
    ``a`` is non-decreasing in ``p(x)``, so ``lower = sum_{x in S} q(x) a(p_low(x))`` and ``upper =
    sum_{x in S} q(x) a(p_high(x)) + (1 - q(S))`` bound the truth; ``exact`` marks rows where ``q(S) =
    1`` and ``p(x)`` is known for every ``x in S``. For ``exact`` this is ``1 - TV`` (the ``tv`` column).
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    _require(trace, ("p_topk_ids", "p_topk_probs", "q_topk_ids", "q_topk_probs"),
             "top-k replay (record the run with record_topk > 0)")
    if rule == "greedy":
        _require(trace, ("p_top1",), "rule 'greedy'")
    if rule == "typical":
        _require(trace, ("h_p",), "rule 'typical'")
    lowers, uppers, exacts = [], [], []
    for row in trace.itertuples(index=False):
        if row.q_topk_ids is None or row.p_topk_ids is None:
            lowers.append(math.nan), uppers.append(math.nan), exacts.append(False)
            continue
        p_probs = np.asarray(row.p_topk_probs, dtype=np.float64)
        p_map = dict(zip(np.asarray(row.p_topk_ids).tolist(), p_probs.tolist()))
        p_cover = float(p_probs.sum())
        p_unseen_max = min(float(p_probs.min()), max(0.0, 1.0 - p_cover))  # bound on p(x) outside p's slice
        q_ids = np.asarray(row.q_topk_ids).tolist()
        q_probs = np.asarray(row.q_topk_probs, dtype=np.float64)
        in_p = np.array([x in p_map for x in q_ids])
        p_low = np.array([p_map.get(x, 0.0) for x in q_ids])
        p_high = np.where(in_p, p_low, p_unseen_max)
        a_low, a_high = (_rule_a(rule, pp, q_probs, q_ids, row, params) for pp in (p_low, p_high))
        q_cover = float(q_probs.sum())
        lower = float((q_probs * a_low).sum())
        lowers.append(lower)
        uppers.append(min(1.0, float((q_probs * a_high).sum()) + max(0.0, 1.0 - q_cover)))
        exacts.append(q_cover >= 1 - 1e-5 and bool(in_p.all() or p_unseen_max <= 1e-7))
    out = trace[STEP_KEYS + ["pos"]].copy()
    out["rule"] = rule
    out["alpha_lower"] = lowers
    out["alpha_upper"] = uppers
    out["exact"] = exacts
    return out


def _rule_a(rule: str, p_of: np.ndarray, q_probs: np.ndarray, q_ids: list[int], row, params: RuleParams) -> np.ndarray:
    """``a_rule(x)`` for the tokens of ``q``'s slice given (bounds on) their ``p(x)``; monotone in ``p``."""
    if rule in ("exact", "lenience"):
        scale = 1.0 if rule == "exact" else params.lenience
        return np.where(q_probs > 0, np.minimum(1.0, p_of / np.maximum(scale * q_probs, 1e-300)), 1.0)
    if rule in ("one_hot_q", "sample_match"):
        return p_of
    if rule == "typical":
        return (p_of > min(params.typical_eps, params.typical_delta * math.exp(-row.h_p))).astype(float)
    return (np.asarray(q_ids) == row.p_top1).astype(float)


# --------------------------------------------------------------------------------------------------
# Stop-rule replay
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StopRule:
    policy: str = "fixed"          # "fixed" | "confidence" | "entropy"
    gamma: int = 4                 # fixed: block length; confidence/entropy: cap (<= the trace's max gamma)
    threshold: float = 0.0         # confidence: keep drafting while q_top_prob >= threshold; entropy: while h_q_raw <= threshold

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        check_gamma("gamma", self.gamma)  # an int: 2.5 would silently draft 2
        check_float("threshold", self.threshold, finite=False)
        if self.gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {self.gamma}")

    @property
    def label(self) -> str:
        return f"fixed g={self.gamma}" if self.policy == "fixed" else f"{self.policy} {self.threshold:.3g} (<= {self.gamma})"


def _signal_ok(df: pd.DataFrame, rule: StopRule) -> np.ndarray:
    if rule.policy == "confidence":
        _require(df, ("q_top_prob",), "the confidence stop rule")
        return df["q_top_prob"].to_numpy(np.float64) >= rule.threshold
    if rule.policy == "entropy":
        _require(df, ("h_q_raw",), "the entropy stop rule")
        return df["h_q_raw"].to_numpy(np.float64) <= rule.threshold
    return np.ones(len(df), dtype=bool)


def blocks_used(trace: pd.DataFrame, rule: StopRule) -> tuple[pd.DataFrame, np.ndarray]:
    """Steps of ``trace`` and the number of tokens ``g`` that ``rule`` would have drafted in each."""
    df = _blocks(trace)
    steps, step_id = _step_index(df)
    recorded = steps["gamma"].to_numpy().astype(int)
    max_gamma = int(recorded.max())
    if rule.gamma > max_gamma:
        raise ValueError(f"rule.gamma = {rule.gamma} exceeds the trace's largest block ({max_gamma}); "
                         "record the trace with a fixed gamma >= every gamma to replay")
    # blocks shorter than max_gamma are the decoder's end-of-generation caps; they stay capped
    if rule.policy == "fixed":
        return steps, np.minimum(rule.gamma, recorded)
    pos = df["pos"].to_numpy().astype(int)
    ok = _signal_ok(df, rule).astype(float)
    mat = np.zeros((len(steps), max_gamma))
    mat[step_id, pos] = ok
    leading = np.cumprod(mat, axis=1).sum(axis=1)
    return steps, np.minimum(np.minimum(leading + 1, rule.gamma), recorded).astype(int)


def replay_stop_rule(trace: pd.DataFrame, rule: StopRule, c: float,
                     verify_cost: float | Callable[[int], float] = 1.0, by: Sequence[str] = ()) -> pd.DataFrame:
    """Tokens and cost per step of ``rule`` replayed on ``trace`` (recorded with fixed max gamma).

    Per step: ``g`` drafted, ``n = min(n_recorded, g)`` accepted (pathwise, exact), ``tokens = n + 1``,
    ``tokens_expected = sum_{k<=g} prod_{i<k} accept_prob_i``, ``cost = g c + r(g)``. Aggregates
    (optionally by ``by``): mean ``g``, ``tau`` (tokens per step), ``tau_expected``, ``cost`` per step,
    ``speedup = sum tokens / sum cost`` (ratio of totals) and ``speedup_expected``.
    """
    c = check_float("c", c, min=0.0)
    if not isinstance(rule, StopRule):
        raise ArgumentTypeError(f"rule: must be a StopRule, got {type(rule).__name__}")
    if not callable(verify_cost):
        check_costs("verify_cost", verify_cost)
    steps, g = blocks_used(trace, rule)
    df = _blocks(trace)
    _, step_id = _step_index(df)
    a = df["accept_prob"].to_numpy(np.float64)
    per = steps.copy()
    per["g"] = g
    per["n"] = np.minimum(per["n_accepted"].to_numpy(), g)
    per["tokens"] = per["n"] + 1
    per["tokens_expected"] = _expected_tokens(a, step_id, df["pos"].to_numpy().astype(int), limit=g)
    per["cost"] = g * float(c) + check_costs("verify_cost", [float(verify_cost(int(x)) if callable(verify_cost) else verify_cost)
                                                            for x in g])
    rows = []
    groups = per.groupby(list(by), sort=True) if by else [((), per)]
    for key, grp in groups:
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key))
        row.update({
            "policy": rule.policy, "gamma": rule.gamma, "threshold": rule.threshold, "label": rule.label,
            "steps": int(len(grp)),
            "g_mean": float(grp["g"].mean()),
            "tau": float(grp["tokens"].mean()),
            "tau_expected": float(grp["tokens_expected"].mean()),
            "cost": float(grp["cost"].mean()),
            "speedup": float(grp["tokens"].sum() / grp["cost"].sum()),
            "speedup_expected": float(grp["tokens_expected"].sum() / grp["cost"].sum()),
        })
        rows.append(row)
    return pd.DataFrame(rows)


def stop_rule_frontier(trace: pd.DataFrame, c: float, verify_cost: float | Callable[[int], float] = 1.0,
                       gammas: Iterable[int] | None = None,
                       confidence_thresholds: Iterable[float] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
                       entropy_thresholds: Iterable[float] = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0),
                       by: Sequence[str] = ()) -> pd.DataFrame:
    """:func:`replay_stop_rule` over a grid: every fixed gamma up to the trace's, and each threshold
    of the confidence and entropy policies (capped at the trace's gamma)."""
    max_gamma = int(_blocks(trace)["gamma"].max())
    gammas = range(1, max_gamma + 1) if gammas is None else gammas
    rules = [StopRule("fixed", int(gm)) for gm in gammas]
    rules += [StopRule("confidence", max_gamma, float(t)) for t in confidence_thresholds]
    rules += [StopRule("entropy", max_gamma, float(t)) for t in entropy_thresholds]
    return pd.concat([replay_stop_rule(trace, r, c, verify_cost, by) for r in rules], ignore_index=True)


def best_rules(frontier: pd.DataFrame, by: Sequence[str] = (), column: str = "speedup") -> pd.DataFrame:
    """For each group (e.g. category) and policy, the grid point with the highest ``column``."""
    keys = [*by, "policy"]
    idx = frontier.groupby(keys, sort=True)[column].idxmax()
    return frontier.loc[idx].reset_index(drop=True)


# --------------------------------------------------------------------------------------------------
# Costs
# --------------------------------------------------------------------------------------------------

def linear_verify_cost(ratio: float, at_gamma: int) -> Callable[[int], float]:
    """``r(g) = 1 + (ratio - 1) g / at_gamma``: the cost of verifying ``g + 1`` tokens in one target
    forward, relative to a 1-token forward, interpolated linearly through the one measured point
    ``r(at_gamma) = ratio`` (memory-bound forwards grow slowly and about linearly in the tokens)."""
    check_float("ratio", ratio)
    check_int("at_gamma", at_gamma)
    if ratio < 1 or at_gamma < 1:
        raise ValueError(f"ratio must be >= 1 and at_gamma >= 1, got {ratio}, {at_gamma}")
    slope = (ratio - 1.0) / at_gamma
    return lambda g: 1.0 + slope * g


def pair_costs(manifest: dict, draft: str) -> tuple[float, Callable[[int], float]]:
    """``(c, r)`` of an embedded pair from its build manifest: the draft's measured cost ratio ``c``
    and :func:`linear_verify_cost` through the measured verify-cost ratio."""
    costs = manifest.get("costs") if isinstance(manifest, dict) else None
    if not costs or draft not in costs.get("drafts", {}):
        raise KeyError(f"manifest has no measured costs for draft {draft!r}")
    return float(costs["drafts"][draft]["c"]), linear_verify_cost(float(costs["verify_cost_ratio"]), int(costs["gamma"]))
