"""benchmarks/bench_ar.py end to end on the tiny pair: SPADE's AR loop and HF generate give the same greedy tokens
and the figures are printed. (No timing thresholds: speed is not tested.)"""

import re

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_ar")


def test_runs_on_the_tiny_pair_and_prints_the_figures(bench, capsys):
    out = bench.main(["--pair", "tiny", "--suite", "embedded", "--n", "1", "--max-new-tokens", "4", "--rounds", "1"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.match(r"SPADE AR \d+\.\d tok/s, HF generate \d+\.\d tok/s; SPADE / HF \d+\.\d\dx", last), last
    assert out["spade_tok_s"] > 0 and out["hf_tok_s"] > 0 and out["range"][0] <= out["spade_vs_hf"] <= out["range"][1]


def test_bad_arguments_are_refused_by_name(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse(["--rounds", "0"])
    assert "--rounds: must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse(["--max-new-tokens", "0"])
    assert "--max-new-tokens: must be >= 1, got 0" in capsys.readouterr().err
