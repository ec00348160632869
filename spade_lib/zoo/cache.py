"""Build-once cache entries: lock, build into a temporary folder, verify, atomically rename.

An entry is a folder ``CACHE_DIR/zoo/<name>-<key>`` where ``key`` is a sha256 prefix of the recipe
(config, corpus hash, build-format version). It is complete iff it exists: a builder writes into a
temporary sibling folder and ``os.rename``s it into place only after ``manifest.json`` (which lists
the sha256 of every other file) is written. A ``filelock`` lock ``<entry>.lock`` serialises builders,
so two processes (two notebooks) asking for the same missing entry build it once: the second waits,
then finds the entry.

A load checks the entry against its manifest: it re-hashes every file unless each file's size and change
times (``st_size``, ``st_mtime_ns``, ``st_ctime_ns``) equal those recorded beside the entry
(``<entry>.verified``) when its hashes were last checked — at its build, or at a load that re-hashed it.
Writing a file moves its times, so a changed file is re-hashed; an unchanged multi-GB entry is not read twice
(the Qwen2.5-Coder pair: ~24 s a load). A corrupted entry (missing file, changed bytes) is moved aside and
**rebuilt with a warning** — embedded builds are deterministic, so the rebuilt entry is equivalent; pass
``rebuild=True`` to force a rebuild of a valid entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
import warnings
from pathlib import Path
from typing import Callable

from filelock import FileLock

from spade_lib.io import write_json

MANIFEST = "manifest.json"


def cache_key(recipe: dict) -> str:
    """A 12-hex-digit sha256 prefix of the canonical JSON of ``recipe``."""
    blob = json.dumps(recipe, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` except the manifest, keyed by POSIX relative path."""
    return {p.relative_to(root).as_posix(): sha256_file(p)
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST}


def read_manifest(entry: Path) -> dict:
    return json.loads((entry / MANIFEST).read_text(encoding="utf-8"))


def verify_entry(entry: Path) -> str | None:
    """``None`` if ``entry`` matches its manifest, else a description of the first problem found."""
    try:
        expected = read_manifest(entry)["files"]
    except (OSError, ValueError, KeyError) as e:
        return f"unreadable {MANIFEST}: {e}"
    try:
        actual = file_hashes(entry)
    except OSError as e:  # e.g. a file vanished while another process replaced the entry
        return f"unreadable file: {e}"
    for rel, digest in expected.items():
        if rel not in actual:
            return f"missing file {rel}"
        if actual[rel] != digest:
            return f"sha256 mismatch for {rel}"
    extra = sorted(set(actual) - set(expected))
    return f"unexpected file {extra[0]}" if extra else None


def _stats(entry: Path) -> dict[str, list[int]]:
    """``{relative path: [size, mtime_ns, ctime_ns]}`` of every file under ``entry``, the manifest included."""
    out = {}
    for p in sorted(entry.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[p.relative_to(entry).as_posix()] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    return out


def _stamp(entry: Path) -> Path:
    return entry.with_name(entry.name + ".verified")


def _problem(entry: Path) -> str | None:
    """:func:`verify_entry`'s answer, without hashing when every file's stats equal the stamp written when the
    entry's hashes were last checked; a full check that passes rewrites the stamp."""
    stats = _stats(entry)
    try:
        if json.loads(_stamp(entry).read_text(encoding="utf-8")) == stats:
            return None
    except (OSError, ValueError):
        pass
    problem = verify_entry(entry)
    if problem is None:
        try:
            write_json(_stamp(entry), stats)
        except OSError:  # a read-only cache still loads; it is re-hashed next time
            pass
    return problem


def _discard(entry: Path) -> None:
    aside = entry.with_name(f".{entry.name}.discarded-{uuid.uuid4().hex[:8]}")
    os.rename(entry, aside)
    shutil.rmtree(aside, ignore_errors=True)


def get_or_build(entry: Path, build: Callable[[Path], dict], *, rebuild: bool = False) -> Path:
    """Return ``entry``, building it first (under the lock) if it is missing, corrupted or ``rebuild``.

    ``build(tmp_dir)`` writes the entry's files into ``tmp_dir`` and returns the manifest body; the
    ``files`` hashes and a fresh ``build_id`` are added here.
    """
    if not rebuild and entry.is_dir() and _problem(entry) is None:
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(entry) + ".lock"):
        if entry.is_dir():
            problem = _problem(entry)
            if problem is None and not rebuild:
                return entry  # built by another process while we waited
            if problem is not None:
                warnings.warn(f"cache entry {entry} is corrupted ({problem}); rebuilding it", stacklevel=3)
            _discard(entry)
        for stale in entry.parent.glob(f".{entry.name}.*.building"):  # left by a killed builder
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".building", dir=entry.parent))
        try:
            manifest = build(tmp)
            manifest["files"] = file_hashes(tmp)
            manifest["build_id"] = uuid.uuid4().hex
            write_json(tmp / MANIFEST, manifest)
            os.rename(tmp, entry)
            write_json(_stamp(entry), _stats(entry))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return entry
