"""Forward costs from paired micro-benchmarks: shapes, the cache shared by notebooks, their use in metrics."""

from __future__ import annotations

import types

import pytest
import torch

from spade_lib import paths
from spade_lib.decoding.drafts.drafters import Drafter
from spade_lib.decoding.model.adapter import CausalLMAdapter
from spade_lib.decoding.studies.costs import measure_costs, measure_tree_cost, verify_cost_fn
from spade_lib.runs import metrics
from spade_lib.runs import costs as costs_mod
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
    assert verify_cost_fn({"r": {"1": 1.2}})(3) == pytest.approx(1.6)  # JSON keys, one point: the line through r(0) = 1


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
    assert got["c_trace"] == base["c_trace"] and got["r_trace"] == base["r_trace"]
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


def test_model_free_drafters_reuse_a_model_drafts_target_measurement(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    pair = types.SimpleNamespace(name="mini", target=llama(layers=2), drafts={"d": llama(layers=1, seed=2)})
    calls = []
    real = costs_mod.measure_costs
    monkeypatch.setattr(costs_mod, "measure_costs", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    got = pair_costs(pair, ["d", "ngram", "null"], 2, context=16, reps=2)
    assert len(calls) == 1 and calls[0] is not None  # r(g) is the target's: timed once, in turns with d
    assert got["ngram"]["r"] == got["d"]["r"] == got["null"]["r"]
    assert got["ngram"]["t_target"] == got["d"]["t_target"]
    assert got["ngram"]["c"] == got["null"]["c"] == 0.0 and got["ngram"]["t_draft"] == 0.0 and got["d"]["c"] > 0



def test_one_r_per_target_across_calls_and_drafts(tmp_path, monkeypatch):
    """Two model drafts measured in separate calls are priced with one r(g) of their target: the first
    measurement's (saved as the target's table); the second keeps its own paired r as r_paired, and its loop
    overhead comes from the shared r(1). A fresh process reading the tables back gets the same."""
    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    pair = types.SimpleNamespace(name="mini", target=llama(layers=2),
                                 drafts={"d": llama(layers=1, seed=2), "e": llama(layers=1, seed=3)})
    real = costs_mod.measure_costs
    bump = iter([1.0, 1.5])  # the second session's r(g) half as large again: a disturbed host

    def fake(*a, **k):
        got = real(*a, **k)
        f = next(bump)
        return {**got, "r": {g: (1 + 0.1 * g) * f for g in got["r"]}}

    monkeypatch.setattr(costs_mod, "measure_costs", fake)
    monkeypatch.setattr(costs_mod, "loop_overhead", lambda *a, **k: {"null_step": 3.0})
    d = pair_costs(pair, ["d"], 2, context=16, reps=2)["d"]
    e = pair_costs(pair, ["e", "null"], 2, context=16, reps=2)
    assert e["e"]["r"] == d["r"] == e["null"]["r"] and e["e"]["r_source"] == "d" and "r_paired" not in d
    assert e["e"]["r_paired"] == pytest.approx({g: 1.5 * v for g, v in d["r"].items()})
    assert e["e"]["overhead"] == pytest.approx(3.0 - d["r"][1]) == d["overhead"]
    targets = list((tmp_path / "costs" / "mini" / "target").glob("r-*.json"))
    assert len(targets) == 1 and costs_mod.read_costs(targets[0])["source"] == "d"
    again = pair_costs(pair, ["e", "d"], 2, context=16, reps=2)  # read back: nothing measured
    assert again["e"] == e["e"] and again["d"] == d


def test_a_longer_table_extends_the_targets_r_and_keeps_the_shared_part(tmp_path, monkeypatch):
    """A table measured to a larger max_gamma (notebook 04's trees) is priced with the shared r(g) where the
    target's table has it and extends it beyond; a later short table reads the same."""
    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    pair = types.SimpleNamespace(name="mini", target=llama(layers=2), drafts={"d": llama(layers=1, seed=2)})
    real = costs_mod.measure_costs
    bump = iter([1.0, 1.5, 2.0])

    def fake(*a, **k):
        got = real(*a, **k)
        f = next(bump)
        return {**got, "r": {g: (1 + 0.1 * g) * f for g in got["r"]}}

    monkeypatch.setattr(costs_mod, "measure_costs", fake)
    short = pair_costs(pair, ["null"], 2, context=16, reps=2, overhead=False)["null"]
    long = pair_costs(pair, ["d"], costs_mod.MIN_GAMMA + 3, context=16, reps=2, overhead=False)["d"]
    n = costs_mod.MIN_GAMMA
    assert all(long["r"][g] == short["r"][g] for g in range(1, n + 1))
    assert long["r"][n + 1] == pytest.approx((1 + 0.1 * (n + 1)) * 1.5) and long["r_source"] == "null"
    target = costs_mod.read_costs(next((tmp_path / "costs" / "mini" / "target").glob("r-*.json")))
    assert target["r"] == long["r"] and set(target["extended"]) == {str(g) for g in range(n + 1, n + 4)}


def test_with_overhead_meets_the_null_loop_at_gamma_1():
    from spade_lib import theory

    t = costs_mod.with_overhead({"c": 0.0, "r": {1: 1.2, 2: 1.3}}, {"null_step": 1.5})
    assert t["overhead"] == pytest.approx(0.3) and t["null_step"] == 1.5
    # the null draft's prediction at gamma 1, 1 / (r(1) + o), is the measured loop ratio
    assert theory.speedup(0.0, 1, 0.0, verify_cost=1.2, overhead=t["overhead"]) == pytest.approx(1 / 1.5)
    low = costs_mod.with_overhead({"r": {1: 1.2}}, {"null_step": 1.1})  # noise below r(1): clipped at 0
    assert low["overhead"] == 0.0 and low["overhead_raw"] == pytest.approx(-0.1)


def test_loop_overhead_is_measured_once_per_pair_and_priced_into_every_table(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    pair = types.SimpleNamespace(name="mini", target=llama(layers=2), drafts={"d": llama(layers=1, seed=2)})
    calls = []
    real = costs_mod.measure_loop_overhead
    monkeypatch.setattr(costs_mod, "measure_loop_overhead", lambda *a, **k: calls.append(k) or real(*a, **k))
    got = pair_costs(pair, ["d", "ngram"], 2, context=16, reps=2)
    assert len(calls) == 1 and calls[0]["context"] == 16  # once for the pair, at the tables' context
    loop = json.loads(next((tmp_path / "costs" / "mini" / "loop").glob("*.json")).read_text())
    assert loop["null_step"] > 0 and loop["s_ar"] > 0 and loop["steps"] == 32 and loop["context"] == 16
    for t in got.values():
        assert t["null_step"] == loop["null_step"]
        assert t["overhead"] == pytest.approx(max(0.0, loop["null_step"] - t["r"][1])) and t["overhead"] >= 0
    # a table cached before the overhead existed gets it from the loop's cache, nothing measured again
    path = next((tmp_path / "costs" / "mini").glob("d-*.json"))
    old = json.loads(path.read_text())
    for k in ("overhead", "overhead_raw", "null_step"):
        old.pop(k)
    path.write_text(json.dumps(old))
    monkeypatch.setattr(costs_mod, "measure_costs", lambda *a, **k: pytest.fail("measured again"))
    again = pair_costs(pair, ["d"], 2, context=16, reps=2)
    assert len(calls) == 1 and again["d"]["overhead"] == pytest.approx(got["d"]["overhead"])
    assert "overhead" in json.loads(path.read_text())  # and the file now carries it


def test_measure_loop_overhead_times_rounds_for_min_seconds_within_its_bounds():
    """At least ``reps`` rounds; more while ``min_seconds`` of rounds have not passed; never more than
    ``max_reps`` (unless ``reps`` asks for more). A round of this 1-layer model is a few milliseconds."""
    from spade_lib.decoding.studies.costs import measure_loop_overhead

    m = llama(layers=1)
    assert measure_loop_overhead(m, steps=4, context=8, reps=3, min_seconds=0.0)["reps"] == 3
    assert measure_loop_overhead(m, steps=4, context=8, reps=3, min_seconds=600.0, max_reps=7)["reps"] == 7
    assert measure_loop_overhead(m, steps=4, context=8, reps=5, min_seconds=600.0, max_reps=2)["reps"] == 5
    got = measure_loop_overhead(m, steps=4, context=8, reps=2, min_seconds=2.0, max_reps=10_000)
    assert got["reps"] > 2 and got["null_step"] > 0  # a round of a few ms (< 1 s on any host): 2 s take more


def test_measure_loop_overhead_checks_its_arguments():
    from spade_lib.decoding.studies.costs import measure_loop_overhead

    for bad in (dict(steps=1), dict(reps=0), dict(context=True), dict(max_reps=0), dict(min_seconds=-1.0),
                dict(min_seconds="5")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            measure_loop_overhead(llama(layers=1), **bad)


# ---------------------------------------------------------------- feature heads: c is the head's drafting step

def _heads_of(target):
    from spade_lib.decoding.drafts.medusa import MedusaHead
    from tests.test_eagle import make_head

    medusa = MedusaHead.from_target(target, num_heads=3)
    with torch.no_grad():
        for p in medusa.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return {"e3": make_head(target, "eagle3"), "e1": make_head(target, "eagle1"), "med": medusa}


@pytest.mark.parametrize("name", ["e3", "e1", "med"])
def test_the_timed_head_step_is_the_drafters_first_step(name):
    """Reference: what HeadStep times after ``prefill(x_1 .. x_n)`` + ``extend([x_{n+1}])`` is the first
    proposal's logits of the head's drafter after observing ``x_0 .. x_n`` (features of the same target)."""
    from spade_lib.decoding.drafts.drafters import TargetView
    from spade_lib.decoding.drafts.policies import FixedGamma
    from spade_lib.decoding.studies.costs import HeadStep
    from spade_lib.sampling import SamplingConfig
    from tests.test_eagle import hidden_at, tiny_target

    target = tiny_target()
    head = _heads_of(target)[name]
    seq = [5, 9, 33, 2, 17, 40, 8, 21]
    n = len(seq) - 2
    drafter = head.drafter()
    layers = drafter.hidden_layers
    hidden = hidden_at(target, seq[: n + 1], layers)
    drafter.reset(torch.tensor(seq[: n + 1]), 64)
    drafter.observe(TargetView(torch.tensor(seq[: n + 1]), 0, hidden, seq[n + 1]))
    draft = drafter.propose(1, FixedGamma(gamma=1), SamplingConfig(temperature=0), None)
    feats = head.features(hidden) if head.kind == "eagle" else hidden[layers[0]]
    step = HeadStep(head, features=feats)
    with torch.no_grad():
        step.prefill(torch.tensor(seq[1: n + 1]))
        logits = step.extend(torch.tensor(seq[n + 1:]))
    torch.testing.assert_close(logits, draft.logits[:1], rtol=1e-5, atol=1e-5)
    step.rollback(n)
    assert step.length == n and (step._run is None or step._run.length == n)


def test_measure_costs_times_a_head_not_zero():
    from tests.test_eagle import tiny_target

    target = tiny_target()
    for head in _heads_of(target).values():
        got = measure_costs(CausalLMAdapter(target), head, 2, context=16, reps=3)
        assert got["c"] > 0 and got["t_draft"] > 0 and sorted(got["r"]) == [1, 2]


def test_pair_costs_time_the_pairs_heads_and_key_them_by_weights(tmp_path, monkeypatch):
    from spade_lib.decoding.studies.costs import HeadStep, is_head
    from tests.test_eagle import make_head, tiny_target

    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    target = tiny_target()
    heads = _heads_of(target)
    pair = types.SimpleNamespace(name="mini", target=target, drafts={}, heads={"e3": heads["e3"], "med": heads["med"]})
    calls = []
    real = costs_mod.measure_costs
    monkeypatch.setattr(costs_mod, "measure_costs", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    got = pair_costs(pair, ["e3", "eagle", "medusa", "ngram"], 2, context=16, reps=2)
    assert [is_head(d) or isinstance(d, HeadStep) for d in calls] == [True, True, True]  # ngram reuses r(g)
    assert got["e3"]["c"] > 0 and got["eagle"]["c"] > 0 and got["medusa"]["c"] > 0 and got["ngram"]["c"] == 0.0
    assert got["eagle"]["key"]["head"] == got["e3"]["key"]["head"]  # "eagle" is the pair's one EAGLE head
    assert got["medusa"]["key"]["head"]["kind"] == "medusa"
    pair.heads["e3"] = make_head(target, "eagle3", seed=7)  # another head under the same name: measured again
    calls.clear()
    again = pair_costs(pair, ["e3"], 2, context=16, reps=2)
    assert len(calls) == 1 and again["e3"]["key"]["head"]["weights_sha256"] != got["e3"]["key"]["head"]["weights_sha256"]
    with pytest.raises(ValueError, match="heads"):
        pair_costs(pair, ["no_such_draft"], 2, context=16, reps=2)


def test_select_costs_reads_the_tables_of_the_runs_machine_newest_first(tmp_path):
    import json
    import os

    def table(name, draft, t, **key):
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({"c": 0.1, "r": {"1": 1.1}, "t_verify": {"1": 0.01},
                                 "key": {"draft": draft, "device": "cpu", "dtype": "float32", "threads": 2, **key}}))
        os.utime(f, (t, t))

    table("d-old", "d", 100)
    table("d-new", "d", 200)
    table("d-4threads", "d", 300, threads=4)
    table("d-cuda", "d", 400, device="cuda:0")
    table("n", "ngram", 100)
    (tmp_path / "broken.json").write_text("{")
    got = costs_mod.select_costs(tmp_path, device="cpu", dtype="float32", threads=2)
    assert sorted(got) == ["d", "ngram"] and got["d"]["file"].endswith("d-new.json") and got["d"]["r"] == {1: 1.1}
    assert costs_mod.select_costs(tmp_path, threads=0)["d"]["file"].endswith("d-cuda.json")  # 0: threads left as set
    assert costs_mod.select_costs(tmp_path, device="cuda")["d"]["file"].endswith("d-cuda.json")
    assert costs_mod.select_costs(tmp_path, dtype="bfloat16") == {}


def test_a_hub_ids_tables_sit_where_the_run_folders_are_named():
    assert costs_mod.cost_folder("Qwen/Qwen2.5-7B") == paths.RUNS_DIR / "costs" / "Qwen--Qwen2.5-7B"
    assert costs_mod.cost_folder("smollm2") == paths.RUNS_DIR / "costs" / "smollm2"


# ---------------------------------------------------------------- the c = 0 trap: a registered drafter is priced by what it runs

class _HiddenModelDrafter:
    """A drafter that runs a model it holds outside a ModelDrafter (pair_costs cannot time it)."""

    def __init__(self, model):
        self.parts = {"net": model}


def test_a_registered_model_drafter_is_timed_not_costed_zero(tmp_path, monkeypatch):
    """A registered drafter that drafts with a model (a distilled draft through a ModelDrafter) gets its
    model's one-token forward as c, keyed by its weights; before the fix it was costed c = 0 like ngram."""
    from spade_lib.decoding.drafts import drafters

    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    distilled = {"model": llama(layers=1, seed=3)}
    monkeypatch.setitem(drafters._REGISTRY, "distilled", drafters._Registered(
        lambda pair, *, device: drafters.ModelDrafter(distilled["model"]), drafters.ModelDrafter.kind))
    pair = types.SimpleNamespace(name="mini", target=llama(layers=2), drafts={})
    calls = []
    real = costs_mod.measure_costs
    monkeypatch.setattr(costs_mod, "measure_costs", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    got = pair_costs(pair, ["distilled", "ngram"], 2, context=16, reps=2)
    assert isinstance(calls[0], CausalLMAdapter) and calls[0].model is distilled["model"]
    assert got["distilled"]["c"] > 0 and got["distilled"]["t_draft"] > 0 and got["ngram"]["c"] == 0.0
    assert got["distilled"]["key"]["model"]["class"] == "LlamaForCausalLM"
    distilled["model"] = llama(layers=1, seed=4)  # another model under the same name: measured again
    calls.clear()
    again = pair_costs(pair, ["distilled"], 2, context=16, reps=2)
    assert len(calls) == 1 and calls[0].model is distilled["model"]
    assert again["distilled"]["key"]["model"]["weights_sha256"] != got["distilled"]["key"]["model"]["weights_sha256"]


def test_a_registered_drafter_holding_a_model_it_cannot_time_is_refused(tmp_path, monkeypatch):
    from spade_lib.decoding.drafts import drafters

    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    monkeypatch.setitem(drafters._REGISTRY, "hidden", drafters._Registered(
        lambda pair, *, device: _HiddenModelDrafter(llama(layers=1)), drafters.ModelDrafter.kind))
    pair = types.SimpleNamespace(name="mini", target=llama(layers=2), drafts={})
    with pytest.raises(ValueError, match=r"draft: registered drafter 'hidden' .*parts\.net: LlamaForCausalLM"):
        pair_costs(pair, ["hidden"], 2, context=16, reps=2)
    assert not (tmp_path / "costs").exists() or not list((tmp_path / "costs").rglob("hidden-*.json"))


def test_the_model_free_registered_drafters_hold_no_model_and_cost_zero(tmp_path, monkeypatch):
    """The stated rule: a drafter holding no torch module and no adapter runs no forward, so c = 0 --
    every registered drafter but the head ones is such a drafter (a new one with a model would fail here)."""
    from spade_lib.decoding.drafts import drafters

    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    pair = types.SimpleNamespace(name="mini", target=llama(layers=2), drafts={})
    free = [n for n in drafters.drafter_names() if not drafters.drafter_kind(n).model]  # declared: no model
    assert {"ngram", "ngram_tree", "suffix", "null"} <= set(free)
    assert all(costs_mod._draft_of(pair, n) == (None, "none", None) for n in free)
    got = pair_costs(pair, free, 2, context=16, reps=2)
    assert all(got[n]["c"] == 0.0 and got[n]["t_draft"] == 0.0 for n in free)


class _ForwardHoldingDrafter(Drafter):
    """Drafts with a model it holds only as a bound method (no attribute is a torch module): the cost code
    cannot find the model by looking, only by the drafter's word (Drafter.drafting_model)."""

    def __init__(self, model, declare: bool):
        self._forward, self._declare = model.forward, declare
        if declare:
            self.drafting_model = lambda: CausalLMAdapter(model)


class _RingDrafter(Drafter):
    """Model-free, with an unrelated ``.head`` (the index of its ring buffer's head)."""

    def __init__(self):
        self.head, self.ring = 0, [0] * 4

    def drafting_model(self):
        return None


def test_the_c_0_trap_a_drafter_is_costed_by_what_it_says_it_runs_not_by_its_attributes(tmp_path, monkeypatch):
    """Before: the cost code keyed on a ``.head`` attribute and searched the rest for a module, so a drafter
    running a model through a bound method got c = 0, a model-free one with an unrelated ``.head`` crashed
    (StopIteration) and a head of the drafter's own (not in pair.heads) crashed too. Now the drafter says
    what a step runs: undeclared is refused, declared models and heads are timed, None is c = 0."""
    from spade_lib.decoding.drafts import drafters
    from tests.test_eagle import make_head, tiny_target

    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    model = llama(layers=1, seed=3)
    own = make_head(tiny_target(), "eagle3")
    for name, factory, kind in (("bound", lambda pair, *, device: _ForwardHoldingDrafter(model, False), _ForwardHoldingDrafter.kind),
                                ("declared", lambda pair, *, device: _ForwardHoldingDrafter(model, True), _ForwardHoldingDrafter.kind),
                                ("ring", lambda pair, *, device: _RingDrafter(), _RingDrafter.kind),
                                # a head of its own, not one of pair.heads: declared as a drafter that runs a model
                                ("own_head", lambda pair, *, device: own.drafter(), drafters.ModelDrafter.kind)):
        monkeypatch.setitem(drafters._REGISTRY, name, drafters._Registered(factory, kind))
    pair = types.SimpleNamespace(name="mini", target=llama(layers=2), drafts={})
    with pytest.raises(ValueError, match=r"draft: registered drafter 'bound' .*does not say what a drafting step runs"):
        pair_costs(pair, ["bound"], 2, context=16, reps=2)
    got = pair_costs(pair, ["declared", "ring"], 2, context=16, reps=2, overhead=False)
    assert got["declared"]["c"] > 0 and got["declared"]["key"]["model"]["class"] == "LlamaForCausalLM"
    assert got["ring"]["c"] == 0.0
    target = tiny_target()
    pair = types.SimpleNamespace(name="mini", target=target, drafts={}, heads={})
    got = pair_costs(pair, ["own_head"], 2, context=16, reps=2, overhead=False)
    assert got["own_head"]["c"] > 0 and got["own_head"]["key"]["head"]["name"] is None
    assert got["own_head"]["key"]["head"]["kind"] == "eagle"
