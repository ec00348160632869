"""Speculative decoding metrics, each named and defined once.

Notation (Leviathan et al., 2023): a *step* drafts ``gamma`` tokens with ``q``, verifies them in one forward of ``p``,
accepts a prefix of ``n <= gamma`` and adds the residual (first rejection) or *bonus* token ``~ p``: ``n + 1`` tokens.
Inputs: a **trace** (``spade_lib.runs.trace``, one row per drafted token: ``reached``, ``accepted``, ``n_accepted``,
``tv``, ``t_draft`` ...; ``gamma = 0`` steps have no rows) or a **summary** (``summary.jsonl``, Spec-Bench's shape:
one row per generation ``question_id, category, sample``; ``new_tokens`` emitted after truncation and stop tokens,
``wall_time`` s (median of timed repeats), ``accept_lengths`` ``n + 1`` per step before truncation, all 1 for AR,
``[]`` for HF generate). Sums run over the rows passed in; ``s_AR = sum wall_time_AR / sum new_tokens_AR`` (prefill in).

- ``acceptance_rate`` ``sum(accepted) / sum(reached)`` (or ``/ n_drafted``, ``over="drafted"``; every rate is
  defined in :mod:`spade_lib.rates`); ``mean_accepted_length`` ``tau = mean_steps (n + 1)`` over a summary, each
  step weight 1 (``tau_no_bonus = mean n``; :func:`spade_lib.measures.tau`); ``tau_drafting_steps`` the same over
  a trace's steps only, ``>= tau``; ``block_efficiency`` ``sum(new_tokens) / sum(steps)`` (Chen et al., 2023);
- ``tokens_per_second`` ``sum(new_tokens) / sum(wall_time)``; ``speedup_ratio_of_totals`` ``tps(method) /
  tps(baseline)``; ``speedup_mean_of_ratios`` ``mean_g [tps_g(method) / tps_g(baseline)]`` over generations ``g``;
  ``bootstrap_speedup``, ``bootstrap_acceptance``: percentile bootstrap intervals, prompts (and timed rounds)
  resampled; ``decode_phase``: the generations less their prompts' prefills (the decode phase's speedup); ``paired_alpha_difference`` ``alpha_a - alpha_b`` of two runs, prompts resampled jointly;
- ``cost_ratio`` ``c_trace = (sum t_draft / n_drafted) / s_AR``, ``verify_cost_ratio`` ``r_trace = mean t_verify /
  s_AR`` (``trace_costs``: both; run-timing estimates, the measurement is :mod:`spade_lib.decoding.studies.costs`);
  ``predicted_speedup`` Thm. 3.8 with verify and loop cost, ``(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + r + o))``
  (per-step drafted counts: ratio of expected totals; ``prefill``: added to both); ``prefill_steps`` ``(P_AR, P_run)``.

**Truncated final block.** Acceptance metrics and ``tau`` count every verification as it happened; throughput, block
efficiency and speedups count only emitted ``new_tokens``, like the baselines (equal counts at ``max_new_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from spade_lib import measures, rates, theory
from spade_lib.decoding.records import STEP_KEYS

GENERATION_KEYS = ["question_id", "sample"]


def _require(df: pd.DataFrame, columns: Sequence[str], arg: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{arg} lacks column(s) {missing}; has {list(df.columns)}")


def _nonempty(n: float, what: str) -> None:
    if n == 0:
        raise ValueError(f"{what}: nothing to average over (empty selection)")


def acceptance_rate(trace: pd.DataFrame, over: str = "reached") -> float:
    """:func:`spade_lib.rates.alpha` (``over="reached"``: accepted / judged) or
    :func:`spade_lib.rates.acceptance_per_drafted` (``"drafted"``) of the trace's :func:`spade_lib.rates.counts`."""
    _require(trace, ["accepted", "reached"], "trace")
    if over not in ("reached", "drafted"):
        raise ValueError(f"over must be 'reached' or 'drafted', got {over!r}")
    c = rates.counts(trace).iloc[0]
    _nonempty(int(c[over]), f"acceptance_rate(over={over!r})")
    return rates.alpha(c["accepted"], c["reached"]) if over == "reached" else \
        rates.acceptance_per_drafted(c["accepted"], c["drafted"])


def steps(trace: pd.DataFrame) -> pd.DataFrame:
    """One row per verification step (that drafted at least one token): step-level columns."""
    _require(trace, STEP_KEYS + ["gamma", "n_accepted"], "trace")
    cols = [c for c in ["category", "gamma", "n_accepted", "next_token", "t_draft", "t_verify",
                        "t_overhead"] if c in trace.columns]
    return trace.groupby(STEP_KEYS, sort=True)[cols].first().reset_index()


def mean_accepted_length(frame: pd.DataFrame, with_bonus: bool = True) -> float:
    """``tau``: mean over steps of ``n + 1`` (``with_bonus``) or ``n`` (:func:`spade_lib.measures.tau`).

    ``frame`` is a summary with ``accept_lengths`` (every step, ``n + 1`` each). A trace (no
    ``accept_lengths``) gives :func:`tau_drafting_steps`, its steps being only those that drafted.
    """
    if "accept_lengths" not in frame.columns:
        return tau_drafting_steps(frame, with_bonus=with_bonus)
    lengths = np.concatenate([np.asarray(a, dtype=np.float64) for a in frame["accept_lengths"]] or [np.zeros(0)])
    _nonempty(len(lengths), "mean_accepted_length")
    return float(measures.tau(lengths.sum() - len(lengths), len(lengths), with_bonus=with_bonus))


def tau_drafting_steps(trace: pd.DataFrame, with_bonus: bool = True) -> float:
    """``tau_drafting_steps``: :func:`spade_lib.measures.tau` over the trace's steps, the steps that drafted
    at least one token (a step that drafted nothing has no trace rows); ``tau`` of a run counts every step
    (:func:`mean_accepted_length` of its summary)."""
    n = steps(trace)["n_accepted"].to_numpy(dtype=np.float64)
    _nonempty(len(n), "tau_drafting_steps")
    return float(measures.tau(n.sum(), len(n), with_bonus=with_bonus))


def block_efficiency(summary: pd.DataFrame) -> float:
    """``sum(new_tokens) / sum(len(accept_lengths))``: emitted tokens per target verification
    (:func:`spade_lib.measures.tau` of the emitted tokens, ``accepted = new_tokens - steps``)."""
    _require(summary, ["new_tokens", "accept_lengths"], "summary")
    n_steps = int(sum(len(a) for a in summary["accept_lengths"]))
    _nonempty(n_steps, "block_efficiency")
    return float(measures.tau(float(summary["new_tokens"].sum()) - n_steps, n_steps))


def tokens_per_second(summary: pd.DataFrame, per_generation: bool = False) -> float | pd.Series:
    """``sum(new_tokens) / sum(wall_time)``, or ``new_tokens / wall_time`` per generation."""
    _require(summary, ["new_tokens", "wall_time"], "summary")
    if (summary["wall_time"] <= 0).any():
        raise ValueError("summary: wall_time must be positive")
    if per_generation:
        return summary["new_tokens"] / summary["wall_time"]
    _nonempty(len(summary), "tokens_per_second")
    return float(summary["new_tokens"].sum() / summary["wall_time"].sum())


def _paired(method: pd.DataFrame, baseline: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Method and baseline rows of the same generations, in the same order."""
    for name, df in (("method", method), ("baseline", baseline)):
        _require(df, GENERATION_KEYS + ["new_tokens", "wall_time"], name)
    m = method.set_index(GENERATION_KEYS).sort_index()
    b = baseline.set_index(GENERATION_KEYS).sort_index()
    if not m.index.equals(b.index):
        only_m = sorted(map(str, m.index.difference(b.index)))[:5]
        only_b = sorted(map(str, b.index.difference(m.index)))[:5]
        raise ValueError(
            f"method and baseline must cover the same (question_id, sample) generations; "
            f"only in method: {only_m}, only in baseline: {only_b}"
        )
    return m, b


def speedup_ratio_of_totals(method: pd.DataFrame, baseline: pd.DataFrame) -> float:
    """``tokens_per_second(method) / tokens_per_second(baseline)`` over the same generations."""
    m, b = _paired(method, baseline)
    return tokens_per_second(m) / tokens_per_second(b)


def speedup_mean_of_ratios(method: pd.DataFrame, baseline: pd.DataFrame) -> float:
    """``mean_g [tps_g(method) / tps_g(baseline)]`` over the same generations ``g``."""
    m, b = _paired(method, baseline)
    return float((tokens_per_second(m, True) / tokens_per_second(b, True)).mean())


def _round_times(m: pd.DataFrame, b: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-round times ``(G, R)`` of method and baseline when both frames carry ``wall_times`` with the
    same number ``R >= 2`` of rounds for every generation; else None."""
    if "wall_times" not in m.columns or "wall_times" not in b.columns:
        return None
    try:
        tm = [np.asarray(x, dtype=np.float64).ravel() for x in m["wall_times"]]
        tb = [np.asarray(x, dtype=np.float64).ravel() for x in b["wall_times"]]
    except (TypeError, ValueError):
        return None
    lengths = {len(x) for x in tm + tb}
    if len(lengths) != 1 or lengths.pop() < 2:
        return None
    tm, tb = np.stack(tm), np.stack(tb)
    if not (np.isfinite(tm).all() and np.isfinite(tb).all() and (tm > 0).all() and (tb > 0).all()):
        raise ValueError("method/baseline: wall_times must be finite and positive")
    return tm, tb


def bootstrap_speedup(method: pd.DataFrame, baseline: pd.DataFrame, *, n_boot: int = 2000, level: float = 0.95,
                      seed: int = 0, by: str | None = "question_id", rounds: bool = True
                      ) -> dict[str, float | bool]:
    """Speedup of ``method`` over ``baseline`` with percentile bootstrap intervals.

    The unit resampled is the prompt (``by="question_id"``: all samples of a prompt move together,
    since they share its length and difficulty) or the generation (``by=None``). For each of
    ``n_boot`` resamples both estimators are recomputed on the same units:

    - ``ratio_of_totals`` ``= (sum N_m / sum t_m) / (sum N_b / sum t_b)`` (long generations weigh more),
    - ``mean_of_ratios`` ``= mean_g (N_m,g / t_m,g) / (N_b,g / t_b,g)`` (every generation weighs 1),

    and ``*_low`` / ``*_high`` are the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles.

    **Two levels** (``rounds=True``, the default, when both frames carry ``wall_times``: every
    generation's ``R >= 2`` timed rounds, paired by round as :mod:`spade_lib.runs.protocol` times them,
    round ``k`` of every session member one after the other): each resample also redraws ``R`` round
    indices for every drawn copy of a generation, with replacement and the same indices for method
    and baseline (the usual two-stage bootstrap: clusters, then units within each drawn cluster), and uses
    the medians of the redrawn rounds as ``t_m,g`` and ``t_b,g`` (the point estimate uses the medians
    of all rounds, ``wall_time``). The interval then carries the round-to-round timing noise as well as
    the prompt-to-prompt spread; with prompts alone, a suite of two prompts has three distinct
    resamples and an "interval" that is only the gap between two prompts' ratios. ``rounds`` in the
    result is ``R`` (0 when only prompts were resampled).

    **Which estimator, and why one stall cannot move it.** The headline speedup is ``ratio_of_totals``:
    the same work (every generation, the same tokens for method and baseline) over the time it took,
    so it answers "how much faster is this suite", and a long generation weighs what it costs. Its
    weakness is that one spoiled reading is a large share of a short run's total (a 2.5 s stall in a
    12-prompt run of 0.2 s generations is half of it). The protocol therefore re-times every stalled
    reading before it reaches this function (:mod:`spade_lib.runs.protocol`, 2b;
    :class:`spade_lib.runs.timing.StallRule`): the totals are then sums over clean readings of the same
    generations, still a ratio of the same work, not a trimmed or re-weighted one, and the summary's
    ``stalls`` says how many readings were taken again. A median of per-prompt ratios would also resist
    one stall, but it answers another question (the typical prompt, not the suite) and is not the
    ratio of the work done; ``mean_of_ratios`` is kept beside the headline as the per-prompt view.

    ``disagree`` is True when the two intervals do not overlap: the estimators then answer different
    questions on these data (a few generations with unusual timings dominate one of them), and a
    single number should not be reported without saying which.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be an integer >= 1, got {n_boot!r}")
    m, b = _paired(method, baseline)
    if (m["wall_time"] <= 0).any() or (b["wall_time"] <= 0).any():
        raise ValueError("method/baseline: wall_time must be positive")
    nm, tm = m["new_tokens"].to_numpy(np.float64), m["wall_time"].to_numpy(np.float64)
    nb, tb = b["new_tokens"].to_numpy(np.float64), b["wall_time"].to_numpy(np.float64)
    _nonempty(len(nm), "bootstrap_speedup")
    ratio = (nm / tm) / (nb / tb)
    if by is None:
        unit = np.arange(len(nm))
    else:
        if by not in m.index.names:
            raise ValueError(f"by must be None or one of {GENERATION_KEYS}, got {by!r}")
        unit = pd.factorize(m.index.get_level_values(by))[0]
    n_units = int(unit.max()) + 1
    per_round = _round_times(m, b) if rounds else None
    n_rounds = 0 if per_round is None else per_round[0].shape[1]
    rm, rb = per_round if per_round is not None else (tm[:, None], tb[:, None])
    # unit u's generations, padded with a dummy generation G (weight 0): members[u, k]
    G = len(nm)
    counts = np.bincount(unit, minlength=n_units)
    order = np.argsort(unit, kind="stable")
    members = np.full((n_units, int(counts.max())), G)
    members[unit[order], np.arange(G) - np.repeat(np.cumsum(counts) - counts, counts)] = order
    nm_p, nb_p = np.append(nm, 1.0), np.append(nb, 1.0)
    rm_p, rb_p = np.vstack([rm, np.ones((1, rm.shape[1]))]), np.vstack([rb, np.ones((1, rb.shape[1]))])
    rng = np.random.default_rng(seed)
    rot, mor = np.empty(n_boot), np.empty(n_boot)
    chunk = max(1, 2_000_000 // members.size // rm.shape[1])
    for i in range(0, n_boot, chunk):
        k = min(chunk, n_boot - i)
        gens = members[rng.integers(0, n_units, size=(k, n_units))]  # (k, U, width): prompts drawn
        # every drawn copy of a generation redraws its R rounds (same indices for method and baseline)
        pick = rng.integers(0, rm.shape[1], size=gens.shape + (rm.shape[1],))
        t_m = np.median(rm_p[gens[..., None], pick], axis=-1)
        t_b = np.median(rb_p[gens[..., None], pick], axis=-1)
        valid = gens < G
        n_m, n_b = np.where(valid, nm_p[gens], 0.0), np.where(valid, nb_p[gens], 0.0)
        rot[i:i + k] = ((n_m.sum((1, 2)) / np.where(valid, t_m, 0.0).sum((1, 2)))
                        / (n_b.sum((1, 2)) / np.where(valid, t_b, 0.0).sum((1, 2))))
        mor[i:i + k] = (np.where(valid, (nm_p[gens] / t_m) / (nb_p[gens] / t_b), 0.0).sum((1, 2))
                        / valid.sum((1, 2)))
    lo, hi = (1 - level) / 2, (1 + level) / 2
    out: dict[str, float | bool] = {
        "ratio_of_totals": float((nm.sum() / tm.sum()) / (nb.sum() / tb.sum())),
        "ratio_of_totals_low": float(np.quantile(rot, lo)), "ratio_of_totals_high": float(np.quantile(rot, hi)),
        "mean_of_ratios": float(ratio.mean()),
        "mean_of_ratios_low": float(np.quantile(mor, lo)), "mean_of_ratios_high": float(np.quantile(mor, hi)),
        "units": float(n_units), "rounds": float(n_rounds), "level": float(level),
    }
    out["disagree"] = bool(out["ratio_of_totals_high"] < out["mean_of_ratios_low"]
                           or out["mean_of_ratios_high"] < out["ratio_of_totals_low"])
    return out


def decode_phase(frame: pd.DataFrame) -> pd.DataFrame | None:
    """The generations after their prompts' prefills: ``frame`` with ``wall_time`` less ``prefill_time`` (and
    every round of ``wall_times`` less the same ``prefill_time``, the median of the readings' own prefills,
    :mod:`spade_lib.runs.protocol`), so :func:`bootstrap_speedup` of two such frames is the speedup of the
    decode phase, ``(N_m / (t_m - P_m)) / (N_b / (t_b - P_b))``: what a per-step model such as
    ``tau / (gamma c + r + o)`` predicts, and what llama.cpp's own timings report. A speculative run's
    ``P`` holds its draft's prefill too, so that cost leaves its side with the target's. ``None`` where a
    generation recorded no prefill (HF generate hides it); rounds that would not stay positive are left out
    (the prompts alone are then resampled), a generation that would not is ``None``."""
    if not {"prefill_time", "wall_time"} <= set(frame.columns):
        return None
    pre = pd.to_numeric(frame["prefill_time"], errors="coerce")
    if pre.isna().any() or len(frame) == 0:
        return None
    wall = frame["wall_time"].astype(float) - pre.astype(float)
    if not (wall > 0).all():
        return None
    out = frame.assign(wall_time=wall)
    if "wall_times" in frame.columns:
        try:
            rounds = [[float(t) - p for t in np.asarray(ts, dtype=np.float64).ravel()]
                      for ts, p in zip(frame["wall_times"], pre.astype(float))]
        except (TypeError, ValueError):
            rounds = None
        if rounds is None or not all(t > 0 for r in rounds for t in r):
            out = out.drop(columns="wall_times")
        else:
            out["wall_times"] = pd.Series(rounds, index=frame.index, dtype=object)
    return out


def _cluster_sums(frame: pd.DataFrame, key: str, num: pd.Series, den: pd.Series) -> pd.DataFrame:
    return pd.DataFrame({"num": num.to_numpy(np.float64), "den": den.to_numpy(np.float64),
                         "unit": frame[key].astype(str).to_numpy()}).groupby("unit", sort=True).sum()


def _ratio_boot(sums: list[pd.DataFrame], n_boot: int, level: float, seed: int,
                stats: Sequence | None = None) -> list[tuple[float, float]]:
    """Percentile intervals of ``stat(sum num, sum den)`` (default ``sum num / sum den``) for each frame of
    per-unit sums, the same units drawn for every frame (units are aligned on their index; a unit missing
    from a frame adds 0)."""
    units = sorted(set().union(*(s.index for s in sums)))
    rng = np.random.default_rng(seed)
    draw = rng.integers(0, len(units), size=(n_boot, len(units)))
    out = []
    for s, stat in zip(sums, stats or [rates.rate] * len(sums)):
        s = s.reindex(units, fill_value=0.0)
        num, den = s["num"].to_numpy()[draw].sum(1), s["den"].to_numpy()[draw].sum(1)
        vals = np.where(den > 0, stat(num, np.where(den > 0, den, 1.0)), np.nan)
        vals = vals[np.isfinite(vals)]
        lo, hi = (1 - level) / 2, (1 + level) / 2
        out.append((float(np.quantile(vals, lo)), float(np.quantile(vals, hi))) if len(vals) else (np.nan, np.nan))
    return out


def _alpha_sums(trace: pd.DataFrame) -> pd.DataFrame:
    _require(trace, ["prompt_id", "accepted", "reached"], "trace")
    return _cluster_sums(trace, "prompt_id", trace["accepted"].astype(np.float64), trace["reached"].astype(np.float64))


def _drafts_accepted(accept_lengths) -> float:
    """``sum(n)`` over one generation's steps, from its ``accept_lengths`` (``n + 1`` each)."""
    return float((np.asarray(accept_lengths, dtype=np.float64) - 1.0).sum())


def bootstrap_acceptance(trace: pd.DataFrame, summary: pd.DataFrame | None = None, *, n_boot: int = 2000,
                         level: float = 0.95, seed: int = 0) -> dict[str, float]:
    """``alpha`` (accepted / judged) and, with ``summary``, ``tau`` (mean ``n + 1`` per step,
    :func:`spade_lib.measures.tau`) with
    percentile bootstrap intervals over prompts: each resample draws the prompts with replacement and
    recomputes the ratio of sums, so the interval holds the prompt-to-prompt spread (positions of one
    prompt are dependent). Returns ``alpha, alpha_low, alpha_high, tau, tau_low, tau_high, prompts``."""
    if not 0 < level < 1:
        raise ValueError(f"level: must lie in (0, 1), got {level!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot: must be an integer >= 1, got {n_boot!r}")
    a = _alpha_sums(trace)
    out = {"alpha": rates.alpha(a["num"].sum(), a["den"].sum())}
    frames = [a]
    if summary is not None:
        _require(summary, ["question_id", "accept_lengths"], "summary")
        # per prompt: accepted drafts sum(n) and steps
        t = _cluster_sums(summary, "question_id", summary["accept_lengths"].map(_drafts_accepted),
                          summary["accept_lengths"].map(lambda x: float(len(x))))
        out["tau"] = float(measures.tau(t["num"].sum(), t["den"].sum())) if t["den"].sum() > 0 else np.nan
        frames.append(t)
    intervals = _ratio_boot(frames, n_boot, level, seed, stats=[rates.alpha, measures.tau][:len(frames)])
    out["alpha_low"], out["alpha_high"] = intervals[0]
    if summary is not None:
        out["tau_low"], out["tau_high"] = intervals[1]
    out["prompts"] = float(len(set(a.index) | (set(frames[1].index) if summary is not None else set())))
    return out


def paired_alpha_difference(trace_a: pd.DataFrame, trace_b: pd.DataFrame, *, n_boot: int = 4000,
                            level: float = 0.95, seed: int = 0) -> dict[str, float]:
    """``alpha_a - alpha_b`` for two runs over the same prompts (e.g. greedy and sampled), with a
    percentile interval from resampling prompts jointly (both runs' positions of a drawn prompt move
    together) and a two-sided bootstrap p-value ``2 min(P(d* <= 0), P(d* >= 0))``. Returns ``diff,
    low, high, p_value, prompts``; with fewer than 5 common prompts the interval is too coarse to
    mean much (``prompts`` says how many)."""
    a, b = _alpha_sums(trace_a), _alpha_sums(trace_b)
    units = sorted(set(a.index) & set(b.index))
    if not units:
        raise ValueError("trace_a/trace_b: no prompt in common")
    a, b = a.loc[units], b.loc[units]
    rng = np.random.default_rng(seed)
    draw = rng.integers(0, len(units), size=(n_boot, len(units)))
    da = rates.alpha(a["num"].to_numpy()[draw].sum(1), a["den"].to_numpy()[draw].sum(1))
    db = rates.alpha(b["num"].to_numpy()[draw].sum(1), b["den"].to_numpy()[draw].sum(1))
    d = da - db
    diff = rates.alpha(a["num"].sum(), a["den"].sum()) - rates.alpha(b["num"].sum(), b["den"].sum())
    lo, hi = (1 - level) / 2, (1 + level) / 2
    p = float(min(1.0, 2 * min((d <= 0).mean(), (d >= 0).mean())))
    return {"diff": diff, "low": float(np.quantile(d, lo)), "high": float(np.quantile(d, hi)), "p_value": p,
            "prompts": float(len(units))}


def cost_ratio(trace: pd.DataFrame, ar_summary: pd.DataFrame) -> float:
    """``c_trace``: the trace's seconds per drafted token over the AR run's seconds per token (an estimate
    from run timings, not the cost measurement ``c`` of :func:`spade_lib.decoding.studies.costs.measure_costs`).

    ``t_draft`` is step-level (repeated on each row of a step), so it is summed once per step.
    """
    st = steps(trace)
    _require(st, ["t_draft"], "trace")
    _nonempty(len(trace), "cost_ratio")
    per_draft_token = st["t_draft"].sum() / len(trace)
    per_target_step = 1.0 / tokens_per_second(ar_summary)
    return float(per_draft_token / per_target_step)


def verify_cost_ratio(trace: pd.DataFrame, ar_summary: pd.DataFrame) -> float:
    """``r_trace``: the trace's seconds per verification forward (``gamma + 1`` tokens, ``t_verify``, once
    per step) over the AR run's seconds per token (an estimate from run timings, not the cost measurement
    ``r(gamma)`` of :func:`spade_lib.decoding.studies.costs.measure_costs`). Theorem 3.8 assumes ``r = 1``."""
    st = steps(trace)
    _require(st, ["t_verify"], "trace")
    _nonempty(len(st), "verify_cost_ratio")
    return float(st["t_verify"].mean() * tokens_per_second(ar_summary))


def trace_costs(trace: pd.DataFrame, ar_summary: pd.DataFrame) -> dict[str, float]:
    """``{"c_trace": ..., "r_trace": ...}``: :func:`cost_ratio` and :func:`verify_cost_ratio` of one run's trace
    over the AR generations it was timed against (``ar_summary``, e.g. the paired baseline of
    :func:`spade_lib.runs.protocol.paired_baseline`).

    With ``T_AR = sum wall_time_AR / sum new_tokens_AR`` the AR run's seconds per token (prefill included),
    ``c_trace = (sum_s t_draft_s / n_drafted) / T_AR`` and ``r_trace = mean_s t_verify_s / T_AR`` over the
    trace's steps ``s``; ``r_trace`` is NaN for a trace without ``t_verify``. Estimates from run timings, named
    apart from the cost measurement's ``c`` and ``r(g)`` (:func:`spade_lib.decoding.studies.costs.measure_costs`).
    ``trace``: one row per drafted token with ``t_draft`` (and ``t_verify``), step-level; ``ar_summary``:
    ``new_tokens`` and ``wall_time`` per generation."""
    return {"c_trace": cost_ratio(trace, ar_summary),
            "r_trace": verify_cost_ratio(trace, ar_summary) if "t_verify" in trace.columns else float("nan")}


def drafted_per_step(trace: pd.DataFrame, summary: pd.DataFrame) -> np.ndarray:
    """Tokens drafted at every verification step of ``summary``'s generations: the trace's ``gamma``
    where a step drafted, 0 for the steps that drafted nothing (prompt lookup without a match;
    they are in ``accept_lengths`` but have no trace rows)."""
    _require(summary, ["accept_lengths"], "summary")
    n_steps = int(sum(len(a) for a in summary["accept_lengths"]))
    g = steps(trace)["gamma"].to_numpy(np.int64) if len(trace) else np.zeros(0, np.int64)
    if len(g) > n_steps:
        raise ValueError(f"trace has {len(g)} drafting steps but summary only {n_steps} steps")
    return np.concatenate([g, np.zeros(n_steps - len(g), np.int64)])


def ar_step_seconds(baseline: pd.DataFrame) -> float | None:
    """The AR loop's seconds per decode step, prefill excluded: ``(sum wall_time - sum prefill_time) /
    sum new_tokens`` of ``baseline``'s generations; ``None`` where it recorded no prefills (HF baselines,
    runs timed before the ``prefill_time`` column) or the times are not positive (:func:`decode_phase`)."""
    decode = decode_phase(baseline) if "new_tokens" in baseline.columns else None
    n = float(baseline["new_tokens"].sum()) if decode is not None else 0.0
    return float(decode["wall_time"].sum()) / n if n > 0 else None


def loop_costs(trace: pd.DataFrame, baseline: pd.DataFrame, r_table: Callable[[int], float]) -> dict | None:
    """What one run's loop paid per step, in the AR decode steps of the baseline it was timed with
    (``t_AR``, :func:`ar_step_seconds`), from its timed steps (``t_verify``, ``t_overhead``; step-level,
    taken once per step, steps that drafted ``g >= 1``): ``{"verify": sum_s t_verify_s / t_AR, "table":
    sum_s r_table(g_s), "rest": sum_s t_overhead_s / t_AR, "steps": the steps}`` -- sums, so runs pool
    (:func:`spade_lib.runs.protocol.speedup_table` prices a run with its session partners' sums: the
    verification's level ``k = verify / table`` and the loop's bookkeeping per step ``o = rest / steps``).
    ``None`` without prefills in ``baseline`` or step times in ``trace``."""
    t_ar = ar_step_seconds(baseline)
    if t_ar is None or not len(trace) or any(c not in trace.columns for c in ("t_verify", "t_overhead")):
        return None
    st = steps(trace)
    st = st[st["gamma"] >= 1]
    if not len(st) or st[["t_verify", "t_overhead"]].isna().any().any():
        return None
    return {"verify": float(st["t_verify"].sum() / t_ar), "table": float(sum(r_table(int(g)) for g in st["gamma"])),
            "rest": float(st["t_overhead"].sum() / t_ar), "steps": int(len(st))}


def prefill_steps(summary: pd.DataFrame, baseline: pd.DataFrame) -> tuple[float, float] | None:
    """The prompts' prefills of a run and of its AR baseline, in AR decode steps: ``(P_AR, P_run)`` with
    ``P = sum_generations prefill_time / t_AR`` and ``t_AR = (sum wall_time_AR - sum prefill_time_AR) /
    sum new_tokens_AR`` the AR loop's seconds per decode step (prefill excluded). ``None`` where either side
    did not record its prefills (HF baselines, runs timed before the ``prefill_time`` column).

    A measured speedup is a ratio of whole generations' wall times, prefill included, which both sides pay
    (the speculative side also prefills its draft): ``(P_AR + N) / (P_run + sum_s cost_s)`` in AR steps, so a
    prediction of the decode steps alone, ``N / sum_s cost_s``, is pulled towards 1 by the prefill's share
    (SmolLM2 on HumanEval, ~150-token prompts and 48 new tokens: ~0.25 of the AR run's time)."""
    t_ar = ar_step_seconds(baseline)
    if t_ar is None or "prefill_time" not in summary.columns or summary["prefill_time"].isna().any():
        return None
    return (float(baseline["prefill_time"].astype(float).sum() / t_ar),
            float(summary["prefill_time"].astype(float).sum() / t_ar))


def predicted_speedup(alpha: float, gamma: int | Sequence[int] | np.ndarray, c: float,
                      verify_cost: float | Sequence[float] | np.ndarray = 1.0, overhead: float = 0.0,
                      prefill: tuple[float, float] | None = None) -> float:
    """Predicted walltime speedup from measured ``alpha``, ``c``, verify cost ``r`` and loop overhead ``o``.

    Scalar ``gamma``: Leviathan et al. (2023), Theorem 3.8 with a verify cost and the loop's per-step
    cost, ``(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + r + o))`` (``r = 1``, ``o = 0`` is the
    theorem as stated), via :func:`spade_lib.theory.speedup`.

    Array ``gamma`` (the number ``g_s`` drafted at each step ``s``, e.g. :func:`drafted_per_step`,
    for drafters that propose fewer than gamma tokens, such as prompt lookup): the ratio of expected
    totals ``sum_s E[tokens | g_s] / sum_s C(g_s)`` with ``E[tokens | g] =
    (1 - alpha^(g+1)) / (1 - alpha)`` (1 when ``g = 0``; :func:`spade_lib.theory.expected_tokens`) and the
    step cost ``C(g_s) = g_s c + r_s + o`` (:func:`spade_lib.theory.step_cost`), ``r_s`` the step's verify
    cost (a number, or one per step; a step that drafted nothing costs one plain target forward, ``r = 1``,
    plus ``o``: it is a step of the same loop). ``prefill = (P_AR, P_run)`` (array ``gamma`` only; :func:`prefill_steps`)
    adds the prompts' prefills in AR steps: ``(P_AR + sum_s E[tokens | g_s]) / (P_run + sum_s cost_s)``, the
    ratio of whole generations' times that a measured speedup is.
    """
    if not (np.ndim(overhead) == 0 and np.isfinite(overhead) and overhead >= 0):
        raise ValueError(f"overhead: must be a finite number >= 0, got {overhead!r}")
    if np.ndim(gamma) == 0:
        if prefill is not None:
            raise ValueError("prefill: needs the drafted count of every step (an array gamma)")
        return float(theory.speedup(alpha, gamma, c, verify_cost=verify_cost, overhead=overhead))
    g = np.asarray(gamma, dtype=np.int64)
    _nonempty(g.size, "predicted_speedup")
    if (g < 0).any():
        raise ValueError("gamma: drafted counts must be >= 0")
    # r(0) = 1: a step that drafted nothing is one plain target forward (theory.verify_cost_curve)
    r = np.where(g > 0, np.broadcast_to(np.asarray(verify_cost, dtype=np.float64), g.shape), 1.0)
    tokens = np.asarray(theory.expected_tokens(alpha, g))
    cost = np.asarray(theory.step_cost(g, float(c), r, float(overhead)))
    if prefill is None:
        return float(tokens.sum() / cost.sum())
    p_base, p_run = (float(x) for x in prefill)
    if not (np.isfinite(p_base) and np.isfinite(p_run) and p_base >= 0 and p_run >= 0):
        raise ValueError(f"prefill: must be two finite numbers >= 0 (AR steps), got {prefill!r}")
    return float((p_base + tokens.sum()) / (p_run + cost.sum()))


def run_metrics(trace: pd.DataFrame, summary: pd.DataFrame, baseline: pd.DataFrame | None = None,
                gamma: int | None = None, costs: dict | None = None) -> dict[str, float]:
    """Every metric above for one run (or one category of it), as a flat dict.

    ``baseline`` (an autoregressive run over the same generations) adds the speedups (with their
    bootstrap intervals, the numbers of prompts and of rounds resampled, ``speedup_prompts`` and
    ``speedup_rounds``, and the ``disagree`` flag of :func:`bootstrap_speedup`), the cost ratios, and two
    predictions from the measured ``alpha``:
    ``speedup_decode`` (with ``_low`` / ``_high``): the same estimator over the decode phase, each side's
    prompt prefill taken out (:func:`decode_phase`; NaN where a side recorded none), the measurement
    ``predicted_steady`` predicts;
    ``predicted_thm38`` (Theorem 3.8 at the run's ``gamma``, ``r = 1``: what the paper's formula says),
    ``predicted_steady`` (every step with what it actually drafted, :func:`drafted_per_step`, at cost
    ``g c + r + o``: decode steps alone) and ``predicted`` (the same with the prompts' prefills both sides
    paid, :func:`prefill_steps`, whose share of the AR run's time is ``prefill_share``: the ratio of whole
    generations a measured speedup is, so the model the measurement should meet; ``predicted_steady`` where
    the prefills were not recorded), and the gaps ``fraction_of_prediction = speedup / predicted`` and
    ``gap = predicted - speedup``.
    Trace-based entries are NaN for runs that drafted nothing (baselines).

    Two kinds of cost ratio, never in the same column: ``c_trace`` and ``r_trace`` (:func:`cost_ratio`,
    :func:`verify_cost_ratio`: estimates from the run's own step timings over the AR run's time per token,
    prefill included, so they run low on short generations), always; ``c`` and ``r = r(gamma)``, the cost
    measurement (``costs``: the draft's :func:`spade_lib.runs.costs.pair_costs` table, forwards timed in
    turns by :func:`spade_lib.decoding.studies.costs.measure_costs`), NaN without ``costs``. The predictions are
    priced with ``c``, ``r(g_s)`` and the table's loop cost ``overhead`` (``o``, 0 when it has none) at
    ``g_s c + r(g_s) + o`` per step; without ``costs`` with ``c_trace`` and ``r_trace`` (``r = 1`` where
    no verify time was recorded) and no loop cost. ``overhead`` is in the result (0 without ``costs``).

    ``stalls`` is the number of timed readings of the run's generations that
    :mod:`spade_lib.runs.protocol` re-timed as stalls (:func:`spade_lib.runs.timing.find_stalls`; the
    summary's ``stalls`` column, 0 for runs timed before it existed).
    """
    nan = float("nan")
    out: dict[str, float] = {
        "generations": float(len(summary)), "new_tokens": float(summary["new_tokens"].sum()),
        "tokens_per_s": tokens_per_second(summary),
        "stalls": float(summary["stalls"].fillna(0).sum()) if "stalls" in summary.columns else 0.0,
    }
    drafted = len(trace) > 0 and bool(trace["reached"].any())
    c = rates.counts(trace).iloc[0] if drafted else None  # alpha = accepted / judged (rates.alpha)
    out["alpha"] = rates.alpha(c["accepted"], c["reached"]) if drafted else nan
    out["accepted"] = float(c["accepted"]) if drafted else nan
    out["reached"] = float(c["reached"]) if drafted else nan
    out["alpha_expected"] = rates.expected_alpha(c["expected"], c["reached"]) if drafted and "expected" in c else nan
    has_steps = "accept_lengths" in summary.columns and summary["accept_lengths"].map(len).sum() > 0
    out["tau"] = mean_accepted_length(summary) if has_steps else nan
    if drafted and has_steps and "prompt_id" in trace.columns:
        boot_a = bootstrap_acceptance(trace, summary)
        for name in ("alpha_low", "alpha_high", "tau_low", "tau_high"):
            out[name] = boot_a[name]
    else:
        out["alpha_low"] = out["alpha_high"] = out["tau_low"] = out["tau_high"] = nan
    out["tau_no_bonus"] = mean_accepted_length(summary, with_bonus=False) if has_steps else nan
    out["block_efficiency"] = block_efficiency(summary) if has_steps else nan
    out["mean_gamma"] = float(steps(trace)["gamma"].mean()) if drafted else nan
    out["mean_drafted"] = float(drafted_per_step(trace, summary).mean()) if drafted and has_steps else nan
    if baseline is not None:
        boot = bootstrap_speedup(summary, baseline, seed=0)
        out["speedup"] = boot["ratio_of_totals"]
        out["speedup_low"], out["speedup_high"] = boot["ratio_of_totals_low"], boot["ratio_of_totals_high"]
        out["speedup_mean_of_ratios"] = boot["mean_of_ratios"]
        out["speedup_mean_of_ratios_low"] = boot["mean_of_ratios_low"]
        out["speedup_mean_of_ratios_high"] = boot["mean_of_ratios_high"]
        out["estimators_disagree"] = float(boot["disagree"])
        out["speedup_prompts"], out["speedup_rounds"] = boot["units"], boot["rounds"]
        dm, db = decode_phase(summary), decode_phase(baseline)
        boot_d = bootstrap_speedup(dm, db, seed=0) if dm is not None and db is not None else None
        for key, name in (("speedup_decode", "ratio_of_totals"), ("speedup_decode_low", "ratio_of_totals_low"),
                          ("speedup_decode_high", "ratio_of_totals_high")):
            out[key] = float(boot_d[name]) if boot_d is not None else nan
        out.update(trace_costs(trace, baseline) if drafted else {"c_trace": nan, "r_trace": nan})
        out["c"] = out["r"] = nan  # the cost measurement's, from a costs table only
        r_fn, overhead = None, 0.0
        if costs is not None and drafted and gamma is not None:
            r_fn = theory.verify_cost_curve(costs["r"])
            out["c"], out["r"] = float(costs["c"]), r_fn(gamma)
            overhead = float(costs.get("overhead") or 0.0)
        out["overhead"] = overhead
        if drafted and gamma is not None:
            c = out["c"] if r_fn is not None else out["c_trace"]
            out["predicted_thm38"] = predicted_speedup(out["alpha"], gamma, c)
            g = drafted_per_step(trace, summary)
            if r_fn is not None:
                r = np.array([r_fn(x) for x in g])
            else:  # the trace's estimate; no verify time recorded: Thm 3.8's 1
                r = out["r_trace"] if np.isfinite(out["r_trace"]) and out["r_trace"] > 0 else 1.0
            out["predicted_steady"] = predicted_speedup(out["alpha"], g, c, verify_cost=r, overhead=overhead)
            pre = prefill_steps(summary, baseline)
            out["prefill_share"] = pre[0] / (pre[0] + float(baseline["new_tokens"].sum())) if pre else nan
            out["predicted"] = (predicted_speedup(out["alpha"], g, c, verify_cost=r, overhead=overhead, prefill=pre)
                                if pre else out["predicted_steady"])
            out["fraction_of_prediction"] = out["speedup"] / out["predicted"]
            out["gap"] = out["predicted"] - out["speedup"]
        else:
            out["predicted_thm38"] = out["predicted"] = out["fraction_of_prediction"] = out["gap"] = nan
            out["predicted_steady"] = out["prefill_share"] = nan
    return out
