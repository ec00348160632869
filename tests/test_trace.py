"""Trace format: schema round trip, atomic shards, metadata, top-k columns, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from spade_lib.runs import trace


def make_records(prompt_id: str, n_steps: int = 3, gamma: int = 3, seed: int = 0, topk: int = 0):
    """Synthetic decoder records that obey the schema's invariants (reached/accepted/n_accepted)."""
    rng = np.random.default_rng(seed)
    rows, emitted = [], 0
    for step in range(n_steps):
        n_acc = int(rng.integers(0, gamma + 1))
        for pos in range(gamma):
            r = {c: 0.5 for c in trace.TRACE_COLUMNS}
            r.update(
                prompt_id=prompt_id, category="code", sample=0, step=step, pos=pos,
                abs_pos=emitted + pos, gamma=gamma, draft_token=int(rng.integers(0, 100)),
                uniform=float(rng.random()), reached=pos <= n_acc, accepted=pos < n_acc,
                n_accepted=n_acc, next_token=7, p_top1=3,
                t_draft=1e-3, t_verify=2e-3, t_overhead=1e-4,
            )
            if topk:
                r.update(p_topk_ids=list(range(topk)), p_topk_probs=[0.1] * topk,
                         q_topk_ids=list(range(topk)), q_topk_probs=[0.2] * topk)
            rows.append(r)
        emitted += n_acc + 1
    return rows


def test_round_trip_types_and_sorting(tmp_path):
    trace.write_shard(make_records("b"), tmp_path / "trace" / "b.parquet", {"run": 1})
    trace.write_shard(make_records("a", seed=1), tmp_path / "trace" / "a.parquet", {"run": 1})
    df = trace.read_trace(tmp_path)
    assert list(df.columns) == trace.TRACE_COLUMNS
    assert df["prompt_id"].tolist()[:9] == ["a"] * 9
    assert df.groupby("prompt_id")["step"].is_monotonic_increasing.all()
    assert str(df["pos"].dtype) == "int16" and str(df["p_x"].dtype) == "float32"
    assert df["accepted"].dtype == bool and df["t_draft"].dtype == np.float64
    assert len(df) == 18


def test_plain_parquet_readable_with_metadata(tmp_path):
    path = trace.write_shard(make_records("a"), tmp_path / "a.parquet", {"pair": "tiny", "seed": 3})
    schema = pq.read_schema(path)
    assert schema.metadata[trace.SCHEMA_VERSION_KEY] == str(trace.SCHEMA_VERSION).encode()
    assert json.loads(schema.metadata[trace.METADATA_KEY]) == {"pair": "tiny", "seed": 3}
    assert trace.read_metadata(path) == {"pair": "tiny", "seed": 3}
    assert trace.read_metadata(tmp_path) == {"pair": "tiny", "seed": 3}  # no metadata.json: shard's
    assert pq.read_table(path).num_rows == 9


def test_empty_shard_and_empty_run(tmp_path):
    trace.write_shard([], tmp_path / "trace" / "x.parquet", {})
    df = trace.read_trace(tmp_path)
    assert df.empty and list(df.columns) == trace.TRACE_COLUMNS


def test_topk_columns_and_mixed_shards(tmp_path):
    trace.write_shard(make_records("a", topk=4), tmp_path / "a.parquet", {})
    trace.write_shard(make_records("b"), tmp_path / "b.parquet", {})
    df = trace.read_trace(tmp_path)
    assert list(df.columns) == trace.TRACE_COLUMNS + trace.TOPK_COLUMNS
    a = df[df.prompt_id == "a"]
    assert list(a["p_topk_ids"].iloc[0]) == [0, 1, 2, 3]
    assert df[df.prompt_id == "b"]["q_topk_probs"].isna().all()


def test_temporary_files_are_ignored(tmp_path):
    (tmp_path / "trace").mkdir()
    (tmp_path / "trace" / ".a.123.parquet").write_bytes(b"half-written")
    trace.write_shard(make_records("a"), tmp_path / "trace" / "a.parquet", {})
    assert [p.name for p in trace.shard_paths(tmp_path)] == ["a.parquet"]
    assert len(trace.read_trace(tmp_path)) == 9


def test_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(ValueError, match="metadata"):
        trace.write_shard(make_records("a"), tmp_path / "a.parquet", {"bad": {1, 2}})
    assert list(tmp_path.iterdir()) == []


def test_bad_records_name_the_column(tmp_path):
    rec = make_records("a")
    del rec[1]["p_x"]
    with pytest.raises(ValueError, match=r"records\[1\].*missing columns \['p_x'\]"):
        trace.write_shard(rec, tmp_path / "a.parquet", {})
    rec = make_records("a")
    rec[0]["surprise"] = 1
    with pytest.raises(ValueError, match="unknown columns \\['surprise'\\]"):
        trace.write_shard(rec, tmp_path / "a.parquet", {})
    rec = make_records("a")
    rec[0]["step"] = "one"
    with pytest.raises(ValueError, match="trace schema"):
        trace.write_shard(rec, tmp_path / "a.parquet", {})
    with pytest.raises(ValueError, match="parquet"):
        trace.write_shard(make_records("a"), tmp_path / "a.csv", {})
    with pytest.raises(FileNotFoundError, match="run_dir_or_paths"):
        trace.read_trace(tmp_path / "nope")


def test_corrupt_shard_is_named(tmp_path):
    good = trace.write_shard(make_records("a"), tmp_path / "a.parquet", {"pair": "x"})
    bad = tmp_path / "b.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=r"^run_dir_or_paths: .*b\.parquet is not a readable Parquet") as e:
        trace.read_trace(tmp_path)
    assert "magic bytes" in str(e.value.__cause__)
    with pytest.raises(ValueError, match=r"^path: .*b\.parquet is not a readable Parquet"):
        trace.read_shard_metadata(bad)
    with pytest.raises(ValueError, match=r"^path: .*b\.parquet"):
        trace.schema_version_of(bad)
    truncated = tmp_path / "c.parquet"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"c\.parquet is not a readable Parquet"):
        trace.read_trace([good, truncated])
    with pytest.raises(FileNotFoundError):
        trace.read_trace([tmp_path / "missing.parquet"])


def test_nan_uniform_survives(tmp_path):
    rec = make_records("a")
    for r in rec:
        r["uniform"] = math.nan
    trace.write_shard(rec, tmp_path / "a.parquet", {})
    assert trace.read_trace(tmp_path)["uniform"].isna().all()


def test_column_groups_partition_the_schema_and_the_decoder_derives_from_them():
    from spade_lib.decoding import records

    names = trace.TRACE_SCHEMA.names
    groups = [records.ROW_KEYS, records.STEP_COLUMNS, records.BLOCK_COLUMNS, records.POSITION_STATS]
    assert sorted(sum(map(list, groups), [])) == sorted(names)
    assert records.RECORD_COLUMNS == tuple(n for n in names if n not in records.ROW_KEYS)
    assert set(records.STEP_KEYS) <= set(records.ROW_KEYS + records.STEP_COLUMNS)
    assert trace.SORT_COLUMNS == [*records.STEP_KEYS, "pos"]
    assert records.INT_STATS == {"draft_token", "p_top1"} and records.BOOL_STATS == {"reached", "accepted"}
