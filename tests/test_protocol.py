"""Timing protocol: interleaved sessions, the shared re-timed baseline, pairing, one identity for 'auto'."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from spade_lib import paths
from spade_lib.bench import Suite
from spade_lib.runs import metrics, protocol, trace
from spade_lib.runs.config import RunConfig
from spade_lib.runs.store import read_summary

N_NEW = 10


def mini_suite(n: int = 3) -> Suite:
    rows = [{"question_id": i, "category": ("code", "prose")[i % 2],
             "turns": [f"def f{i}(x):\n    return x + {i}\n" if i % 2 == 0 else f"The value {i} is the"]}
            for i in range(n)]
    return Suite("mini", rows, {})


@pytest.fixture(scope="module")
def pair():
    from spade_lib.zoo.pairs import load_pair

    before = torch.get_num_threads()
    yield load_pair("tiny")
    torch.set_num_threads(before)


@pytest.fixture()
def runs_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    return tmp_path


def cfg(**kw) -> RunConfig:
    return RunConfig(**{**dict(max_new_tokens=N_NEW, device="cpu", threads=1), **kw})


def tiny_runs(root, configs, baseline, proto):
    """``configs`` timed beside ``baseline`` on the tiny pair into the runs folder ``root`` (``RUNS_DIR`` and the
    thread count restored after); returns ``root``."""
    from spade_lib.zoo.pairs import load_pair

    before, old = torch.get_num_threads(), paths.RUNS_DIR
    paths.RUNS_DIR = root
    try:
        protocol.run_interleaved(load_pair("tiny"), mini_suite(), configs, baseline, protocol=proto, progress=False)
    finally:
        paths.RUNS_DIR = old
        torch.set_num_threads(before)
    return root


def test_auto_device_is_resolved_before_hashing():
    assert cfg(device="auto").hash == cfg(device="cpu").hash  # this machine's tests run on the CPU
    assert cfg(device="auto").device == "cpu"


def test_protocol_validates_and_sets_identity():
    with pytest.raises(ValueError, match="repeats"):
        protocol.Protocol(repeats=0)
    with pytest.raises(ValueError, match="pauses"):
        protocol.Protocol(pauses=protocol.timing.StallRule())
    with pytest.raises(TypeError, match="config"):
        protocol.Protocol().config("ar")
    c = protocol.Protocol(warmup=2, repeats=3).config(cfg())
    assert (c.warmup, c.repeats) == (2, 3)


def test_sessions_interleave_pair_and_share_the_baseline(pair, runs_dir):
    suite = mini_suite()
    proto = protocol.Protocol(warmup=0, repeats=3)
    ar = cfg(method="ar")
    g2 = cfg(method="spade", draft="distilled", gamma=2)
    dirs = protocol.run_interleaved(pair, suite, [g2], ar, protocol=proto, progress=False)
    assert list(dirs) == [proto.config(ar), proto.config(g2)]
    s = read_summary(dirs[proto.config(g2)])
    assert len(s) == 3 and (s["wall_times"].map(len) == 3).all()
    assert s["session"].nunique() == 1
    assert set(s["session_wall_time"].iloc[0]) == {proto.config(ar).hash, proto.config(g2).hash}
    assert protocol.interleaved_with(s, proto.config(ar)) and not protocol.interleaved_with(s, cfg(method="hf"))
    base, interleaved = protocol.paired_baseline(s, proto.config(ar))
    assert interleaved and (base["new_tokens"] == N_NEW).all()
    ar_summary = read_summary(dirs[proto.config(ar)])
    assert base["wall_time"].tolist() == pytest.approx(ar_summary["wall_time"].tolist())
    # every round of every member is kept, so the speedup's interval resamples rounds within prompts
    assert base["wall_times"].tolist() == ar_summary["wall_times"].tolist()
    assert s["session_wall_times"].map(lambda d: d[proto.config(g2).hash]).tolist() == s["wall_times"].tolist()
    assert metrics.bootstrap_speedup(s, base, n_boot=50)["rounds"] == 3
    # and its prefills, which a prediction adds as the measured ratio of whole generations holds them
    assert base["prefill_time"].tolist() == pytest.approx(ar_summary["prefill_time"].tolist())
    assert metrics.prefill_steps(s, base) is not None
    # rows timed before session_prefill_time: the baseline's own rows of the same session give them
    old = s.drop(columns="session_prefill_time")
    assert "prefill_time" not in protocol.paired_baseline(old, proto.config(ar))[0].columns
    from_own, _ = protocol.paired_baseline(old, proto.config(ar), ar_summary)
    assert from_own["prefill_time"].tolist() == pytest.approx(ar_summary["prefill_time"].tolist())
    other = ar_summary.assign(session="another")  # another session's prefills are not this one's
    assert "prefill_time" not in protocol.paired_baseline(old, proto.config(ar), other)[0].columns

    # a second session (another notebook): the finished AR run is re-timed, its folder left alone
    stamp = (dirs[proto.config(ar)] / "summary.jsonl").stat().st_mtime_ns
    g1 = cfg(method="spade", draft="distilled", gamma=1)
    dirs2 = protocol.run_interleaved(pair, suite, [g2, g1], ar, protocol=proto, progress=False)
    assert (dirs2[proto.config(ar)] / "summary.jsonl").stat().st_mtime_ns == stamp
    s1 = read_summary(dirs2[proto.config(g1)])
    assert proto.config(ar).hash in s1["session_wall_time"].iloc[0]
    assert s1["session"].iloc[0] != s["session"].iloc[0]
    # the same request again reads everything back
    assert protocol.run_interleaved(pair, suite, [g1, g2], ar, protocol=proto, progress=False) == {
        proto.config(ar): dirs2[proto.config(ar)], proto.config(g1): dirs2[proto.config(g1)],
        proto.config(g2): dirs2[proto.config(g2)]}

    table = protocol.speedup_table(dirs2, ar, protocol=proto)
    assert table["interleaved"].all()
    assert table.loc[table.method == "ar", "speedup"].tolist() == pytest.approx([1.0])
    sp = table[table.method == "spade"]
    assert (sp["speedup_low"] <= sp["speedup"]).all() and (sp["speedup"] <= sp["speedup_high"]).all()
    assert sp["predicted"].notna().all() and sp["r_trace"].gt(0).all()
    # the second session re-timed AR without writing its folder: its prefills come from the session's rows
    assert sp["prefill_share"].between(0, 1, inclusive="neither").all()
    # each row carries its physical controls: what controls.speedup_warnings says of that row alone
    from spade_lib.runs import controls

    assert table["physical_control"].tolist() == [
        "; ".join(controls.speedup_warnings(table.loc[[i]], model=False)) for i in table.index]
    # and the two-sided cost-model control apart from the physics (measured vs predicted; no defect)
    assert table["model_control"].tolist() == [
        "; ".join(controls.prediction_warnings(table.loc[[i]])) for i in table.index]
    forged = table.assign(speedup_low=table["tau"].fillna(1.0) + 1.0)
    assert all(controls.speedup_warnings(forged.loc[[i]]) for i in forged.index[forged.method == "spade"])
    # greedy SPADE emits the target's greedy tokens: same text as AR (tiny pair, float32)
    tr = trace.read_trace(dirs2[proto.config(g1)])
    assert len(tr) > 0 and tr["t_verify"].gt(0).all()


def test_session_configs_must_pair(pair, runs_dir):
    with pytest.raises(ValueError, match="same n_samples"):
        protocol.run_interleaved(pair, mini_suite(1), [cfg(method="spade", max_new_tokens=4)], cfg(method="ar"),
                                 protocol=protocol.Protocol(warmup=0), progress=False)


def test_warmup_generations_are_capped_at_warmup_tokens(pair, runs_dir, monkeypatch):
    with pytest.raises(ValueError, match="warmup_tokens"):
        protocol.Protocol(warmup_tokens=-1)
    seen = []
    real = protocol.make_generator

    def spy(p, c, records="separate"):
        g = real(p, c, records)
        timed = g.timed
        g.timed = lambda ids, n, seed: seen.append(n) or timed(ids, n, seed)
        return g

    monkeypatch.setattr(protocol, "make_generator", spy)
    protocol.run_interleaved(pair, mini_suite(1), [], cfg(method="ar"),
                             protocol=protocol.Protocol(warmup=1, repeats=1, warmup_tokens=3), progress=False)
    assert seen[0] == 3 and seen[1:] == [N_NEW]  # one warm-up of 3 tokens, then the timed generation
    seen.clear()
    protocol.run_interleaved(pair, mini_suite(1), [], cfg(method="ar", seed=1),
                             protocol=protocol.Protocol(warmup=1, repeats=1, warmup_tokens=0), progress=False)
    assert seen[0] == N_NEW  # 0: the run's own length


@pytest.mark.parametrize("records", ["timed", "separate"])
def test_records_are_kept_off_the_clock_both_ways(pair, runs_dir, monkeypatch, records):
    """records="timed": every SPADE generation of a session is a timed round (or the warm-up), the
    trace's step timings are the last round's own, and the statistics' time is taken out of the wall
    time (a statistics pass made 40 ms slower per step leaves the timed wall time below it).
    records="separate": the timed rounds record step-level facts only, and one untimed pass per
    generation records the tokens."""
    import time

    from spade_lib.decoding import records as columns
    from spade_lib.decoding.decode import SpeculativeDecoder

    calls, last = [], {}
    real_generate, real_stats = SpeculativeDecoder.generate, columns.position_stats

    def spy(self, ids, n, seed=0):
        out = real_generate(self, ids, n, seed=seed)
        calls.append(self.record)
        last.setdefault(seed, []).append(out)
        return out

    monkeypatch.setattr(SpeculativeDecoder, "generate", spy)
    monkeypatch.setattr(columns, "position_stats", lambda inputs: time.sleep(0.04) or real_stats(inputs))
    suite = mini_suite(2)
    # stalls reported, not re-timed: a re-timing is one more generation, which this count of records must not see
    # (a loaded host, e.g. make test's two processes, judged a 12 ms reading a stall; re-timing: tests below)
    proto = protocol.Protocol(warmup=1, repeats=2, records=records, stalls=protocol.timing.StallRule(max_retimes=0))
    sp = cfg(method="spade", temperature=1.0, gamma=2)
    dirs = protocol.run_interleaved(pair, suite, [sp], cfg(method="ar", temperature=1.0), protocol=proto,
                                    progress=False)
    n = len(suite.rows)
    timed_kind = True if records == "timed" else "light"
    assert sorted(map(str, calls)) == sorted(map(str, [timed_kind] * (1 + 2 * n) + ([True] * n if records == "separate"
                                                                                    else [])))
    tr = trace.read_trace(dirs[proto.config(sp)])
    for _, s in read_summary(dirs[proto.config(sp)]).iterrows():
        timed = [o for o in last[int(s["seed"])] if (o.timing["records"] > 0) == (records == "timed")]
        steps = [st for st in timed[-1].steps if st.gamma > 0]
        mine = tr[tr["prompt_id"] == str(s["question_id"])].drop_duplicates("step")
        assert mine["t_verify"].tolist() == [st.t_verify for st in steps]  # the last timed round's
        assert s["wall_time"] < 0.04 * len(steps)  # the statistics' time is not in it
    assert json.loads((dirs[proto.config(sp)] / "metadata.json").read_text())["sessions"][-1]["records"] == records
    with pytest.raises(ValueError, match="records"):
        protocol.Protocol(records="inline")


class _VirtualTime:
    """A clock that only the fake generations below advance: every timing of a session is then exactly known.
    ``jump`` seconds set during a reading pass on the clock's next reading (the reading's end): the session's
    clock then jumps between that reading and the next one, as a host pause outside any reading does."""

    def __init__(self):
        self.now = 0.0
        self.jump = 0.0

    def __call__(self, device=None):
        t, self.now, self.jump = self.now, self.now + self.jump, 0.0
        return t


def _virtual_session(pair, root, monkeypatch, *, stall_on=None, rule=protocol.timing.StallRule(), repeats=1,
                     pauses=protocol.timing.PauseRule(), impossible_on=None, gap_on=None, readings=None):
    """A 6-prompt session (AR and SPADE gamma 2, ``repeats`` rounds) timed on a virtual clock: AR costs ~10 ms
    a token, SPADE ~6 ms (each reading its prompt's cost times a seeded +-5 % jitter), a tenth of it the
    prefill; each of ``stall_on`` / ``impossible_on`` / ``gap_on`` = (method, question_id) spoils that
    configuration's first timing of that prompt: 2.5 s more inside it (a stall); a prefill 3x the reading
    it lies in (impossible); a 30 s jump of the session's clock right after it (a host pause between readings).
    ``readings`` (a dict) collects every timed reading: ``(method, question_id, k) -> (seconds, prefill)``.
    Returns the session's speedup_table (by method), the SPADE run's summary and that run's folder."""
    from spade_lib.runs.config import generation_seed

    monkeypatch.setattr(paths, "RUNS_DIR", root)
    clock = _VirtualTime()
    monkeypatch.setattr(protocol.devices, "clock", clock)
    real, seen = protocol.make_generator, {}
    prompt_cost = {generation_seed(0, q, 0): 1.0 + 0.15 * (q % 3) for q in range(6)}
    question = {generation_seed(0, q, 0): q for q in range(6)}
    readings = {} if readings is None else readings

    def virtual(p, c, records="separate"):
        gen = real(p, c, records)
        timed = gen.timed

        def run(ids, n, seed):
            g = timed(ids, n, seed)
            g.untimed = 0.0
            if seed not in prompt_cost:  # the warm-up: untimed anyway
                return g
            k = seen[(c.method, seed)] = seen.get((c.method, seed), 0) + 1
            first = k == 1
            jitter = 1.0 + 0.05 * (2 * np.random.default_rng([c.method == "ar", seed, k]).random() - 1)
            t = (0.010 if c.method == "ar" else 0.006) * len(g.output_ids) * prompt_cost[seed] * jitter
            g.prefill = 0.1 * t
            hit = (c.method, question[seed])
            if first and hit == stall_on:
                t += 2.5
            if first and hit == impossible_on:
                g.prefill = 3 * t
            if first and hit == gap_on:
                clock.jump = 30.0
            clock.now += t
            readings[(c.method, question[seed], k)] = (t, g.prefill)
            return g

        gen.timed = run
        return gen

    monkeypatch.setattr(protocol, "make_generator", virtual)
    proto = protocol.Protocol(warmup=1, repeats=repeats, stalls=rule, pauses=pauses)
    ar, sp = cfg(method="ar"), cfg(method="spade", draft="distilled", gamma=2)
    dirs = protocol.run_interleaved(pair, mini_suite(6), [sp], ar, protocol=proto, progress=False)
    table = protocol.speedup_table(dirs, ar, protocol=proto).set_index("method")
    return table, read_summary(dirs[proto.config(sp)]), dirs[proto.config(sp)]


def _session_with_stall(pair, root, monkeypatch, *, stall_on, rule):
    """One round per prompt, ``stall_on`` stalled: the SPADE row of speedup_table, the SPADE run's summary and
    its session's stall report."""
    table, summary, run = _virtual_session(pair, root, monkeypatch, stall_on=stall_on, rule=rule)
    return table.loc["spade"], summary, protocol.session_stalls(run)


def _warnings(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("physical control")]


@pytest.mark.parametrize("retimes", [2, 0])  # timed again at once, or (no re-timing allowed) dropped
def test_a_prefill_longer_than_its_reading_is_flagged_and_never_priced(pair, tmp_path, monkeypatch, capsys, retimes):
    q = 2
    readings = {}
    table, summary, run = _virtual_session(pair, tmp_path, monkeypatch, repeats=3, impossible_on=("spade", q),
                                           pauses=protocol.timing.PauseRule(max_retimes=retimes), readings=readings)
    said = _warnings(capsys.readouterr().out)
    mine = [w for w in said if f"prompt {q} (sample 0)" in w]
    assert len(said) == len(mine) == 1  # one event, printed once, by the session
    assert "spade-distilled-g2-T0" in mine[0] and "prefill" in mine[0] and "prefill <= wall" in mine[0]
    injected = readings[("spade", q, 1)][1]
    assert injected > readings[("spade", q, 1)][0]  # the reading the decoder says it cannot have taken
    sp = table.loc["spade"]
    row = summary.set_index("question_id").loc[q]
    report = protocol.session_controls(run)[-1]
    assert report["count"] == 1 and report["events"][0]["control"] == "prefill"
    # no row prices a prefill beyond its wall time, and the injected one is nowhere
    assert (summary["prefill_time"] <= summary["wall_time"]).all()
    assert all(v != pytest.approx(injected) for d in summary["session_prefill_time"] for v in d.values())
    if retimes:  # the block was timed again as a whole: its readings are the second timing's, every member's
        assert row["priced"] and sp["unpriced"] == 0 and report["dropped"] == []
        assert row["wall_times"] == pytest.approx([readings[("spade", q, k)][0] for k in (4, 5, 6)])
        ar_hash = next(h for h in row["session_wall_times"] if h != protocol.Protocol().config(
            cfg(method="spade", draft="distilled", gamma=2)).hash)
        assert row["session_wall_times"][ar_hash] == pytest.approx([readings[("ar", q, k)][0] for k in (4, 5, 6)])
        assert sp["speedup_prompts"] == 6
    else:  # dropped: written and reported, out of the speedup intervals and the prediction
        assert not row["priced"] and report["dropped"] == [[str(q), 0]]
        assert row["reading_controls"] == mine
        assert sp["unpriced"] == 1 and sp["speedup_prompts"] == 5 and f"prompt {q}" in sp["reading_control"]
        assert table.loc["ar", "unpriced"] == 1  # the baseline's own row of the block too


@pytest.mark.parametrize("retimes", [2, 0])
def test_a_host_pause_between_readings_is_flagged_and_never_priced(pair, tmp_path, monkeypatch, capsys, retimes):
    """A 30 s jump of the session's clock between two readings of one block: no reading holds it, so no stall
    rule can see it; the block is timed again (or its generation dropped) and the warning names the prompt."""
    q = 3
    readings = {}
    table, summary, run = _virtual_session(pair, tmp_path, monkeypatch, repeats=3, gap_on=("spade", q),
                                           pauses=protocol.timing.PauseRule(max_retimes=retimes), readings=readings)
    said = _warnings(capsys.readouterr().out)
    assert len(said) == 1 and f"prompt {q} (sample 0)" in said[0] and "host pause" in said[0]
    assert "30.000 s" in said[0]
    report = protocol.session_controls(run)[-1]
    assert [e["control"] for e in report["events"]] == ["gap"] and report["events"][0]["seconds"] == 30.0
    assert protocol.session_stalls(run)[-1]["count"] == 0  # the per-reading stall rule saw nothing
    row = summary.set_index("question_id").loc[q]
    sp = table.loc["spade"]
    if retimes:
        assert row["priced"] and row["wall_times"] == pytest.approx([readings[("spade", q, k)][0] for k in (4, 5, 6)])
        assert sp["unpriced"] == 0 and sp["speedup_prompts"] == 6
    else:
        assert not row["priced"] and report["dropped"] == [[str(q), 0]]
        assert sp["unpriced"] == 1 and sp["speedup_prompts"] == 5


def test_a_pause_inside_one_round_is_caught_by_its_own_rounds_from_the_first_prompt(pair, tmp_path, monkeypatch,
                                                                                    capsys):
    """A 2.5 s stall inside the first prompt's first SPADE reading: the per-token stall rule cannot judge it yet
    (fewer than min_reference readings), the prompt's other rounds can."""
    readings = {}
    _, summary, run = _virtual_session(pair, tmp_path, monkeypatch, repeats=3, stall_on=("spade", 0),
                                       rule=protocol.timing.StallRule(min_reference=50), readings=readings)
    said = _warnings(capsys.readouterr().out)
    assert len(said) == 1 and "prompt 0 (sample 0)" in said[0] and "its other rounds" in said[0]
    row = summary.set_index("question_id").loc[0]
    assert row["priced"] and row["wall_times"] == pytest.approx([readings[("spade", 0, k)][0] for k in (4, 5, 6)])
    assert max(row["wall_times"]) < 1.0 and protocol.session_controls(run)[-1]["events"][0]["control"] == "round"


def test_priced_generations_leaves_out_read_back_rows_with_a_prefill_beyond_their_wall_time():
    """Issue 56: a row read back from an older session (prefill 0.298 s inside a wall time of 0.119 s) is left out
    of the run, its baseline and its trace alike; a run with nothing left is refused."""
    import pandas as pd

    summary = pd.DataFrame({"question_id": [121, 122, 123], "sample": [0, 0, 0], "wall_time": [0.1, 0.119, 0.1],
                            "prefill_time": [0.01, 0.298, 0.01], "new_tokens": [8, 8, 8]})
    base = summary.assign(wall_time=0.2, prefill_time=[0.02, 0.02, 0.5])
    tr = pd.DataFrame({"prompt_id": ["121", "122", "123"], "sample": [0, 0, 0]})
    s, t, b, why = protocol.priced_generations(summary, tr, base, label="spade-x")
    assert s["question_id"].tolist() == b["question_id"].tolist() == [121] and t["prompt_id"].tolist() == ["121"]
    assert set(why) == {(122, 0), (123, 0)}
    assert why[(122, 0)].startswith("physical control: spade-x: prompt 122") and "0.298" in why[(122, 0)]
    assert "baseline's prefill 0.500" in why[(123, 0)]
    clean = summary.assign(prefill_time=0.01)
    assert protocol.priced_generations(clean, tr, clean)[3] == {}
    with pytest.raises(ValueError, match="spade-x"):
        protocol.priced_generations(summary.assign(prefill_time=1.0), tr, base, label="spade-x")


@pytest.mark.parametrize("question", [1, 4])  # judged once 4 readings exist (prompt 1), or as it comes (prompt 4)
def test_one_stall_is_retimed_reported_and_cannot_move_the_speedup(pair, tmp_path, monkeypatch, question):
    clean, clean_summary, clean_report = _session_with_stall(pair, tmp_path / "clean", monkeypatch, stall_on=None,
                                                             rule=protocol.timing.StallRule())
    assert clean_summary["stalls"].sum() == 0 and clean_report[-1]["count"] == 0  # no false alarm
    s0 = clean["speedup"]
    assert 1.4 < s0 < 2.0  # ~10 / 6 by construction

    got, summary, report = _session_with_stall(pair, tmp_path / "stall", monkeypatch, stall_on=("spade", question),
                                               rule=protocol.timing.StallRule())
    assert 0.85 * s0 <= got["speedup_low"] <= got["speedup"] <= got["speedup_high"] <= 1.15 * s0
    assert got["stalls"] == 1 and summary["stalls"].tolist() == [int(q == question) for q in range(6)]
    stalled = summary.set_index("question_id").loc[question]
    assert stalled["stall_readings"][0] > 2.5  # the spoiled reading is kept in the record, not in wall_time
    assert report[-1]["count"] == 1 and report[-1]["prompts"] == [str(question)]
    assert report[-1]["readings"][0]["config"] == got["label"] and not report[-1]["readings"][0]["persistent"]

    # the old protocol (no re-timing; the ratio of totals over the stalled reading) is moved far outside
    old, old_summary, old_report = _session_with_stall(pair, tmp_path / "old", monkeypatch, stall_on=("spade", question),
                                                       rule=protocol.timing.StallRule(max_retimes=0))
    assert old_report[-1]["count"] == 1  # still reported ...
    assert old["speedup"] < 0.5 * s0 and old["speedup_low"] < 0.85 * s0  # ... and it moves the speedup


def test_a_run_is_priced_at_its_session_partners_loop_level_never_its_own(pair, runs_dir):
    """loop_priced: the table's r(g) times k = the partners' verify seconds over t_AR sum r(g), o = their rest
    per step; the run's own steps never enter its prediction, its partners' do."""
    suite = mini_suite(4)
    proto = protocol.Protocol(warmup=0, repeats=1)
    ar = cfg(method="ar", max_new_tokens=32)
    null = cfg(method="spade", draft="null", gamma=2, max_new_tokens=32)
    dist = cfg(method="spade", draft="distilled", gamma=2, max_new_tokens=32)
    dirs = protocol.run_interleaved(pair, suite, [null, dist], ar, protocol=proto, progress=False)
    table = {"c": 0.1, "r": {g: 1.0 + 0.1 * g for g in range(1, 13)}, "overhead": 0.5}
    costs = {"null": table, "distilled": table}
    traces = {c: trace.read_trace(d) for c, d in dirs.items()}
    t = protocol.speedup_table(dirs, ar, protocol=proto, costs=costs, traces=traces).set_index("draft")
    assert t.loc["null", "r_source"] == "loop" and t.loc["-", "r_source"] == ""
    # k by hand from the partner (the distilled run) alone
    s_d = read_summary(dirs[proto.config(dist)])
    base, _ = protocol.paired_baseline(s_d, proto.config(ar))
    t_ar = (base["wall_time"].sum() - base["prefill_time"].sum()) / base["new_tokens"].sum()
    st = metrics.steps(traces[proto.config(dist)])
    st = st[st["gamma"] >= 1]
    assert len(st) >= protocol.MIN_LOOP_STEPS
    k = st["t_verify"].sum() / (t_ar * sum(table["r"][int(g)] for g in st["gamma"]))
    assert t.loc["null", "loop_level"] == pytest.approx(k)
    assert t.loc["null", "r"] == pytest.approx(k * table["r"][2])
    assert t.loc["null", "overhead"] == pytest.approx(st["t_overhead"].sum() / t_ar / len(st))
    # its own steps, made 100x slower, leave its prediction alone; its partner's move it
    slow_own = dict(traces)
    slow_own[proto.config(null)] = traces[proto.config(null)].assign(t_verify=lambda f: 100 * f["t_verify"])
    t2 = protocol.speedup_table(dirs, ar, protocol=proto, costs=costs, traces=slow_own).set_index("draft")
    assert t2.loc["null", "predicted"] == pytest.approx(t.loc["null", "predicted"])
    assert t2.loc["distilled", "predicted"] < 0.5 * t.loc["distilled", "predicted"]
    # alone in its session (no partner): the table prices it
    alone = {c: d for c, d in dirs.items() if c.draft != "distilled"}
    t3 = protocol.speedup_table(alone, ar, protocol=proto, costs=costs).set_index("draft")
    assert t3.loc["null", "r_source"] == "table" and t3.loc["null", "r"] == pytest.approx(table["r"][2])
    assert t3.loc["null", "overhead"] == pytest.approx(0.5)
