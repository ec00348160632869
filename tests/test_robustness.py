"""Hostile and mistaken inputs at every entry point: each is refused with a ValueError/TypeError whose
message names the argument, and nothing is written (or left behind) anywhere.

Every case runs with the working directory and SPADE's runs/figures folders pointed at a fresh
temporary folder, which must be unchanged afterwards (``no_writes``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from spade_lib import paths, runbook, theory, validate
from spade_lib.bench import Suite
from spade_lib.decoding.drafts.policies import ConfidenceThreshold, EntropyThreshold, FixedGamma
from spade_lib.params import ParameterError, check_range, parse_parameters_cell, resolve
from spade_lib.runs import runner, trace
from spade_lib.runs.config import RunConfig
from spade_lib.runs.store import read_summary
from spade_lib.sampling import SamplingConfig, adjust
from spade_lib.verify import verify
from spade_lib.whatif import align, replay

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------ helpers

def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """cwd, RUNS_DIR and FIGURES_DIR inside ``tmp_path/sandbox``; yields that folder."""
    box = tmp_path / "sandbox"
    box.mkdir()
    monkeypatch.chdir(box)
    monkeypatch.setattr(paths, "RUNS_DIR", box / "runs")
    monkeypatch.setattr(paths, "FIGURES_DIR", box / "figures")
    return box


def refused(exc: type[BaseException], name: str, fn, *args, root: Path | None = None, **kwargs):
    """``fn(*args, **kwargs)`` raises ``exc`` whose message contains ``name``, and ``root`` (if given)
    is unchanged by the call."""
    before = _snapshot(root) if root is not None else None
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert name in str(info.value), f"message does not name {name!r}: {info.value}"
    if root is not None:
        assert _snapshot(root) == before, f"files changed under {root}: {_snapshot(root) ^ before}"
    return info.value


def _pq(B=1, gamma=2, V=4, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    p = torch.rand(B, gamma + 1, V, generator=g, dtype=dtype)
    q = torch.rand(B, gamma, V, generator=g, dtype=dtype)
    return p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True), torch.zeros(B, gamma, dtype=torch.long)


# ------------------------------------------------------------------------------------ validate itself

@pytest.mark.parametrize("fn, exc, name", [
    (lambda: validate.check_int("n", True), TypeError, "n: "),
    (lambda: validate.check_int("n", 4.0), TypeError, "n: "),
    (lambda: validate.check_int("n", "4"), TypeError, "n: "),
    (lambda: validate.check_int("n", 0, min=1), ValueError, "n: "),
    (lambda: validate.check_float("x", math.nan), ValueError, "x: "),
    (lambda: validate.check_float("x", math.inf), ValueError, "x: "),
    (lambda: validate.check_float("x", 0.0, min=0.0, min_open=True), ValueError, "x: "),
    (lambda: validate.check_choice("mode", "EXACT", ("exact",)), ValueError, "mode: "),
    (lambda: validate.check_choice("flag", 1, (True, False)), ValueError, "flag: "),
    (lambda: validate.check_prob_tensor("p", torch.tensor([0.5, 0.6])), ValueError, "p: "),
    (lambda: validate.check_prob_tensor("p", torch.tensor([1, 0])), TypeError, "p: "),
    (lambda: validate.check_identifier("name", "x; import os"), ValueError, "name: "),
    (lambda: validate.check_identifier("name", "class"), ValueError, "name: "),
])
def test_checkers_refuse_and_name_the_argument(fn, exc, name):
    e = refused(exc, name, fn)
    assert str(e).startswith(name)


def test_type_errors_are_also_value_errors_for_older_callers():
    with pytest.raises(ValueError):
        validate.check_int("gamma", "4")


@pytest.mark.parametrize("qid", ["../../evil", "/etc/passwd", "a/b", ".hidden", "", "é", "x" * 300, "a b", "-rf"])
def test_safe_name_never_leaves_the_folder(qid):
    name = validate.safe_name(qid)
    assert "/" not in name and "\\" not in name and not name.startswith((".", "-")) and 0 < len(name) <= 120
    assert Path("trace", name + ".parquet").resolve().parent == Path("trace").resolve()


def test_safe_name_keeps_plain_ids_and_separates_lookalikes():
    assert validate.safe_name(7) == "7" and validate.safe_name("q-1.a_b") == "q-1.a_b"
    assert len({validate.safe_name(s) for s in ["a/b", "a_b", "a\\b", "a b", "a:b"]}) == 5


# ------------------------------------------------------------------------------------ numerics

def test_tiny_temperature_is_stable_or_refused():
    z = torch.tensor([[3.0, 1.0, 3.0, -2.0], [50.0, -50.0, 0.0, 49.0]])
    for t in (1e-30, 1.2e-38):  # logits / T overflows float32 without the max shift
        p = adjust(z, SamplingConfig(temperature=t))
        assert torch.isfinite(p).all() and torch.allclose(p.sum(-1), torch.ones(2))
        assert p[0].tolist() == [0.5, 0.0, 0.5, 0.0] and p[1, 0] == 1.0
    refused(ValueError, "temperature", SamplingConfig, temperature=5e-324)  # rounds to 0 in float32


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(uniforms=torch.full((1, 2), math.nan, dtype=torch.float64)), ValueError, "uniforms"),
    (dict(next_uniforms=torch.tensor([math.nan], dtype=torch.float64)), ValueError, "next_uniforms"),
    (dict(sum_tol=math.nan), ValueError, "sum_tol"),
    (dict(sum_tol=-1.0), ValueError, "sum_tol"),
    (dict(sum_tol="1e-4"), TypeError, "sum_tol"),
    (dict(mode="lenience", lenience=5), ValueError, "lenience"),
    (dict(mode="lenience", lenience=math.nan), ValueError, "lenience"),
    (dict(mode="typical", eps=math.nan), ValueError, "eps"),
])
def test_verify_refuses(kwargs, exc, name):
    p, q, x = _pq()
    refused(exc, name, verify, p, q, x, **kwargs)


def test_nan_uniforms_are_fine_where_no_uniform_is_used():
    """Greedy verification reads no uniform: NaN ones (what a greedy trace records) are accepted by the
    checks and change nothing -- the outcome is the plain greedy reference (accept while ``x_i = argmax
    p_i``, then emit ``argmax p`` at the first mismatch) and the same as with no uniforms at all."""
    p, q, _ = _pq()
    top = p.argmax(-1)[0].tolist()
    x = torch.tensor([[top[0], (top[1] + 1) % p.shape[-1]]])  # position 0 matches, position 1 does not
    nan = verify(p, q, x, mode="greedy", uniforms=torch.full((1, 2), math.nan, dtype=torch.float64),
                 next_uniforms=torch.tensor([math.nan], dtype=torch.float64))
    assert nan.n_accepted.tolist() == [1] and nan.next_token.tolist() == [top[1]]
    assert nan.accepted.tolist() == [[True, False]] and nan.accept_prob.tolist() == [[1.0, 0.0]]
    assert torch.equal(nan.next_dist, torch.nn.functional.one_hot(torch.tensor([top[1]]), p.shape[-1]).double())
    none = verify(p, q, x, mode="greedy")
    for field in ("n_accepted", "next_token", "accept_prob", "accepted", "reached", "p_x", "q_x", "next_dist"):
        assert torch.equal(getattr(nan, field), getattr(none, field)), field


@pytest.mark.parametrize("fn, exc, name", [
    (lambda: FixedGamma(10**9), ValueError, "gamma"),
    (lambda: ConfidenceThreshold(max_gamma=10**12), ValueError, "max_gamma"),
    (lambda: ConfidenceThreshold(threshold=math.nan), ValueError, "threshold"),
    (lambda: EntropyThreshold(threshold="1"), TypeError, "threshold"),
    (lambda: theory.optimal_gamma(0.8, 0.1, max_gamma=10**12), ValueError, "max_gamma"),
])
def test_huge_gamma_and_bad_thresholds(fn, exc, name):
    refused(exc, name, fn)


# ------------------------------------------------------------------------------------ runs: config

@pytest.mark.parametrize("kw, exc, name", [
    (dict(mode="bogus"), ValueError, "mode"),
    (dict(policy="confidence", threshold=math.nan), ValueError, "threshold"),
    (dict(policy="confidence", threshold=1.5), ValueError, "threshold"),
    (dict(policy="entropy", threshold=-1.0), ValueError, "threshold"),
    (dict(gamma=2.0), TypeError, "gamma"),
    (dict(max_gamma=10**9, policy="confidence"), ValueError, "max_gamma"),
    (dict(temperature=math.nan), ValueError, "temperature"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(chat_template=1), ValueError, "chat_template"),
    (dict(dtype="float99"), ValueError, "dtype"),
])
def test_run_config_refuses_at_construction(kw, exc, name, sandbox):
    refused(exc, name, RunConfig, root=sandbox, **kw)


# ------------------------------------------------------------------------------------ runs: run_suite

N_NEW = 4


@pytest.fixture(scope="module")
def pair():
    from spade_lib.zoo.pairs import load_pair

    before = torch.get_num_threads()
    yield load_pair("tiny")
    torch.set_num_threads(before)


def _suite(ids, name="mini") -> Suite:
    rows = [{"question_id": q, "category": "prose", "turns": [f"The value {i} is returned when"]}
            for i, q in enumerate(ids)]
    return Suite(name, rows, {})


def _cfg(**kw) -> RunConfig:
    return RunConfig(**{**dict(max_new_tokens=N_NEW, device="cpu", threads=1, warmup=0), **kw})


def test_run_suite_refuses_before_writing(pair, sandbox):
    run_dir = sandbox / "run"
    refused(TypeError, "config", runner.run_suite, pair, _suite([1]), {"gamma": 4}, run_dir, root=sandbox)
    refused(ValueError, "draft", runner.run_suite, pair, _suite([1]), _cfg(draft="huge"), run_dir,
            progress=False, root=sandbox)
    refused(ValueError, "dtype", runner.run_suite, pair, _suite([1]), _cfg(dtype="float16"), run_dir,
            progress=False, root=sandbox)
    refused(ValueError, "suite", runner.run_suite, pair, _suite([]), _cfg(), run_dir, progress=False, root=sandbox)


def test_question_ids_cannot_write_outside_the_run(pair, sandbox):
    evil = ["../../escaped", str(sandbox / "abs"), "a/b"]
    run_dir = runner.run_suite(pair, _suite(evil), _cfg(), sandbox / "run", progress=False)
    outside = {p for p in _snapshot(sandbox) if not p.startswith("run")}
    assert outside == set(), outside
    names = sorted(p.name for p in trace.shard_paths(run_dir))
    assert names == sorted(f"{validate.safe_name(q)}.parquet" for q in evil)
    assert set(read_summary(run_dir)["question_id"]) == set(evil)
    assert set(trace.read_trace(run_dir)["prompt_id"]) <= set(evil)


def _rewrite_schema_version(shard: Path, version: bytes) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(shard)
    kv = dict(table.schema.metadata)
    kv[trace.SCHEMA_VERSION_KEY] = version
    meta = json.loads(kv[trace.METADATA_KEY])
    meta["schema_version"] = int(version)
    kv[trace.METADATA_KEY] = json.dumps(meta).encode()
    pq.write_table(table.replace_schema_metadata(kv), shard)


def test_schema_version_is_checked_on_read_and_resume(pair, sandbox):
    run_dir = runner.run_suite(pair, _suite([1, 2]), _cfg(), sandbox / "run", progress=False)
    shard = run_dir / "trace" / "2.parquet"
    _rewrite_schema_version(shard, b"99")
    e = refused(ValueError, "run_dir_or_paths", trace.read_trace, run_dir, root=sandbox)
    assert str(shard) in str(e) and "99" in str(e)
    (run_dir / "metadata.json").unlink()
    refused(ValueError, "run_dir", runner.run_suite, pair, _suite([1, 2]), _cfg(), run_dir,
            progress=False, root=sandbox)


def test_deleted_metadata_and_another_config_is_refused(pair, sandbox):
    run_dir = runner.run_suite(pair, _suite([1]), _cfg(), sandbox / "run", progress=False)
    (run_dir / "metadata.json").unlink()
    stamp = (run_dir / "trace" / "1.parquet").stat().st_mtime_ns
    e = refused(ValueError, "run_dir", runner.run_suite, pair, _suite([1]), _cfg(temperature=1.0, seed=7), run_dir,
                progress=False, root=sandbox)
    assert "config_hash" in str(e) and "1.parquet" in str(e)
    assert not (run_dir / "metadata.json").exists()
    assert (run_dir / "trace" / "1.parquet").stat().st_mtime_ns == stamp


def test_metadata_of_another_run_is_refused(pair, sandbox):
    run_dir = runner.run_suite(pair, _suite([1]), _cfg(), sandbox / "run", progress=False)
    refused(ValueError, "run_dir", runner.run_suite, pair, _suite([1]), _cfg(seed=3), run_dir,
            progress=False, root=sandbox)
    (run_dir / "metadata.json").write_text("[1, 2", encoding="utf-8")
    refused(ValueError, "run_dir", runner.run_suite, pair, _suite([1]), _cfg(), run_dir,
            progress=False, root=sandbox)


def test_shard_locked_by_another_process_is_not_computed_twice(pair, sandbox):
    """Hold one shard's lock as another process would: this run computes the other shards first,
    then waits for the lock, finds the shard finished by the holder, and does not redo it."""
    import threading

    from filelock import FileLock

    suite, config, run_dir = _suite([1, 2, 3]), _cfg(), sandbox / "run"
    reference = runner.run_suite(pair, suite, config, sandbox / "ref", progress=False)
    (run_dir / "trace").mkdir(parents=True)
    held = threading.Event()
    written: list[str] = []

    def other_process():  # holds shard 2, finishes it once the run has done the others, then releases
        lock = FileLock(str(run_dir / "trace" / "2.lock"))
        lock.acquire()
        held.set()
        for _ in range(1200):
            if len(written) >= 2:
                break
            threading.Event().wait(0.05)
        (run_dir / "trace" / "2.parquet").write_bytes((reference / "trace" / "2.parquet").read_bytes())
        lock.release()

    t = threading.Thread(target=other_process)
    t.start()
    held.wait(timeout=60)
    try:
        runner.run_suite(pair, suite, config, run_dir, progress=False, on_shard=lambda p: written.append(p.name))
    finally:
        t.join(timeout=120)
    assert written == ["1.parquet", "3.parquet"]
    assert len(read_summary(run_dir)) == 3


TWO_PROCESS_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    torch.set_num_threads(1)
    from spade_lib.bench import Suite
    from spade_lib.runs import runner
    from spade_lib.runs.config import RunConfig
    from spade_lib.zoo.pairs import load_pair
    run_dir, log, go = sys.argv[1], sys.argv[2], sys.argv[3]
    pair = load_pair("tiny")
    rows = [{"question_id": i, "category": "prose", "turns": [f"The value {i} is returned when"]} for i in range(6)]
    config = RunConfig(max_new_tokens=4, device="cpu", threads=1, warmup=0)
    import os, time
    open(go + "." + str(os.getpid()), "w").close()
    while len([p for p in os.listdir(os.path.dirname(go)) if p.startswith(os.path.basename(go) + ".")]) < 2:
        time.sleep(0.02)
    done = []
    runner.run_suite(pair, Suite("mini", rows, {}), config, run_dir, progress=False,
                     on_shard=lambda p: done.append(p.name))
    json.dump(done, open(log, "w"))
""")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SPADE_TEST_PROCESSES") != "1",
                    reason="two Python processes loading the tiny pair: ~110 s on a shared 2-core machine; "
                           "set SPADE_TEST_PROCESSES=1 (the thread-level lock test always runs)")
def test_two_processes_share_a_run_without_duplicates(sandbox):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run_dir, go = sandbox / "run", sandbox / "go"
    procs = [subprocess.Popen([sys.executable, "-c", TWO_PROCESS_SCRIPT, str(run_dir), str(sandbox / f"log{i}"),
                               str(go)], env=env) for i in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    logs = [json.loads((sandbox / f"log{i}").read_text()) for i in range(2)]
    assert sorted(logs[0] + logs[1]) == sorted(f"{i}.parquet" for i in range(6)), logs  # each shard once
    assert len(read_summary(run_dir)) == 6
    assert len(json.loads((run_dir / "metadata.json").read_text())["sessions"]) == 2


# ------------------------------------------------------------------------------------ decoder inputs

@pytest.fixture(scope="module")
def decoders(pair):
    from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder

    return (SpeculativeDecoder(pair.target, pair.draft, gamma=2, tokenizer=pair.tokenizer),
            AutoregressiveDecoder(pair.target, tokenizer=pair.tokenizer))


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("prompt, exc", [
    ("vocab", ValueError), ([-1, 2], ValueError), ("hello world", TypeError), ([1.5, 2], TypeError),
    (torch.tensor([1, -3]), ValueError),
])
def test_decoder_prompt_ids(decoders, which, prompt, exc):
    dec = decoders[which]
    if isinstance(prompt, str) and prompt == "vocab":
        prompt = [1, dec.target.vocab_size]
    refused(exc, "prompt_ids", dec.generate, prompt, 2)


@pytest.mark.parametrize("kw, exc, name", [
    (dict(eos_token_id="10"), TypeError, "eos_token_id"),
    (dict(eos_token_id=[1, "2"]), TypeError, "eos_token_id"),
    (dict(eos_token_id=-5), ValueError, "eos_token_id"),
    (dict(mode="lenience", lenience=5), ValueError, "lenience"),
    (dict(mode="typical", eps=math.nan), ValueError, "eps"),
    (dict(mode="exact", lenience=0.5), ValueError, "lenience"),
])
def test_decoder_construction(pair, kw, exc, name):
    from spade_lib.decoding.decode import SpeculativeDecoder

    refused(exc, name, SpeculativeDecoder, pair.target, pair.draft, gamma=2, **kw)


# ------------------------------------------------------------------------------------ suites

def test_invalid_utf8_names_file_and_line(sandbox):
    from spade_lib.bench.format import read_jsonl

    path = sandbox / "s.jsonl"
    path.write_bytes(b'{"question_id": 1, "category": "a", "turns": ["ok"]}\n'
                     b'{"question_id": 2, "category": "a", "turns": ["bad \xff byte"]}\n')
    e = refused(ValueError, "s.jsonl:2", read_jsonl, path, spade=False, root=sandbox)
    assert "UTF-8" in str(e)


def test_manifest_that_is_a_list(sandbox):
    from spade_lib.bench import load_suite

    (sandbox / "s.jsonl").write_text('{"question_id": 1, "category": "a", "turns": ["ok"]}\n')
    (sandbox / "s.manifest.json").write_text("[1, 2]")
    from spade_lib.bench.format import manifest_path

    manifest_path(sandbox / "s.jsonl").write_text("[1, 2]")
    refused(ValueError, "manifest", load_suite, sandbox / "s.jsonl", root=sandbox)


@pytest.mark.parametrize("kw, name", [
    (dict(min_tokens=50, max_tokens=10), "min_tokens"),
    (dict(name="../escape"), "name"),
    (dict(name=".hidden"), "name"),
    (dict(n_per_category=0), "n_per_category"),
    (dict(max_tokens=-1), "max_tokens"),
])
def test_build_suite_spec(kw, name, sandbox):
    from spade_lib.bench import SuiteSpec, build_suite

    spec = SuiteSpec(**{**dict(name="s", sources=["embedded"], tokenizer="tiny"), **kw})
    refused(ValueError, name, build_suite, spec, root=sandbox)


# ------------------------------------------------------------------------------------ zoo

@pytest.mark.parametrize("kw, exc, name", [
    (dict(dtype="float99"), ValueError, "dtype"),
    (dict(dtype=["float32"]), ValueError, "dtype"),
    (dict(device=3), TypeError, "device"),
    (dict(device="gpu0"), ValueError, "device"),
    pytest.param(dict(device="cuda"), ValueError, "device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")),
])
def test_load_pair_device_and_dtype(kw, exc, name, sandbox):
    from spade_lib.zoo.pairs import load_pair

    refused(exc, name, load_pair, "tiny", root=sandbox, **kw)


# ------------------------------------------------------------------------------------ notebooks / runbook

CELL = """# SPADE parameters
gamma: int = 4  # draft length; range: [1, inf)
p: float = 0.5  # a probability; range: [0, 1]
rate: float = 1.0  # a rate; range: (0, inf)
temps: list[float] = [0.0, 1.0]  # temperatures; range: >= 0 and <= 2
pair: str = "tiny"  # pair; range: one of ["tiny", "default"]
device: str | None = None  # None = auto
"""


@pytest.mark.parametrize("name, value", [
    ("gamma", 0), ("p", 1.5), ("p", math.nan), ("temps", [0.5, 3.0]), ("pair", "huge"), ("rate", 0.0),
    ("rate", math.inf),
])
def test_parameter_ranges(name, value):
    declared = parse_parameters_cell(CELL)
    refused(ParameterError, name, resolve, declared, {name: value}, [name], "nb", None)


def test_parameter_ranges_accept_good_values_and_none():
    declared = parse_parameters_cell(CELL)
    p = resolve(declared, {"gamma": 10**9, "p": 1, "rate": 1e-9, "temps": [2], "device": None},
                ["gamma", "p", "rate", "temps"], "nb", None)
    assert p.gamma == 10**9
    check_range("device", None, ">= 1")


@pytest.mark.parametrize("spec", ["between 1 and 3", ">= one", "[0, 1", "one of 3", "one of []"])
def test_malformed_range_fails_at_parse(spec):
    refused(ParameterError, "x", parse_parameters_cell, f"# SPADE parameters\nx: int = 1  # x; range: {spec}\n")


def test_notebooks_01_02_declare_ranges():
    from spade_lib.params import parameters_cell_source

    for stem, name in [("01_m1_build_benchmark", "n_per_category"), ("02_m2_acceptance_math", "gamma")]:
        declared = parse_parameters_cell(parameters_cell_source(REPO / "notebooks" / f"{stem}.ipynb"))
        assert declared[name].range is not None
        refused(ParameterError, name, resolve, declared, {name: 0}, [name], stem, None)


@pytest.mark.parametrize("kw, exc, name", [
    (dict(params_dir=Path("no/such/folder")), ValueError, "params_dir"),
    (dict(extra={"x = 1; import os; os.system('touch pwned'); y": 1}), ValueError, "parameter name"),
    (dict(extra={"undeclared_name": 3}), ParameterError, "undeclared_name"),
    (dict(extra={"gamma": 0}), ParameterError, "gamma"),
    (dict(extra={"gamma": "3"}), ParameterError, "gamma"),
    (dict(profile="no_such_profile"), ParameterError, "no_such_profile"),
])
def test_runbook_checks_before_papermill(kw, exc, name, sandbox, monkeypatch):
    import papermill

    def boom(*a, **k):
        raise AssertionError("papermill was called")

    monkeypatch.setattr(papermill, "execute_notebook", boom)
    monkeypatch.delenv("SPADE_PROFILE", raising=False)
    refused(exc, name, runbook.run_notebooks, only=["02"], root=sandbox, **kw)
    assert os.environ.get("SPADE_PROFILE") is None


def test_runbook_params_file_must_be_a_mapping(sandbox, monkeypatch):
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    folder = sandbox / "prof"
    folder.mkdir()
    (folder / "02_m2_acceptance_math.yaml").write_text("- 1\n- 2\n")
    refused(ValueError, "params_dir", runbook.run_notebooks, only=["02"], params_dir=folder, root=sandbox)


def test_runbook_cli_exits_cleanly(sandbox, capsys):
    with pytest.raises(SystemExit) as info:
        runbook.main(["--only", "02", "--params", "no/such/folder"])
    assert info.value.code == 2 and "params_dir" in capsys.readouterr().err
    assert _snapshot(sandbox) == set()


# ------------------------------------------------------------------------------------ alignment / replay

@pytest.mark.parametrize("seqs, exc, name", [
    ([[1, 2], []], ValueError, "sequences[1]"),
    ("1 2 3", TypeError, "sequences"),
    ([[1, 2.5]], TypeError, "sequences[0]"),
    ("too_long", ValueError, "sequences[0]"),
])
def test_score_sequences(pair, seqs, exc, name):
    if seqs == "too_long":
        from spade_lib.decoding.model.adapter import context_limit

        seqs = [[1] * (context_limit(pair.target) + 1)]
    refused(exc, name, align.score_sequences, pair.target, pair.draft, seqs)


def _tiny_trace() -> pd.DataFrame:
    rows = []
    for step in range(3):
        for pos in range(4):
            rows.append(dict(prompt_id="1", category="c", sample=0, step=step, pos=pos, gamma=4,
                             accept_prob=0.7, accepted=pos < 2, reached=pos <= 2, n_accepted=2,
                             q_top_prob=0.8, h_q_raw=1.0, p_x=0.5, q_x=0.6, uniform=0.5, tv=0.3))
    return pd.DataFrame(rows)


@pytest.mark.parametrize("fn, exc, name", [
    (lambda: align.predict_tau([np.array([0.5, 0.6])], [2.5]), TypeError, "gammas"),
    (lambda: align.block_tokens(np.array([0.5, 0.6]), 2.5), TypeError, "gamma"),
    (lambda: align.predict(pd.DataFrame({"seq": [0, 0], "i": [0, 1], "alpha": [0.5, 0.6]}), [2], c=-1.0),
     ValueError, "c: "),
    (lambda: align.predict(pd.DataFrame({"seq": [0, 0], "i": [0, 1], "alpha": [0.5, 0.6]}), [2], c=math.nan),
     ValueError, "c: "),
    (lambda: align.predict(pd.DataFrame({"seq": [0, 0], "i": [0, 1], "alpha": [0.5, 0.6]}), [2], c=0.1,
                           verify_cost=0.0), ValueError, "verify_cost"),
    (lambda: replay.replay_stop_rule(_tiny_trace(), FixedGamma(2), c=math.nan), ValueError, "c: "),
    (lambda: replay.replay_stop_rule(_tiny_trace(), FixedGamma(2), c=0.1, verify_cost=-1.0),
     ValueError, "verify_cost"),
    (lambda: replay.replay_stop_rule(_tiny_trace(), FixedGamma(2), c=0.1,
                                     verify_cost=lambda g: math.nan), ValueError, "verify_cost"),
    (lambda: FixedGamma(2.5), TypeError, "gamma"),
    (lambda: ConfidenceThreshold(threshold=math.nan, max_gamma=4), ValueError, "threshold"),
    (lambda: replay.rule_accept_prob(_tiny_trace().assign(h_p=1.0), "typical", {"typical": {"eps": math.nan}}),
     ValueError, "eps"),
    (lambda: replay.rule_accept_prob(_tiny_trace(), "lenience", {"lenience": {"lenience": math.nan}}), ValueError,
     "lenience"),
    (lambda: theory.linear_verify_cost(math.nan, 4), ValueError, "ratio"),
])
def test_alignment_and_replay_refuse(fn, exc, name):
    refused(exc, name, fn)


def test_replay_still_works_on_good_input():
    out = replay.replay_stop_rule(_tiny_trace(), FixedGamma(2), c=0.1)
    assert np.isfinite(out["speedup"]).all() and (out["speedup"] > 0).all()


@pytest.mark.parametrize("profile", sorted(p.name for p in (REPO / "params").iterdir() if p.is_dir()))
def test_runbook_accepts_the_shipped_profiles(profile, sandbox):
    notebooks = runbook.numbered_notebooks(REPO / "notebooks")
    out = runbook.check_parameters(notebooks, profile, REPO / "params" / profile, {})
    assert set(out) == set(notebooks) and _snapshot(sandbox) == set()


def test_command_line_options_below_their_minimum_are_refused_by_name(capsys):
    """validate.check_options: the first option under its least value stops the command line through argparse (exit
    status 2) with "--<name>: must be >= <least>, got <value>", the attribute's _ written - as typed; values at the
    minimum pass."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--max-new-tokens", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    validate.check_options(ap, ap.parse_args([]), {"max_new_tokens": 1, "threads": 0})
    for argv, message in ((["--max-new-tokens", "0"], "--max-new-tokens: must be >= 1, got 0"),
                          (["--threads", "-2"], "--threads: must be >= 0, got -2")):
        with pytest.raises(SystemExit) as stop:
            validate.check_options(ap, ap.parse_args(argv), {"max_new_tokens": 1, "threads": 0})
        assert stop.value.code == 2 and message in capsys.readouterr().err
