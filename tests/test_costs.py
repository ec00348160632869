"""Forward costs from paired micro-benchmarks: shapes, the cache shared by notebooks, their use in metrics."""

from __future__ import annotations

import types

import pytest

from spade_lib import paths
from spade_lib.runs import metrics
from spade_lib.decoding.adapter import CausalLMAdapter
from spade_lib.runs import costs as costs_mod
from spade_lib.decoding.costs import measure_costs, measure_tree_cost, verify_cost_fn
from spade_lib.runs.costs import pair_costs
from tests.test_decode import llama
from tests.test_metrics import summary, trace_from_blocks


def test_measure_costs_tables():
    t, d = CausalLMAdapter(llama(layers=2)), CausalLMAdapter(llama(layers=1, seed=1))
    got = measure_costs(t, d, 3, context=16, reps=3)
    assert sorted(got["r"]) == [1, 2, 3] and got["c"] > 0 and got["t_target"] > 0
    assert all(v > 0 for v in got["r"].values())
    no_draft = measure_costs(t, None, 2, context=16, reps=2)
    assert no_draft["c"] == 0.0 and sorted(no_draft["r"]) == [1, 2]
    with pytest.raises(ValueError, match="max_gamma"):
        measure_costs(t, d, 0)
    with pytest.raises(ValueError, match="reps"):
        measure_costs(t, d, 2, reps=0)


def test_measure_tree_cost_times_the_tree_masked_verification_forward():
    t = CausalLMAdapter(llama(layers=2))
    got = measure_tree_cost(t, [-1, 0, 0, -1, 3], context=16, reps=3)
    assert got["n_nodes"] == 5 and got["r"] > 0 and got["t_verify"] > 0 and got["context"] == 16
    for bad in ([], [0], [-1, 1]):
        with pytest.raises(ValueError, match="parents"):
            measure_tree_cost(t, bad, context=16, reps=2)
    with pytest.raises(ValueError, match="reps"):
        measure_tree_cost(t, [-1], reps=0)


def test_verify_cost_fn_edges():
    r = verify_cost_fn({"r": {1: 1.1, 2: 1.3, 3: 1.6}})
    assert r(0) == 1.0 and r(2) == 1.3
    assert r(5) == pytest.approx(1.6 + 2 * 0.3)  # linear beyond the table, through its last two points
    assert verify_cost_fn({"r": {"1": 1.2}})(3) == pytest.approx(1.2)  # JSON keys, one point: flat


def test_pair_costs_are_cached_per_key(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    pair = types.SimpleNamespace(name="mini", target=llama(layers=2), drafts={"d": llama(layers=1, seed=2)})
    first = pair_costs(pair, ["d", "ngram"], 2, context=16, reps=2)
    assert first["ngram"]["c"] == 0.0 and first["d"]["c"] > 0
    assert sorted(first["d"]["r"]) == list(range(1, costs_mod.MIN_GAMMA + 1))  # at least MIN_GAMMA
    assert len(list((tmp_path / "costs" / "mini").glob("*.json"))) == 2

    def boom(*a, **k):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(costs_mod, "measure_costs", boom)
    again = pair_costs(pair, ["d"], 4, context=16, reps=2)  # below MIN_GAMMA: the same measurement
    assert again["d"]["r"] == first["d"]["r"] and again["d"]["c"] == first["d"]["c"]


def test_run_metrics_prices_predictions_with_given_costs():
    t = trace_from_blocks([("a", 2, 3), ("a", 3, 3), ("b", 0, 3)], t_draft=0.003)
    s = summary(["a", "b"], [7, 1], [0.5, 0.1], [[3, 4], [1]])
    ar = summary(["a", "b"], [7, 1], [1.0, 0.2])
    base = metrics.run_metrics(t, s, ar, gamma=3)
    got = metrics.run_metrics(t, s, ar, gamma=3, costs={"c": 0.1, "r": {1: 1.2, 2: 1.4, 3: 1.5}})
    assert got["c"] == 0.1 and got["r"] == 1.5
    assert got["c_trace"] == base["c"] and got["r_trace"] == base["r"]
    assert got["predicted"] == pytest.approx(metrics.predicted_speedup(5 / 7, 3, 0.1, verify_cost=1.5))
    assert got["predicted_thm38"] == pytest.approx(metrics.predicted_speedup(5 / 7, 3, 0.1))


def test_model_free_drafters_share_one_target_measurement(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    pair = types.SimpleNamespace(name="mini", target=llama(layers=2), drafts={})
    calls = []
    real = costs_mod.measure_costs
    monkeypatch.setattr(costs_mod, "measure_costs", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    got = pair_costs(pair, ["ngram", "null"], 2, context=16, reps=2)
    assert len(calls) == 1 and calls[0] is None  # the target timed once for both
    assert got["ngram"]["r"] == got["null"]["r"] and got["null"]["c"] == 0.0
    assert got["ngram"]["key"]["draft"] == "ngram" and got["null"]["key"]["draft"] == "null"
