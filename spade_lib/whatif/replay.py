"""What-if replay of a stored trace under other acceptance rules and stop rules, without a model.

A trace (``spade_lib.runs.trace``) keeps per drafted ``x_i``: ``p(x_i)``, ``q(x_i)``, the verifier's uniform ``u_i``,
``H(p)`` and the draft's confidence (notation: Leviathan et al. 2023). **The replay assumption**: replayable is the
per-step outcome given the *same drafted block*, its accepted length ``n`` (``n + 1`` tokens emitted); tau is the mean
over recorded steps. Exact per block; for a real run it assumes the blocks it would draft look like the recorded ones.

**Acceptance rules** are :mod:`spade_lib.rules`' registry (read live): ``a_i`` is the function ``verify`` runs, on
the trace columns of the same names; pathwise decisions reuse ``u_i`` (common random numbers). Needs (``Rule.needs``),
exactness (``Rule.exactness``): ``exact`` (``accept_prob``, ``uniform``), ``lenience`` (``p_x``, ``q_x``, ``uniform``),
``one_hot_q`` (``p_x``, ``uniform``): pathwise; ``typical`` (``p_x``, ``h_p``), ``greedy`` (``draft_token``,
``p_top1``): deterministic; ``sample_match`` (``p_x``): in expectation (pathwise needs ``p``'s CDF at ``x``: not
stored). Options: ``params={rule: {...}}``. Not replayable: the residual at a counterfactual rejection, the text after
a changed step, rules that change drafting (``one_hot_q``/``greedy`` re-verify the recorded sampled drafts); pathwise
needs ``uniform`` (NaN in deterministic modes: expectations only). Expected tokens of a block (Rao-Blackwellised):
``E[n + 1] = sum_{k=0}^{gamma} prod_{i<k} a_i``. A fresh draft's ``alpha_rule = sum_x q(x) a(x)`` needs the full
laws; :func:`rule_alpha_topk` bounds it from top-k slices (``record_topk > 0``): the sum over ``q``'s slice ``S``
(``p(x)`` bounded outside ``p``'s) plus at most ``q(outside S)``; exact when the slices hold all the mass.

**Stop rules** are :mod:`spade_lib.decoding.drafts.policies`' (``get_policy``). From a trace at ``gamma = max_gamma``, a policy
drafting ``g <= max_gamma`` sees the same first ``g`` drafts, ``p``, ``q`` and uniforms: its accepted length is exactly
``min(n, g)`` (a real run agrees in distribution, not token for token). ``g`` is ``Policy.replay_gamma``: ``fixed``
drafts ``gamma``; ``confidence`` while ``q_top_prob >= threshold``, ``entropy`` while ``h_q_raw <= threshold``:
``g = 1 + #leading kept`` (cap ``max_gamma``). Predicted speedup ``sum_steps (min(n, g) + 1) / sum_steps C(g)``,
``C(g) = g c + r(g)`` target-forward units (:func:`spade_lib.theory.step_cost`; ``r(g)``: verifying ``g + 1`` tokens).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from spade_lib.validate import (ArgumentTypeError, check_costs, check_finite_columns, check_float, check_gamma,
                                check_int)
from spade_lib import measures
from spade_lib import rules as _rules
from spade_lib.decoding.drafts import policies as _policies
from spade_lib.decoding.records import STEP_KEYS
from spade_lib.theory import step_cost


Options = Mapping[str, Mapping[str, float]] | None


def _rule(name: str) -> _rules.Rule:
    if not isinstance(name, str) or name not in _rules.rule_names():
        raise ValueError(f"rule must be one of {_rules.rule_names()}, got {name!r}")
    return _rules.get_rule(name)


def _options(rule: _rules.Rule, options: Options) -> dict[str, float]:
    return rule.check_options((options or {}).get(rule.name, {}))


# --------------------------------------------------------------------------------------------------
# Per-position acceptance under a rule
# --------------------------------------------------------------------------------------------------

def _require(trace: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    missing = sorted(set(columns) - set(trace.columns))
    if missing:
        raise ValueError(f"trace lacks columns {missing} needed for {what}")


def _finite(trace: pd.DataFrame, columns: Iterable[str]) -> None:
    """Refuse NaN / inf in the numeric ``columns`` a replay reads (``uniform`` may be NaN: not drawn, in
    deterministic modes), naming the column and the row: a NaN ``accept_prob`` would silently end a block's
    accepted run (NaN > u is False) and shift every tau."""
    check_finite_columns("trace", trace, columns, nan_ok=("uniform",), keys=(*STEP_KEYS, "pos"))


def _accept(rule: _rules.Rule, columns: Mapping[str, np.ndarray], opts: dict[str, float]) -> np.ndarray:
    """The rule's own accept probability (the function ``verify`` runs) on NumPy columns, float64."""
    inputs = {}
    for name in {"p_x", "q_x", *rule.inputs_needed}:
        if name in columns:
            v = np.asarray(columns[name])
            inputs[name] = torch.from_numpy(v.astype(np.float64 if v.dtype.kind == "f" else np.int64))
    return rule.accept(inputs, **opts).to(torch.float64).numpy()


def rule_accept_prob(trace: pd.DataFrame, rule: str, params: Options = None) -> np.ndarray:
    """``a_i``: probability that ``rule`` accepts the drafted token of each row, were it reached."""
    r = _rule(rule)
    _require(trace, r.needs if r.stored_accept else r.inputs_needed, f"rule {rule!r}")
    _finite(trace, ("accept_prob",) if r.stored_accept else r.inputs_needed)
    if r.stored_accept:
        return trace["accept_prob"].to_numpy(np.float64)
    return _accept(r, {c: trace[c].to_numpy() for c in r.inputs_needed}, _options(r, params))


def rule_accepts(trace: pd.DataFrame, rule: str, params: Options = None) -> np.ndarray:
    """Pathwise decision of ``rule`` for each row, were it reached (NaN where a uniform is missing).

    Stochastic rules compare the recorded uniform with ``a_i`` exactly as the verifier does
    (``u < a``, in float32 like the stored columns); deterministic rules ignore the uniform.
    """
    r = _rule(rule)
    if r.deterministic:
        return (rule_accept_prob(trace, rule, params) > 0.5).astype(np.float64)
    if not r.pathwise_replay:  # e.g. sample_match: y ~ p over the whole vocabulary is not stored
        return np.full(len(trace), np.nan)
    _require(trace, ("uniform",), f"a pathwise replay of rule {rule!r}")
    _finite(trace, ("uniform",))
    u = trace["uniform"].to_numpy(np.float32)
    a = rule_accept_prob(trace, rule, params).astype(np.float32)
    out = (u < a).astype(np.float64)
    out[np.isnan(u)] = np.nan
    return out


# --------------------------------------------------------------------------------------------------
# Counterfactual re-verification
# --------------------------------------------------------------------------------------------------

def _blocks(trace: pd.DataFrame, reads: Iterable[str] = ()) -> pd.DataFrame:
    """``trace`` sorted by step and position, its step columns and ``reads`` checked finite first (the error
    names the caller's row)."""
    _require(trace, STEP_KEYS + ["pos", "category", "gamma", "n_accepted"], "replay")
    if len(trace) == 0:
        raise ValueError("trace is empty")
    _finite(trace, [*STEP_KEYS, "pos", "gamma", "n_accepted", *reads])
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


def counterfactual_steps(trace: pd.DataFrame, rules: Sequence[str] | None = None,
                         params: Options = None) -> pd.DataFrame:
    """One row per recorded step and rule: the recorded ``n_accepted`` and, under the rule, the
    pathwise accepted length ``n_path`` (NaN where uniforms are missing) and the expected tokens
    ``tokens_expected = E[n + 1 | block]``."""
    names = _rules.rule_names() if rules is None else rules
    df = _blocks(trace, [c for rule in names for c in _rule(rule).needs])
    steps, step_id = _step_index(df)
    pos = df["pos"].to_numpy().astype(int)
    frames = []
    for rule in names:
        a = rule_accept_prob(df, rule, params)
        decided = rule_accepts(df, rule, params) if ("uniform" in df.columns or _rule(rule).deterministic) \
            else np.full(len(df), np.nan)
        out = steps.copy()
        out["rule"] = rule
        out["n_path"] = _leading_run(decided, step_id, pos)
        out["tokens_expected"] = _expected_tokens(a, step_id, pos)
        frames.append(out)
    return pd.concat(frames, ignore_index=True)


def counterfactual(trace: pd.DataFrame, rules: Sequence[str] | None = None, params: Options = None,
                   by: Sequence[str] = ()) -> pd.DataFrame:
    """Acceptance and tau under each rule, from one trace (optionally grouped, e.g. by ``category``).

    Columns: ``acceptance_path`` (accepted drafts / drafted tokens, pathwise), ``tau_path`` (mean
    ``n_path + 1`` over steps whose pathwise length is known), ``tau_expected`` (mean
    ``E[n + 1 | block]``; each a :func:`spade_lib.measures.tau` over the trace's steps), ``coverage_path`` (fraction of steps with a known pathwise length),
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
            "tau_path": float(measures.tau(g.loc[known, "n_path"].sum(), int(known.sum()))) if known.any() else math.nan,
            "tau_expected": float(measures.tau(g["tokens_expected"].sum() - len(g), len(g))),
            "tau_recorded": float(measures.tau(g["n_accepted"].sum(), len(g))),
            "coverage_path": float(known.mean()),
            "needs": ", ".join(_rule(rule).needs),
            "exactness": _rule(rule).exactness,
        })
        rows.append(row)
    return pd.DataFrame(rows)


def replay_decisions(trace: pd.DataFrame, rule: str = "exact", params: Options = None) -> pd.DataFrame:
    """Row-level replay: ``reached`` and ``accepted`` as ``rule`` would have decided them on the same
    blocks (``reached`` = every earlier position of the block accepted). Replaying the rule a trace
    was recorded with must give back its own ``reached``/``accepted``/``n_accepted`` columns."""
    df = _blocks(trace, _rule(rule).needs)
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

def rule_alpha_topk(trace: pd.DataFrame, rule: str, params: Options = None) -> pd.DataFrame:
    """Per row: bounds on ``alpha_rule = sum_x q(x) a_rule(x)`` from the stored top-k slices.

    Over the slice ``S`` of ``q`` (``q_topk_ids``), ``p(x)`` is read from ``p``'s slice; a token
    outside ``p``'s slice has ``0 <= p(x) <= min(smallest stored p prob, 1 - p(slice))``. Every rule's
    ``a`` is non-decreasing in ``p(x)``, so ``lower = sum_{x in S} q(x) a(p_low(x))`` and ``upper =
    sum_{x in S} q(x) a(p_high(x)) + (1 - q(S))`` bound the truth; ``exact`` marks rows where ``q(S) =
    1`` and ``p(x)`` is known for every ``x in S``. For ``exact`` this is ``1 - TV`` (the ``tv`` column).
    """
    r = _rule(rule)
    opts = _options(r, params)
    _require(trace, ("p_topk_ids", "p_topk_probs", "q_topk_ids", "q_topk_probs"),
             "top-k replay (record the run with record_topk > 0)")
    scalars = [c for c in r.inputs_needed if c not in ("p_x", "q_x", "draft_token")]  # per-row inputs
    _require(trace, scalars, f"rule {rule!r}")
    _finite(trace, scalars)
    lowers, uppers, exacts = [], [], []
    for label, row in zip(trace.index, trace.itertuples(index=False)):
        if row.q_topk_ids is None or row.p_topk_ids is None:
            lowers.append(math.nan), uppers.append(math.nan), exacts.append(False)
            continue
        for col in ("p_topk_probs", "q_topk_probs"):
            probs = np.asarray(getattr(row, col), dtype=np.float64)
            if not np.all(np.isfinite(probs)):
                raise ValueError(f"trace: column {col!r} holds a non-finite probability at row {label!r}; "
                                 "it must be finite")
        p_probs = np.asarray(row.p_topk_probs, dtype=np.float64)
        p_map = dict(zip(np.asarray(row.p_topk_ids).tolist(), p_probs.tolist()))
        p_cover = float(p_probs.sum())
        p_unseen_max = min(float(p_probs.min()), max(0.0, 1.0 - p_cover))  # bound on p(x) outside p's slice
        q_ids = np.asarray(row.q_topk_ids).tolist()
        q_probs = np.asarray(row.q_topk_probs, dtype=np.float64)
        in_p = np.array([x in p_map for x in q_ids])
        p_low = np.array([p_map.get(x, 0.0) for x in q_ids])
        p_high = np.where(in_p, p_low, p_unseen_max)
        a_low, a_high = (_rule_a(r, pp, q_probs, q_ids, row, opts, scalars) for pp in (p_low, p_high))
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


def _rule_a(rule: _rules.Rule, p_of: np.ndarray, q_probs: np.ndarray, q_ids: list[int], row,
            opts: dict[str, float], scalars: Sequence[str]) -> np.ndarray:
    """``a_rule(x)`` for the tokens of ``q``'s slice given (bounds on) their ``p(x)``; monotone in ``p``."""
    columns = {"p_x": p_of, "q_x": q_probs, "draft_token": np.asarray(q_ids)}
    columns.update({c: np.full(len(q_ids), getattr(row, c)) for c in scalars})
    return _accept(rule, columns, opts)


# --------------------------------------------------------------------------------------------------
# Stop-rule replay
# --------------------------------------------------------------------------------------------------

def _as_policy(rule: _policies.Policy) -> _policies.Policy:
    if not isinstance(rule, _policies.Policy):
        raise ValueError(f"rule: expected a spade_lib.decoding.drafts.policies.Policy, got {type(rule).__name__}")
    return rule


def blocks_used(trace: pd.DataFrame, rule: _policies.Policy) -> tuple[pd.DataFrame, np.ndarray]:
    """Steps of ``trace`` and the number of tokens ``g`` that the policy ``rule`` would have drafted
    in each (its vectorised replay form, :meth:`spade_lib.decoding.drafts.policies.Policy.replay_gamma`)."""
    policy = _as_policy(rule)
    df = _blocks(trace, _policies.SIGNAL_COLUMNS if policy.needs_signals else ())
    steps, _ = _step_index(df)
    max_gamma = int(steps["gamma"].max())
    if policy.max_gamma > max_gamma:
        raise ValueError(f"rule.gamma = {policy.max_gamma} exceeds the trace's largest block ({max_gamma}); "
                         "record the trace with a fixed gamma >= every gamma to replay")
    return steps, policy.replay_gamma(df)


def rule_alpha_bounds(trace: pd.DataFrame, rules: Iterable[str] | None = None, params: Options = None) -> pd.DataFrame:
    """Per rule (default: every registered one), :func:`rule_alpha_topk`'s bounds averaged over the trace's
    rows: ``alpha_lower``, ``alpha_upper`` (the mean fresh-draft acceptance ``alpha_rule = sum_x q(x) a(x)``
    lies between them), ``rows_exact`` (share of rows where the slices pin it), ``width = alpha_upper -
    alpha_lower``, and ``truth_outside``: for ``exact`` only (NaN for the others), how far the stored truth
    ``1 - tv`` falls outside a row's bounds at most, ``max_rows max(lower - (1 - tv), (1 - tv) - upper)``
    (``<= 0`` when every row covers it; ``inf`` where a row has no slices). ``trace``: recorded with
    ``record_topk > 0`` (``p_topk_*``, ``q_topk_*`` columns, and ``tv``)."""
    rows = []
    for rule in (_rules.rule_names() if rules is None else rules):
        b = rule_alpha_topk(trace, rule, params)
        row = {"rule": rule, "alpha_lower": b["alpha_lower"].mean(), "alpha_upper": b["alpha_upper"].mean(),
               "rows_exact": b["exact"].mean(), "truth_outside": math.nan}
        if rule == "exact":
            _finite(trace, ("tv",))
            truth = 1.0 - trace["tv"].to_numpy(np.float64)
            outside = np.maximum(b["alpha_lower"].to_numpy() - truth, truth - b["alpha_upper"].to_numpy())
            row["truth_outside"] = math.inf if np.isnan(outside).any() else float(outside.max(initial=-math.inf))
        rows.append(row)
    out = pd.DataFrame(rows)
    out.insert(4, "width", out["alpha_upper"] - out["alpha_lower"])
    return out


def replay_stop_rule(trace: pd.DataFrame, rule: _policies.Policy, c: float,
                     verify_cost: float | Callable[[int], float] = 1.0, by: Sequence[str] = (),
                     overhead: float = 0.0) -> pd.DataFrame:
    """Tokens and cost per step of ``rule`` replayed on ``trace`` (recorded with fixed max gamma).

    Per step: ``g`` drafted, ``n = min(n_recorded, g)`` accepted (pathwise, exact), ``tokens = n + 1``,
    ``tokens_expected = sum_{k<=g} prod_{i<k} accept_prob_i``, ``cost = g c + r(g) + o`` (``o``:
    ``overhead``, the pair's measured per-step loop cost in target steps; 0 is the paper's model). Aggregates
    (optionally by ``by``): mean ``g``, ``tau`` (tokens per step, :func:`spade_lib.measures.tau`),
    ``tau_expected``, ``cost`` per step,
    ``speedup = sum tokens / sum cost`` (ratio of totals) and ``speedup_expected``.
    """
    c = check_float("c", c, min=0.0)
    overhead = check_float("overhead", overhead, min=0.0)
    if not isinstance(rule, _policies.Policy):
        raise ArgumentTypeError(f"rule: must be a spade_lib.decoding.drafts.policies.Policy, got {type(rule).__name__}")
    if not callable(verify_cost):
        check_costs("verify_cost", verify_cost)
    policy = _as_policy(rule)
    steps, g = blocks_used(trace, policy)
    df = _blocks(trace, ("accept_prob",))
    _, step_id = _step_index(df)
    a = df["accept_prob"].to_numpy(np.float64)
    per = steps.copy()
    per["g"] = g
    per["n"] = np.minimum(per["n_accepted"].to_numpy(), g)
    per["tokens"] = per["n"] + 1
    per["tokens_expected"] = _expected_tokens(a, step_id, df["pos"].to_numpy().astype(int), limit=g)
    per["cost"] = np.broadcast_to(step_cost(g, float(c), verify_cost, overhead), g.shape)
    rows = []
    groups = per.groupby(list(by), sort=True) if by else [((), per)]
    for key, grp in groups:
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key))
        row.update({
            "policy": policy.name, "gamma": policy.max_gamma,
            "threshold": float(getattr(policy, "threshold", math.nan)),
            "label": policy.label,
            "steps": int(len(grp)),
            "g_mean": float(grp["g"].mean()),
            "tau": float(measures.tau(grp["n"].sum(), len(grp))),
            "tau_expected": float(measures.tau(grp["tokens_expected"].sum() - len(grp), len(grp))),
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
                       by: Sequence[str] = (), overhead: float = 0.0) -> pd.DataFrame:
    """:func:`replay_stop_rule` over a grid: every fixed gamma up to the trace's, and each threshold
    of the confidence and entropy policies (capped at the trace's gamma); ``overhead`` as there."""
    max_gamma = int(_blocks(trace)["gamma"].max())
    gammas = range(1, max_gamma + 1) if gammas is None else gammas
    rules = [_policies.get_policy("fixed", gamma=int(gm)) for gm in gammas]
    rules += [_policies.get_policy("confidence", max_gamma=max_gamma, threshold=float(t)) for t in confidence_thresholds]
    rules += [_policies.get_policy("entropy", max_gamma=max_gamma, threshold=float(t)) for t in entropy_thresholds]
    return pd.concat([replay_stop_rule(trace, r, c, verify_cost, by, overhead) for r in rules], ignore_index=True)


def best_rules(frontier: pd.DataFrame, by: Sequence[str] = (), column: str = "speedup") -> pd.DataFrame:
    """For each group (e.g. category) and policy, the grid point with the highest ``column``."""
    keys = [*by, "policy"]
    idx = frontier.groupby(keys, sort=True)[column].idxmax()
    return frontier.loc[idx].reset_index(drop=True)
