"""Notebook 04's runs and tables from the package (spade_lib.diagnose.study, tree_study and the tables they
added): each against the notebook's inline code it replaced (the reference), on hand-made tables, synthetic
traces and the tiny pair's real runs; and the check of the drafts with its message."""

from __future__ import annotations

import types
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from spade_lib import diagnose as dg
from spade_lib import paths
from spade_lib.decoding.drafts.tree_drafting import TreeConfig
from spade_lib.diagnose import study, tree_study
from spade_lib.runs import metrics, protocol, trace
from spade_lib.runs.config import RunConfig
from spade_lib.runs.store import read_summary
from tests.tree_traces import random_steps, tree_trace

DRAFTS, GAMMA, T1 = ["distilled", "data_only"], 3, 1.0


def run_config(**fields) -> RunConfig:
    """What ``Experiment.run_config`` gives a notebook: the shared fields, then the run's own."""
    return RunConfig(**{**dict(max_new_tokens=16, device="cpu", threads=1, max_prompt_tokens=64), **fields})


# -- hand-made inputs ---------------------------------------------------------------------------------

def test_the_study_checks_every_draft_before_it_runs_anything(monkeypatch):
    """run_drafts / position_runs check each draft (drafters.check_draft: the pair's drafts and heads, or a
    registered drafter; a head drafter only with heads) before a run is made."""
    bare = types.SimpleNamespace(name="p", drafts={"distilled": 0}, heads={})
    monkeypatch.setattr(protocol, "run_interleaved", lambda *a, **k: pytest.fail("ran before checking the drafts"))
    kw = dict(gamma=2, proto=None)
    for bad, match in (("nope", r"^draft: pair 'p' has drafts \['distilled'\], heads \[\] .* not 'nope'"),
                       ("eagle", r"^draft: 'eagle' drafts with one of the pair's feature heads, and pair 'p' has none")):
        with pytest.raises(ValueError, match=match):
            study.run_drafts(bare, None, run_config, ["distilled", "ngram", bad], temperature=1.0, **kw)
        with pytest.raises(ValueError, match=match):
            study.position_runs(bare, None, run_config, ["distilled", bad], temperatures=[1.0], **kw)
    headed = types.SimpleNamespace(name="p", drafts={"distilled": 0}, heads={"eagle3": 0})
    with pytest.raises(pytest.fail.Exception, match="ran before"):  # every draft passed: the runs start
        study.run_drafts(headed, None, run_config, ["eagle", "eagle3", "ngram"], temperature=1.0, **kw)


def test_with_run_tau_is_the_summaries_tau_per_category_and_overall():
    t = dg.synthetic_trace(60, 3, [0.8, 0.6, 0.4], n_prompts=4, seed=1)
    table = dg.category_summary(dg.combine_runs({"a": t, "b": t}, key="draft"), by="draft")
    summ = pd.DataFrame({"category": ["code", "code", "prose"], "accept_lengths": [[1, 4, 2], [3], [2, 2, 1, 1]]})
    got = dg.with_run_tau(table, {"a": summ, "b": summ.assign(accept_lengths=[[2], [2, 3], [1]])}, by="draft")
    by_hand = {("a", "code"): (1 + 4 + 2 + 3) / 4, ("a", "prose"): 6 / 4, ("a", "overall"): 16 / 8,
               ("b", "code"): 7 / 3, ("b", "prose"): 1.0, ("b", "overall"): 8 / 4}
    for (d, cat), tau in by_hand.items():
        row = got[(got.draft == d) & (got.category == cat)]
        assert row["tau"].tolist() == pytest.approx([tau]), (d, cat)
    assert list(got.columns) == [*table.columns, "tau"] and "tau" not in table.columns  # the input is kept


def test_separated_fits_names_the_groups_past_the_bound():
    coefs = pd.DataFrame({"draft": ["a", "a", "b", "c"], "coef_per_sd": [0.5, -9.0, 8.0, 30.0]})
    assert dg.separated_fits(coefs, by="draft") == ["a", "c"]  # 8.0 is not past the bound
    assert dg.separated_fits(coefs, by="draft", max_coef_per_sd=40) == []
    assert dg.separated_fits(pd.DataFrame(), by="draft") == []


def test_root_acceptance_equals_the_notebooks_first_token_table():
    rng = np.random.default_rng(0)
    runs = {"tree 8": tree_trace(random_steps(30, 8, seed=1)), "chain": tree_trace([([-1, 0, 1], [1, 0, 1], [1, 0, 1, 0])] * 5)}
    both = dg.combine_runs(runs, key="run")
    both["accept_prob"] = rng.uniform(0, 1, len(both))  # the recorded exact probability, any number,
    both.loc[~both["reached"], "accept_prob"] = np.nan  # and NaN where a node was never judged, as recorded
    sibling = dg.sibling_acceptance(both, by="run")  # notebook 04's inline code before root_acceptance
    first = sibling[(sibling.depth == 0) & (sibling.sibling_rank == 0)].set_index("run")
    roots = both[(both.depth == 0) & (both.sibling_rank == 0) & both.reached]
    exact_first = roots.groupby("run", observed=True)["accept_prob"].mean()
    got = dg.root_acceptance(both, by="run").set_index("run")
    pd.testing.assert_frame_equal(got.drop(columns="accept_prob"), first, check_index_type=False,
                                  check_categorical=False)
    assert got["accept_prob"].to_dict() == pytest.approx(exact_first.to_dict())
    alone = dg.root_acceptance(runs["chain"].assign(accept_prob=0.25))
    assert len(alone) == 1 and alone["reached"].iloc[0] == 5 and alone["accept_prob"].iloc[0] == 0.25
    with pytest.raises(ValueError, match="accept_prob"):
        dg.root_acceptance(runs["chain"].drop(columns="accept_prob"))


def _notebook_wrong_q(traces, pos_table, drafts, gamma, wrong_q, n_prompts, seed):
    """Notebook 04's wrong-q cell before wrong_q_study (the reference)."""
    alpha_hat = pos_table[pos_table.draft == drafts[0]].set_index("pos")["alpha_cond"].reindex(range(gamma))
    alpha_hat = alpha_hat.fillna(0.5).clip(0.3, 0.95).to_numpy()
    n_steps = max(int((traces.pos == 0).sum()) * 100, 20_000)
    synthetic = {w: dg.synthetic_trace(n_steps, gamma, alpha_hat, n_prompts=n_prompts, wrong_q=w, seed=seed)
                 for w in (0.0, wrong_q)}
    wrong_table = pd.concat([dg.expected_vs_realised(t).assign(trace=f"synthetic, wrong_q={w:g}")
                             for w, t in synthetic.items()], ignore_index=True)
    rejudgeable = [d for d in drafts if traces.loc[traces.draft == d, "uniform"].notna().any()
                   and (traces.loc[traces.draft == d, "depth"] == traces.loc[traces.draft == d, "pos"]).all()]
    wrong_power = None
    if rejudgeable:
        rejudged = dg.rejudge_wrong_q(traces[traces.draft.isin(rejudgeable)], wrong_q)
        wrong_power = dg.wrong_q_power(rejudged, by="draft", level=1e-3)
        real_wrong = dg.expected_vs_realised(rejudged, by="draft", bases=("accept_prob",)).assign(
            trace=f"this run re-judged, wrong_q={wrong_q:g}")
        wrong_table = pd.concat([wrong_table, real_wrong], ignore_index=True)
    return synthetic, wrong_table, wrong_power


@pytest.mark.parametrize("greedy_first", [False, True])
def test_wrong_q_study_equals_the_notebooks_cell(greedy_first):
    a = dg.synthetic_trace(150, 4, [0.9, 0.8, 0.6, 0.5], n_prompts=3, seed=2)
    b = dg.synthetic_trace(150, 4, [0.7, 0.6, 0.5, 0.4], n_prompts=3, seed=3)
    if greedy_first:  # a greedy draft records no uniforms: it is not re-judged
        a = a.assign(uniform=np.nan)
    traces = dg.categorize(dg.combine_runs({"a": a, "b": b}, key="draft"))
    pos_table = dg.position_acceptance(traces, by="draft")
    ref_syn, ref_table, ref_power = _notebook_wrong_q(traces, pos_table, ["a", "b"], 4, 0.25, 3, 0)
    got = dg.wrong_q_study(traces, pos_table[pos_table.draft == "a"].set_index("pos")["alpha_cond"], 4, 0.25,
                           n_prompts=3, by="draft", seed=0)
    assert list(got.synthetic) == [0.0, 0.25]
    for w in got.synthetic:
        pd.testing.assert_frame_equal(got.synthetic[w], ref_syn[w])
    pd.testing.assert_frame_equal(got.table, ref_table)
    pd.testing.assert_frame_equal(got.power, ref_power)
    assert set(got.power["draft"].astype(str)) == ({"b"} if greedy_first else {"a", "b"})
    only_greedy = dg.wrong_q_study(traces[traces.draft == "a"].assign(uniform=np.nan), pd.Series([0.9]), 4, 0.25,
                                   n_prompts=3)
    assert only_greedy.power is None and set(only_greedy.table["trace"]) == {"synthetic, wrong_q=0",
                                                                             "synthetic, wrong_q=0.25"}


def _notebook_tree_configs(wide, budgets, gamma, temperature, draft):
    """Notebook 04's tree configurations before tree_study.plan (the reference)."""
    checked = (sorted(b for b in set(budgets) if b < wide.total_nodes)[-2:] if wide.shape in ("eagle2", "trie") else [])

    def tree_config(T, nodes=None):
        t = wide if nodes is None else replace(wide, total_nodes=nodes)
        return run_config(method="spade", draft=draft, gamma=t.max_depth, temperature=T, tree=t.spec())

    configs = {}
    for T in dict.fromkeys([0.0, temperature]):
        configs[(f"chain g{gamma}", T)] = run_config(method="spade", draft=draft, gamma=gamma, temperature=T)
        configs[(f"tree {wide.total_nodes}", T)] = tree_config(T)
    for b in checked:
        configs[(f"tree {b}", 0.0)] = tree_config(0.0, b)
    return checked, configs


@pytest.mark.parametrize("spec,temperature", [("eagle2", 1.0), ("eagle2:nodes=8,depth=3,topk=2", 0.0),
                                              ("static", 1.0)])
def test_tree_plan_equals_the_notebooks_configurations(spec, temperature):
    budgets = [2, 4, 8, 16]
    got = tree_study.plan(spec, budgets, run_config, draft="distilled", gamma=4, temperature=temperature)
    checked, configs = _notebook_tree_configs(TreeConfig.parse(spec), budgets, 4, temperature, "distilled")
    assert got.checked == checked and got.configs == configs
    assert got.temperatures == list(dict.fromkeys([0.0, temperature]))
    assert got.ar == {T: run_config(method="ar", temperature=T) for T in got.temperatures}
    assert got.chain_label == "chain g4" and got.wide_label == f"tree {got.wide.total_nodes}"
    assert (got.checked == [4, 8]) == (spec == "eagle2") and (spec != "static" or got.checked == [])
    with pytest.raises(ValueError, match="tree_spec must name a tree"):
        tree_study.plan("chain", budgets, run_config, draft="distilled", gamma=4, temperature=1.0)


# -- the tiny pair's runs --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny pair, a four-prompt suite and a run folder of their own."""
    from spade_lib.bench import default_suite
    from spade_lib.zoo.pairs import load_pair

    mp = pytest.MonkeyPatch()
    mp.setattr(paths, "RUNS_DIR", tmp_path_factory.mktemp("runs"))
    threads = torch.get_num_threads()
    try:
        yield types.SimpleNamespace(pair=load_pair("tiny"), suite=default_suite(tokenizer="tiny", n_per_category=1),
                                    proto=protocol.Protocol(warmup=0, repeats=2))
    finally:
        torch.set_num_threads(threads)
        mp.undo()


@pytest.mark.slow
def test_draft_runs_and_their_speedups_equal_the_notebooks(tiny):
    pair, suite, proto = tiny.pair, tiny.suite, tiny.proto
    got = study.run_drafts(pair, suite, run_config, DRAFTS, gamma=GAMMA, temperature=T1, proto=proto)
    # notebook 04's first cell before run_drafts (the reference): every run is read back now
    ar_config = run_config(method="ar", temperature=T1)
    configs = {d: run_config(method="spade", draft=d, gamma=GAMMA, temperature=T1) for d in DRAFTS}
    dirs = protocol.run_interleaved(pair, suite, list(configs.values()), ar_config, protocol=proto, progress=False)
    run_dirs = {d: dirs[proto.config(c)] for d, c in configs.items()}
    run_dirs["ar"] = dirs[proto.config(ar_config)]
    assert got.dirs == run_dirs and list(got.dirs) == [*DRAFTS, "ar"] and got.configs == configs
    traces = dg.categorize(dg.combine_runs({d: trace.read_trace(run_dirs[d]) for d in DRAFTS}, key="draft"))
    pd.testing.assert_frame_equal(got.traces, traces)
    for name, d in run_dirs.items():
        pd.testing.assert_frame_equal(got.summaries[name], read_summary(d))
    # the per-category speedups, as the notebook's summary cell computed them
    from spade_lib.runs.costs import pair_costs

    costs = pair_costs(pair, DRAFTS, GAMMA)
    speed_dirs = {proto.config(c): run_dirs[d] for d, c in configs.items()}
    cat = protocol.speedup_table(speed_dirs, ar_config, protocol=proto, by="category", costs=costs)
    overall = protocol.speedup_table(speed_dirs, ar_config, protocol=proto, costs=costs).assign(category="overall")
    ref = pd.concat([cat, overall], ignore_index=True)[study.SPEED_COLUMNS]
    pd.testing.assert_frame_equal(got.category_speedups(pair, proto), ref)
    # the run's tau per category is the one tau of the summaries
    table = dg.with_run_tau(dg.category_summary(got.traces, by="draft"), got.summaries, by="draft")
    row = table[(table.draft == "distilled") & (table.category == "overall")].iloc[0]
    assert row["tau"] == metrics.mean_accepted_length(got.summaries["distilled"])


@pytest.mark.slow
def test_position_runs_equal_the_notebooks(tiny):
    pair, suite, proto = tiny.pair, tiny.suite, tiny.proto
    got = study.position_runs(pair, suite, run_config, DRAFTS, gamma=5, temperatures=[0.0, T1, 0.0], proto=proto)
    eagle_dirs = {}  # notebook 04's EAGLE cell before position_runs (the reference)
    for T in dict.fromkeys([0.0, T1]):
        ar_T = run_config(method="ar", temperature=T)
        cs = {d: run_config(method="spade", draft=d, gamma=5, temperature=T) for d in DRAFTS}
        got_T = protocol.run_interleaved(pair, suite, list(cs.values()), ar_T, protocol=proto, progress=False)
        eagle_dirs.update({(d, T): got_T[proto.config(c)] for d, c in cs.items()})
    ref = pd.concat([trace.read_trace(p).assign(draft=d, T=T) for (d, T), p in eagle_dirs.items()], ignore_index=True)
    pd.testing.assert_frame_equal(got, ref)
    assert sorted(set(zip(got["draft"], got["T"]))) == sorted((d, T) for d in DRAFTS for T in (0.0, T1))


@pytest.mark.slow
def test_tree_runs_equal_the_notebooks(tiny):
    pair, suite, proto = tiny.pair, tiny.suite, tiny.proto
    tree_plan = tree_study.plan("eagle2:nodes=6,depth=3,topk=2", [2, 4], run_config, draft="distilled", gamma=GAMMA,
                                temperature=T1)
    got = tree_study.run(pair, suite, tree_plan, proto=proto)
    tree_dirs, tree_speed = {}, []  # notebook 04's tree cell before tree_study.run (the reference)
    for T in dict.fromkeys([0.0, T1]):
        cs = {k: c for k, c in tree_plan.configs.items() if k[1] == T}
        ar_T = run_config(method="ar", temperature=T)
        got_T = protocol.run_interleaved(pair, suite, list(cs.values()), ar_T, protocol=proto, progress=False)
        tree_dirs.update({k: got_T[proto.config(c)] for k, c in cs.items()})
        speed_T = protocol.speedup_table({proto.config(c): got_T[proto.config(c)] for c in cs.values()}, ar_T,
                                         protocol=proto)
        tree_speed.append(speed_T.assign(run=[f"{k[0]} T={T:g}" for k in cs]))
    tree_traces = dg.categorize(dg.combine_runs({f"{k[0]} T={k[1]:g}": trace.read_trace(d)
                                                 for k, d in tree_dirs.items()}, key="run"))
    assert got.dirs == tree_dirs and [tree_study.run_label(*k) for k in got.dirs] == [
        "chain g3 T=0", "tree 6 T=0", "tree 2 T=0", "tree 4 T=0", "chain g3 T=1", "tree 6 T=1"]
    pd.testing.assert_frame_equal(got.traces, tree_traces)
    pd.testing.assert_frame_equal(got.depth, dg.depth_acceptance(tree_traces, by="run"))
    pd.testing.assert_frame_equal(got.sibling, dg.sibling_acceptance(tree_traces, by="run"))
    pd.testing.assert_frame_equal(got.lengths, dg.tree_accept_length_hist(tree_traces, by="run"))
    pd.testing.assert_frame_equal(got.summary, dg.tree_summary(tree_traces, by="run"))
    cost_ref = pd.concat(tree_speed, ignore_index=True).rename(columns={"mean_gamma": "nodes"})[
        ["run", "T", "nodes", "tau", "tau_low", "tau_high", "speedup", "speedup_low", "speedup_high"]]
    pd.testing.assert_frame_equal(got.cost_table(), cost_ref)
    r = {1: 1.1, 2: 1.2, 3: 1.3, 6: 1.6}
    cost_ref.insert(3, "r_nodes", [r.get(int(round(n)), float("nan")) for n in cost_ref["nodes"]])
    pd.testing.assert_frame_equal(got.cost_table(r), cost_ref)
