"""spade_lib.runs.cross_drafts: notebook 03's cross-vocabulary section, run on a tiny cross-vocabulary pair built
here (the tiny pair's target and a random draft with its own 300-token tokenizer), and the HF generator facts
checked against the tests they name and against how the runs call HF."""

from __future__ import annotations

import ast
import math

import pytest
import torch

from spade_lib import paths
from spade_lib.bench import Suite
from spade_lib.runs import cross_drafts as xd
from spade_lib.runs import protocol, verdicts
from spade_lib.runs.config import RunConfig
from spade_lib.runs.store import read_summary

HF_TESTS = paths.REPO_ROOT / "tests" / "test_hf_crossvocab.py"
N_NEW = 8


@pytest.fixture(scope="module")
def cross_pair(tmp_path_factory):
    """The tiny target with a draft of its own tokenizer (``pair.draft_tokenizers["own"]``), as tests/test_zoo.py
    builds one."""
    from spade_lib.zoo.configs import ModelConfig, TokenizerConfig
    from spade_lib.zoo.pairs import load_pair
    from spade_lib.zoo.tokenizer import train_tokenizer
    from spade_lib.zoo.train import new_model

    before = torch.get_num_threads()
    tiny = load_pair("tiny")
    other = tmp_path_factory.mktemp("own_draft")
    tok = train_tokenizer(["def f(x):\n    return x\n" * 50, "print('hello world')\n" * 50, "The value is the " * 50],
                          TokenizerConfig(vocab_size=300))
    new_model(ModelConfig(n_layers=1, hidden=32, n_heads=2, intermediate=64, max_positions=256), len(tok),
              seed=3).eval().save_pretrained(other, safe_serialization=True)
    tok.save_pretrained(other)
    pair = load_pair("tinyx", target=str(tiny.path / "target"), drafts={"own": str(other)})
    assert list(pair.draft_tokenizers) == ["own"] and len(pair.draft_tokenizers["own"]) != len(pair.tokenizer)
    yield pair
    torch.set_num_threads(before)


def _cfg(**kw) -> RunConfig:
    return RunConfig(**{**dict(max_new_tokens=N_NEW, device="cpu", threads=1), **kw})


def _suite() -> Suite:
    rows = [{"question_id": i, "category": ("code", "prose")[i % 2],
             "turns": [f"def f{i}(x):\n    return x + {i}\n" if i % 2 == 0 else f"The value {i} is the"]}
            for i in range(3)]
    return Suite("mini", rows, {})


# -- the facts ----------------------------------------------------------------------------------------------

def test_every_fact_names_tests_that_exist_and_the_three_generators_are_told_apart():
    defined = {n.name for n in ast.walk(ast.parse(HF_TESTS.read_text(encoding="utf-8")))
               if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
    for fact in xd.HF_GENERATORS:
        assert fact.tests, fact.name
        for t in fact.tests:
            path, name = t.split("::")
            assert path == "tests/test_hf_crossvocab.py" and name in defined, t
    uag, usd_pruned, usd_unpruned = xd.HF_GENERATORS
    assert (uag.sampling, uag.exact, uag.runs_use) == (False, True, True)
    assert (usd_pruned.sampling, usd_pruned.exact, usd_pruned.runs_use) == (True, False, False)
    assert (usd_unpruned.sampling, usd_unpruned.exact, usd_unpruned.runs_use) == (True, True, True)
    # the sentence is the fact's: exact or not, its tests named
    assert " is exact: " in uag.sentence() and "test_uag_greedy_equals_target_greedy" in uag.sentence()
    assert " is not exact: " in usd_pruned.sentence() and "not what SPADE's runs call" in usd_pruned.sentence()
    assert [f.sentence() for f in xd.HF_GENERATORS if not f.sampling] == xd.generator_lines([0.0])
    assert [f.sentence() for f in xd.HF_GENERATORS if f.sampling] == xd.generator_lines([1.0])
    assert xd.generator_lines([0.0, 1.0]) == [f.sentence() for f in xd.HF_GENERATORS]


def test_the_runs_call_hf_the_way_the_facts_say(cross_pair, monkeypatch):
    """runs.methods hands HF both tokenizers and, when sampling, the unpruned translator (the exact USD):
    what HF_GENERATORS says SPADE's hf_assisted runs call."""
    from spade_lib.decoding import baselines
    from spade_lib.runs.methods import make_generator

    calls = []
    monkeypatch.setattr(baselines, "hf_generate", lambda *a, **kw: calls.append(kw) or pytest.skip("captured"))
    for T in (0.0, 1.0):
        gen = make_generator(cross_pair, _cfg(method="hf_assisted", draft="own", gamma=3, temperature=T), "separate")
        with pytest.raises(pytest.skip.Exception):
            gen.timed([1, 2, 3], N_NEW, 0)
    for kw, fact in zip(calls, [f for f in xd.HF_GENERATORS if f.runs_use]):
        assert kw["sampling"].greedy == (not fact.sampling)
        assert kw["assistant_tokenizer"] is cross_pair.draft_tokenizers["own"]
        assert kw["target_tokenizer"] is cross_pair.tokenizer
        assert kw["prune_lm_head"] is False  # greedy ignores it; sampling: the unpruned (exact) translator


# -- the section's library function on a real session ---------------------------------------------------------

@pytest.fixture(scope="module")
def session(cross_pair, tmp_path_factory):
    from spade_lib.runs.costs import pair_costs

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paths, "RUNS_DIR", tmp_path_factory.mktemp("runs"))
        suite, proto = _suite(), protocol.Protocol(warmup=0, repeats=2)
        baselines = {T: proto.config(_cfg(method="ar", temperature=T)) for T in (0.0, 1.0)}
        session_dirs, cross_dirs = {}, {}
        for T in (0.0, 1.0):
            cross = [proto.config(c) for c in xd.cross_configs(_cfg, ["own"], ["text", "tli"], 3, T)]
            plain = [_cfg(method="hf", temperature=T)] if T == 0 else []
            dirs = protocol.run_interleaved(cross_pair, suite, plain + cross, baselines[T], protocol=proto,
                                            progress=False)
            session_dirs.update({c: d for c, d in dirs.items() if c not in cross})
            cross_dirs.update({c: d for c, d in dirs.items() if c in cross})
        costs = pair_costs(cross_pair, ["own"], 3, reps=3)
        report = xd.cross_report(cross_pair, suite.rows, cross_dirs, session_dirs, baselines, protocol=proto,
                                 costs=costs)
        yield dict(report=report, suite=suite, proto=proto, baselines=baselines, session_dirs=session_dirs,
                   cross_dirs=cross_dirs, costs=costs)


def test_cross_report_reads_every_run_of_the_sessions(session):
    r, cross_dirs = session["report"], session["cross_dirs"]
    t = r.table
    assert list(t["label"]) == [c.label for c in cross_dirs] and len(t) == 6
    assert t["interleaved"].all()
    assert list(t["rule"]) == ["text", "tli", "-"] * 2 and list(t["method"]) == ["spade", "spade", "hf_assisted"] * 2
    spade = t[t["method"] == "spade"]
    assert spade["alpha"].between(0, 1).all() and (spade["tau"] >= 1).all() and spade["predicted"].gt(0).all()
    assert spade["c"].eq(session["costs"]["own"]["c"]).all()  # the cost table prices the prediction
    hf = t[t["method"] == "hf_assisted"].set_index("T")
    assert math.isnan(hf.loc[0.0, "alpha"]) and not math.isnan(hf.loc[0.0, "speedup_vs_hf"])  # HF generate at T = 0
    assert math.isnan(hf.loc[1.0, "speedup_vs_hf"])                                             # none at T = 1
    # the speedups are the session's, as protocol.speedup_table reads them (the reference)
    for T in (0.0, 1.0):
        ref = protocol.speedup_table({c: d for c, d in cross_dirs.items() if c.temperature == T},
                                     session["baselines"][T], protocol=session["proto"], costs=session["costs"])
        got = t[t["T"] == T].reset_index(drop=True)
        assert got["speedup"].tolist() == ref["speedup"].tolist()
        assert got["speedup_low"].tolist() == ref["speedup_low"].tolist()
        assert got["alpha"].equals(ref["alpha"])


def test_greedy_cross_vocabulary_runs_emit_the_targets_greedy_tokens(session):
    r, cross_dirs, base = session["report"], session["cross_dirs"], session["baselines"][0.0]
    greedy = [c for c in cross_dirs if c.temperature == 0]
    assert sorted(r.greedy) == sorted(c.label for c in greedy)
    for c in greedy:  # SPADE's text and TLI rules and HF's UAG: exact at T = 0
        assert r.greedy[c.label] == {"identical": 3, "near_tie": 0, "bug": 0}, c.label
        ours = read_summary(cross_dirs[c]).set_index("question_id")["output_ids"]
        ref = read_summary(session["session_dirs"][base]).set_index("question_id")["output_ids"]
        assert all(list(ours[q]) == list(ref[q]) for q in ref.index)


def test_cross_report_lines_carry_intervals_and_the_facts(session):
    r = session["report"]
    text = "\n".join(r.lines)
    assert verdicts.unsupported(text) == []
    assert [line for line in r.lines if line.startswith("!!! ")] == ["!!! " + w for w in r.warnings]
    for label in r.table["label"]:
        assert sum(line.startswith(label + " (") for line in r.lines) == 1, label
    assert "spade-own-g3-rule=tli-T0 (SPADE, rule tli): alpha " in text
    assert "hf_assisted-own-g3-T0 (HF UAG): alpha and tau not recorded" in text
    assert "hf_assisted-own-g3-T1 (HF USD (unpruned translator))" in text
    assert "greedy tokens equal to AR's on 3 of 3 prompts" in text and "cost-model prediction" in text
    comparisons = [line for line in r.lines if ": SPADE " in line and " vs HF " in line]
    assert len(comparisons) == 4 and all(line.count("[") == 2 for line in comparisons)


def test_no_cross_drafts_prints_that_there_is_nothing_to_run(cross_pair):
    r = xd.cross_report(cross_pair, [], {}, {}, {}, protocol=protocol.Protocol())
    assert r.lines == ["cross-vocabulary drafts: none to run (cross_drafts is empty)"] and r.table.empty
    assert list(r.table.columns) == xd.COLUMNS and r.greedy == {} and r.warnings == []


def test_check_cross_drafts(cross_pair):
    xd.check_cross_drafts(cross_pair, ["own"], ["text", "tli", "slrs"])
    xd.check_cross_drafts(cross_pair, [], [])
    with pytest.raises(ValueError, match=r"^cross_drafts: \['distilled'\] not cross-vocabulary drafts of pair 'tinyx'"):
        xd.check_cross_drafts(cross_pair, ["distilled"], ["text"])
