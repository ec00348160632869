"""The stop-rule study: data-driven threshold grids, AdaEDL's entropy bound, a learned stop classifier.

Every rule is replayed with :func:`spade_lib.whatif.replay.replay_stop_rule` on a trace recorded with a fixed
``max_gamma`` (a rule drafting ``g`` tokens accepts exactly ``min(n, g)``). After each drafted token ``i`` a rule reads
a signal known then and keeps drafting while it passes its threshold:

- ``confidence``: the draft's max probability ``q_top_prob >= threshold``;
- ``entropy``: the draft's entropy ``h_q_raw <= threshold`` (nats);
- ``adaedl`` (Agrawal et al., 2024): the entropy lower bound on acceptance ``1 - sqrt(gamma_c H(q)) >= lambda``, i.e.
  the entropy rule at ``H <= (1 - lambda)^2 / gamma_c`` (static bound; the paper also adapts ``lambda`` online);
- ``learned`` (SpecDec++ / DISCO style): a logistic ``P(accepted | reached)`` on draft-side features (position,
  ``H(q)``, ``q_top_prob``, ``log q(x)``) fitted on one split of the prompts; keep drafting while ``prod_{j<=i} p_hat_j
  >= threshold`` (the whole block so far accepted).

**Grids** are the signal's quantiles on the trace plus the two degenerate values (never stops: ``fixed max_gamma``;
stops after one token: ``fixed 1``), so an optimum at a grid end is a degenerate rule (:func:`edge_check`).
Thresholds are chosen on training prompts and scored on held-out ones (:func:`split_prompts`), for every rule.
:func:`study` (:class:`StudyConfig`) does it all for one trace: split, classifier, grids, chosen rules with held-out
scores, every grid point on the whole trace. :func:`chosen_configs` turns chosen rules into runnable ``RunConfig``;
:func:`replay_vs_run` compares a replay with its run: the run's decisions replayed exactly (must hold), ``tau``
within a stated tolerance, the speedup against the run's interval. **Limit:** the replay keeps the trace's block
boundaries, the run starts each block where the last stopped; with a signal autocorrelated along the text a stopping
rule meets a hard stretch at the start of several short blocks, so its run drafts fewer tokens per step and ``tau``
falls below the replay (reported, not hidden). **Costs:** a step costs ``g c + r(g) + o`` target steps
(:func:`spade_lib.theory.step_cost`), ``o`` the pair's measured loop overhead (``overhead``, default 0: the paper's).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize

from spade_lib.decoding.drafts.policies import Policy, get_policy
from spade_lib.decoding.records import STEP_KEYS
from spade_lib.whatif import replay
from spade_lib.whatif.align import measured_tau

SIGNAL = {"confidence": "q_top_prob", "entropy": "h_q_raw"}
FEATURES = ("pos", "h_q_raw", "q_top_prob", "log_q_x")
_LEARNED = "_learned_signal"


def split_prompts(trace: pd.DataFrame, frac: float = 0.5, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, test): the trace's prompts shuffled with ``seed``, the first ``frac`` of them train."""
    if not 0 < frac < 1:
        raise ValueError(f"frac must lie in (0, 1), got {frac!r}")
    ids = np.array(sorted(trace["prompt_id"].astype(str).unique()))
    if len(ids) < 2:
        raise ValueError(f"trace: need at least 2 prompts to split, got {len(ids)}")
    rng = np.random.default_rng(seed)
    ids = ids[rng.permutation(len(ids))]
    n_train = min(max(1, int(round(frac * len(ids)))), len(ids) - 1)
    train = trace["prompt_id"].astype(str).isin(set(ids[:n_train]))
    return trace[train], trace[~train]


def signal_grid(trace: pd.DataFrame, policy: str, points: int = 12) -> list[float]:
    """Thresholds for ``policy`` ("confidence" or "entropy"): quantiles of its signal on ``trace``
    plus both degenerate ends (see the module docstring)."""
    if policy not in SIGNAL:
        raise ValueError(f"policy must be one of {sorted(SIGNAL)}, got {policy!r}")
    if isinstance(points, bool) or not isinstance(points, int) or points < 2:
        raise ValueError(f"points must be an integer >= 2, got {points!r}")
    x = trace[SIGNAL[policy]].to_numpy(np.float64)
    x = x[np.isfinite(x)]
    qs = np.quantile(x, np.linspace(0.02, 0.98, points)) if len(x) else np.zeros(0)
    if len(x) > 1:  # midway between observed values: a float32 recomputation cannot land on the other side
        u = np.unique(x)
        i = np.clip(np.searchsorted(u, qs), 0, len(u) - 2)
        qs = (u[i] + u[i + 1]) / 2
    if policy == "confidence":  # >= 0 always passes (never stops); > max never passes
        ends = [0.0, float(x.max()) + 1e-6 if len(x) else 1.0]
    else:  # H <= max always passes; H <= -1 never does
        ends = [-1.0, float(x.max()) + 1e-6 if len(x) else 20.0]
    return sorted({float(v) for v in [*qs, *ends]})


def adaedl_threshold(lam: float, gamma_c: float = 1.0) -> float:
    """The entropy threshold of AdaEDL's static rule: ``1 - sqrt(gamma_c H) >= lam`` iff
    ``H <= (1 - lam)^2 / gamma_c``."""
    if not 0 <= lam < 1:
        raise ValueError(f"lam must lie in [0, 1), got {lam!r}")
    if gamma_c <= 0:
        raise ValueError(f"gamma_c must be > 0, got {gamma_c!r}")
    return (1.0 - lam) ** 2 / gamma_c


def _features(trace: pd.DataFrame) -> np.ndarray:
    q = trace["q_x_raw"] if "q_x_raw" in trace.columns else trace["q_x"]
    cols = {"pos": trace["pos"], "h_q_raw": trace["h_q_raw"], "q_top_prob": trace["q_top_prob"],
            "log_q_x": np.log(np.clip(q.to_numpy(np.float64), 1e-12, 1.0))}
    return np.column_stack([np.asarray(cols[f], dtype=np.float64) for f in FEATURES])


@dataclass
class LearnedStop:
    """Logistic ``P(accepted | reached)`` on draft-side features, standardised (``fit`` / ``predict``)."""

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray  # intercept first
    n_train: int

    @classmethod
    def fit(cls, trace: pd.DataFrame, l2: float = 1e-2) -> "LearnedStop":
        """Fit on the reached rows of ``trace`` (L2-penalised maximum likelihood, L-BFGS)."""
        reached = trace[trace["reached"].astype(bool)]
        if len(reached) < 10 or reached["accepted"].nunique() < 2:
            raise ValueError("trace: need >= 10 reached rows with both outcomes to fit a stop classifier")
        X = _features(reached)
        mean, scale = X.mean(0), X.std(0)
        scale = np.where(scale > 0, scale, 1.0)
        Z = np.column_stack([np.ones(len(X)), (X - mean) / scale])
        y = reached["accepted"].to_numpy(np.float64)

        def loss(w):
            z = Z @ w
            nll = np.sum(np.logaddexp(0.0, z) - y * z) / len(y) + l2 * np.sum(w[1:] ** 2)
            p = 1.0 / (1.0 + np.exp(-z))
            grad = Z.T @ (p - y) / len(y)
            grad[1:] += 2 * l2 * w[1:]
            return nll, grad

        res = optimize.minimize(loss, np.zeros(Z.shape[1]), jac=True, method="L-BFGS-B")
        return cls(mean, scale, res.x, len(y))

    def predict(self, trace: pd.DataFrame) -> np.ndarray:
        """``p_hat`` per row of ``trace``."""
        Z = np.column_stack([np.ones(len(trace)), (_features(trace) - self.mean) / self.scale])
        return 1.0 / (1.0 + np.exp(-(Z @ self.coef)))

    def signal(self, trace: pd.DataFrame) -> np.ndarray:
        """Per row: ``prod_{j <= pos} p_hat_j`` within its step (the block-survival probability)."""
        df = trace[STEP_KEYS + ["pos"]].copy()
        df["lp"] = np.log(np.clip(self.predict(trace), 1e-12, 1.0))
        df = df.sort_values(STEP_KEYS + ["pos"], kind="stable")
        df["cum"] = np.exp(df.groupby(STEP_KEYS, sort=False)["lp"].cumsum())
        return df["cum"].reindex(trace.index).to_numpy()

    def auc(self, trace: pd.DataFrame) -> float:
        """Held-out AUC of ``p_hat`` on the reached rows of ``trace`` (0.5: chance)."""
        from scipy.stats import mannwhitneyu

        r = trace[trace["reached"].astype(bool)]
        y = r["accepted"].to_numpy(bool)
        if y.all() or not y.any():
            return float("nan")
        p = self.predict(r)
        return float(mannwhitneyu(p[y], p[~y]).statistic / (y.sum() * (~y).sum()))


# the thresholds each policy accepts; a grid end beyond them never passes: the rule drafts one token
_RANGE = {"confidence": (0.0, 1.0), "entropy": (0.0, math.inf)}


def _policy(policy: str, gamma: int, threshold: float) -> Policy:
    if policy == "fixed":
        return get_policy("fixed", gamma=int(gamma))
    return get_policy(policy, max_gamma=int(gamma), threshold=float(threshold))


def _replay(trace, policy, gamma, threshold, c, verify_cost, by, *, name=None, shown=None, overhead=0.0):
    lo, hi = _RANGE.get(policy, (-math.inf, math.inf))
    if lo <= threshold <= hi:
        out = replay.replay_stop_rule(trace, _policy(policy, gamma, threshold), c, verify_cost, by, overhead=overhead)
        out["threshold"] = float(threshold)  # fixed: the 0.0 it was called with (a Policy has none)
    else:  # the degenerate "always stop after one token" end: exactly fixed gamma 1
        out = replay.replay_stop_rule(trace, _policy("fixed", 1, 0.0), c, verify_cost, by, overhead=overhead)
        out["policy"], out["gamma"], out["threshold"] = policy, int(gamma), float(threshold)
        out["label"] = f"{policy} {threshold:.3g} (<= {gamma})"
    if name is not None:
        out["policy"] = name
        out["threshold"] = shown
        out["label"] = f"{name} {shown:.3g} (<= {gamma})"
    return out


def frontier(trace: pd.DataFrame, c: float, verify_cost: float | Callable[[int], float], *, max_gamma: int,
             grids: dict[str, Sequence[float]], learned: LearnedStop | None = None, gamma_c: float = 1.0,
             by: Sequence[str] = (), overhead: float = 0.0) -> pd.DataFrame:
    """Every rule of the study replayed on ``trace``: fixed ``1..max_gamma`` and each threshold of
    ``grids`` (keys ``"confidence"``, ``"entropy"``, ``"adaedl"`` (lambdas), ``"learned"``); a step
    costs ``g c + r(g) + overhead``."""
    kw = dict(overhead=overhead)
    rows = [_replay(trace, "fixed", g, 0.0, c, verify_cost, by, **kw) for g in range(1, max_gamma + 1)]
    for policy in ("confidence", "entropy"):
        rows += [_replay(trace, policy, max_gamma, t, c, verify_cost, by, **kw) for t in grids.get(policy, ())]
    for lam in grids.get("adaedl", ()):
        rows.append(_replay(trace, "entropy", max_gamma, adaedl_threshold(lam, gamma_c), c, verify_cost, by,
                            name="adaedl", shown=float(lam), **kw))
    if learned is not None and grids.get("learned"):
        t = trace.copy()
        t["q_top_prob"] = learned.signal(trace)  # the learned signal, read by the confidence replay
        for th in grids["learned"]:
            rows.append(_replay(t, "confidence", max_gamma, th, c, verify_cost, by, name="learned", shown=float(th),
                                **kw))
    return pd.concat(rows, ignore_index=True)


def best(front: pd.DataFrame, by: Sequence[str] = (), column: str = "speedup") -> pd.DataFrame:
    """Per group and policy, the grid point with the highest ``column`` (smallest threshold on ties)."""
    keys = [*by, "policy"]
    idx = front.groupby(keys, sort=True)[column].idxmax()
    return front.loc[idx].reset_index(drop=True)


def edge_check(front: pd.DataFrame, chosen: pd.DataFrame, max_gamma: int) -> pd.DataFrame:
    """Per policy: whether the chosen grid point is at an end of its grid, and if so whether that end
    is a degenerate rule (it drafts ``max_gamma`` every step, or 1). ``suspicious`` = at an end that is
    not degenerate: the grid is too narrow and must be widened. For ``fixed``, ``max_gamma`` is the
    edge (the trace cannot show longer blocks)."""
    out = []
    for _, row in chosen.iterrows():
        policy = row["policy"]
        grid = front[front["policy"] == policy]
        if policy == "fixed":
            at_edge = int(row["gamma"]) == max_gamma and int(row["g_mean"] + 0.5) >= max_gamma - 1
            out.append({"policy": policy, "chosen": row["label"], "at_edge": at_edge, "degenerate": False,
                        "suspicious": at_edge})
            continue
        values = grid["threshold"].to_numpy(np.float64)
        at_end = row["threshold"] in (values.min(), values.max())
        g_mean = float(row["g_mean"])
        fixed_max = front[(front["policy"] == "fixed") & (front["gamma"] == max_gamma)]["g_mean"]
        degenerate = bool(abs(g_mean - 1.0) < 1e-9 or (len(fixed_max) and abs(g_mean - float(fixed_max.iloc[0])) < 1e-9))
        out.append({"policy": policy, "chosen": row["label"], "at_edge": bool(at_end), "degenerate": degenerate,
                    "suspicious": bool(at_end and not degenerate)})
    return pd.DataFrame(out)


def evaluate(front_train: pd.DataFrame, test: pd.DataFrame, c: float, verify_cost, *, max_gamma: int,
             learned: LearnedStop | None = None, gamma_c: float = 1.0, overhead: float = 0.0) -> pd.DataFrame:
    """The best rule of each policy on the training prompts, replayed on the held-out ``test`` trace."""
    chosen = best(front_train)
    rows = []
    for _, r in chosen.iterrows():
        grids = {}
        if r["policy"] == "fixed":
            one = _replay(test, "fixed", int(r["gamma"]), 0.0, c, verify_cost, (), overhead=overhead)
        else:
            grids[r["policy"]] = [float(r["threshold"])]
            one = frontier(test, c, verify_cost, max_gamma=max_gamma, grids=grids, learned=learned, gamma_c=gamma_c,
                           overhead=overhead)
            one = one[one["policy"] == r["policy"]]
        rows.append(one.assign(speedup_train=float(r["speedup"])))
    return pd.concat(rows, ignore_index=True)


# ---------------------------------------------------------------- the study of one trace

@dataclass(frozen=True)
class StudyConfig:
    """How :func:`study` chooses and scores the rules on a ``max_gamma`` trace."""

    max_gamma: int                   # the trace's fixed draft length: the longest block a rule may draft
    grid_points: int = 12            # quantile points of each data-driven grid (plus its two degenerate ends)
    adaedl_lambdas: tuple[float, ...] = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)  # AdaEDL's grid on its bound
    gamma_c: float = 0.1             # AdaEDL's constant in its bound 1 - sqrt(gamma_c H(q))
    train_frac: float = 0.5          # share of the prompts the thresholds and the classifier are chosen on
    seed: int = 0                    # seed of the prompt split


@dataclass
class StopStudy:
    """One trace's stop-rule study (:func:`study`): the split, the learned rule, the grids, the rules
    chosen on the training prompts and their scores on the held-out ones."""

    train: pd.DataFrame              # the training prompts' rows
    test: pd.DataFrame               # the held-out prompts' rows
    model: LearnedStop | None        # the learned rule (None: nothing to learn, see no_model)
    no_model: str | None             # why there is no learned rule
    grids: dict[str, list[float]]    # the threshold grid of each policy
    front_train: pd.DataFrame        # every grid point replayed on the training prompts
    chosen: pd.DataFrame             # best(front_train): each policy's rule
    edges: pd.DataFrame              # edge_check of the chosen rules
    held_out: pd.DataFrame           # evaluate(): the chosen rules on the held-out prompts
    front: pd.DataFrame              # every grid point replayed on the whole trace
    auc: float                       # the learned rule's held-out AUC (NaN without one)


def learned_grid(model: LearnedStop, train: pd.DataFrame, points: int) -> list[float]:
    """Thresholds for the learned rule: quantiles of its signal on ``train`` (rounded to 6 digits) and
    its degenerate ends 0 (never stops) and just above 1 (always stops after one token)."""
    sig = model.signal(train)
    return sorted({0.0, 1.000001, *np.round(np.quantile(sig, np.linspace(0.02, 0.98, points)), 6)})


def study(trace: pd.DataFrame, c: float, verify_cost: float | Callable[[int], float],
          config: StudyConfig, overhead: float = 0.0) -> StopStudy:
    """The stop-rule study of one ``max_gamma`` trace (module docstring): split its prompts
    (:func:`split_prompts`), fit the learned rule on the training half, build every policy's grid from
    the training half, choose each policy's best rule there (:func:`best`, :func:`edge_check`), score
    the chosen rules on the held-out half (:func:`evaluate`), and replay every grid point on the whole
    trace. ``c``, ``verify_cost`` (``r(g)``) and the loop ``overhead`` ``o`` price a step ``g c + r(g) + o``."""
    train, test = split_prompts(trace, config.train_frac, seed=config.seed)
    try:
        model, no_model = LearnedStop.fit(train), None
        grid = learned_grid(model, train, config.grid_points)
    except ValueError as e:  # e.g. every training position accepted: nothing to learn
        model, no_model, grid = None, str(e), []
    grids = {"confidence": signal_grid(train, "confidence", config.grid_points),
             "entropy": signal_grid(train, "entropy", config.grid_points),
             "adaedl": list(config.adaedl_lambdas), "learned": grid}
    kw = dict(max_gamma=config.max_gamma, learned=model, gamma_c=config.gamma_c, overhead=overhead)
    front_train = frontier(train, c, verify_cost, grids=grids, **kw)
    chosen = best(front_train)
    return StopStudy(train=train, test=test, model=model, no_model=no_model, grids=grids, front_train=front_train,
                     chosen=chosen, edges=edge_check(front_train, chosen, config.max_gamma),
                     held_out=evaluate(front_train, test, c, verify_cost, **kw),
                     front=frontier(trace, c, verify_cost, grids=grids, **kw),
                     auc=model.auc(test) if model is not None else float("nan"))


def studies(traces: Mapping[float, pd.DataFrame], c: float, verify_cost: float | Callable[[int], float],
            config: StudyConfig, overhead: float = 0.0) -> dict[float, StopStudy]:
    """:func:`study` of each temperature's ``max_gamma`` trace (``traces``: temperature -> trace, one row per
    drafted token recorded at a fixed ``max_gamma``), with the same ``c``, ``r(g)``, loop ``overhead`` ``o`` (a
    step of ``g`` drafts costs ``g c + r(g) + o`` target steps) and settings; in the order of ``traces``."""
    return {T: study(t, c, verify_cost, config, overhead=overhead) for T, t in traces.items()}


def stacked(found: Mapping[float, StopStudy], field: str) -> pd.DataFrame:
    """One table of the studies' ``field`` (``"edges"``, ``"held_out"``, ``"front"``, ...), a column ``T``
    (the temperature) added, in the order of ``found``."""
    return pd.concat([getattr(s, field).assign(T=T) for T, s in found.items()], ignore_index=True)


# ---------------------------------------------------------------- the chosen rules, run for real

def chosen_configs(chosen: pd.DataFrame, base, *, max_gamma: int, gamma_c: float = 1.0) -> dict:
    """``{policy: RunConfig}``: each chosen rule (a row of :func:`best`) as the decoder runs it,
    ``base`` (a ``spade_lib.runs.config.RunConfig``) with the rule's fields replaced. ``fixed`` sets
    ``gamma``; ``confidence`` and ``entropy`` set ``policy``, ``threshold`` and ``max_gamma``; AdaEDL's
    static rule runs as the entropy policy at :func:`adaedl_threshold`. A degenerate grid end is clipped
    to the range the decoder's policies accept (confidence ``[0, 1]``, entropy ``>= 0``), which makes
    the same decisions. The learned rule has no decoder policy and is left out."""
    out = {}
    for _, row in chosen.iterrows():
        policy = row["policy"]
        if policy == "fixed":
            out["fixed"] = dataclasses.replace(base, gamma=int(row["gamma"]))
        elif policy in ("confidence", "entropy", "adaedl"):
            th = adaedl_threshold(float(row["threshold"]), gamma_c) if policy == "adaedl" else float(row["threshold"])
            th = min(max(th, 0.0), 1.0) if policy == "confidence" else max(th, 0.0)
            out[policy] = dataclasses.replace(base, max_gamma=max_gamma, threshold=th,
                                              policy="confidence" if policy == "confidence" else "entropy")
    return out


def replay_vs_run(front: pd.DataFrame, chosen: pd.DataFrame, policy: str, run_trace: pd.DataFrame,
                  measured: pd.Series, run_policy: Policy | None = None) -> dict:
    """A chosen rule's replay on the whole trace against its real run: ``tau`` replayed vs measured
    (full-length blocks, :func:`spade_lib.whatif.align.measured_tau`) and the speedup replayed vs
    measured (``measured``: the run's row of ``spade_lib.runs.protocol.speedup_table``).
    ``within_tolerance``: ``|tau_replayed - tau_run| < 4 sqrt(se_run^2 + se_pred^2) + 0.05``, with the
    replay's rough standard error ``se_pred = (g + 1) / sqrt(12 steps)`` (tokens per step in ``[1, g + 1]``);
    it can fail without a bug where the replay's fixed block boundaries meet an autocorrelated signal
    (module docstring). ``decisions_replayed`` (with ``run_policy``, the policy the run drafted with):
    the share of the run's steps whose draft length the policy's replay form gives back from the run's
    own signals, :meth:`~spade_lib.decoding.drafts.policies.Policy.replay_gamma`; anything below 1 is a bug
    (the decoder and the replay read the signals differently)."""
    row = chosen[chosen.policy == policy].iloc[0]
    same = (front.policy == policy) & (front.gamma == row["gamma"]) & (front.threshold == row["threshold"])
    replayed = front[same].iloc[0]  # the chosen grid point (labels round thresholds), on every prompt
    tau_run, se, _ = measured_tau(run_trace)
    n_rep = int(replayed["steps"])
    se_pred = float(np.sqrt((replayed["g_mean"] + 1) ** 2 / 12 / max(n_rep, 1)))
    out = {"policy": policy, "rule": row["label"], "tau_replayed": replayed["tau"], "tau_run": tau_run,
           "se_run": se, "g_replayed": replayed["g_mean"], "g_run": measured["mean_drafted"],
           "speedup_replayed": replayed["speedup"], "speedup_run": measured["speedup"],
           "speedup_low": measured["speedup_low"], "speedup_high": measured["speedup_high"],
           "within_tolerance": abs(replayed["tau"] - tau_run) < 4 * np.hypot(se, se_pred) + 0.05}
    if run_policy is not None:
        out["decisions_replayed"] = decisions_replayed(run_trace, run_policy)
    return out


def decisions_replayed(run_trace: pd.DataFrame, run_policy: Policy) -> float:
    """The share of ``run_trace``'s steps (a run drafted with ``run_policy``) whose draft length the
    run's own signals give back: every drafted position but the last kept drafting
    (:meth:`~spade_lib.decoding.drafts.policies.Policy.replay_gamma` equals the recorded ``gamma``) and the
    last one stopped, unless the block reached ``max_gamma`` or the token budget (a block whose end
    ``abs_pos + gamma + 1`` is its generation's furthest is taken as capped by the budget).
    1.0: the decoder's decisions and the replay's agree everywhere."""
    df = run_trace.sort_values([*STEP_KEYS, "pos"], kind="stable")
    if not len(df):
        return 1.0
    steps = df.groupby(STEP_KEYS, sort=False).agg(gamma=("gamma", "first"), start=("abs_pos", "first"))
    steps["keep_last"] = pd.Series(run_policy.keep_mask(df), index=df.index).groupby(
        [df[k] for k in STEP_KEYS], sort=False).last().to_numpy()
    end = steps["start"] + steps["gamma"] + 1
    capped = end == end.groupby(level=[k for k in STEP_KEYS if k != "step"], sort=False).transform("max")
    recorded = steps["gamma"].to_numpy().astype(int)
    stopped = ~steps["keep_last"].to_numpy(bool) | (recorded >= run_policy.max_gamma) | capped.to_numpy(bool)
    return float(np.mean((run_policy.replay_gamma(df) == recorded) & stopped))
