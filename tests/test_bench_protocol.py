"""benchmarks/bench_protocol.py on the tiny pair: two sessions, the second with one injected stall, which the
protocol re-times and reports. (No timing thresholds: a 1 s sleep in one ~10 ms generation is the stall.)"""

import re

import pytest

from spade_lib import paths


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_protocol")


def test_an_injected_stall_is_retimed_and_reported(bench, capsys, monkeypatch):
    monkeypatch.setattr(paths, "RUNS_DIR", paths.RUNS_DIR)  # the benchmark points it at its temporary folders
    bench.main(["--pair", "tiny", "--n-per-category", "1", "--max-new-tokens", "8", "--gammas", "2",
                "--repeats", "1", "--stall", "1.0"])
    out = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"overlapping=\d+/\d+ max_abs_diff=\d+\.\d{3}", out[-1]), out[-1]
    m = re.fullmatch(r"stall: injected=1 retimed=(\d+) persistent=(\d+) worst_rel_change=\d+\.\d{3} "
                     r"within_15pct=(yes|no)", out[-2])
    assert m, out[-2]
    assert int(m.group(1)) >= 1 and int(m.group(2)) == 0  # the stall was taken again, and was a stall
    sessions = [line for line in out if line.startswith("session ")]
    assert len(sessions) == 2 and "re-timed: " in sessions[1]
    with pytest.raises(SystemExit):
        bench.main(["--stall", "-1"])
