"""Notebook 05's runs and tables from the package (spade_lib.whatif.sessions and the functions it calls):
each against the notebook's inline code it replaced (the reference), on the tiny pair's real runs, plus the
checks across parameters with their messages."""

from __future__ import annotations

import types

import numpy as np
import pandas as pd
import pytest
import torch

from spade_lib import paths
from spade_lib.runs import metrics, protocol, trace
from spade_lib.runs.config import RunConfig
from spade_lib.runs.store import read_summary
from spade_lib.whatif import align, replay, sessions, stoprules

GAMMAS, MAX_GAMMA, TEMPERATURE, STOP_T = [1, 2], 3, 1.0, [0.0, 1.0]


def run_config(**fields) -> RunConfig:
    """What ``Experiment.run_config`` gives a notebook: the shared fields, then the run's own."""
    return RunConfig(**{**dict(max_new_tokens=24, device="cpu", threads=1, max_prompt_tokens=64), **fields})


def test_alignable_reads_the_drafts_declared_kind_and_names_those_it_can_replay():
    """Notebook 05 replays a draft's own q on the pair's vocabulary (sessions.REPLAYABLE, read from the declared
    kind by drafters.check_draft): a draft model aligns too, a feature head (registered or by its name) only
    replays; a cross-vocabulary draft, a model-free drafter and a head drafter without heads are refused."""
    pair = types.SimpleNamespace(name="p", drafts={"distilled": 0, "cross": 0}, draft_tokenizers={"cross": 0},
                                 heads={})
    assert sessions.alignable(pair, "distilled") is True  # a draft model: every section, the alignment too
    for bad in ("cross", "ngram", "null"):
        with pytest.raises(ValueError, match=r"^draft: '" + bad + r"' is not a drafter of pair 'p' with q=True, "
                                             r"vocabulary='same': notebook 05 replays a draft's own probabilities q "
                                             r"on the pair's vocabulary \(those: \['distilled'\]\)"):
            sessions.alignable(pair, bad)
    with pytest.raises(ValueError, match=r"^draft: 'medusa' drafts with one of the pair's feature heads, and pair "
                                         r"'p' has none attached"):
        sessions.alignable(pair, "medusa")
    with_heads = types.SimpleNamespace(**{**vars(pair), "heads": {"m1": 0}})
    assert sessions.alignable(with_heads, "medusa") is False  # the replays only
    assert sessions.alignable(with_heads, "eagle") is False
    assert sessions.alignable(with_heads, "m1") is False
    with pytest.raises(ValueError, match=r"\(those: \['eagle', 'medusa', 'distilled', 'm1'\]\)"):
        sessions.alignable(with_heads, "cross")
    assert "'medusa' is a feature head" in sessions.NO_ALIGNMENT.format(draft="medusa")


def test_check_gammas_refuses_a_gamma_past_max_gamma():
    assert sessions.check_gammas((1, 4), 4) == [1, 4]
    with pytest.raises(ValueError, match=r"max_gamma \(3\) must be >= every entry of gammas \(\[1, 4\]\)"):
        sessions.check_gammas([1, 4], 3)
    with pytest.raises(ValueError, match="gammas"):
        sessions.check_gammas([], 3)


def _notebook_configs(proto):
    """Notebook 05's configurations as it built them inline before sessions.plan (the reference)."""
    ar = {T: proto.config(run_config(method="ar", temperature=T)) for T in dict.fromkeys([TEMPERATURE, *STOP_T])}
    fixed = {g: proto.config(run_config(method="spade", draft="distilled", gamma=g, temperature=TEMPERATURE))
             for g in GAMMAS}
    rep = proto.config(run_config(method="spade", draft="distilled", gamma=MAX_GAMMA, record_topk=4,
                                  temperature=TEMPERATURE))
    stop = {T: proto.config(run_config(method="spade", draft="distilled", gamma=MAX_GAMMA, temperature=T))
            for T in STOP_T}
    members = {T: [c for c in [*fixed.values(), rep, *stop.values()] if c.temperature == T] for T in ar}
    return ar, fixed, rep, stop, members


def test_plan_equals_the_notebooks_configurations():
    proto = protocol.Protocol(warmup=0, repeats=2)
    got = sessions.plan(run_config, proto, draft="distilled", gammas=GAMMAS, max_gamma=MAX_GAMMA, record_topk=4,
                        temperature=TEMPERATURE, stop_temperatures=STOP_T)
    ar, fixed, rep, stop, members = _notebook_configs(proto)
    assert (got.ar, got.fixed, got.replay, got.stop) == (ar, fixed, rep, stop)
    assert list(got.ar) == [1.0, 0.0] and {T: got.members(T) for T in got.ar} == members
    assert got.names == {"g1": fixed[1], "g2": fixed[2], "replay": rep}
    assert all(c.repeats == 2 for c in [*ar.values(), rep])  # as run: the protocol's fields


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The tiny pair's notebook-05 runs on a four-prompt suite, made once in a folder of their own."""
    from spade_lib.bench import default_suite
    from spade_lib.zoo.pairs import load_pair

    mp = pytest.MonkeyPatch()
    mp.setattr(paths, "RUNS_DIR", tmp_path_factory.mktemp("runs"))
    pair = load_pair("tiny")
    suite = default_suite(tokenizer="tiny", n_per_category=1)
    proto = protocol.Protocol(warmup=0, repeats=2)
    threads = torch.get_num_threads()
    try:
        cfgs = sessions.plan(run_config, proto, draft="distilled", gammas=GAMMAS, max_gamma=MAX_GAMMA,
                             record_topk=4, temperature=TEMPERATURE, stop_temperatures=STOP_T)
        runs = sessions.run(pair, suite, cfgs, proto=proto)
        yield types.SimpleNamespace(pair=pair, suite=suite, proto=proto, cfgs=cfgs, runs=runs)
    finally:
        torch.set_num_threads(threads)
        mp.undo()


@pytest.mark.slow
def test_run_reads_every_run_back_and_prices_trace_costs_on_its_session(made):
    runs, cfgs = made.runs, made.cfgs
    ar, fixed, rep, stop, members = _notebook_configs(made.proto)
    # the notebook's loop: one interleaved session per temperature
    ref = {}
    for T, ar_cfg in ar.items():
        ref.update(protocol.run_interleaved(made.pair, made.suite, members[T], ar_cfg, protocol=made.proto,
                                            progress=False))
    assert runs.dirs == ref  # read back: the same folders, in the same order
    assert {T: n for T, (n, _) in runs.sessions.items()} == {1.0: 5, 0.0: 2}
    assert set(runs.traces) == {c for c in ref if c.method == "spade"}
    for cfg, d in ref.items():
        pd.testing.assert_frame_equal(runs.summaries[cfg], read_summary(d))
    # the notebook's trace_costs: c_trace, r_trace against the AR generations of the run's own session
    base, interleaved = protocol.paired_baseline(read_summary(ref[rep]), ar[rep.temperature])
    got = runs.trace_costs(rep)
    assert interleaved and got == {"c_trace": metrics.cost_ratio(trace.read_trace(ref[rep]), base),
                                   "r_trace": metrics.verify_cost_ratio(trace.read_trace(ref[rep]), base)}


def _notebook_checks(names, run_dirs, traces, pair, suite, sampling):
    """Notebook 05's alignment cell before score_runs / reached_gap (the reference)."""
    scores, keys, rows = {}, {}, []
    for name, cfg in names.items():
        seqs, prompt_lengths, keys[name] = align.run_sequences(run_dirs[cfg], pair.tokenizer, suite)
        scores[name] = align.score_sequences(pair.target, pair.drafts["distilled"], seqs, prompt_lengths, sampling)
        scores[name] = scores[name].merge(keys[name][["seq", "prompt_id", "category", "sample"]], on="seq")
    for name, cfg in names.items():
        tr = traces[cfg]
        tf = scores[name][["prompt_id", "sample", "i", "alpha"]].rename(columns={"i": "abs_pos"})
        emitted = keys[name][["prompt_id", "sample", "new_tokens"]]
        reached = tr[tr["reached"]].merge(emitted, on=["prompt_id", "sample"])
        reached = reached[reached["abs_pos"] < reached["new_tokens"]]
        reached = reached.merge(tf, on=["prompt_id", "sample", "abs_pos"], how="left")
        rows.append((len(reached), float(np.abs(reached["alpha"] - (1.0 - reached["tv"])).max())))
    return scores, keys, rows


@pytest.mark.slow
def test_scores_gaps_and_tau_table_equal_the_notebooks(made):
    from spade_lib.sampling import SamplingConfig

    runs, cfgs, sampling = made.runs, made.cfgs, SamplingConfig(temperature=TEMPERATURE)
    scored = align.score_runs(made.pair.target, made.pair.drafts["distilled"],
                              {n: runs.dirs[c] for n, c in cfgs.names.items()}, made.pair.tokenizer, made.suite,
                              sampling)
    ref_scores, ref_keys, ref_rows = _notebook_checks(cfgs.names, runs.dirs, runs.traces, made.pair, made.suite,
                                                      sampling)
    assert list(scored.scores) == list(cfgs.names) and all(s > 0 for s in scored.seconds.values())
    for name in cfgs.names:
        pd.testing.assert_frame_equal(scored.scores[name], ref_scores[name])
        pd.testing.assert_frame_equal(scored.keys[name], ref_keys[name])
    gaps = [align.reached_gap(scored.scores[n], scored.keys[n], runs.traces[c]) for n, c in cfgs.names.items()]
    assert gaps == ref_rows and all(n > 0 and gap < 1e-3 for n, gap in gaps)
    # a reached position without a teacher-forced score is a failed check, not a smaller maximum
    name, cfg = "g1", cfgs.names["g1"]
    assert align.reached_gap(scored.scores[name].iloc[1:], scored.keys[name], runs.traces[cfg])[1] == np.inf

    # the tau table against its parts, each computed here by the function that defines it
    sweep = protocol.speedup_table({c: runs.dirs[c] for c in [cfgs.ar[TEMPERATURE], *cfgs.fixed.values()]},
                                   cfgs.ar[TEMPERATURE], protocol=made.proto).set_index("gamma")
    got = align.tau_table({g: runs.traces[c] for g, c in cfgs.fixed.items()},
                          {g: scored.scores[f"g{g}"] for g in GAMMAS}, sweep, c=0.2, verify_cost=1.1)
    assert got["gamma"].tolist() == list(GAMMAS)
    for _, row in got.iterrows():
        g = int(row["gamma"])
        assert (row["tau_full_blocks"], row["se"], row["steps"]) == align.measured_tau(runs.traces[cfgs.fixed[g]], g)
        pred = align.predict(scored.scores[f"g{g}"], [g], c=0.2, verify_cost=1.1).set_index("method")
        assert [row[f"tau_{m}"] for m in align.PREDICTION_METHODS] == pred.loc[list(align.PREDICTION_METHODS), "tau"].tolist()
        assert (row["speedup_renewal"], row["speedup_iid"]) == (pred.loc["renewal", "speedup"], pred.loc["iid", "speedup"])
        assert [row[f"{k}_measured"] for k in ("speedup", "speedup_low", "speedup_high")] == \
            sweep.loc[g, ["speedup", "speedup_low", "speedup_high"]].tolist() and row["tau"] == sweep.loc[g, "tau"]
        assert row["gap_renewal"] == row["tau_renewal"] - row["tau_full_blocks"]
        assert row["within_tolerance"] == (abs(row["gap_renewal"]) < 4 * row["se"] + 0.1)


@pytest.mark.slow
def test_rule_bounds_equal_the_notebooks_and_flag_a_miss(made):
    from spade_lib.rules import rule_names

    tr = made.runs.traces[made.cfgs.replay]
    rows = []  # notebook 05's fresh-draft cell before rule_alpha_bounds (the reference)
    for rule in rule_names():
        b = replay.rule_alpha_topk(tr, rule)
        rows.append({"rule": rule, "alpha_lower": b["alpha_lower"].mean(), "alpha_upper": b["alpha_upper"].mean(),
                     "rows_exact": b["exact"].mean()})
        if rule == "exact":
            truth = 1.0 - tr["tv"].to_numpy()
            assert ((b["alpha_lower"] <= truth + 1e-4) & (truth <= b["alpha_upper"] + 1e-4)).all()
    ref = pd.DataFrame(rows)
    ref["width"] = ref["alpha_upper"] - ref["alpha_lower"]
    got = replay.rule_alpha_bounds(tr)
    pd.testing.assert_frame_equal(got.drop(columns="truth_outside"), ref)
    assert got.set_index("rule").loc["exact", "truth_outside"] <= 1e-4
    assert got.loc[got.rule != "exact", "truth_outside"].isna().all()
    # a recorded tv the slices contradict is caught: 1 - tv moved below every lower bound
    wrong = replay.rule_alpha_bounds(tr.assign(tv=1.0), rules=["exact"])
    assert wrong["truth_outside"].iloc[0] > 1e-4


@pytest.mark.slow
def test_studies_and_chosen_rules_equal_the_notebooks_loops(made):
    runs, cfgs, proto = made.runs, made.cfgs, made.proto
    config = stoprules.StudyConfig(max_gamma=MAX_GAMMA, grid_points=4, seed=0)
    got = stoprules.studies({T: runs.traces[cfgs.stop[T]] for T in STOP_T}, 0.2, 1.1, config, overhead=0.05)
    assert list(got) == STOP_T
    for T in STOP_T:
        ref = stoprules.study(runs.traces[cfgs.stop[T]], 0.2, 1.1, config, overhead=0.05)
        pd.testing.assert_frame_equal(got[T].front, ref.front)
    pd.testing.assert_frame_equal(stoprules.stacked(got, "edges"), pd.concat(
        [got[T].edges.assign(T=T) for T in STOP_T], ignore_index=True))
    # the chosen rules run for real, as notebook 05's loop did before run_chosen_rules (the reference)
    base = {T: run_config(method="spade", draft="distilled", temperature=T) for T in STOP_T}
    compare = sessions.run_chosen_rules(made.pair, made.suite, got, runs, base, proto=proto, max_gamma=MAX_GAMMA,
                                        gamma_c=0.1)
    ref = []
    for T in STOP_T:
        cfgs_T = stoprules.chosen_configs(got[T].chosen, base[T], max_gamma=MAX_GAMMA, gamma_c=0.1)
        dirs = protocol.run_interleaved(made.pair, made.suite, list(cfgs_T.values()), cfgs.ar[T], protocol=proto,
                                        progress=False)  # read back
        table = protocol.speedup_table({proto.config(c): dirs[proto.config(c)] for c in cfgs_T.values()}, cfgs.ar[T],
                                       protocol=proto)
        for (policy, cfg_p), (_, m) in zip(cfgs_T.items(), table.iterrows()):
            ref.append({"T": T, **stoprules.replay_vs_run(got[T].front, got[T].chosen, policy,
                                                          trace.read_trace(dirs[proto.config(cfg_p)]), m,
                                                          run_policy=cfg_p.make_policy())})
    pd.testing.assert_frame_equal(compare, pd.DataFrame(ref))
    assert len(compare) >= 2 * 3 and (compare["decisions_replayed"] == 1.0).all()
