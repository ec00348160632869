"""Physical controls: speedup above tau, a null draft faster than autoregressive, r(g) below 1."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from spade_lib.runs import controls


def table(**overrides):
    rows = [
        dict(pair="p", suite="s", label="ar-T0", method="ar", draft="-", gamma=0, T=0.0, tau=math.nan,
             speedup=1.0, speedup_low=1.0, speedup_high=1.0),
        dict(pair="p", suite="s", label="hf-T0", method="hf", draft="-", gamma=0, T=0.0, tau=math.nan,
             speedup=3.0, speedup_low=2.5, speedup_high=3.5),  # plain generate: not speculative, never checked
        dict(pair="p", suite="s", label="spade-distilled-g4-T0", method="spade", draft="distilled", gamma=4,
             T=0.0, tau=2.0, speedup=1.6, speedup_low=1.4, speedup_high=2.2),
        dict(pair="p", suite="s", label="hf_assisted-distilled-g4-T0", method="hf_assisted", draft="distilled",
             gamma=4, T=0.0, tau=math.nan, speedup=5.0, speedup_low=4.0, speedup_high=6.0),  # no tau: skipped
        dict(pair="p", suite="s", label="spade-null-g4-T0", method="spade", draft="null", gamma=4, T=0.0,
             tau=1.0, speedup=0.8, speedup_low=0.7, speedup_high=1.05),
    ]
    for i, kw in overrides.items():
        rows[int(i[1:])].update(kw)
    return pd.DataFrame(rows)


def test_a_consistent_table_passes():
    assert controls.speedup_warnings(table()) == []
    assert controls.speedup_warnings(table().to_dict("records")) == []  # rows as mappings work too


def test_speedup_above_tau_is_a_baseline_defect():
    w = controls.speedup_warnings(table(r2=dict(speedup=2.6, speedup_low=2.3, speedup_high=2.9)))
    assert len(w) == 1 and w[0].startswith(controls.PREFIX)
    assert "p/spade-distilled-g4-T0 on s at T=0" in w[0] and "tau = 2.000" in w[0] and "2.300" in w[0]
    # an interval that merely reaches above tau is not flagged: only one lying wholly above it
    assert controls.speedup_warnings(table(r2=dict(speedup=2.1, speedup_low=1.9, speedup_high=2.4))) == []


def test_null_control_faster_than_ar():
    w = controls.speedup_warnings(table(r4=dict(speedup=1.2, speedup_low=1.1, speedup_high=1.3)))
    assert len(w) == 1 and "null-draft control" in w[0] and "spade-null-g4-T0" in w[0]  # flagged once, by (b)
    assert controls.speedup_warnings(table(r4=dict(speedup_low=1.0))) == []  # not beyond 1


def test_the_decode_phase_is_held_to_the_same_physics():
    """A decode-phase speedup (prefills out) above tau, or a null draft's above 1, is as impossible as a whole
    generation's: flagged, naming the decode phase; one inside the bounds is not."""
    w = controls.speedup_warnings(table(r2=dict(speedup_decode=2.5, speedup_decode_low=2.2, speedup_decode_high=2.8)))
    assert len(w) == 1 and "decode phase" in w[0] and "2.200" in w[0] and "tau = 2.000" in w[0]
    w = controls.speedup_warnings(table(r4=dict(speedup_decode=1.2, speedup_decode_low=1.1, speedup_decode_high=1.3)))
    assert len(w) == 1 and "null-draft control" in w[0] and "decode phase" in w[0]
    assert controls.speedup_warnings(table(r2=dict(speedup_decode=1.9, speedup_decode_low=1.7,
                                                   speedup_decode_high=2.1))) == []


def test_missing_columns_are_tolerated():
    t = table().drop(columns=["pair", "suite", "label"])
    t.loc[2, ["speedup_low", "tau"]] = [3.0, 2.0]
    w = controls.speedup_warnings(t)
    assert len(w) == 1 and "spade-distilled-g4" in w[0]


def test_cost_warnings():
    costs = {"distilled": {"c": 0.3, "r": {1: 1.01, 2: 0.97, 3: 0.90, 4: 0.80}},
             "ngram": {"c": 0.0, "r": {"1": 1.0, "2": 1.1}}}
    w = controls.cost_warnings(costs, pair="smollm2")
    assert len(w) == 1 and w[0].startswith(f"{controls.PREFIX}: smollm2/distilled")
    assert "g=3: 0.900" in w[0] and "g=4: 0.800" in w[0] and "g=2" not in w[0]
    assert controls.cost_warnings(costs, tol=0.25) == []
    assert len(controls.cost_warnings(costs, tol=0.0)) == 1
    with pytest.raises(ValueError, match="tol"):
        controls.cost_warnings(costs, tol=1.5)


def test_prediction_outside_the_interval_is_a_warning_either_way():
    t = table().assign(predicted=[math.nan, math.nan, 1.8, 4.0, 0.9])  # inside every interval (hf/ar not checked)
    assert controls.speedup_warnings(t) == [] and controls.prediction_warnings(t) == []
    # the embedded null control: measured 0.28x [0.15, 0.51] against 1 / (r + o) = 0.59
    low = table(r4=dict(speedup=0.28, speedup_low=0.15, speedup_high=0.51)).assign(
        predicted=[math.nan, math.nan, 1.8, math.nan, 0.59], overhead=0.2)
    w = controls.speedup_warnings(low)
    assert len(w) == 1 and w[0].startswith(controls.MODEL_PREFIX + ":") and "spade-null-g4-T0" in w[0]
    assert "0.590x" in w[0] and "measured / predicted = 0.47" in w[0] and "per-step cost" in w[0]
    assert "overhead 0.200" in w[0]
    assert controls.speedup_warnings(low, model=False) == []  # not physics: the run is no defect
    high = t.assign(predicted=[math.nan, math.nan, 1.2, math.nan, 0.9])  # SPADE measured above its prediction
    w = controls.prediction_warnings(high)
    assert len(w) == 1 and "spade-distilled-g4-T0" in w[0] and "over-prices" in w[0]
    # the physics first: a run above tau gets both lines, the physical one first
    both = high.assign(speedup_low=[1.0, 2.5, 2.3, 4.0, 0.7])
    w = controls.speedup_warnings(both)
    assert [x.split(":")[0] for x in w] == [controls.PREFIX, controls.MODEL_PREFIX]



# -- session_report: what notebook 03 prints about its controls, against the notebook's former cell --------

NOTEBOOK_CONTROLS = 'import warnings\n\nfrom spade_lib.runs import controls\n\n# physics before ratios: every step costs at least one target forward, so r(g) >= 1, speedup <= tau and the\n# null draft <= 1; a violation is a defect of the baseline (or of the machine\'s timing), never a result\nphysics = controls.cost_warnings(costs, pair=the_pair.name) + controls.speedup_warnings(table)\nfor line in physics:\n    print("!!! " + line)\n    warnings.warn(line, RuntimeWarning, stacklevel=1)\ndefects = set(table.loc[table["physical_control"] != "", "label"])  # speedup_table\'s per-row controls\nprint(f"physical controls: {len(physics)} violation(s)" + (": the runs named above are left out of the figures"\n                                                          if physics else\n      " (r(g) >= 1 within 5 % for every draft, every speedup <= its tau, the null draft <= 1)"))\nnull_rows = table[table.draft == "null"]\nfor _, r in null_rows.iterrows():\n    print(f"null-draft control, T={r[\'T\']:g}: {r[\'speedup\']:.3f}x [{r[\'speedup_low\']:.3f}, {r[\'speedup_high\']:.3f}] "\n          f"(expected 1 / (r({gamma_ref}) + o) = 1 / ({r[\'r\']:.3f} + {r[\'overhead\']:.3f}) = "\n          f"{1 / (r[\'r\'] + r[\'overhead\']):.3f}, a prediction from the cost table)")\nflagged = table[table["estimators_disagree"] == 1]\nassert table["interleaved"].all(), "every speedup must come from one interleaved session"\nif len(flagged):\n    for _, r in flagged.iterrows():\n        print(f"FLAG {r[\'label\']}: ratio of totals {r[\'speedup\']:.2f} [{r[\'speedup_low\']:.2f}, {r[\'speedup_high\']:.2f}] "\n              f"vs mean of ratios {r[\'speedup_mean_of_ratios\']:.2f} [{r[\'speedup_mean_of_ratios_low\']:.2f}, "\n              f"{r[\'speedup_mean_of_ratios_high\']:.2f}]: the estimators disagree; read both")\nelse:\n    print(f"ratio of totals and mean of ratios agree within their intervals for all {len(table)} runs")\nwidths = (table["speedup_high"] - table["speedup_low"])[table.method != "ar"]\nprint(f"95 % intervals of the speedups: median width {widths.median():.3f}, widest {widths.max():.3f} "\n      f"({len(the_suite)} prompts, {repeats} interleaved repeats each)")'


def _session(seed, *, disagree=False, defect=False):
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = [dict(label="ar-T0", method="ar", draft="-", gamma=0, T=0.0, tau=math.nan, speedup=1.0, speedup_low=1.0,
                 speedup_high=1.0, r=math.nan, overhead=math.nan, predicted=math.nan)]
    for T in (0.0, 1.0):
        for draft in ("distilled", "null"):
            s = rng.uniform(0.3, 1.0)
            rows.append(dict(label=f"spade-{draft}-g4-T{T:g}", method="spade", draft=draft, gamma=4, T=T,
                             tau=1.0 if draft == "null" else 2.5, speedup=s, speedup_low=s - 0.1,
                             speedup_high=s + 0.1, r=rng.uniform(1, 2), overhead=rng.uniform(0, 3),
                             predicted=rng.uniform(0.2, 1.2), prefill_share=rng.uniform(0.05, 0.4),
                             r_source="loop" if T else "table", loop_level=1.1 if T else math.nan))
    t = pd.DataFrame(rows)
    t["speedup_mean_of_ratios"] = t["speedup"] * 1.01
    t["speedup_mean_of_ratios_low"], t["speedup_mean_of_ratios_high"] = t["speedup_low"], t["speedup_high"]
    t["estimators_disagree"] = 0.0
    if disagree:
        t.loc[2, "estimators_disagree"] = 1.0
    if defect:  # the null draft faster than autoregressive beyond its interval
        t.loc[2, ["speedup", "speedup_low", "speedup_high"]] = (1.5, 1.3, 1.7)
    t["interleaved"] = True
    t["physical_control"] = ""
    return t


@pytest.mark.parametrize("seed, disagree, defect, low_r", [(0, False, False, False), (1, True, False, False),
                                                           (2, False, True, True), (3, True, True, False)])
def test_session_report_prints_what_the_notebooks_former_cell_printed(seed, disagree, defect, low_r):
    import contextlib
    import io
    import warnings

    t = _session(seed, disagree=disagree, defect=defect)
    costs = {"distilled": {"r": {1: 0.9 if low_r else 1.1, 2: 1.2}}, "null": {"r": {1: 1.1}}}
    found, lines = controls.session_report(costs, t, pair="tiny", gamma=4, prompts=4, repeats=3)
    out = io.StringIO()
    ns = dict(costs=costs, table=t, the_pair=type("P", (), {"name": "tiny"}), gamma_ref=4, the_suite=[0] * 4,
              repeats=3)
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(NOTEBOOK_CONTROLS, ns)  # noqa: S102 -- the reference
    ref = out.getvalue().splitlines()
    tally = [line for line in lines if line.startswith(("physical controls:", "cost-model controls:"))]
    null = [line for line in lines if line.startswith("null-draft control")]
    assert [line for line in lines if line not in tally + null] == [
        line for line in ref if not line.startswith(("physical controls:", "null-draft control"))]
    # the null-draft lines: the former cell's per-step prediction, and the table's with the prompts' prefills
    # (the one its control compares; the former cell printed only the per-step one, ~a fifth off on both pairs)
    for line, (_, r) in zip(null, t[t["draft"] == "null"].iterrows(), strict=True):
        steady = f"1 / (r(4) + o) = 1 / ({r['r']:.3f} + {r['overhead']:.3f}) = {1 / (r['r'] + r['overhead']):.3f}"
        assert steady in line and f"{r['speedup']:.3f}x [{r['speedup_low']:.3f}, {r['speedup_high']:.3f}]" in line
        assert f"({100 * r['prefill_share']:.0f} % of the AR time) as measured: {r['predicted']:.3f};" in line
        # and where r and o came from: the session partners' loops (at the table's curve x k), or the table
        assert ("session partners' loops paid them, the cost table's r(g) x 1.100)" in line) == (r["r_source"] == "loop")
        assert line.endswith("a prediction from the cost table)") == (r["r_source"] == "table")
    # the tally counts physics apart from the cost model (the former cell counted a model warning as a violation)
    n_cost, n_runs = len(controls.cost_warnings(costs, pair="tiny")), len(controls.speedup_warnings(t, model=False))
    n_model = len(controls.prediction_warnings(t))
    assert tally[0].startswith(f"physical controls: {n_cost + n_runs} violation(s)")
    assert ("left out of the figures" in tally[0]) == (n_runs > 0) and ("too optimistic" in tally[0]) == (n_cost > 0)
    assert tally[1:] == ([f"cost-model controls: {n_model} prediction(s) outside the measured interval, named above "
                          "(not a defect: those runs stay in the figures)"] if n_model else [])
    assert found == controls.cost_warnings(costs, pair="tiny") + controls.speedup_warnings(t)
    assert bool(found) == (low_r or defect or any(t["predicted"].lt(t["speedup_low"]) | t["predicted"].gt(t["speedup_high"])))
    assert sum(line.startswith("null-draft control") for line in lines) == 2
    assert sum(line.startswith("FLAG ") for line in lines) == int(disagree)


def test_session_report_with_every_control_passing():
    t = _session(5)
    t["predicted"] = t["speedup"]  # every prediction inside its interval
    found, lines = controls.session_report({"distilled": {"r": {1: 1.1}}}, t, pair="tiny", gamma=4, prompts=4,
                                           repeats=3)
    assert found == [] and not any(line.startswith(("!!!", "cost-model controls")) for line in lines)
    assert lines[0] == ("physical controls: 0 violation(s) (r(g) >= 1 within 5 % for every draft, every speedup <= "
                        "its tau, the null draft <= 1)")
    assert lines[-2] == "ratio of totals and mean of ratios agree within their intervals for all 5 runs"


def test_reading_warnings_name_the_run_and_the_prompt_once_each():
    events = [
        dict(control="prefill", label="spade-distilled-g2-T0", question_id=122, sample=0, round=2, prefill=0.298,
             seconds=0.119, action="dropped"),
        dict(control="gap", label="ar-T0", question_id=7, sample=1, round=0, seconds=61.0, after="spade-null-g2-T0",
             action="retimed"),
        dict(control="round", label="ar-T0", question_id=8, sample=0, round=1, seconds=21.0, median=0.5,
             limit=math.log(1.5), action="retimed"),
        dict(control="tokens", label="spade-null-g2-T1", question_id=9, sample=0, tokens=40, baseline="ar-T1",
             baseline_tokens=64, action="flagged"),
    ]
    w = controls.reading_warnings(events, pair="smollm2")
    assert len(w) == 4 and all(line.startswith(controls.PREFIX + ": smollm2/") for line in w)
    assert "smollm2/spade-distilled-g2-T0: prompt 122 (sample 0)" in w[0] and "0.298 s" in w[0]
    assert "prefill <= wall" in w[0] and "never priced" in w[0]
    assert "prompt 7 (sample 1)" in w[1] and "61.000 s" in w[1] and "host pause" in w[1] and "timed again" in w[1]
    assert "42.00x the median" in w[2] and "beyond 1.50x" in w[2]
    assert "timed 40 new tokens, its baseline ar-T1 64" in w[3] and w[3].endswith("flagged")
    assert controls.reading_warnings([]) == []
    with pytest.raises(ValueError, match="control"):
        controls.reading_warnings([dict(control="vibes")])


def test_held_out_errors_price_each_run_against_its_interval():
    """Issue 56: the cost model's error on configurations outside its fit, with the run's interval and n."""
    table = [{"label": "spade-d-g4-T0", "method": "spade", "T": 0.0, "r_source": "loop", "loop_partners": 1,
              "speedup": 1.15, "speedup_low": 1.08, "speedup_high": 1.21, "predicted": 1.20},
             {"label": "spade-null-g4-T0", "method": "spade", "T": 0.0, "r_source": "loop", "loop_partners": 1,
              "speedup": 0.88, "speedup_low": 0.84, "speedup_high": 0.92, "predicted": 0.80},
             {"label": "hf-T0", "method": "hf", "T": 0.0, "speedup": 0.65, "speedup_low": 0.62,
              "speedup_high": 0.69, "predicted": 0.9},
             {"label": "spade-x-g4-T0", "method": "spade", "T": 0.0, "speedup": 1.0, "predicted": float("nan")}]
    e = controls.held_out_errors(table)
    assert list(e["label"]) == ["spade-d-g4-T0", "spade-null-g4-T0"]  # HF and unpriced runs are not predictions
    assert list(e.columns) == controls.HELD_OUT_COLUMNS
    assert e["error"].round(4).tolist() == [round(1.15 / 1.20 - 1, 4), round(0.88 / 0.80 - 1, 4)]
    assert e["error_low"].iloc[0] < 0 < e["error_high"].iloc[0] and e["inside"].tolist() == [True, False]
    line = controls.held_out_line(e)
    assert "n = 2 runs" in line and "inside the run's 95 % interval for 1 of 2" in line and "largest 10.0 %" in line
    assert "no priced speculative run" in controls.held_out_line(controls.held_out_errors([]))
