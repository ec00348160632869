"""Cache entries of the zoo: build once, verify by sha256 (re-hashed only when a file's stats moved since the last
check), rebuild corrupted entries, one build under concurrency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from spade_lib.paths import REPO_ROOT
from spade_lib.zoo import cache
from spade_lib.zoo.cache import cache_key, get_or_build, read_manifest, verify_entry


def _builder(calls: list):
    def build(tmp: Path) -> dict:
        calls.append(tmp)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "weights.bin").write_bytes(b"\x01\x02\x03")
        return {"answer": 42}
    return build


def test_build_once_then_reuse(tmp_path):
    calls = []
    entry = get_or_build(tmp_path / "e", _builder(calls))
    assert get_or_build(tmp_path / "e", _builder(calls)) == entry and len(calls) == 1
    m = read_manifest(entry)
    assert m["answer"] == 42 and set(m["files"]) == {"sub/weights.bin"} and verify_entry(entry) is None
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folders left


def test_an_unchanged_entry_is_not_rehashed_and_a_same_size_rewrite_is(tmp_path, monkeypatch):
    """The build records its files' stats; a load that finds them unchanged hashes nothing. Rewriting a file with
    other bytes of the same size moves its times: the next load re-hashes, finds the mismatch and rebuilds."""
    calls, hashed = [], []
    real = cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file", lambda path: hashed.append(path) or real(path))
    entry = get_or_build(tmp_path / "e", _builder(calls))
    assert (tmp_path / "e.verified").is_file() and len(hashed) == 1  # the build hashed its one file
    hashed.clear()
    assert get_or_build(tmp_path / "e", _builder(calls)) == entry and hashed == [] and len(calls) == 1
    (tmp_path / "e.verified").unlink()  # no record (e.g. an entry built before records): re-hashed once, recorded
    get_or_build(tmp_path / "e", _builder(calls))
    assert len(hashed) == 1 and (tmp_path / "e.verified").is_file() and len(calls) == 1
    hashed.clear()
    (entry / "sub" / "weights.bin").write_bytes(b"\x01\x02\x04")  # same size, other bytes
    with pytest.warns(UserWarning, match="corrupted.*sha256 mismatch"):
        get_or_build(tmp_path / "e", _builder(calls))
    assert len(calls) == 2 and hashed and verify_entry(entry) is None


def test_rebuild_forces_a_new_build(tmp_path):
    calls = []
    first = read_manifest(get_or_build(tmp_path / "e", _builder(calls)))["build_id"]
    second = read_manifest(get_or_build(tmp_path / "e", _builder(calls), rebuild=True))["build_id"]
    assert len(calls) == 2 and first != second


@pytest.mark.parametrize("damage", ["flip", "delete", "extra", "manifest"])
def test_corrupted_entry_is_detected_and_rebuilt(tmp_path, damage):
    calls = []
    entry = get_or_build(tmp_path / "e", _builder(calls))
    weights = entry / "sub" / "weights.bin"
    if damage == "flip":
        weights.write_bytes(b"\x01\x02\x04")
    elif damage == "delete":
        weights.unlink()
    elif damage == "extra":
        (entry / "sub" / "stray.bin").write_bytes(b"")
    else:
        (entry / "manifest.json").write_text("{not json")
    assert verify_entry(entry) is not None
    with pytest.warns(UserWarning, match="corrupted"):
        get_or_build(tmp_path / "e", _builder(calls))
    assert len(calls) == 2 and verify_entry(entry) is None


def test_failed_build_leaves_nothing(tmp_path):
    def build(tmp: Path) -> dict:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        get_or_build(tmp_path / "e", build)
    assert not (tmp_path / "e").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["e.lock"]


def test_leftovers_of_a_killed_builder_are_removed(tmp_path):
    stale = tmp_path / ".e.abc123.building"
    stale.mkdir()
    (stale / "half.bin").write_bytes(b"x")
    get_or_build(tmp_path / "e", _builder([]))
    assert not stale.exists()


def test_cache_key_is_canonical():
    assert cache_key({"a": 1, "b": [1, 2]}) == cache_key({"b": [1, 2], "a": 1})
    assert cache_key({"a": 1}) != cache_key({"a": 2}) and len(cache_key({})) == 12


_WORKER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from spade_lib.zoo.cache import get_or_build, read_manifest
    entry, log, go = map(Path, sys.argv[1:4])
    Path(str(log) + "." + sys.argv[4]).touch()          # ready
    while not go.exists():
        time.sleep(0.01)
    def build(tmp):
        with open(log, "a") as f:
            f.write("build\\n")
        time.sleep(1.0)                                  # both workers are inside get_or_build now
        (tmp / "w.bin").write_bytes(b"w")
        return {}
    print(read_manifest(get_or_build(entry, build))["build_id"])
""")


def test_two_processes_build_once(tmp_path):
    entry, log, go = tmp_path / "e", tmp_path / "log", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(entry), str(log), str(go), str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(2)]
    deadline = time.monotonic() + 120
    while not all(Path(f"{log}.{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            [p.communicate() for p in procs if p.poll() is not None]
        time.sleep(0.05)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert log.read_text() == "build\n"
    ids = {out.strip() for out, _ in outs}
    assert len(ids) == 1 and ids == {read_manifest(entry)["build_id"]}


@pytest.mark.slow
def test_two_processes_load_tiny_once(tmp_path):
    """Two notebooks asking for the tiny pair on an empty cache: one build, both load it."""
    script = "from spade_lib.zoo.pairs import load_pair; print(load_pair('tiny').manifest['build_id'])"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SPADE_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    assert len({out.strip() for out, _ in outs}) == 1
    entries = sorted(p.name for p in (tmp_path / "zoo").iterdir() if not p.name.endswith((".lock", ".verified")))
    assert len(entries) == 2 and all(not n.startswith(".") for n in entries)  # pair + tokenizer, no temp dirs
    assert json.loads((tmp_path / "zoo" / entries[0] / "manifest.json").read_text())["kind"] in ("pair", "tokenizer")
