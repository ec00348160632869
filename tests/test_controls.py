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
