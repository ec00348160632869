"""The run CLI and sharded runs (spade_lib.runs.cli, spade_lib.runs.launch, run_suite's rank/world_size).

The slow tests launch ``torchrun --standalone --nproc-per-node 2`` (two CPU processes, gloo) on the
tiny pair and compare the merged run folder with a one-process run of the same YAML: equal in every
column except the measured timings. One of them SIGKILLs rank 1 after its first shard; the same
command run again (here in one process) completes the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from spade_lib import paths
from spade_lib.bench import Suite, load_suite
from spade_lib.runs import cli, launch, runner, trace
from spade_lib.runs.config import RunConfig
from spade_lib.runs.store import read_summary

N_PROMPTS = 6
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE",
               "GROUP_RANK", "TORCHELASTIC_RUN_ID")
TIMED = ["wall_time", "wall_times", "prefill_time"]  # the clocks: every other column is deterministic


@pytest.fixture(scope="module")
def pair():
    from spade_lib.zoo.pairs import load_pair

    before = torch.get_num_threads()
    yield load_pair("tiny")
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A 6-prompt suite file and a run YAML for it (tiny pair, T = 1 so the seeds matter)."""
    d = tmp_path_factory.mktemp("cli")
    rows = [{"question_id": i, "category": ("code", "prose")[i % 2],
             "turns": [f"def f{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n" if i % 2 == 0
                       else f"The value {i} is returned when the function is called with"],
             "source": "test", "source_id": str(i), "subtask": None, "n_tokens": None, "length_tier": None}
            for i in range(N_PROMPTS)]
    suite_path = Suite("mini", rows, {}).save(d / "mini.jsonl")
    config = {"pair": "tiny", "suite": str(suite_path), "n_per_category": None, "temperature": 1,
              "max_new_tokens": 12, "device": "cpu", "threads": 1, "warmup": 0}
    yaml_path = d / "run.yaml"
    yaml_path.write_text(yaml.safe_dump(config))
    return {"suite": suite_path, "yaml": yaml_path}


@pytest.fixture(scope="module")
def reference(pair, files, tmp_path_factory) -> Path:
    """The one-process run of the YAML, through run_suite."""
    spec = cli.load_spec(files["yaml"])
    out = tmp_path_factory.mktemp("ref") / "run"
    return runner.run_suite(pair, load_suite(files["suite"]), spec.config, out, progress=False)


@pytest.fixture()
def no_launcher(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)


def assert_same_run(a: Path, b: Path) -> None:
    """Equal traces and summaries except the timings; equal run identity in the metadata."""
    pd.testing.assert_frame_equal(trace.read_trace(a).drop(columns=trace.TIMING_COLUMNS),
                                  trace.read_trace(b).drop(columns=trace.TIMING_COLUMNS))
    sa, sb = read_summary(a), read_summary(b)
    pd.testing.assert_frame_equal(sa.drop(columns=TIMED), sb.drop(columns=TIMED))
    ma, mb = (json.loads((d / "metadata.json").read_text()) for d in (a, b))
    assert {k: v for k, v in ma.items() if k != "sessions"} == {k: v for k, v in mb.items() if k != "sessions"}


# ---------------------------------------------------------------- the YAML

def test_unknown_keys_are_refused_with_a_hint():
    with pytest.raises(ValueError, match=r"unknown keys 'gama' \(did you mean 'gamma'\?\), 'colour'"):
        cli.spec_from_dict({"pair": "tiny", "gama": 4, "colour": "red"})


def test_yaml_numbers_give_the_python_config_and_hash():
    spec = cli.spec_from_dict(yaml.safe_load("pair: tiny\ntemperature: 0\ntop_p: 1\ngamma: 3\n"))
    assert spec.config == RunConfig(temperature=0.0, top_p=1.0, gamma=3)
    assert spec.config.hash == RunConfig(gamma=3).hash
    assert (spec.pair, spec.suite, spec.n_per_category, spec.resume) == ("tiny", "embedded", None, True)


@pytest.mark.parametrize("data, match", [
    ([1, 2], "expected a mapping"),
    ({"gamma": 4}, "give pair"),
    ({"pair": "tiny", "draft_id": "x"}, "need target_id"),
    ({"target_id": "org/big"}, "needs draft_id or drafts"),
    ({"pair": "tiny", "n_per_category": 0}, "n_per_category"),
    ({"pair": "tiny", "gamma": 0}, "gamma: must be an integer"),
    ({"pair": "tiny", "resume": "yes"}, "resume"),
    ({"pair": "tiny", "suite": ""}, "suite must be a non-empty string"),
    ({"target_id": "org/big", "drafts": ["a"]}, "drafts must map"),
])
def test_bad_yaml_names_the_key(data, match):
    with pytest.raises(ValueError, match=match):
        cli.spec_from_dict(data)


def test_load_spec_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config: no such file"):
        cli.load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pair: [tiny\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        cli.load_spec(bad)
    bad.write_text("pair: tiny\nmethod: beam\n")
    with pytest.raises(ValueError, match=f"{bad}: method: must be one of"):
        cli.load_spec(bad)


@pytest.mark.parametrize("path", sorted((paths.PARAMS_DIR / "cli").glob("*.yaml")), ids=lambda p: p.stem)
def test_example_configs_parse(path):
    spec = cli.load_spec(path)
    assert spec.pair or spec.target_id


def test_the_default_suite_is_the_embedded_file(files):
    spec = cli.spec_from_dict({"pair": "tiny", "n_per_category": 2})
    suite = cli.load_suite_for(spec)
    assert len(suite) == 2 * len(load_suite(paths.DATA_DIR / "embedded.jsonl").categories)
    with pytest.raises(FileNotFoundError, match="suite: no file"):
        cli.load_suite_for(cli.spec_from_dict({"pair": "tiny", "suite": "no_such_suite"}))
    assert len(cli.load_suite_for(cli.spec_from_dict({"pair": "tiny", "suite": str(files["suite"])}))) == N_PROMPTS


# ---------------------------------------------------------------- ranks

def test_ranks_from_env():
    assert launch.ranks_from_env({}) == launch.Ranks(0, 1, 0, False)
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert launch.ranks_from_env(env) == launch.Ranks(1, 2, 1, True)
    assert not launch.ranks_from_env({"RANK": "1", "WORLD_SIZE": "2"}).rendezvous  # a job array: no barrier
    with pytest.raises(ValueError, match="RANK: must be in"):
        launch.ranks_from_env({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="WORLD_SIZE: expected an integer"):
        launch.ranks_from_env({"WORLD_SIZE": "two"})


def test_sum_over_ranks_adds_through_the_store():
    """Without a process group a rank's count is the total; in one (a one-rank gloo group on an in-memory
    store here) the counts add up in the store under their key, the barrier passed."""
    import torch.distributed as dist

    assert launch.sum_over_ranks(3) == 3
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert launch.sum_over_ranks(3) == 3
        assert launch.sum_over_ranks(4, key="other") == 4
        assert launch.sum_over_ranks(2) == 5  # the same key keeps adding
    finally:
        dist.destroy_process_group()


def test_rank_and_world_size_are_checked(files):
    suite, config = load_suite(files["suite"]), cli.load_spec(files["yaml"]).config
    for kw, match in ((dict(rank=2, world_size=2), "rank: "),
                      (dict(rank=0, world_size=0), "world_size: "),
                      (dict(rank=-1, world_size=2), "rank: ")):
        with pytest.raises(ValueError, match=match):
            runner.run_suite(None, suite, config, files["suite"].parent / "never", **kw)


def test_several_ranks_refuse_a_fixed_gpu_or_a_device_map():
    spec = cli.spec_from_dict({"pair": "tiny", "device_map": "auto"})
    with pytest.raises(ValueError, match="device_map: a target spread over devices runs in one process"):
        cli.rank_device(spec, launch.Ranks(0, 2, 0, True))
    assert cli.rank_device(spec, launch.Ranks()) is None
    assert cli.rank_device(cli.spec_from_dict({"pair": "tiny", "device": "cpu"}), launch.Ranks(1, 2, 1, True)) == "cpu"


# ---------------------------------------------------------------- sharding and merging in one process

def test_two_shares_merge_into_the_one_process_run(files, reference, tmp_path, no_launcher, monkeypatch):
    """Ranks started as independent jobs (RANK/WORLD_SIZE set, no MASTER_ADDR: no barrier), in any
    order, then ``--merge``."""
    out = tmp_path / "sharded"
    argv = ["--config", str(files["yaml"]), "--out", str(out), "--no-progress"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, shards in (("1", {"1", "3", "5"}), ("0", {str(i) for i in range(N_PROMPTS)})):
        monkeypatch.setenv("RANK", rank)
        assert cli.main(argv) is None  # no process group: each rank writes its share and stops
        assert {p.stem for p in trace.shard_paths(out)} == shards
        assert (out / "metadata.json").exists() == (rank == "0")  # rank 0 alone writes the metadata
        assert not (out / "summary.jsonl").exists()  # nobody merges before every rank is done
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    info = cli.main(argv + ["--merge"])
    assert info["generations"] == N_PROMPTS
    assert_same_run(out, reference)


def test_merge_refuses_incomplete_or_mixed_runs(pair, files, reference, tmp_path):
    suite = load_suite(files["suite"])
    identity = trace.read_shard_metadata(reference / "trace" / "0.parquet")
    identity = {k: identity[k] for k in ("schema_version", "pair", "suite", "config", "config_hash")}
    run = shutil.copytree(reference, tmp_path / "run")
    (run / "summary.jsonl").unlink()
    (run / "trace" / "3.parquet").unlink()
    with pytest.raises(RuntimeError, match=r"incomplete: 1 of 6 prompts have no shard \(3\); run the same command"):
        launch.merge_run(run, suite, identity)
    assert not (run / "summary.jsonl").exists()
    other = runner.run_suite(pair, Suite("mini", suite.rows[3:4], {}), cli.load_spec(files["yaml"]).config,
                             tmp_path / "other", progress=False)
    shutil.copy(other / "trace" / "3.parquet", run / "trace" / "3.parquet")  # a shard of another suite
    with pytest.raises(RuntimeError, match=r"3.parquet: belongs to another run \(differs in \['suite'\]\)"):
        launch.merge_run(run, suite, identity)
    shutil.copy(reference / "trace" / "3.parquet", run / "trace" / "3.parquet")
    shutil.copy(reference / "trace" / "3.parquet", run / "trace" / "3b.parquet")  # the same prompt twice
    with pytest.raises(RuntimeError, match="prompt '3' already in"):
        launch.merge_run(run, suite, identity)
    (run / "trace" / "3b.parquet").unlink()
    assert launch.merge_run(run, suite, identity) == run / "summary.jsonl"
    assert_same_run(run, reference)


# ---------------------------------------------------------------- torchrun, two CPU processes

def torchrun(files: dict[str, Path], out: Path, script: Path | None = None) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2`` (a free port; gloo) of the CLI or of ``script``."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(paths.REPO_ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [str(script)] if script else ["-m", "spade_lib.runs.cli"]
    cmd += ["--config", str(files["yaml"]), "--out", str(out), "--no-progress"]
    return subprocess.run(cmd, cwd=paths.REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_torchrun_two_processes_equal_one(files, reference, tmp_path):
    out = tmp_path / "run"
    done = torchrun(files, out)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "[rank 0/2] done: 3 prompts decoded" in log and "[rank 1/2] done: 3 prompts decoded" in log
    assert "with 2 process(es)" in log and f"{N_PROMPTS} prompts, {N_PROMPTS} generations" in log
    assert_same_run(out, reference)
    assert json.loads((out / "metadata.json").read_text())["sessions"][-1]["world_size"] == 2


@pytest.mark.slow
def test_a_killed_rank_leaves_a_run_that_a_rerun_completes(files, reference, tmp_path, no_launcher):
    script = tmp_path / "kill_rank_1.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(paths.REPO_ROOT)!r})
        from spade_lib.runs import cli, trace
        if os.environ.get("RANK") == "1":  # SIGKILL rank 1 right after its first shard
            write = trace.write_shard
            def write_then_die(*args, **kwargs):
                write(*args, **kwargs)
                os.kill(os.getpid(), signal.SIGKILL)
            trace.write_shard = write_then_die
        sys.exit(cli.console())
    """))
    out = tmp_path / "run"
    died = torchrun(files, out, script)
    assert died.returncode != 0, (died.stdout + died.stderr)[-4000:]
    left = {p.stem for p in trace.shard_paths(out)}
    assert "1" in left and not {"3", "5"} & left  # rank 1 wrote its first prompt, then died
    assert not (out / "summary.jsonl").exists()
    info = cli.main(["--config", str(files["yaml"]), "--out", str(out), "--no-progress"])  # the rerun
    assert info["decoded_now"] == N_PROMPTS - len(left)
    assert_same_run(out, reference)
