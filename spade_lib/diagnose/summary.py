"""Per-category summary of a run in Spec-Bench's shape, and every M3 table in one call.

Per category (Spec-Bench reports per category and overall), over steps ``s`` with ``N_s`` accepted
drafts out of ``gamma_s``, so ``|A| = sum_s N_s`` accepted and ``|R| = sum_s min(N_s + 1, gamma_s)``
reached (judged) positions (all computed from the step-level columns):

- ``acceptance = |A| / sum_s gamma_s``        acceptance per drafted token
  (:func:`spade_lib.rates.acceptance_per_drafted`)
- ``alpha = |A| / |R|``                         acceptance per judged (reached) token (:func:`spade_lib.rates.alpha`)
- ``tau_drafting_steps = mean_s (N_s + 1)``     mean accepted length with the bonus/residual token over
  the trace's steps (:func:`spade_lib.measures.tau`); ``tau_no_bonus_drafting_steps = mean_s N_s``.
  A trace has rows only for the steps that drafted, so this is not a run's ``tau`` (Spec-Bench's mean
  of ``accept_lengths``, every step: :func:`spade_lib.runs.metrics.mean_accepted_length` of its
  summary) when a drafter sometimes drafts nothing (prompt lookup without a match)
- ``emitted = sum_s (N_s + 1)``, the tokens the drafted steps produced (Spec-Bench's ``new_tokens``
  up to truncation: the last step of a generation may be cut by ``max_new_tokens``, and steps that
  drafted nothing have no trace rows);
- ``tokens_per_second = emitted / sum_s (t_draft + t_verify + t_overhead)`` when timings exist, and
  ``speedup = tokens_per_second / baseline_tokens_per_second`` (ratio of totals) when a baseline
  rate is given. Wall-clock speedups of whole generations come from the runs' summaries
  (:mod:`spade_lib.runs.metrics`), as notebook 04 does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from spade_lib import measures, rates
from spade_lib.diagnose.frame import By, Groups, TraceLike, as_trace, categorize, group_keys, step_rows

TIME_COLUMNS = ("t_draft", "t_verify", "t_overhead")


def category_summary(trace: TraceLike, by: By = None, *, category: str = "category", overall: bool = True,
                     baseline_tokens_per_second: float | Mapping[str, float] | None = None) -> pd.DataFrame:
    """One row per ``by`` group and ``category`` (plus ``"overall"`` rows when ``overall``):
    ``generations``, ``steps``, ``drafted``, ``reached``, ``accepted``, ``emitted``, ``acceptance``,
    ``alpha``, ``tau_drafting_steps``, ``tau_no_bonus_drafting_steps``, ``time``, ``tokens_per_second``,
    ``speedup``.

    ``baseline_tokens_per_second`` is one rate, or a mapping from category (and ``"overall"``) to rate.
    """
    df = as_trace(trace, ("prompt_id", "sample", "pos", category, "gamma", "n_accepted"))
    keys = group_keys(by, df)
    has_time = all(c in df.columns for c in TIME_COLUMNS)
    steps = step_rows(df, keys + ["prompt_id", "sample", category, "gamma", "n_accepted",
                                  *(TIME_COLUMNS if has_time else ())])
    time = (sum(steps[c].to_numpy(dtype=np.float64) for c in TIME_COLUMNS) if has_time
            else np.full(len(steps), np.nan))
    n_acc = steps["n_accepted"].to_numpy()
    gamma = steps["gamma"].to_numpy()
    reached = np.minimum(n_acc.astype(np.int64) + 1, gamma)  # a block is judged up to its first rejection

    def summarise(cols: list[str]) -> pd.DataFrame:
        gs = Groups.of(steps, cols)
        out = gs.frame()
        gens = Groups.of(steps, cols + ["prompt_id", "sample"]).keys
        if cols:
            per = gens.groupby(cols, observed=True).size().rename("generations").reset_index()
            out = out.merge(per, on=cols, how="left", sort=False)
        else:
            out["generations"] = len(gens)
        out["steps"] = gs.sum()
        out["drafted"] = gs.sum(gamma).astype(np.int64)
        out["n_acc"] = gs.sum(n_acc).astype(np.int64)
        out["time"] = gs.sum(time)
        out["reached"] = gs.sum(reached).astype(np.int64)
        out["accepted"] = out["n_acc"]
        return out

    out = summarise(keys + [category])
    out[category] = out[category].astype(str)
    if overall:
        tot = summarise(keys)
        tot[category] = "overall"
        out = pd.concat([out, tot], ignore_index=True)
        if keys:
            out = out.sort_values(keys, kind="stable")
    out["emitted"] = out["n_acc"] + out["steps"]
    with np.errstate(invalid="ignore", divide="ignore"):
        out["acceptance"] = rates.acceptance_per_drafted(out["accepted"], out["drafted"])
        out["alpha"] = rates.alpha(out["accepted"], out["reached"])
        out["tau_drafting_steps"] = measures.tau(out["n_acc"], out["steps"])
        out["tau_no_bonus_drafting_steps"] = measures.tau(out["n_acc"], out["steps"], with_bonus=False)
        out["tokens_per_second"] = out["emitted"] / out["time"]
    if baseline_tokens_per_second is None:
        base = np.nan
    elif isinstance(baseline_tokens_per_second, Mapping):
        base = out[category].map(baseline_tokens_per_second).astype(float)
    else:
        base = float(baseline_tokens_per_second)
    out["speedup"] = out["tokens_per_second"] / base
    cols = keys + [category, "generations", "steps", "drafted", "reached", "accepted", "emitted", "acceptance",
                   "alpha", "tau_drafting_steps", "tau_no_bonus_drafting_steps", "time", "tokens_per_second", "speedup"]
    return out[cols].reset_index(drop=True)


def with_run_tau(table: pd.DataFrame, summaries: Mapping[str, pd.DataFrame], by: str, *,
                 category: str = "category") -> pd.DataFrame:
    """``table`` (a :func:`category_summary` by ``by``) with a column ``tau``: the run's mean accepted length
    ``tau = sum_s (N_s + 1) / #steps`` over *every* verification step ``s`` of its generations in the row's
    category (all of them for ``"overall"``; a step that drafted nothing counts ``N_s = 0``),
    :func:`spade_lib.runs.metrics.mean_accepted_length` of ``summaries[group]`` (``accept_lengths``, ``n + 1``
    per step, Spec-Bench's mean accept length: the one ``tau``, as notebook 03 reports it), beside the table's
    ``tau_drafting_steps`` (the trace's steps only). ``summaries``: group of ``by`` -> that run's
    ``summary.jsonl`` rows (``category``, ``accept_lengths``)."""
    from spade_lib.runs import metrics

    out = table.copy()
    out["tau"] = [metrics.mean_accepted_length(summaries[g] if cat == "overall" else
                                               summaries[g][summaries[g][category] == cat])
                  for g, cat in zip(out[by].astype(str), out[category].astype(str))]
    return out


def all_tables(trace: TraceLike, tokenizer: Any = None, by: By = None, *, bins: int = 10,
               min_support: int = 20, seed: int = 0) -> dict[str, pd.DataFrame]:
    """Every M3 table of ``trace`` (one pass each), keyed by name; what the notebook and the
    benchmark compute. The logistic model contributes ``logit_coefficients`` and ``logit_scores``."""
    from spade_lib.diagnose.calibration import calibration_error, calibration_table
    from spade_lib.diagnose.correlates import acceptance_by_bins, acceptance_logit, entropy_by_outcome
    from spade_lib.diagnose.expected import expected_vs_realised
    from spade_lib.diagnose.position import accept_length_hist, acceptance_heatmap, position_acceptance
    from spade_lib.diagnose.tokens import token_class_acceptance, token_table

    df = categorize(as_trace(trace))
    keys = group_keys(by, df)
    tables: dict[str, pd.DataFrame] = {
        "position": position_acceptance(df, keys),
        "position_by_category": position_acceptance(df, keys + ["category"]),
        "accept_length": accept_length_hist(df, keys),
        "entropy": entropy_by_outcome(df, keys),
        "binned": acceptance_by_bins(df, keys, bins=bins),
    }
    fit = acceptance_logit(df, keys, seed=seed, skip_degenerate=True)
    tables["logit_coefficients"], tables["logit_scores"] = fit.coefficients, fit.scores
    calib = pd.concat([calibration_table(df, keys, score=s, bins=bins) for s in ("q_x", "accept_prob")],
                      ignore_index=True)
    tables["calibration"] = calib
    tables["calibration_error"] = calibration_error(calib, keys)
    tables["expected_overall"] = expected_vs_realised(df, keys)
    tables["expected_by_position"] = expected_vs_realised(df, keys + ["pos"])
    tables["expected_by_category"] = expected_vs_realised(df, keys + ["category"])
    tables["tokens"] = token_table(df, tokenizer, keys, min_support=min_support)
    tables["token_classes"] = token_class_acceptance(df, tokenizer, keys)
    tables["summary"] = category_summary(df, keys)
    tables["heatmap"] = acceptance_heatmap(df, keys)
    return tables
