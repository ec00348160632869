"""Physical controls: numbers a correct measurement cannot produce, turned into warnings.

Each function is pure (no files, no clocks) and returns strings starting with :data:`PREFIX` that name the pair, the
configuration and the numbers (printed by notebooks, benchmarks and ``python -m spade_lib.report``, which also collects
such lines from executed notebooks); an empty list: every control passed. ``t_1``: a one-token target forward.

(a) **A speculative speedup cannot exceed tau.** An AR step costs one forward for one token; a speculative step (SPADE
    or HF assisted) emits ``tau`` tokens on average (:func:`spade_lib.runs.metrics.mean_accepted_length`) for at
    least ``r(g) t_1 >= t_1`` (``g + 1`` tokens read the same weights as one) plus drafting ``>= 0``, so ``speedup =
    tau t_AR / t_step <= tau`` (``speedup_decode`` too). ``speedup_low > tau`` (95 % interval wholly above) is a defect
    of the **baseline** (slower than its forwards: extra work, cold cache, other thread count); not checked: HF, AR.
(b) **The null draft is the control**: always rejected, ``tau = 1``, so ``speedup_low > 1`` means a slow baseline.
(c) **Verification cannot be cheaper than one token**: ``r(g) = t(target, g + 1 tokens) / t_1 >= 1``; ``r(g) < 1 -
    tol`` is a defective micro-benchmark (frequency scaling, load between paired forwards, unequal caches).
(d) **The cost model, two-sided**: each speculative run beside its prediction ``tau / (gamma c + r(gamma) + o)``
    (null draft: ``1 / (r(g) + o)``; :func:`spade_lib.runs.metrics.run_metrics`' ``predicted``, ``o`` from
    :func:`spade_lib.decoding.studies.costs.measure_loop_overhead`); a prediction outside the measured 95 % interval warns
    either way. Not physics: lines start with :data:`MODEL_PREFIX`, go to ``model_control`` of
    :func:`spade_lib.runs.protocol.speedup_table` (not ``physical_control``), and the run stays in the figures.
(e) **Every reading is physical** (:func:`reading_warnings`; rules in :mod:`spade_lib.runs.timing`, applied by
    :func:`spade_lib.runs.protocol.run_interleaved` before pricing): a prefill longer than its reading, a clock gap
    between readings or a reading far beyond its rounds re-times the block or drops the generation; a method and
    baseline timing different new-token counts for one prompt are flagged. Each line names the run and the prompt.

:func:`session_report` (notebook 03): violations, null draft vs prediction, both speedup estimators, interval widths.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

__all__ = ["HELD_OUT_COLUMNS", "MODEL_PREFIX", "NON_SPECULATIVE", "NULL_DRAFT", "PREFIX", "READING_CONTROLS", "cost_warnings",
           "held_out_errors", "held_out_line",
           "prediction_warnings", "reading_warnings", "speedup_warnings", "session_report"]

PREFIX = "physical control"
MODEL_PREFIX = "cost-model control"    # control (d): measured vs predicted, two-sided
NULL_DRAFT = "null"                    # the control drafter: its tokens are always rejected
NON_SPECULATIVE = ("ar", "hf")         # the autoregressive baseline and plain HF generate
READING_CONTROLS = ("prefill", "gap", "round", "tokens")  # control (e), one reading's (reading_warnings)


def _rows(table) -> list[Mapping[str, Any]]:
    """The rows of a DataFrame (``speedups``/``speedup_table``) or of an iterable of mappings."""
    if hasattr(table, "to_dict") and hasattr(table, "columns"):
        return table.to_dict("records")
    return [dict(r) for r in table]


def _num(value) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return math.nan
    return x


def _name(row: Mapping[str, Any]) -> str:
    """``pair/label`` (or the method, draft and gamma where the table has no label)."""
    label = row.get("label")
    if not isinstance(label, str) or not label:
        label = f"{row.get('method', '?')}-{row.get('draft', '?')}-g{row.get('gamma', '?')}"
    pair = row.get("pair")
    where = f"{pair}/" if isinstance(pair, str) and pair else ""
    suite = row.get("suite")
    on = f" on {suite}" if isinstance(suite, str) and suite else ""
    T = _num(row.get("T"))
    at = f" at T={T:g}" if math.isfinite(T) else ""
    return f"{where}{label}{on}{at}"


def _interval(row: Mapping[str, Any], key: str = "speedup") -> str:
    return (f"{_num(row.get(key)):.3f}x [{_num(row.get(f'{key}_low')):.3f}, "
            f"{_num(row.get(f'{key}_high')):.3f}]")


def speedup_warnings(table, *, model: bool = True) -> list[str]:
    """Controls (a), (b) and, with ``model``, (d) of the module docstring on a speedup table (one row
    per configuration, with ``method``, ``draft``, ``tau``, ``speedup_low``, ``predicted``; ``pair``,
    ``label``, ``T`` name it): the physics first, then :func:`prediction_warnings`.

    (a) a speculative configuration (``method`` not in :data:`NON_SPECULATIVE`) with
    ``speedup_low > tau``; (b) the null-draft control (``draft == "null"``) with ``speedup_low > 1``.
    A null-draft row flagged by (b) is not flagged again by (a). Rows with a missing ``tau`` (HF
    assisted generation hides its steps) or a missing interval are skipped by (a)."""
    out = _physics_warnings(table)
    return out + prediction_warnings(table) if model else out


def _priced(table):
    """The speculative rows of ``table`` that carry a prediction: ``(row, predicted, low, high, inside)`` with
    ``inside`` whether ``predicted`` lies in ``[speedup_low, speedup_high]`` (``None`` without an interval): the
    one interval test both the warnings and the held-out errors read."""
    for row in _rows(table):
        if row.get("method", "spade") in NON_SPECULATIVE:
            continue
        pred, low, high = _num(row.get("predicted")), _num(row.get("speedup_low")), _num(row.get("speedup_high"))
        if not (math.isfinite(pred) and pred > 0):
            continue
        inside = bool(low <= pred <= high) if math.isfinite(low) and math.isfinite(high) else None
        yield row, pred, low, high, inside


def prediction_warnings(table) -> list[str]:
    """Control (d) of the module docstring: one warning per speculative row whose ``predicted`` lies
    outside ``[speedup_low, speedup_high]``, naming both, their ratio and which way it misses. Rows
    without a prediction (HF assisted generation, a table without the column) or an interval are skipped."""
    out = []
    for row, pred, low, high, inside in _priced(table):
        if inside is not False:
            continue
        ratio = _num(row.get("speedup")) / pred
        o = _num(row.get("overhead"))
        priced = "tau / (gamma c + r(gamma)" + (f" + overhead {o:.3f})" if math.isfinite(o) and o > 0 else ")")
        why = ("the loop pays a per-step cost the model does not price (or the run was disturbed)" if pred > high
               else "the model over-prices a step (or the baseline is slow)")
        out.append(f"{MODEL_PREFIX}: {_name(row)}: measured {_interval(row)} excludes the cost-model prediction "
                   f"{pred:.3f}x ({priced}; measured / predicted = {ratio:.2f}): {why}")
    return out


HELD_OUT_COLUMNS = ["label", "T", "r_source", "loop_partners", "speedup", "speedup_low", "speedup_high",
                    "predicted", "error", "error_low", "error_high", "inside"]


def held_out_errors(table):
    """The cost model's error on configurations it was not fitted to, one row per priced speculative run of
    ``table`` (a :func:`spade_lib.runs.protocol.speedup_table`): ``error = measured / predicted - 1`` with its
    95 % interval ``[speedup_low, speedup_high] / predicted - 1`` (the prediction is a constant of the run, so
    the interval is the speedup's), ``inside`` whether 0 lies in it.

    Held out: a run with ``r_source == "loop"`` is priced at the level its *partners'* loops paid (the other
    runs of its session and temperature, never its own steps; ``protocol.loop_priced``), so its row tests the
    calibration on a configuration outside the fit; a ``"table"`` row is priced by the cost table alone
    (measured in another process, also outside the run). Runs without a prediction are left out."""
    rows = []
    for row, pred, low, high, inside in _priced(table):
        x = _num(row.get("speedup"))
        rows.append({"label": row.get("label"), "T": row.get("T"), "r_source": row.get("r_source") or "table",
                     "loop_partners": row.get("loop_partners", 0), "speedup": x, "speedup_low": low,
                     "speedup_high": high, "predicted": pred, "error": x / pred - 1,
                     "error_low": low / pred - 1 if math.isfinite(low) else math.nan,
                     "error_high": high / pred - 1 if math.isfinite(high) else math.nan, "inside": inside})
    return pd.DataFrame(rows, columns=HELD_OUT_COLUMNS)


def held_out_line(errors) -> str:
    """One sentence over :func:`held_out_errors`: how many runs, the median and largest absolute error, and how
    many predictions lie inside their run's interval (n stated: a verdict carries its sample size)."""
    if not len(errors):
        return "cost model on held-out configurations: no priced speculative run"
    err = errors["error"].abs()
    inside = errors["inside"].dropna()
    return (f"cost model on held-out configurations (n = {len(errors)} runs, each priced by its session partners' "
            f"loops or the cost table, never its own steps): median |measured / predicted - 1| = "
            f"{100 * err.median():.1f} %, largest {100 * err.max():.1f} %; the prediction lies inside the run's 95 % "
            f"interval for {int(inside.sum())} of {len(inside)}")


def _physics_warnings(table) -> list[str]:
    out = []
    for row in _rows(table):
        method = row.get("method", "spade")
        if method in NON_SPECULATIVE:
            continue
        tau = _num(row.get("tau"))
        for key, what in (("speedup", ""), ("speedup_decode", " (decode phase, prefills out)")):
            low = _num(row.get(f"{key}_low"))
            if row.get("draft") == NULL_DRAFT and low > 1.0:
                out.append(f"{PREFIX}: {_name(row)}: the null-draft control is faster than autoregressive "
                           f"beyond its interval{what} ({_interval(row, key)} > 1): its drafts are always rejected, "
                           f"so each step costs at least one target forward and emits one token; the "
                           f"autoregressive baseline is slower than it should be")
            elif math.isfinite(tau) and low > tau:
                out.append(f"{PREFIX}: {_name(row)}: speedup{what} {_interval(row, key)} lies above tau = "
                           f"{tau:.3f}: each speculative step costs at least one target forward and emits tau "
                           f"tokens on average, so speedup <= tau; the autoregressive baseline is slower than its "
                           f"target forwards")
    return out


def _done(event: Mapping[str, Any]) -> str:
    return {"retimed": "its block (every member's rounds of the prompt) was timed again",
            "dropped": "every timing of its block broke a control, so the generation is dropped: reported, "
                       "never priced (not in the speedup intervals nor the prediction)"}.get(
        event.get("action"), "flagged")


def reading_warnings(events, *, pair: str = "") -> list[str]:
    """Control (e) of the module docstring: one line per event of
    :func:`spade_lib.runs.protocol.run_interleaved`'s reading controls, each a mapping with ``control`` (one of
    :data:`READING_CONTROLS`), ``label`` (the run), ``question_id``, ``sample`` and the control's numbers:
    ``prefill`` / ``seconds`` (``"prefill"``), ``seconds`` / ``after`` (``"gap"``: the clock's jump, and the
    reading before it), ``seconds`` / ``median`` / ``limit`` (``"round"``), ``tokens`` / ``baseline`` /
    ``baseline_tokens`` (``"tokens"``), ``round``, and ``action`` (``"retimed"``, ``"dropped"``, else flagged)."""
    out = []
    for e in _rows(events):
        kind = e.get("control")
        if kind not in READING_CONTROLS:
            raise ValueError(f"events: control must be one of {READING_CONTROLS}, got {kind!r}")
        where = f"{_name({'label': e.get('label'), 'pair': pair})}: prompt {e.get('question_id')} (sample {e.get('sample')})"
        k = e.get("round")
        if kind == "prefill":
            what = (f"round {k} read a prefill of {_num(e.get('prefill')):.3f} s inside a generation of "
                    f"{_num(e.get('seconds')):.3f} s: the prefill is timed inside its generation by the same clock, "
                    f"so prefill <= wall; the reading is impossible (a clock or subtraction defect)")
        elif kind == "gap":
            what = (f"the session's clock jumped {_num(e.get('seconds')):.3f} s between {e.get('after')}'s reading "
                    f"and this run's round {k}, where the protocol runs nothing: a host pause (the readings after "
                    f"it run on caches and clocks another tenant left)")
        elif kind == "round":
            med, t = _num(e.get("median")), _num(e.get("seconds"))
            what = (f"round {k} read {t:.3f} s, {t / med:.2f}x the median {med:.3f} s of its other rounds (beyond "
                    f"{math.exp(_num(e.get('limit'))):.2f}x, the session's robust spread of rounds): a host pause "
                    f"inside the reading")
        else:
            what = (f"timed {e.get('tokens')} new tokens, its baseline {e.get('baseline')} "
                    f"{e.get('baseline_tokens')}: the pairing compares unequal work (tokens are counted on both "
                    f"sides; the ratio of totals stays a throughput ratio, the prediction prices this run's tokens)")
        out.append(f"{PREFIX}: {where}: {what}; {_done(e)}")
    return out


def cost_warnings(costs: Mapping[str, Mapping], *, tol: float = 0.05, pair: str = "") -> list[str]:
    """Control (c) of the module docstring on a pair's cost tables (draft name -> table with ``"r":
    {g: r(g)}``, as :func:`spade_lib.runs.costs.pair_costs` returns): one warning per draft whose
    ``r(g) < 1 - tol`` at some ``g``, naming every such ``g``."""
    if not (isinstance(tol, (int, float)) and 0 <= tol < 1):
        raise ValueError(f"tol: must be a number in [0, 1), got {tol!r}")
    out = []
    where = f"{pair}/" if pair else ""
    for draft, table in costs.items():
        r = (table or {}).get("r") or {}
        low = []
        for g, v in sorted(((int(g), _num(v)) for g, v in r.items()), key=lambda gv: gv[0]):
            if v < 1 - tol:
                low.append(f"g={g}: {v:.3f}")
        if low:
            out.append(f"{PREFIX}: {where}{draft}: r(g) < {1 - tol:g} at " + ", ".join(low)
                       + ": verifying g + 1 tokens cannot cost less than a one-token target forward; the cost "
                         "micro-benchmark is defective (load or frequency changes between the paired forwards) "
                         "and predictions priced with it are too optimistic")
    return out


def session_report(costs: Mapping[str, Mapping], table, *, pair: str = "", gamma: int, prompts: int,
                   repeats: int) -> tuple[list[str], list[str]]:
    """What notebook 03 prints about one pair's sessions before any figure: ``(warnings, lines)``.

    ``warnings`` are :func:`cost_warnings` of ``costs`` then :func:`speedup_warnings` of ``table`` (a
    :func:`spade_lib.runs.protocol.speedup_table` with ``estimators_disagree`` and the mean-of-ratios
    interval); ``lines`` print them (each after ``"!!! "``), then the physical violations' count (a run's
    leaves the figures, a draft's r(g) below 1 makes its predictions too optimistic) apart from the cost-model
    controls' (control (d): not a defect, the run stays in the figures), the null-draft control at
    ``gamma`` against its prediction ``1 / (r(gamma) + o)`` per decode step and with the prompts' prefills
    (the table's ``predicted``, which the measured ratio of whole generations is compared with) per temperature, every run whose two speedup
    estimators disagree (or that they all agree), and the median and widest interval of the speedups
    over ``prompts`` prompts with ``repeats`` interleaved repeats."""
    cost = cost_warnings(costs, pair=pair)
    found = cost + speedup_warnings(table)
    lines = ["!!! " + line for line in found]
    runs = [w for w in found[len(cost):] if w.startswith(PREFIX + ":")]  # physics of a run: out of the figures
    model = [w for w in found if w.startswith(MODEL_PREFIX + ":")]
    if cost or runs:
        lines.append(f"physical controls: {len(cost) + len(runs)} violation(s): "
                     + "; ".join(([f"{len(runs)} run(s) named above left out of the figures"] if runs else [])
                                 + ([f"{len(cost)} draft(s) with r(g) below 1, their predictions too optimistic"]
                                    if cost else [])))
    else:
        lines.append("physical controls: 0 violation(s) (r(g) >= 1 within 5 % for every draft, every speedup <= "
                     "its tau, the null draft <= 1)")
    if model:
        lines.append(f"cost-model controls: {len(model)} prediction(s) outside the measured interval, named above "
                     "(not a defect: those runs stay in the figures)")
    for _, r in table[table["draft"] == NULL_DRAFT].iterrows():
        steady = 1 / (r['r'] + r['overhead'])
        pre = r.get("prefill_share", math.nan)
        with_prefill = (f"; with the prompts' prefills ({100 * pre:.0f} % of the AR time) as measured: "
                        f"{r['predicted']:.3f}" if math.isfinite(_num(pre)) and math.isfinite(_num(r.get("predicted")))
                        else "")
        lines.append(f"null-draft control, T={r['T']:g}: {r['speedup']:.3f}x [{r['speedup_low']:.3f}, "
                     f"{r['speedup_high']:.3f}] (expected per decode step 1 / (r({gamma}) + o) = 1 / ({r['r']:.3f} + "
                     f"{r['overhead']:.3f}) = {steady:.3f}{with_prefill}; "
                     + (f"r and o as its session partners' loops paid them, the cost table's r(g) x "
                        f"{_num(r.get('loop_level')):.3f})" if r.get("r_source") == "loop"
                        else "a prediction from the cost table)"))
    flagged = table[table["estimators_disagree"] == 1]
    for _, r in flagged.iterrows():
        lines.append(f"FLAG {r['label']}: ratio of totals {r['speedup']:.2f} [{r['speedup_low']:.2f}, "
                     f"{r['speedup_high']:.2f}] vs mean of ratios {r['speedup_mean_of_ratios']:.2f} "
                     f"[{r['speedup_mean_of_ratios_low']:.2f}, {r['speedup_mean_of_ratios_high']:.2f}]: the "
                     "estimators disagree; read both")
    if not len(flagged):
        lines.append(f"ratio of totals and mean of ratios agree within their intervals for all {len(table)} runs")
    widths = (table["speedup_high"] - table["speedup_low"])[table["method"] != "ar"]
    lines.append(f"95 % intervals of the speedups: median width {widths.median():.3f}, widest {widths.max():.3f} "
                 f"({prompts} prompts, {repeats} interleaved repeats each)")
    return found, lines
