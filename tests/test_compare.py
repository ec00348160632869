"""Reproducibility check: every speedup of a runs folder, and two folders compared per configuration."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from spade_lib.runs import protocol
from spade_lib.runs import compare
from test_protocol import cfg, tiny_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tiny_runs(tmp_path_factory.mktemp("runs"), [cfg(method="spade", draft="distilled", gamma=2), cfg(method="hf")],
                     cfg(method="ar"), protocol.Protocol(warmup=0, repeats=3))


def test_speedups_of_a_runs_folder(runs):
    t = compare.speedups(runs)
    assert sorted(t["method"]) == ["ar", "hf", "spade"] and (t["pair"] == "tiny").all()
    assert (t["baseline"] == "ar-T0").all() and t["run"].str.startswith(tuple(t["label"])).all()
    ar = t[t.method == "ar"].iloc[0]
    assert ar["speedup"] == pytest.approx(1.0)
    spade = t[t.method == "spade"].iloc[0]
    assert spade["speedup_low"] <= spade["speedup"] <= spade["speedup_high"]
    assert spade["speedup_rounds"] == 3  # the session kept every round of every member


def test_two_folders_compared(runs, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(runs, other)
    assert compare.main([str(runs), str(other), "--strict", "--csv", str(tmp_path / "c.csv")]) == 0
    out = capsys.readouterr().out
    assert "3 of 3 configurations have overlapping speedup intervals" in out
    assert pd.read_csv(tmp_path / "c.csv")["overlap"].all()
    a = compare.speedups(runs)
    b = a.assign(speedup_low=a["speedup_high"] + 1, speedup_high=a["speedup_high"] + 2)
    c = compare.compare(a, b)
    assert not c.loc[c["run"].str.startswith("spade"), "overlap"].any()


def test_bad_folders_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no traces"):
        compare.speedups(tmp_path)
    (tmp_path / "traces").mkdir()
    with pytest.raises(FileNotFoundError, match="no finished autoregressive baseline"):
        compare.speedups(tmp_path)
