"""The sentences notebook 03 prints from its tables: every number formatted from the run, every verdict
standing on a measured interval.

Each function takes the tables the notebook already has and returns a list of lines; nothing here times,
plots or prints. A sentence that ranks or compares (faster, slower, higher, stops paying, apart) says so
only where a measured 95 % interval supports it -- an interval against a reference
(:func:`spade_lib.runs.verdicts.side`) or against another interval
(:func:`spade_lib.runs.verdicts.interval_side`) -- and otherwise says that it cannot tell. Predictions are
labelled as predictions. ``tests/test_notebook_verdicts.py`` reads this module's text as it reads the
notebooks' (:func:`spade_lib.runs.verdicts.unsupported` on every line it can build), and
``tests/test_narrative.py`` runs it on synthetic tables.

- :func:`speedup_lines`: per temperature, the highest measured speedup (a ranking only where its interval
  clears every other run's), the main draft at ``gamma_ref``, how many runs are faster or slower than
  autoregressive beyond their interval, and measured over predicted;
- :func:`temperature_lines`: greedy against sampled acceptance of the main draft (a paired bootstrap of
  the difference, :func:`spade_lib.runs.metrics.paired_alpha_difference`) and their speedups, interval
  against interval; :func:`temperature_comparison` reads the two runs' traces for it;
- :func:`category_lines`: per draft and temperature, the categories with the lowest and highest ``tau``;
- :func:`summary_lines`: the three above, the notebook's summary;
- :func:`batch_lines`: the batch study (:mod:`spade_lib.decoding.studies.batch_study`): its costs beside the cost
  table's, the trend from the smallest to the largest batch, where speculation stops paying.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from spade_lib.runs import metrics, trace, verdicts
from spade_lib.runs.config import RunConfig

__all__ = ["interval", "tau_interval", "speedup_lines", "temperature_lines", "temperature_comparison",
           "category_lines", "summary_lines", "batch_lines"]

NULL_DRAFT = "null"  # the control (spade_lib.runs.controls): reported with the controls, not ranked here


def interval(r: Mapping[str, Any]) -> str:
    """``"1.23x [1.01, 1.45]"``: a row's speedup and its 95 % interval."""
    return f"{r['speedup']:.2f}x [{r['speedup_low']:.2f}, {r['speedup_high']:.2f}]"


def tau_interval(r: Mapping[str, Any]) -> str:
    """``"2.50 [2.10, 2.90]"``: a row's ``tau`` and its 95 % interval."""
    return f"{r['tau']:.2f} [{r['tau_low']:.2f}, {r['tau_high']:.2f}]"


def speedup_lines(table: pd.DataFrame, temperatures: Sequence[float], *, main_draft: str, gamma_ref: int) -> list[str]:
    """Per temperature, over the SPADE runs of ``table`` (a :func:`spade_lib.runs.protocol.speedup_table`;
    the null-draft control left out): the highest measured speedup, which is a ranking only where its interval
    lies above every other run's; ``main_draft`` at ``gamma_ref``; how many runs' intervals lie wholly above
    or below 1; the range of measured over predicted and the two predictions (Theorem 3.8, the cost model)."""
    lines = []
    for T in temperatures:
        sp = table[(table["method"] == "spade") & (table["T"] == T) & (table["draft"] != NULL_DRAFT)]
        if not len(sp):
            lines.append(f"T={T:g}: no SPADE run besides the null-draft control")
            continue
        best = sp.loc[sp["speedup"].idxmax()]
        main = sp[(sp["draft"] == main_draft) & (sp["gamma"] == gamma_ref)]
        # the highest point estimate is a ranking only where its interval clears every other run's
        tied = [r["label"] for _, r in sp.iterrows() if r["label"] != best["label"] and verdicts.interval_side(
            best["speedup_low"], best["speedup_high"], r["speedup_low"], r["speedup_high"]) == "overlapping"]
        lines.append(f"T={T:g}: highest measured speedup {best['label']} at {interval(best)} over autoregressive"
                     + (f" (its interval overlaps those of {len(tied)} other run(s): cannot tell it from them)" if tied
                        else " (its interval lies above every other SPADE run's)" if len(sp) > 1 else "")
                     + (f"; {main_draft} at gamma {gamma_ref}: {interval(main.iloc[0])}" if len(main) else ""))
        above = sp[sp["speedup_low"] > 1]
        below = sp[sp["speedup_high"] < 1]
        lines.append(f"  {len(above)} of {len(sp)} SPADE runs are faster than autoregressive beyond their interval, "
                     f"{len(below)} slower beyond it")
        lines.append(f"  measured / predicted (alpha, c, r, o): {sp['fraction_of_prediction'].min():.2f} to "
                     f"{sp['fraction_of_prediction'].max():.2f}; Thm 3.8 with r = 1 predicts "
                     f"{sp['predicted_thm38'].mean():.2f}x on average vs {sp['predicted'].mean():.2f}x with the measured "
                     f"r and o (mean r {sp['r'].mean():.2f}, o {sp['overhead'].mean():.2f}; predictions, not measurements)")
    return lines


def temperature_lines(greedy_row: Mapping[str, Any], sampled_row: Mapping[str, Any], difference: Mapping[str, float],
                      *, main_draft: str, gamma_ref: int, T1: float) -> list[str]:
    """Greedy (``T = 0``) against sampled (``T = T1``) for one configuration: acceptance through the paired
    bootstrap ``difference`` (:func:`spade_lib.runs.metrics.paired_alpha_difference`: ``diff, low, high,
    p_value, prompts``; fewer than 5 prompts: cannot tell), then the speedups, each temperature's interval
    against the other's. The rows are the two runs' rows of a speedup table."""
    d = difference
    a0, a1 = greedy_row["alpha"], sampled_row["alpha"]
    test = (f"difference {d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}], paired bootstrap over "
            f"{int(d['prompts'])} prompts, p = {d['p_value']:.2g}")
    lines = []
    if d["prompts"] < 5:
        lines.append(f"greedy vs sampled acceptance of {main_draft}: cannot tell with {int(d['prompts'])} prompts "
                     f"(alpha {a0:.2f} at T=0 vs {a1:.2f} at T={T1:g}; {test})")
    elif d["low"] > 0 or d["high"] < 0:
        word = "higher" if d["diff"] > 0 else "lower"
        lines.append(f"greedy acceptance of {main_draft} is {word} than sampled here (alpha {a0:.2f} at T=0 vs "
                     f"{a1:.2f} at T={T1:g}; {test})")
    else:
        lines.append(f"greedy and sampled acceptance of {main_draft} do not differ detectably here (alpha "
                     f"{a0:.2f} at T=0 vs {a1:.2f} at T={T1:g}; {test})")
    # the speedups themselves: each temperature's interval against the other's (a higher acceptance need not
    # give a higher speedup: the sessions differ, and so do sampling's costs)
    s0, s1 = greedy_row, sampled_row
    where = verdicts.interval_side(s0["speedup_low"], s0["speedup_high"], s1["speedup_low"], s1["speedup_high"])
    lines.append(f"speedup of {main_draft} at gamma {gamma_ref}: {interval(s0)} at T=0 vs {interval(s1)} at T={T1:g}: "
                 + ({"above": "the greedy interval lies above the sampled one",
                     "below": "the greedy interval lies below the sampled one"}.get(where)
                    or "the intervals overlap: cannot tell which temperature is faster"))
    return lines


def temperature_comparison(table: pd.DataFrame, run_dirs: Mapping[RunConfig, Path], temperatures: Sequence[float],
                           *, main_draft: str, gamma_ref: int) -> list[str]:
    """:func:`temperature_lines` for ``main_draft`` at ``gamma_ref``, greedy against the first positive
    temperature, the acceptance difference from the two runs' traces (same prompts, resampled jointly: a
    pooled two-proportion test would treat them as independent). No lines unless ``temperatures`` holds 0
    and another."""
    if not (len(temperatures) > 1 and 0.0 in temperatures):
        return []
    T1 = next(t for t in temperatures if t > 0)
    pick = {T: next(c for c in run_dirs if c.method == "spade" and c.draft == main_draft and c.gamma == gamma_ref
                    and c.temperature == T) for T in (0.0, T1)}
    d = metrics.paired_alpha_difference(trace.read_trace(run_dirs[pick[0.0]]), trace.read_trace(run_dirs[pick[T1]]))
    s0, s1 = (table.loc[table["label"] == pick[T].label].iloc[0] for T in (0.0, T1))
    return temperature_lines(s0, s1, d, main_draft=main_draft, gamma_ref=gamma_ref, T1=T1)


def category_lines(per_cat: pd.DataFrame) -> list[str]:
    """Per draft and temperature of a per-category speedup table (``draft, T, category, generations, tau,
    tau_low, tau_high``): the categories with the lowest and the highest ``tau`` and whether their intervals
    are apart; with one generation a category the interval over prompts is a point, and the line says so."""
    lines = []
    for (d, T), c in per_cat.groupby(["draft", "T"]):
        c = c.sort_values("tau")
        n = int(c["generations"].min())
        if len(c) == 1:
            lines.append(f"{d}, T={T:g}: one category ({c['category'].iloc[0]}), tau {tau_interval(c.iloc[0])}")
            continue
        lo_c, hi_c = c.iloc[0], c.iloc[-1]
        apart = verdicts.interval_side(hi_c["tau_low"], hi_c["tau_high"], lo_c["tau_low"], lo_c["tau_high"]) == "above"
        lines.append(f"{d}, T={T:g}: tau lowest on {lo_c['category']} ({tau_interval(lo_c)}), highest on "
                     f"{hi_c['category']} ({tau_interval(hi_c)}); at least {n} generation{'s' if n > 1 else ''} a "
                     "category: " + ("the two intervals do not overlap" if apart else "the intervals overlap: cannot "
                                     "tell these categories apart")
                     + (" (one prompt a category: an interval over prompts is a point)" if n == 1 else ""))
    return lines


def summary_lines(table: pd.DataFrame, per_cat: pd.DataFrame, run_dirs: Mapping[RunConfig, Path],
                  temperatures: Sequence[float], *, main_draft: str, gamma_ref: int) -> list[str]:
    """Notebook 03's summary: :func:`speedup_lines`, :func:`temperature_comparison`, :func:`category_lines`."""
    return (speedup_lines(table, temperatures, main_draft=main_draft, gamma_ref=gamma_ref)
            + temperature_comparison(table, run_dirs, temperatures, main_draft=main_draft, gamma_ref=gamma_ref)
            + category_lines(per_cat))


def batch_lines(study: pd.DataFrame, table_costs: Mapping[str, Any], *, main_draft: str, gamma_ref: int) -> list[str]:
    """The batch study (:func:`spade_lib.decoding.studies.batch_study.batch_study` with
    :func:`spade_lib.runs.batch_speedup.with_intervals`) in words: the study's ``c``, ``r``, ``o(B)`` at the
    smallest batch beside the cost table's (``table_costs``, the main draft's :func:`spade_lib.runs.costs.pair_costs`
    entry; different forwards, so different ratios), then per temperature the measured speedup from the
    smallest to the largest batch with the trend read from the two intervals, the predictions (labelled),
    and where the measured speedup stops paying (its interval wholly below 1) beside where the prediction does."""
    from spade_lib.decoding.studies.batch_study import stops_paying
    from spade_lib.decoding.studies.costs import verify_cost_fn

    small = study[study["batch_size"] == study["batch_size"].min()].iloc[0]
    lines = [f"costs of {main_draft}: the study's batched forwards at B = {int(small['batch_size'])}: c = "
             f"{small['c']:.3f}, r({gamma_ref}) = {small['r']:.3f}, o(B) = {small['overhead']:.3f}; this notebook's "
             f"cost table (single sequence): c = {table_costs['c']:.3f}, r({gamma_ref}) = "
             f"{verify_cost_fn(table_costs)(gamma_ref):.3f}, o = {float(table_costs.get('overhead', 0.0)):.3f} -- "
             "different forwards (the batch decoder's Hugging Face forward with a padding mask and a DynamicCache, "
             "the cost table's single-sequence adapter forward on a 128-token cache), so different ratios"]
    measured_stop, predicted_stop = stops_paying(study), stops_paying(study, "predicted")
    for T in dict.fromkeys(study["temperature"]):
        at = study[study["temperature"] == T].set_index("batch_size")
        first, last = at.index.min(), at.index.max()

        def iv(b):
            return f"{at.loc[b, 'speedup']:.2f}x [{at.loc[b, 'speedup_low']:.2f}, {at.loc[b, 'speedup_high']:.2f}]"

        where = verdicts.interval_side(at.loc[last, "speedup_low"], at.loc[last, "speedup_high"],
                                       at.loc[first, "speedup_low"], at.loc[first, "speedup_high"])
        trend = (f"the B = {last} interval lies {where} the B = {first} one" if where != "overlapping" else
                 f"the B = {first} and B = {last} intervals overlap: cannot tell whether the speedup changes with B")
        lines.append(f"T = {T:g}: measured speedup {iv(first)} at B = {first} -> {iv(last)} at B = {last} "
                     f"({int(at.loc[last, 'rounds'])} rounds, {int(at.loc[last, 'prompts'])} distinct prompts at "
                     f"B = {last}): {trend}")
        lines.append(f"  predicted {at.loc[first, 'predicted']:.2f} -> {at.loc[last, 'predicted']:.2f} with o(B) "
                     f"({at.loc[first, 'predicted_forwards']:.2f} -> {at.loc[last, 'predicted_forwards']:.2f} from the "
                     f"forwards alone; r(B) {at.loc[first, 'r']:.2f} -> {at.loc[last, 'r']:.2f}): predictions, not "
                     "measurements")
        stop = measured_stop[T]
        lines.append("  " + (f"speculation does not pay even at B = {stop}: {iv(stop)} lies below 1" if stop == first
                             else f"speculation stops paying at B = {stop}: {iv(stop)} lies below 1" if stop is not None
                             else "no batch size's interval lies below 1 in this range: cannot tell where speculation "
                                  "stops paying")
                     + "; the prediction falls below 1 at B = "
                     + (f"{predicted_stop[T]}" if predicted_stop[T] is not None else "none in this range")
                     + " (a prediction, not a measurement)")
    return lines
