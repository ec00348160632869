"""spade_lib.runs.narrative: notebook 03's sentences, run on synthetic tables.

The reference is the notebook's former inline code (its summary and batch-study cells, verbatim below, run
with ``exec``): the library must print the very same lines. Every line it can print on many synthetic
tables -- intervals apart and overlapping, few and many prompts -- must pass
``spade_lib.runs.verdicts.unsupported``, and a planted verdict without an interval must not.
"""

from __future__ import annotations

import contextlib
import io
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from spade_lib.runs import narrative, verdicts
from spade_lib.runs.config import RunConfig

NOTEBOOK_SUMMARY = 'def interval(r):\n    return f"{r[\'speedup\']:.2f}x [{r[\'speedup_low\']:.2f}, {r[\'speedup_high\']:.2f}]"\n\n\nlines = []\nfor T in temperatures:\n    sp = table[(table.method == "spade") & (table["T"] == T) & (table.draft != "null")]  # the control: above\n    best = sp.loc[sp["speedup"].idxmax()]\n    main = sp[(sp.draft == main_draft) & (sp.gamma == gamma_ref)]\n    # the highest point estimate is a ranking only where its interval clears every other run\'s\n    tied = [r["label"] for _, r in sp.iterrows() if r["label"] != best["label"] and verdicts.interval_side(\n        best["speedup_low"], best["speedup_high"], r["speedup_low"], r["speedup_high"]) == "overlapping"]\n    lines.append(f"T={T:g}: highest measured speedup {best[\'label\']} at {interval(best)} over autoregressive"\n                 + (f" (its interval overlaps those of {len(tied)} other run(s): cannot tell it from them)" if tied\n                    else " (its interval lies above every other SPADE run\'s)" if len(sp) > 1 else "")\n                 + (f"; {main_draft} at gamma {gamma_ref}: {interval(main.iloc[0])}" if len(main) else ""))\n    above = sp[sp["speedup_low"] > 1]\n    below = sp[sp["speedup_high"] < 1]\n    lines.append(f"  {len(above)} of {len(sp)} SPADE runs are faster than autoregressive beyond their interval, "\n                 f"{len(below)} slower beyond it")\n    lines.append(f"  measured / predicted (alpha, c, r, o): {sp[\'fraction_of_prediction\'].min():.2f} to "\n                 f"{sp[\'fraction_of_prediction\'].max():.2f}; Thm 3.8 with r = 1 predicts "\n                 f"{sp[\'predicted_thm38\'].mean():.2f}x on average vs {sp[\'predicted\'].mean():.2f}x with the measured r and o "\n                 f"(mean r {sp[\'r\'].mean():.2f}, o {sp[\'overhead\'].mean():.2f}; predictions, not measurements)")\nif len(temperatures) > 1 and 0.0 in temperatures:\n    # greedy vs sampled acceptance of the main draft at gamma_ref: the two runs decode the same prompts, so\n    # prompts are resampled jointly (a pooled two-proportion test would treat them as independent)\n    T1 = next(t for t in temperatures if t > 0)\n    pick = {T: next(c for c in run_dirs if c.method == "spade" and c.draft == main_draft and c.gamma == gamma_ref\n                    and c.temperature == T) for T in (0.0, T1)}\n    d = metrics.paired_alpha_difference(trace.read_trace(run_dirs[pick[0.0]]), trace.read_trace(run_dirs[pick[T1]]))\n    a0, a1 = (table.loc[table["label"] == pick[T].label, "alpha"].iloc[0] for T in (0.0, T1))\n    test = (f"difference {d[\'diff\']:+.3f} [{d[\'low\']:+.3f}, {d[\'high\']:+.3f}], paired bootstrap over "\n            f"{int(d[\'prompts\'])} prompts, p = {d[\'p_value\']:.2g}")\n    if d["prompts"] < 5:\n        lines.append(f"greedy vs sampled acceptance of {main_draft}: cannot tell with {int(d[\'prompts\'])} prompts "\n                     f"(alpha {a0:.2f} at T=0 vs {a1:.2f} at T={T1:g}; {test})")\n    elif d["low"] > 0 or d["high"] < 0:\n        word = "higher" if d["diff"] > 0 else "lower"\n        lines.append(f"greedy acceptance of {main_draft} is {word} than sampled here (alpha {a0:.2f} at T=0 vs "\n                     f"{a1:.2f} at T={T1:g}; {test})")\n    else:\n        lines.append(f"greedy and sampled acceptance of {main_draft} do not differ detectably here (alpha "\n                     f"{a0:.2f} at T=0 vs {a1:.2f} at T={T1:g}; {test})")\n    # the speedups themselves: each temperature\'s interval against the other\'s (a higher acceptance need not\n    # give a higher speedup: the sessions differ, and so do sampling\'s costs)\n    s0, s1 = (table.loc[table["label"] == pick[T].label].iloc[0] for T in (0.0, T1))\n    where = verdicts.interval_side(s0["speedup_low"], s0["speedup_high"], s1["speedup_low"], s1["speedup_high"])\n    lines.append(f"speedup of {main_draft} at gamma {gamma_ref}: {interval(s0)} at T=0 vs {interval(s1)} at T={T1:g}: "\n                 + ({"above": "the greedy interval lies above the sampled one",\n                     "below": "the greedy interval lies below the sampled one"}.get(where)\n                    or "the intervals overlap: cannot tell which temperature is faster"))\ndef tau_iv(r):\n    return f"{r[\'tau\']:.2f} [{r[\'tau_low\']:.2f}, {r[\'tau_high\']:.2f}]"\n\n\nfor (d, T), c in per_cat.groupby(["draft", "T"]):\n    c = c.sort_values("tau")\n    n = int(c["generations"].min())\n    if len(c) == 1:\n        lines.append(f"{d}, T={T:g}: one category ({c[\'category\'].iloc[0]}), tau {tau_iv(c.iloc[0])}")\n        continue\n    lo_c, hi_c = c.iloc[0], c.iloc[-1]\n    apart = verdicts.interval_side(hi_c["tau_low"], hi_c["tau_high"], lo_c["tau_low"], lo_c["tau_high"]) == "above"\n    lines.append(f"{d}, T={T:g}: tau lowest on {lo_c[\'category\']} ({tau_iv(lo_c)}), highest on {hi_c[\'category\']} "\n                 f"({tau_iv(hi_c)}); at least {n} generation{\'s\' if n > 1 else \'\'} a category: "\n                 + ("the two intervals do not overlap" if apart else "the intervals overlap: cannot tell these "\n                    "categories apart") + (" (one prompt a category: an interval over prompts is a point)" if n == 1 else ""))\nprint("\\n".join(lines))'
NOTEBOOK_BATCH = 'from spade_lib.decoding.studies.costs import verify_cost_fn\n\nif study is not None:\n    # the two cost measurements side by side, and why they differ (markdown above)\n    small = study[study.batch_size == study.batch_size.min()].iloc[0]\n    table_costs = costs[main_draft]\n    print(f"costs of {main_draft}: the study\'s batched forwards at B = {int(small[\'batch_size\'])}: c = {small[\'c\']:.3f}, "\n          f"r({gamma_ref}) = {small[\'r\']:.3f}, o(B) = {small[\'overhead\']:.3f}; this notebook\'s cost table (single "\n          f"sequence): c = {table_costs[\'c\']:.3f}, r({gamma_ref}) = {verify_cost_fn(table_costs)(gamma_ref):.3f}, "\n          f"o = {float(table_costs.get(\'overhead\', 0.0)):.3f} -- different forwards (the batch decoder\'s Hugging Face "\n          "forward with a padding mask and a DynamicCache, the cost table\'s single-sequence adapter forward on a "\n          "128-token cache), so different ratios")\n    measured_stop, predicted_stop = stops_paying(study), stops_paying(study, "predicted")\n    for T in study_cfg.temperatures:\n        at = study[study.temperature == T].set_index("batch_size")\n        first, last = at.index.min(), at.index.max()\n\n        def iv(b):\n            return f"{at.loc[b, \'speedup\']:.2f}x [{at.loc[b, \'speedup_low\']:.2f}, {at.loc[b, \'speedup_high\']:.2f}]"\n\n        where = verdicts.interval_side(at.loc[last, "speedup_low"], at.loc[last, "speedup_high"],\n                                       at.loc[first, "speedup_low"], at.loc[first, "speedup_high"])\n        trend = (f"the B = {last} interval lies {where} the B = {first} one" if where != "overlapping" else\n                 f"the B = {first} and B = {last} intervals overlap: cannot tell whether the speedup changes with B")\n        print(f"T = {T:g}: measured speedup {iv(first)} at B = {first} -> {iv(last)} at B = {last} "\n              f"({int(at.loc[last, \'rounds\'])} rounds, {int(at.loc[last, \'prompts\'])} distinct prompts at B = {last}): {trend}")\n        print(f"  predicted {at.loc[first, \'predicted\']:.2f} -> {at.loc[last, \'predicted\']:.2f} with o(B) "\n              f"({at.loc[first, \'predicted_forwards\']:.2f} -> {at.loc[last, \'predicted_forwards\']:.2f} from the forwards "\n              f"alone; r(B) {at.loc[first, \'r\']:.2f} -> {at.loc[last, \'r\']:.2f}): predictions, not measurements")\n        stop = measured_stop[T]\n        print("  " + (f"speculation does not pay even at B = {stop}: {iv(stop)} lies below 1" if stop == first else\n                      f"speculation stops paying at B = {stop}: {iv(stop)} lies below 1" if stop is not None else\n                      "no batch size\'s interval lies below 1 in this range: cannot tell where speculation stops paying")\n              + "; the prediction falls below 1 at B = "\n              + (f"{predicted_stop[T]}" if predicted_stop[T] is not None else "none in this range")\n              + " (a prediction, not a measurement)")\n    _ = save_figure(plot_speedup_vs_batch(study), E.figure_name("m2_speedup_vs_batch"))'


def _printed(source: str, namespace: dict) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(source, namespace)  # noqa: S102 -- the notebook's former cell, the reference
    return out.getvalue().splitlines()


def _cfg(draft, gamma, T):
    return RunConfig(method="spade", draft=draft, gamma=gamma, temperature=T, max_new_tokens=8, device="cpu")


def synthetic(seed: int, *, temperatures=(0.0, 1.0), apart: bool = False):
    """A speedup table, a per-category table and the run folders' configs of a notebook-03-shaped session."""
    rng = np.random.default_rng(seed)
    rows, cats, dirs = [], [], {}
    for T in temperatures:
        for draft, gamma in (("distilled", 1), ("distilled", 4), ("data_only", 4), ("ngram", 4), ("null", 4)):
            cfg = _cfg(draft, gamma, T)
            dirs[cfg] = f"/runs/{cfg.label}"
            s = (3.0 if apart and (draft, gamma) == ("distilled", 4) else rng.uniform(0.4, 1.6))
            half = rng.uniform(0.01, 0.4) if not apart else 0.05
            pred = rng.uniform(0.3, 2.0)
            rows.append(dict(config=cfg, label=cfg.label, method="spade", draft=draft, gamma=gamma, T=T, speedup=s,
                             speedup_low=s - half, speedup_high=s + rng.uniform(0.01, 0.4), alpha=rng.uniform(),
                             predicted=pred, fraction_of_prediction=s / pred, predicted_thm38=rng.uniform(1, 3),
                             r=rng.uniform(1, 2), overhead=rng.uniform(0, 1)))
            n = int(rng.integers(1, 4))
            for cat in ("code", "prose", "math")[: 1 + seed % 3]:
                tau = rng.uniform(1, 5)
                w = 0.0 if n == 1 else rng.uniform(0.0, 1.5)
                cats.append(dict(draft=draft, T=T, category=cat, generations=n, tau=tau, tau_low=tau - w,
                                 tau_high=tau + w))
    table = pd.DataFrame(rows)
    table = pd.concat([pd.DataFrame([dict(label="ar-T0", method="ar", draft="-", gamma=0, T=0.0, speedup=1.0,
                                          speedup_low=1.0, speedup_high=1.0)]), table], ignore_index=True)
    return table, pd.DataFrame(cats), dirs


def _difference(seed):
    rng = np.random.default_rng(seed)
    diff = rng.uniform(-0.2, 0.2)
    half = rng.uniform(0.01, 0.3)
    return {"diff": diff, "low": diff - half, "high": diff + half, "p_value": rng.uniform(),
            "prompts": float(rng.choice([3, 8, 40]))}


def _fake_reads(monkeypatch, d):
    monkeypatch.setattr(narrative.metrics, "paired_alpha_difference", lambda a, b: d)
    monkeypatch.setattr(narrative.trace, "read_trace", lambda path: None)


@pytest.mark.parametrize("seed", range(12))
def test_summary_lines_equal_the_notebooks_former_cell(seed, monkeypatch):
    table, per_cat, dirs = synthetic(seed, apart=seed % 4 == 0)
    d = _difference(seed)
    _fake_reads(monkeypatch, d)
    for temperatures in ([0.0, 1.0], [1.0], [0.0]):
        got = narrative.summary_lines(table, per_cat, dirs, temperatures, main_draft="distilled", gamma_ref=4)
        ns = dict(table=table, per_cat=per_cat, run_dirs=dirs, temperatures=temperatures, main_draft="distilled",
                  gamma_ref=4, verdicts=verdicts, metrics=SimpleNamespace(paired_alpha_difference=lambda a, b: d),
                  trace=SimpleNamespace(read_trace=lambda path: None))
        assert got == _printed(NOTEBOOK_SUMMARY, ns)
        assert verdicts.unsupported("\n".join(got)) == [], got


def test_a_ranking_is_printed_only_where_its_interval_clears_the_others(monkeypatch):
    table, per_cat, dirs = synthetic(0, apart=True)
    lines = narrative.speedup_lines(table, [0.0], main_draft="distilled", gamma_ref=4)
    assert "spade-distilled-g4-T0 at 3.00x [2.95, " in lines[0] and "lies above every other SPADE run's" in lines[0]
    table.loc[table["label"] == "spade-distilled-g4-T0", "speedup_low"] = 0.1  # now it overlaps the others
    lines = narrative.speedup_lines(table, [0.0], main_draft="distilled", gamma_ref=4)
    assert "cannot tell it from them" in lines[0] and "lies above" not in lines[0]
    lone = table[(table["T"] == 0.0) & (table["draft"] == "null")]
    assert narrative.speedup_lines(lone, [0.0], main_draft="distilled", gamma_ref=4) == [
        "T=0: no SPADE run besides the null-draft control"]


def test_temperature_lines_say_cannot_tell_with_few_prompts_or_overlapping_intervals():
    s0 = dict(alpha=0.9, speedup=1.2, speedup_low=1.1, speedup_high=1.3)
    s1 = dict(alpha=0.7, speedup=0.9, speedup_low=0.8, speedup_high=1.0)
    few = {"diff": 0.2, "low": 0.1, "high": 0.3, "p_value": 0.01, "prompts": 4.0}
    lines = narrative.temperature_lines(s0, s1, few, main_draft="d", gamma_ref=4, T1=1.0)
    assert lines[0].startswith("greedy vs sampled acceptance of d: cannot tell with 4 prompts")
    assert lines[1].endswith("the greedy interval lies above the sampled one")
    many = {**few, "prompts": 20.0}
    assert " is higher than sampled here" in narrative.temperature_lines(s0, s1, many, main_draft="d", gamma_ref=4,
                                                                        T1=1.0)[0]
    null = {**many, "low": -0.1}
    lines = narrative.temperature_lines(s0, {**s1, "speedup_high": 1.15}, null, main_draft="d", gamma_ref=4, T1=1.0)
    assert "do not differ detectably" in lines[0] and "cannot tell which temperature is faster" in lines[1]


def _study(seed):
    rng = np.random.default_rng(seed)
    rows = []
    for T in (0.0, 1.0):
        for B in (1, 2, 4):
            s = rng.uniform(0.5, 1.5)
            rows.append(dict(temperature=T, batch_size=B, rounds=3, prompts=min(4, 2 * B), c=rng.uniform(0.1, 1),
                             r=rng.uniform(0.5, 2), overhead=rng.uniform(0, 4), speedup=s,
                             speedup_low=s - rng.uniform(0.01, 0.5), speedup_high=s + rng.uniform(0.01, 0.5),
                             predicted=rng.uniform(0.3, 2), predicted_forwards=rng.uniform(0.5, 3)))
    return pd.DataFrame(rows)


@pytest.mark.parametrize("seed", range(10))
def test_batch_lines_equal_the_notebooks_former_cell(seed):
    from spade_lib.decoding.studies import batch_study

    study = _study(seed)
    costs = {"c": 0.7, "r": {1: 1.1, 2: 1.3, 3: 1.5, 4: 1.9}, "overhead": 3.35}
    got = narrative.batch_lines(study, costs, main_draft="distilled", gamma_ref=4)
    ns = dict(study=study, costs={"distilled": costs}, main_draft="distilled", gamma_ref=4, verdicts=verdicts,
              stops_paying=batch_study.stops_paying, study_cfg=SimpleNamespace(temperatures=(0.0, 1.0)),
              save_figure=lambda *a, **k: None, plot_speedup_vs_batch=lambda s: None,
              E=SimpleNamespace(figure_name=lambda n: n))
    assert got == _printed(NOTEBOOK_BATCH, ns)
    assert verdicts.unsupported("\n".join(got)) == [], got


def test_a_planted_unsupported_verdict_is_caught_beside_the_sound_lines(monkeypatch):
    """The check the report runs on printed text flags a verdict word with no interval among sound lines."""
    table, per_cat, dirs = synthetic(3)
    _fake_reads(monkeypatch, _difference(3))
    lines = narrative.summary_lines(table, per_cat, dirs, [0.0, 1.0], main_draft="distilled", gamma_ref=4)
    planted = "distilled beats autoregressive at every gamma"
    assert verdicts.unsupported("\n".join([*lines, planted])) == [planted]
