"""benchmarks/bench_native.py end to end on the tiny pair: it builds both forwards, their logits agree, and
the last line carries the figures in the agreed format. (No timing thresholds: speed is not tested.)"""

import re

import pytest

from spade_lib.decoding.model import native


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_native")


@pytest.mark.skipif(not native.available(), reason="SPADE's native kernels do not build here")
def test_runs_on_the_tiny_pair_and_prints_the_figures(bench, capsys):
    out = bench.main(["--pair", "tiny", "--rounds", "2", "--steps", "1", "--context", "8", "--copy-mib", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"native_vs_library=\d+\.\d{3} native_vs_copy=\d+\.\d{3} library_vs_copy=\d+\.\d{3}",
                        lines[-1]), lines[-1]
    assert "attention native: True" in lines[0]
    diff = float(re.search(r"native vs library (\S+)$", lines[1]).group(1))
    assert diff < 1e-4  # the same function, summation order apart
    assert out["native / library step time"] > 0 and 0 < out["native products alone / copy"]


def test_bad_arguments_are_refused_by_name(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse(["--rounds", "0"])
    assert "--rounds: must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse(["--threads", "-1"])
    assert "--threads: must be >= 0, got -1" in capsys.readouterr().err
