"""Runner: resumable atomic shards (kill -9 included), metadata, baselines, config hashing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch

from spade_lib import paths
from spade_lib.runs import runner, trace
from spade_lib.runs.config import RunConfig, generation_seed
from spade_lib.runs.store import (list_runs, read_summary, run_dir_for, run_identity, shard_done, suite_key,
                                  write_summary)
from spade_lib.bench import Suite

N_NEW = 12


def mini_suite(n: int = 4) -> Suite:
    rows = [{"question_id": i, "category": ("code", "prose")[i % 2],
             "turns": [f"def f{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n" if i % 2 == 0
                       else f"The value {i} is returned when the function is called with"]}
            for i in range(n)]
    return Suite("mini", rows, {})


@pytest.fixture(scope="module")
def pair():
    from spade_lib.zoo.pairs import load_pair

    before = torch.get_num_threads()
    yield load_pair("tiny")
    torch.set_num_threads(before)


def cfg(**kw) -> RunConfig:
    base = dict(max_new_tokens=N_NEW, device="cpu", threads=1, warmup=0)
    return RunConfig(**{**base, **kw})


def deterministic(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=trace.TIMING_COLUMNS)


def test_run_writes_trace_summary_metadata(pair, tmp_path):
    suite = mini_suite()
    c = cfg(temperature=1.0, n_samples=2)
    d = runner.run_suite(pair, suite, c, tmp_path / "run", progress=False)
    df = trace.read_trace(d)
    s = read_summary(d)
    assert sorted(p.name for p in trace.shard_paths(d)) == [f"{i}.parquet" for i in range(4)]
    assert len(s) == 8 and s["question_id"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert (s["new_tokens"] == N_NEW).all() and (s["wall_time"] > 0).all()
    # the summary's accept lengths (n + 1 per step) agree with the trace's steps; a step that
    # drafted nothing (e.g. the last token of the budget) has no trace rows
    steps = df.groupby(["prompt_id", "sample", "step"])["n_accepted"].first()
    for (pid, sample, step), n in steps.items():
        row = s[(s.question_id == int(pid)) & (s["sample"] == sample)].iloc[0]
        assert row["accept_lengths"][step] == n + 1
    assert len(steps) <= s["n_steps"].sum()
    assert set(df["prompt_id"]) == {"0", "1", "2", "3"} and set(df["sample"]) == {0, 1}
    assert len(set(s["seed"])) == 8
    meta = trace.read_metadata(d)
    assert meta["suite"]["sha256"] == suite.sha256 and meta["config_hash"] == c.hash
    assert meta["environment"]["torch_threads"] == 1
    for key in ("cpu_model", "torch", "transformers", "git_commit"):
        assert key in meta["environment"]
    assert trace.read_shard_metadata(d / "trace" / "0.parquet")["config"] == c.to_dict()


def test_resume_skips_finished_shards(pair, tmp_path):
    suite = mini_suite()
    d = runner.run_suite(pair, suite, cfg(), tmp_path / "run", progress=False)
    stamps = {p.name: p.stat().st_mtime_ns for p in trace.shard_paths(d)}
    os.unlink(d / "trace" / "2.parquet")
    written = []
    runner.run_suite(pair, suite, cfg(), d, progress=False, on_shard=written.append)
    assert [p.name for p in written] == ["2.parquet"]
    after = {p.name: p.stat().st_mtime_ns for p in trace.shard_paths(d)}
    assert {k: v for k, v in after.items() if k != "2.parquet"} == \
           {k: v for k, v in stamps.items() if k != "2.parquet"}
    assert len(read_summary(d)) == 4


def test_temporaries_and_unreadable_shards_are_redone(pair, tmp_path):
    suite = mini_suite(2)
    d = runner.run_suite(pair, suite, cfg(), tmp_path / "run", progress=False)
    reference = trace.read_trace(d)
    (d / "trace" / ".1.abcd.parquet").write_bytes(b"half")   # a write cut short by a crash
    (d / "trace" / "1.parquet").write_bytes(b"not parquet")  # cannot happen with atomic writes, still
    written = []
    runner.run_suite(pair, suite, cfg(), d, progress=False, on_shard=written.append)
    assert [p.name for p in written] == ["1.parquet"]
    assert not list((d / "trace").glob(".*"))
    pd.testing.assert_frame_equal(deterministic(trace.read_trace(d)), deterministic(reference))


def test_shard_with_other_columns_than_its_schema_version_is_redone(pair, tmp_path):
    import pyarrow.parquet as pq

    suite = mini_suite(2)
    d = runner.run_suite(pair, suite, cfg(), tmp_path / "run", progress=False)
    reference = trace.read_trace(d)
    shard = d / "trace" / "1.parquet"
    table = pq.read_table(shard)  # same run identity and schema version, one column gone
    pq.write_table(table.drop_columns(["kl"]).replace_schema_metadata(table.schema.metadata), shard)
    identity = run_identity(pair, suite, cfg())
    assert not shard_done(shard, identity)
    assert shard_done(d / "trace" / "0.parquet", identity)
    written = []
    runner.run_suite(pair, suite, cfg(), d, progress=False, on_shard=written.append)
    assert [p.name for p in written] == ["1.parquet"]
    pd.testing.assert_frame_equal(deterministic(trace.read_trace(d)), deterministic(reference))


def test_corrupt_shard_is_named_by_the_readers(pair, tmp_path):
    d = runner.run_suite(pair, mini_suite(2), cfg(), tmp_path / "run", progress=False)
    bad = d / "trace" / "1.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(ValueError, match=r"1\.parquet is not a readable Parquet") as e:
        write_summary(d)
    assert "magic bytes" in str(e.value.__cause__)
    with pytest.raises(ValueError, match=r"^run_dir_or_paths: .*1\.parquet is not a readable Parquet"):
        trace.read_trace(d)


def test_same_dir_different_run_is_refused(pair, tmp_path):
    d = runner.run_suite(pair, mini_suite(2), cfg(), tmp_path / "run", progress=False)
    with pytest.raises(ValueError, match="different run.*config"):
        runner.run_suite(pair, mini_suite(2), cfg(gamma=2), d, progress=False)


def test_baselines_and_greedy_equality(pair, tmp_path):
    suite = mini_suite(2)
    spade = read_summary(runner.run_suite(pair, suite, cfg(), tmp_path / "s", progress=False))
    ar_dir = runner.run_suite(pair, suite, cfg(method="ar"), tmp_path / "ar", progress=False)
    ar = read_summary(ar_dir)
    hf = read_summary(runner.run_suite(pair, suite, cfg(method="hf"), tmp_path / "hf", progress=False))
    assert trace.read_trace(ar_dir).empty and (ar["accept_lengths"].map(set) == {1}).all()  # 1 token a step
    assert (hf["accept_lengths"].map(len) == 0).all()  # HF exposes no steps
    # greedy speculative decoding in fp32 reproduces greedy autoregressive decoding token for token
    assert spade["output_ids"].tolist() == ar["output_ids"].tolist() == hf["output_ids"].tolist()


@pytest.mark.slow
def test_kill_9_then_resume_equals_uninterrupted(pair, tmp_path):
    """A subprocess is SIGKILLed after its second shard; resuming gives the uninterrupted trace."""
    n = 8
    killed_dir, clean_dir = tmp_path / "killed", tmp_path / "clean"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(paths.REPO_ROOT)!r})
        from spade_lib.runs import runner
        from spade_lib.zoo.pairs import load_pair
        from tests.test_runner import cfg, mini_suite
        pair = load_pair("tiny")
        runner.run_suite(pair, mini_suite({n}), cfg(temperature=1.0), {str(killed_dir)!r}, progress=False,
                         on_shard=lambda p: print(p.name, flush=True))
        print("finished", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=paths.REPO_ROOT)
    lines = []
    try:
        while len(lines) < 2:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert len(lines) == 2 and "finished" not in lines, lines
    done_before = len(trace.shard_paths(killed_dir))
    assert 2 <= done_before < n
    assert not (killed_dir / "summary.jsonl").exists()

    written = []
    runner.run_suite(pair, mini_suite(n), cfg(temperature=1.0), killed_dir, progress=False,
                     on_shard=written.append)
    assert len(written) == n - done_before
    runner.run_suite(pair, mini_suite(n), cfg(temperature=1.0), clean_dir, progress=False)
    pd.testing.assert_frame_equal(deterministic(trace.read_trace(killed_dir)),
                                  deterministic(trace.read_trace(clean_dir)))
    cols = ["question_id", "sample", "seed", "new_tokens", "accept_lengths", "output_ids", "text"]
    pd.testing.assert_frame_equal(read_summary(killed_dir)[cols], read_summary(clean_dir)[cols])
    assert len(json.loads((killed_dir / "metadata.json").read_text())["sessions"]) == 2


def test_run_dir_for_and_config_hash(monkeypatch):
    a, b = cfg(), cfg(gamma=2)
    assert a.hash == cfg().hash and a.hash != b.hash
    d = run_dir_for("tiny", "mini", a)
    assert d.parent == paths.RUNS_DIR / "traces" / "tiny" / "mini" and d.name.endswith(a.hash)
    assert run_dir_for("Qwen/Qwen2.5-7B", "mini", a).parts[-3] == "Qwen--Qwen2.5-7B"
    with pytest.raises(ValueError, match="suite_name"):
        run_dir_for("tiny", "", a)
    with pytest.raises(ValueError, match="pair_name"):
        run_dir_for("../x", "mini", a)


def test_policy_and_mode_options():
    from spade_lib.decoding.drafts.policies import ConfidenceThreshold, FixedGamma, policy_names

    assert cfg(gamma=3).make_policy() == FixedGamma(3)
    c = cfg(policy="confidence", threshold=0.3, max_gamma=5)
    assert c.make_policy() == ConfidenceThreshold(threshold=0.3, max_gamma=5)
    assert cfg(policy="confidence", policy_options={"threshold": 0.2}).make_policy().threshold == 0.2  # options win
    a, b = cfg(mode="lenience"), cfg(mode="lenience", mode_options={"lenience": 0.7})
    assert a.hash != b.hash and b.mode_options == {"lenience": 0.7}
    opts = {"lenience": 0.7}
    c = cfg(mode="lenience", mode_options=opts)
    opts["lenience"] = 0.9  # the config keeps its own copy
    assert c.mode_options == {"lenience": 0.7} and c.hash == b.hash
    assert policy_names()[:3] == ("fixed", "confidence", "entropy")


def test_generation_seed_is_stable():
    assert generation_seed(0, 5, 1) == generation_seed(0, 5, 1)
    assert len({generation_seed(0, q, s) for q in range(20) for s in range(5)}) == 100
    assert generation_seed(0, 5, 1) == 5483192104208182565


@pytest.mark.parametrize("kw, match", [
    (dict(method="beam"), "method"), (dict(policy="oracle"), "policy"), (dict(gamma=0), "gamma"),
    (dict(temperature=-1.0), "temperature"), (dict(dtype="int8"), "dtype"), (dict(repeats=0), "repeats"),
    (dict(method="hf_assisted", draft="ngram"), "ngram"), (dict(chat_template="maybe"), "chat_template"),
    (dict(mode="nope"), "mode"), (dict(mode="lenience", mode_options={"lenience": 2.0}), "lenience"),
    (dict(mode="exact", mode_options={"eps": 0.1}), "unknown"), (dict(mode_options={"lenience": 0.5}), "mode_options"),
    (dict(policy_options={"nope": 1}), "policy_options"), (dict(policy_options=[1]), "policy_options"),
    (dict(policy="confidence", threshold=2.0), "threshold"),
])
def test_bad_config_names_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(**kw)


def test_bad_draft_and_placement(pair, tmp_path):
    with pytest.raises(ValueError, match="draft: pair 'tiny' has drafts"):
        runner.run_suite(pair, mini_suite(1), cfg(draft="huge"), tmp_path / "x", progress=False)
    with pytest.raises(ValueError, match="dtype"):
        runner.run_suite(pair, mini_suite(1), cfg(dtype="bfloat16"), tmp_path / "y", progress=False)


def test_default_run_dir_uses_the_suite_hash(pair, tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    suite = mini_suite(1)
    d = runner.run_suite(pair, suite, cfg(method="ar"), progress=False)
    assert d == run_dir_for("tiny", suite_key(suite), cfg(method="ar"))
    assert suite_key(suite) == f"mini-{suite.sha256[:8]}"
    runs = list_runs(tmp_path / "traces")
    assert runs[["pair", "method", "config_hash"]].values.tolist() == [["tiny", "ar", cfg(method="ar").hash]]


def test_a_tree_run_config_is_canonical_and_chain_hashes_stay():
    """RunConfig.tree: one canonical spec (two spellings, one hash), chain configs hash as before the field
    existed (it is left out of their identity), and a tree refused for methods that draft none."""
    from spade_lib.runs.config import RunConfig

    chain = RunConfig()
    assert "tree" not in chain.to_dict()
    a = RunConfig(tree="eagle2:nodes=16,depth=4,topk=4")
    b = RunConfig(tree="eagle2:topk=4,depth=4,nodes=16")
    assert a.hash == b.hash != chain.hash and a.tree == b.tree and "eagle2" in a.label
    with pytest.raises(ValueError, match="tree"):
        RunConfig(method="ar", tree="eagle2")
    with pytest.raises(ValueError):
        RunConfig(tree="no_such_shape")


def test_a_drafter_tree_combination_is_refused_when_the_config_is_built():
    """Issue 57: a config checks its tree against the shapes its draft proposes (a registered drafter's declared
    kind; any other name is a draft model or head of the pair, which grows the model shapes) when it is built,
    not once run_suite has written its folder."""
    from spade_lib.runs.config import RunConfig

    with pytest.raises(ValueError, match=r"^tree: draft 'ngram' drafts chains only, not a 'eagle2' tree"):
        RunConfig(tree="eagle2", draft="ngram")
    with pytest.raises(ValueError, match=r"^tree: draft 'distilled' \(a draft model or head of the pair\) drafts "
                                         r"\('chain', 'eagle2', 'static', 'sampled'\), not a 'trie' tree"):
        RunConfig(tree="trie:nodes=8", draft="distilled")
    with pytest.raises(ValueError, match=r"^tree: draft 'suffix' drafts \('trie',\), not a 'eagle2' tree"):
        RunConfig(tree="eagle2", draft="suffix")
    assert RunConfig(tree="trie:nodes=8", draft="ngram_tree").tree.startswith("trie")
    assert RunConfig(tree="eagle2", draft="eagle").tree.startswith("eagle2")
    assert RunConfig(tree="static", draft="distilled").tree.startswith("static")
    assert RunConfig(tree="chain", draft="ngram").tree == ""  # the chain is no tree


def test_a_refused_run_leaves_its_folder_as_it_was(pair, tmp_path):
    """Issue 57: run_suite makes every check before it writes anything, so a config refused with the pair (a
    cross-vocabulary draft with a tree, a head drafter without heads, an option the drafter does not take, an
    unknown draft) leaves an absent folder absent and another run's folder byte for byte as it was; the
    corrected config then runs in the folder the refused one named."""
    import dataclasses

    suite = mini_suite(1)
    crossed = dataclasses.replace(pair, draft_tokenizers={"data_only": pair.tokenizer})
    refused = [(crossed, cfg(draft="data_only", tree="eagle2:nodes=4,depth=2,topk=2"),
                r"^tree: the cross-vocabulary draft 'data_only' drafts chains only"),
               (pair, cfg(draft="eagle"), r"^draft: 'eagle' drafts with one of the pair's feature heads"),
               (pair, cfg(draft="ngram", draft_options={"bogus": 1}), r"^options: drafter 'ngram' takes"),
               (pair, cfg(draft="huge"), r"^draft: pair 'tiny' has drafts")]
    for p, c, match in refused:
        with pytest.raises(ValueError, match=match):
            runner.run_suite(p, suite, c, tmp_path / "run", progress=False)
        assert not (tmp_path / "run").exists()
    other = runner.run_suite(pair, suite, cfg(method="ar"), tmp_path / "other", progress=False)

    def files():
        return {f.relative_to(other): (f.stat().st_mtime_ns, f.read_bytes()) for f in other.rglob("*") if f.is_file()}

    before = files()
    for p, c, match in refused:
        with pytest.raises(ValueError, match=match):
            runner.run_suite(p, suite, c, other, progress=False)
        assert files() == before
    d = runner.run_suite(pair, suite, cfg(draft="ngram"), tmp_path / "run", progress=False)
    assert len(read_summary(d)) == 1


def test_draft_options_reach_the_drafter_and_empty_ones_keep_the_hash():
    """RunConfig.draft_options: left out of an empty config's identity (hashes stay), part of the hash and
    label otherwise, passed to make_drafter (winning over ngram_max), refused for methods that build no
    drafter and for values that cannot be hashed."""
    from spade_lib.runs.config import RunConfig

    plain = RunConfig(draft="ngram")
    assert "draft_options" not in plain.to_dict()
    opt = RunConfig(draft="ngram", draft_options={"max_ngram": 5, "min_ngram": 2})
    assert opt.hash != plain.hash and "max_ngram=5" in opt.label and "min_ngram=2" in opt.label
    class Target(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

    class FakePair:
        target, drafts, heads, name = Target(), {}, {}, "fake"

    d = opt.make_drafter(FakePair())
    assert (d.max_ngram, d.min_ngram) == (5, 2)
    assert RunConfig(draft="ngram", ngram_max=4).make_drafter(FakePair()).max_ngram == 4
    with pytest.raises(ValueError, match="^draft_options: only method 'spade'"):
        RunConfig(method="ar", draft_options={"rule": "tli"})
    with pytest.raises(ValueError, match="^draft_options: must hold JSON values"):
        RunConfig(draft_options={"x": object()})


def test_a_tree_run_writes_tree_traces_and_equals_autoregressive(pair, tmp_path):
    """run_suite with RunConfig(tree=...): greedy outputs equal the AR run's, and the shards carry each
    drafted node's place (parent < node, depth = depth(parent) + 1, checked again by read_trace)."""
    suite = mini_suite(2)
    ar = read_summary(runner.run_suite(pair, suite, cfg(method="ar"), tmp_path / "ar", progress=False))
    d = runner.run_suite(pair, suite, cfg(tree="eagle2:nodes=6,depth=3,topk=2", gamma=3), tmp_path / "tree",
                         progress=False)
    assert read_summary(d)["output_ids"].tolist() == ar["output_ids"].tolist()
    df = trace.read_trace(d)
    assert (df["parent"] < df["node"]).all() and (df["sibling_rank"] > 0).any()
    for _, step in df.groupby(["prompt_id", "sample", "step"]):
        depth = dict(zip(step["node"], step["depth"]))
        assert all(dep == (0 if par < 0 else depth[par] + 1) for par, dep in zip(step["parent"], step["depth"]))


def test_run_identity_names_the_heads_only_for_a_run_a_head_drafts(pair):
    import types

    suite = mini_suite(1)
    built = types.SimpleNamespace(name=pair.name, manifest={"sha256": "abc", "heads": {
        "eagle3": {"build_id": "b1"}, "medusa": {"build_id": "b2"}}})
    bare = types.SimpleNamespace(name=pair.name, manifest={"sha256": "abc"})
    for c in (cfg(method="ar"), cfg()):  # autoregressive and a draft-model run: heads attached or not, one run
        assert run_identity(built, suite, c) == run_identity(bare, suite, c)
    for draft in ("eagle", "medusa", "eagle3"):  # a head drafts: its build is part of the run
        got = run_identity(built, suite, cfg(draft=draft))
        assert got["pair"]["heads"] == {"eagle3": "b1", "medusa": "b2"}
        assert got != run_identity(bare, suite, cfg(draft=draft))
    real = types.SimpleNamespace(name="hf", manifest={"kind": "hf", "heads": {"draft": "/heads/eagle3"}})
    assert run_identity(real, suite, cfg(draft="draft"))["pair"]["heads"] == {"draft": "/heads/eagle3"}
