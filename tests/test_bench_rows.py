"""benchmarks/bench_rows.py end to end on the tiny pair: every figure it prints is there, r(1) is 1, the roofline
floor is at least 1, the stream floor measured, and its last lines carry the agreed format. (No timing thresholds: speed is not tested.)"""

import re

import pytest

from spade_lib.decoding.model import native


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_rows")


@pytest.mark.parametrize("torch_too", [False, True])
def test_runs_on_the_tiny_pair_and_prints_every_row_count(bench, capsys, torch_too):
    rows = [1, 2, 3]
    argv = ["--pair", "tiny", "--rows", *map(str, rows), "--rounds", "1", "--reps", "1", "--context", "8"]
    out = bench.main(argv + ([] if torch_too else ["--no-torch"]))
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("pair=tiny ") and f"native attention={native.available()}" in lines[0]
    assert set(out) == {"chain k=1", *(f"{kind} k={k}" for k in rows[1:] for kind in ("chain", "tree"))}
    assert out["chain k=1"]["r"] == 1.0
    for tag, fig in out.items():
        assert fig["forward"] > 0 and fig["products"] > 0 and fig["floor"] >= 1.0, tag
        assert (fig["stream"] > 0) == native.available(), tag  # the stream floor: the same weights, k FMAs a chunk
        assert (fig["torch"] > 0) == torch_too and (fig["attention"] > 0) == native.available(), tag
    number = r"\d+\.\d{3}"
    for name, line in zip(("r_chain", "r_over_floor", "stream_floor"), lines[-3:]):
        assert re.fullmatch(f"{name}=" + ",".join(f"{k}:{number}" for k in rows), line), line


def test_bad_arguments_are_refused_by_name(bench, capsys):
    for argv, message in ((["--rounds", "0"], "--rounds: must be >= 1, got 0"),
                          (["--context", "0"], "--context: must be >= 1, got 0"),
                          (["--rows", "1", "0"], "--rows: every row count must be >= 1, got [1, 0]"),
                          (["--threads", "-1"], "--threads: must be >= 0, got -1")):
        with pytest.raises(SystemExit):
            bench.parse(argv)
        assert message in capsys.readouterr().err
