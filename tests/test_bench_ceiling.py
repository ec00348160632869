"""benchmarks/bench_ceiling.py: the tokens a goal needs (exact arithmetic), and every model-drafted chain run of a
runs folder priced at the byte floors, on the tiny pair (figures only: the tiny models sit in the caches, so the
"ceiling" is not one for them; what is checked is that each figure is the stated formula of the run's own numbers)."""

from __future__ import annotations

import math

import pytest

from spade_lib.decoding.model.lean import LeanForward
from spade_lib.runs import metrics, protocol
from spade_lib.runs.store import list_runs, read_summary
from spade_lib.runs.trace import read_trace
from test_protocol import cfg, tiny_runs


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_ceiling")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tiny_runs(tmp_path_factory.mktemp("runs"),
                     [cfg(method="spade", draft="distilled", gamma=2), cfg(method="spade", draft="ngram", gamma=2)],
                     cfg(method="ar"), protocol.Protocol(warmup=0, repeats=1))


def test_tokens_for_a_goal_solve_the_whole_generation_ratio(bench):
    n = bench.tokens_for(1.8, 5.0, 7.0, 2.0)
    assert n == pytest.approx(76.0) and (5.0 + n) / (7.0 + n / 2.0) == pytest.approx(1.8)
    assert bench.tokens_for(1.8, 5.0, 7.0, 1.8) == math.inf  # the decode phase itself no faster than the goal
    assert bench.tokens_for(1.5, 10.0, 1.0, 2.0) == 0.0      # already there with no new token


def test_each_model_drafted_chain_is_priced_at_its_byte_ratio_and_free_verification(bench, runs, capsys):
    from spade_lib.zoo.pairs import load_pair

    out = bench.main(["--pair", "tiny", "--runs-dir", str(runs), "--goal", "1.5"])
    assert [r["label"] for r in out] == ["spade-distilled-g2-T0"]  # prompt lookup drafts with no model: left out
    pair = load_pair("tiny")
    c_bytes = LeanForward(pair.drafts["distilled"], 2).weight_bytes() / LeanForward(pair.target, 2).weight_bytes()
    found = list_runs(runs / "traces")
    run = found[(found["method"] == "spade") & (found["draft"] == "distilled")]["run_dir"].iloc[0]
    base = read_summary(found[found["method"] == "ar"]["run_dir"].iloc[0])
    s, tr = read_summary(run), read_trace(run)
    alpha = metrics.run_metrics(tr, s, base, gamma=2)["alpha"]
    g = metrics.drafted_per_step(tr, s)
    row = out[0]
    assert row["c_bytes"] == pytest.approx(c_bytes) and 0 < c_bytes < 1
    assert row["ceiling_step"] == pytest.approx(metrics.predicted_speedup(alpha, g, c_bytes))
    assert row["ceiling"] == pytest.approx(metrics.predicted_speedup(alpha, g, c_bytes,
                                                                     prefill=metrics.prefill_steps(s, base)))
    assert row["n_goal_floor"] == pytest.approx(bench.tokens_for(1.5, row["prefill_ar"], row["prefill_run"],
                                                                 row["ceiling_step"]))
    assert "ceiling" in capsys.readouterr().out


def test_bad_input_is_refused_by_name(bench, tmp_path):
    with pytest.raises(SystemExit):
        bench.main(["--goal", "1"])
    with pytest.raises(SystemExit, match="no finished runs"):
        bench.main(["--pair", "tiny", "--runs-dir", str(tmp_path)])
