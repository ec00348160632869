"""Trace format: schema round trip, atomic shards, metadata, top-k columns, bad input; schema v2 (the draft
tree columns, v1 files read with chain values, checked values); one place to add a column."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
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
            r = {c: 0.5 for c in trace.trace_columns()}
            r.update(
                prompt_id=prompt_id, category="code", sample=0, step=step, pos=pos,
                node=pos, parent=pos - 1, depth=pos, sibling_rank=0,
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
    assert list(df.columns) == trace.trace_columns()
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
    assert df.empty and list(df.columns) == trace.trace_columns()


def test_topk_columns_and_mixed_shards(tmp_path):
    trace.write_shard(make_records("a", topk=4), tmp_path / "a.parquet", {})
    trace.write_shard(make_records("b"), tmp_path / "b.parquet", {})
    df = trace.read_trace(tmp_path)
    assert list(df.columns) == trace.trace_columns() + trace.TOPK_COLUMNS
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

    names = trace.schema_for().names
    assert names == trace.trace_columns() == list(records.names())
    groups = [records.ROW_KEYS, records.STEP_COLUMNS, records.BLOCK_COLUMNS, records.TREE_COLUMNS,
              records.POSITION_STATS]
    assert sorted(sum(map(list, groups), [])) == sorted(names)
    assert records.TREE_COLUMNS == ("node", "parent", "depth", "sibling_rank")
    assert records.RECORD_COLUMNS == tuple(n for n in names if n not in records.ROW_KEYS)
    assert set(records.STEP_KEYS) <= set(records.ROW_KEYS + records.STEP_COLUMNS)
    assert trace.SORT_COLUMNS == [*records.STEP_KEYS, "pos"]
    assert records.INT_STATS == {"draft_token", "p_top1"} and records.BOOL_STATS == {"reached", "accepted"}


# -- schema v2: the draft tree --------------------------------------------------------------------

V1_COLUMNS = [n for n in trace.trace_columns() if n not in ("node", "parent", "depth", "sibling_rank")]


def _write_v1(records, path):
    """A shard as SPADE's schema version 1 wrote it: no tree columns, version key 1."""
    keep = V1_COLUMNS + (trace.TOPK_COLUMNS if trace.TOPK_COLUMNS[0] in records[0] else [])
    schema = pa.schema([f for f in trace.schema_for(True) if f.name in keep],
                       metadata={trace.SCHEMA_VERSION_KEY: b"1", trace.METADATA_KEY: b"{}"})
    pq.write_table(pa.Table.from_pylist([{k: r[k] for k in keep} for r in records], schema=schema), path)
    return path


def test_schema_v2_tree_columns_and_describe(tmp_path):
    assert trace.SCHEMA_VERSION == 2
    t = trace.describe().set_index("column")
    assert list(t.index) == trace.trace_columns()
    assert (t.loc[["node", "parent", "depth", "sibling_rank"], "since"] == 2).all()
    assert (t.loc[V1_COLUMNS, "since"] == 1).all() and (t["type"].loc[["node", "parent"]] == "int16").all()
    assert t["meaning"].str.len().min() > 5
    trace.write_shard(make_records("a"), tmp_path / "a.parquet", {})
    df = trace.read_trace(tmp_path)
    np.testing.assert_array_equal(df["node"], df["pos"])
    np.testing.assert_array_equal(df["parent"], df["pos"] - 1)
    assert (df["depth"] == df["pos"]).all() and (df["sibling_rank"] == 0).all() and str(df["node"].dtype) == "int16"


def test_v1_files_read_with_chain_values(tmp_path):
    rec = make_records("a", topk=2) + make_records("b", seed=3, topk=2)
    _write_v1(rec[:9], tmp_path / "a.parquet")
    trace.write_shard(rec[9:], tmp_path / "b.parquet", {})  # a v2 shard beside it
    assert trace.schema_version_of(tmp_path / "a.parquet") == 1
    df = trace.read_trace(tmp_path)
    assert list(df.columns) == trace.trace_columns() + trace.TOPK_COLUMNS
    old = df[df.prompt_id == "a"]
    np.testing.assert_array_equal(old["node"], old["pos"])
    np.testing.assert_array_equal(old["parent"], old["pos"] - 1)
    assert (old["depth"] == old["pos"]).all() and (old["sibling_rank"] == 0).all()
    assert str(old["parent"].dtype) == "int16" and list(old["p_topk_ids"].iloc[0]) == [0, 1]
    # every v1 column reads back unchanged
    ref = pd.DataFrame(rec[:9])[V1_COLUMNS]
    pd.testing.assert_frame_equal(old[V1_COLUMNS].reset_index(drop=True), ref, check_dtype=False)
    # a v1 file missing a v1 column is refused, naming the file and the column
    table = pq.read_table(tmp_path / "a.parquet")
    pq.write_table(table.drop_columns(["p_x"]), tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=r"a\.parquet: its columns are not .*missing \['p_x'\]"):
        trace.read_trace(tmp_path)


def _tree_records(parents, depths, ranks, nodes=None):
    """One step of a tree: drafted tokens with the given parents, depths and sibling ranks."""
    rows = make_records("t", n_steps=1, gamma=len(parents))
    for i, r in enumerate(rows):
        r.update(node=i if nodes is None else nodes[i], parent=parents[i], depth=depths[i], sibling_rank=ranks[i])
    return rows


def test_a_tree_step_is_representable(tmp_path):
    # root -> 0, 1 (siblings); 0 -> 2, 3; 3 -> 4
    rows = _tree_records([-1, -1, 0, 0, 3], [0, 0, 1, 1, 2], [0, 1, 0, 1, 0])
    trace.write_shard(rows, tmp_path / "t.parquet", {})
    df = trace.read_trace(tmp_path)
    assert df["parent"].tolist() == [-1, -1, 0, 0, 3] and df["sibling_rank"].tolist() == [0, 1, 0, 1, 0]


@pytest.mark.parametrize("parents, depths, ranks, nodes, what", [
    ([-1, 1, 1], [0, 1, 2], [0, 0, 0], None, r"parent must lie in \[-1, node\)"),
    ([-1, 0, -2], [0, 1, 0], [0, 0, 0], None, r"parent must lie in \[-1, node\)"),
    ([-1, 0, 1], [0, 1, 1], [0, 0, 0], None, r"depth must be 0 under the root, else depth\(parent\) \+ 1"),
    ([-1, 0, 1], [1, 2, 3], [0, 0, 0], None, r"depth must be 0 under the root"),
    ([-1, 0, 0], [0, 1, 1], [0, 0, 0], None, r"sibling ranks .* 0 \.\. k-1, each once"),
    ([-1, 0, 0], [0, 1, 1], [0, 1, 2], None, r"sibling ranks"),
    ([-1, 0, 1], [0, 1, 2], [0, 0, 0], [0, 1, 1], r"nodes of a step must be 0 \.\. n-1, each once"),
    ([-1, 0, 1], [0, 1, 2], [0, 0, 0], [0, 1, 3], r"nodes of a step must be 0 \.\. n-1"),
])
def test_bad_trees_are_refused_naming_the_file(tmp_path, parents, depths, ranks, nodes, what):
    rows = _tree_records(parents, depths, ranks, nodes)
    with pytest.raises(ValueError, match=r"^records: the tree columns describe no draft tree at prompt_id 't', "
                                         r"sample 0, step 0, node .*" + what):
        trace.write_shard(rows, tmp_path / "t.parquet", {})
    # the same rows written behind SPADE's back are refused on reading, naming the file
    table = pa.Table.from_pylist(rows, schema=trace.schema_for()).replace_schema_metadata(
        {trace.SCHEMA_VERSION_KEY: b"2"})
    pq.write_table(table, tmp_path / "t.parquet")
    with pytest.raises(ValueError, match=r"^run_dir_or_paths: .*t\.parquet: the tree columns describe no draft tree.*"
                                         + what):
        trace.read_trace(tmp_path)


def test_v2_files_with_other_columns_or_types_are_refused(tmp_path):
    path = trace.write_shard(make_records("a"), tmp_path / "a.parquet", {})
    table = pq.read_table(path)
    i = table.schema.get_field_index("parent")
    bad = table.set_column(i, pa.field("parent", pa.int32()), table.column("parent").cast(pa.int32()))
    pq.write_table(bad, path)
    with pytest.raises(ValueError, match=r"a\.parquet: its columns are not the trace schema v2's: .*"
                                         r"of another type \['parent \(int32, not int16\)'\]"):
        trace.read_trace(tmp_path)
    pq.write_table(table.drop_columns(["depth"]).append_column("extra", pa.array([1] * table.num_rows)), path)
    with pytest.raises(ValueError, match=r"missing \['depth'\], unknown \['extra'\]"):
        trace.read_trace(tmp_path)
    for version in (b"0", b"3"):
        pq.write_table(table.replace_schema_metadata({trace.SCHEMA_VERSION_KEY: version}), path)
        with pytest.raises(ValueError, match=r"a\.parquet has trace schema version .*reads versions 1 to 2"):
            trace.read_trace(tmp_path)


# -- one place to add a column ----------------------------------------------------------------------

def test_a_registered_column_flows_from_the_decoder_to_the_parquet_file(tmp_path):
    """One ``register_column`` and nothing else: the records, the schema, the shards of a real run and
    read_trace carry it; once unregistered, a shard that holds it is refused by name."""
    from spade_lib.bench import default_suite
    from spade_lib.decoding import records
    from spade_lib.runs import runner
    from spade_lib.runs.config import RunConfig
    from spade_lib.zoo.pairs import load_pair

    col = records.Column("tokens_after_block", "int32", "block", "tokens the step emits after x: gamma - pos",
                         value=lambda s, step, pos: s.gamma - pos)
    with pytest.raises(ValueError, match="built-in"):
        records.register_column(records.Column("pos", "int16", "block", "again", value=lambda s, st, p: p))
    records.register_column(col)
    try:
        assert trace.trace_columns()[-1] == "tokens_after_block" and trace.schema_for().field(-1).type == pa.int32()
        with pytest.raises(ValueError, match="already registered"):
            records.register_column(col)
        config = RunConfig(max_new_tokens=12, gamma=3, temperature=1.0, warmup=0, device="cpu", threads=1)
        run_dir = runner.run_suite(load_pair("tiny"), default_suite(tokenizer="tiny", n_per_category=1), config,
                                   tmp_path / "run", progress=False)
        shard = trace.shard_paths(run_dir)[0]
        raw = pq.read_table(shard)
        assert raw.column_names[-1] == "tokens_after_block" and raw.schema.field(-1).type == pa.int32()
        df = trace.read_trace(run_dir)
        assert len(df) > 0
        np.testing.assert_array_equal(df["tokens_after_block"], df["gamma"] - df["pos"])
    finally:
        records.unregister_column("tokens_after_block")
    assert "tokens_after_block" not in trace.trace_columns()
    with pytest.raises(ValueError, match=r"parquet: its columns are not .*unknown \['tokens_after_block'\]"):
        trace.read_trace(shard)


def _verified_block(R=3, g=4, V=11, seed=0):
    """Random logits of a target and a draft, and the verification of ``R`` blocks of ``g`` drafts."""
    import torch

    from spade_lib.verify import verify

    gen = torch.Generator().manual_seed(seed)
    logits_p = 2 * torch.randn(R, g + 1, V, generator=gen)
    q_logits = 2 * torch.randn(R, g, V, generator=gen)
    p, q = (logits_p / 0.8).softmax(-1), (q_logits / 0.8).softmax(-1)
    x = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(R, g)
    res = verify(p, q, x, uniforms=torch.rand(R, g, generator=gen))
    return logits_p, p, x, q, q_logits, res


def test_position_stats_equal_a_plain_reference():
    """records.position_stats (the one definition both decoders call) against each column's formula
    written out per row and position in float64."""
    import torch

    from spade_lib.decoding import records

    logits_p, p, x, q, q_logits, res = _verified_block()
    names, got = records.position_stats(records.StatInputs(logits_p, p, x, q, q_logits, res))
    assert names == records.POSITION_STATS and got.shape == (3, len(names), 4) and got.dtype == torch.float64

    def H(d):
        d = d.double()
        return float(-(d[d > 0] * d[d > 0].log()).sum())

    for r in range(3):
        for i in range(4):
            pi, qi = p[r, i].double(), q[r, i].double()
            praw, qraw = logits_p[r, i].double().softmax(-1), q_logits[r, i].double().softmax(-1)
            xi = int(x[r, i])
            top = torch.sort(praw, descending=True)
            ref = {"draft_token": xi, "p_x": float(res.p_x[r, i]), "q_x": float(res.q_x[r, i]),
                   "accept_prob": float(res.accept_prob[r, i]), "uniform": float(res.uniforms[r, i]),
                   "reached": float(res.reached[r, i]), "accepted": float(res.accepted[r, i]),
                   "h_p": H(pi), "h_q": H(qi), "tv": 0.5 * float((pi - qi).abs().sum()),
                   "kl": float((pi[pi > 0] * (pi[pi > 0] / qi[pi > 0]).log()).sum()),
                   "p_top1": int(top.indices[0]), "p_margin": float(top.values[0] - top.values[1]),
                   "q_top_prob": float(qraw.max()), "p_x_raw": float(praw[xi]), "q_x_raw": float(qraw[xi]),
                   "h_p_raw": H(praw), "h_q_raw": H(qraw), "tv_raw": 0.5 * float((praw - qraw).abs().sum())}
            assert set(ref) == set(names)
            for j, name in enumerate(names):
                assert abs(float(got[r, j, i]) - ref[name]) <= 1e-5 * max(1.0, abs(ref[name])), (name, r, i)


def test_a_registered_position_column_is_computed_and_written(tmp_path):
    """A position column is one register_column with its ``compute``: position_stats computes it, the
    records carry it, the shard stores it (what the decoders write once they call position_stats)."""
    from spade_lib.decoding import records
    from spade_lib.decoding.common import GenerationResult, StepInfo

    col = records.Column("log_ratio", "float32", "position", "log p(x) - log q(x)",
                         compute=lambda i: i.res.p_x.log() - i.res.q_x.log())
    records.register_column(col)
    try:
        logits_p, p, x, q, q_logits, res = _verified_block(R=1, g=3)
        names, stats = records.position_stats(records.StatInputs(logits_p, p, x, q, q_logits, res))
        assert names[-1] == "log_ratio"
        host = stats[0].tolist()  # the decoder's one transfer: {column: [g values]}
        step = StepInfo(3, int(res.n_accepted), int(res.next_token), int(res.n_accepted) + 1, 0, "max_gamma",
                        0.1, 0.2, 0.3, stats=dict(zip(names, host)))
        rows = GenerationResult([1, 2], 4, "max_new_tokens", [step]).records()
        assert list(rows[0]) == list(records.record_names()) and list(rows[0])[-1] == "log_ratio"
        path = trace.write_shard([{"prompt_id": "a", "category": "code", "sample": 0, **r} for r in rows],
                                 tmp_path / "a.parquet", {})
        stored = pq.read_table(path).column("log_ratio").to_numpy()
        np.testing.assert_allclose(stored, (res.p_x.log() - res.q_x.log())[0].numpy(), rtol=1e-6)
        bad = StepInfo(3, 0, 5, 1, 0, "max_gamma", stats={n: v for n, v in zip(names, host) if n != "log_ratio"})
        with pytest.raises(ValueError, match=r"computed no \['log_ratio'\]"):
            GenerationResult([5], 4, "max_new_tokens", [bad]).records()
    finally:
        records.unregister_column("log_ratio")
    with pytest.raises(ValueError, match="cannot be unregistered"):
        records.unregister_column("p_x")
