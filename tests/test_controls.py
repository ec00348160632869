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
