"""benchmarks/bench_head_data.py end to end on the tiny pair: the three generators answer the same prompts with
the same greedy tokens and the ratios line is printed. (No timing thresholds: speed is not tested.)"""

import re

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_head_data")


def test_runs_on_the_tiny_pair_and_prints_the_ratios(bench, capsys):
    bench.main(["--pair", "tiny", "--prompts", "humaneval", "--n-prompts", "3", "--batch", "2", "--gen-tokens", "4"])
    out = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"head_data_lean_x=\d+\.\d\d head_data_hf_x=\d+\.\d\d rows_equal=3/3", out[-1]), out[-1]
    assert sum(line.strip().startswith(("single:", "batch-lean:", "batch-hf:")) for line in out) == 3


def test_bad_arguments_are_refused_by_name(bench, capsys):
    for flag in ("--n-prompts", "--batch", "--gen-tokens"):
        with pytest.raises(SystemExit):
            bench.parse_args([flag, "0"])
        assert f"{flag}: must be >= 1, got 0" in capsys.readouterr().err
