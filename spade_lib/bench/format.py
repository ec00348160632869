"""The suite format: Spec-Bench-compatible JSONL rows plus a hashed manifest.

A suite is one JSON object per line, shaped like Spec-Bench's ``question.jsonl`` (Xia et al. 2024), which Spec-Bench
tooling reads unchanged (it ignores SPADE's extra keys)::

    {"question_id": 81, "category": "writing", "turns": ["first user turn", "second turn"]}

============  =======  ==================================================================
field         type     meaning
============  =======  ==================================================================
question_id   int      unique within the suite (Spec-Bench's own ids are kept as they are)
category      str      fine category, e.g. ``writing`` or ``code_completion``
turns         [str]    user turns; multi-turn prompts keep every turn
source        str      name of the source the prompt came from (``spec_bench``, ``embedded``)
source_id     str      the prompt's id inside that source (file:line, dataset row, ...)
subtask       str      coarse task; Spec-Bench's 8 MT-bench categories share ``mt_bench``
n_tokens      int      tokens of the first turn under the manifest's tokenizer (null: none)
length_tier   str      ``short`` / ``medium`` / ``long`` by ``n_tokens`` (null: no tokenizer)
reference     [str]    optional: a reference answer / the held-out continuation, per turn
============  =======  ==================================================================

The manifest ``<stem>.manifest.json`` (beside ``<stem>.jsonl``): suite name and format version, the spec it was built
from, seed, each source's license, counts per category, token-length statistics, tokenizer, software versions and the
``sha256`` of the JSONL bytes, which :func:`load_suite` recomputes (a changed file is refused). Serialisation is
canonical (``json.dumps(row, sort_keys=True, ensure_ascii=False)``, ``\\n`` line ends): equal suites are equal bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spade_lib.io import write_bytes, write_json

FORMAT_VERSION = 1
REQUIRED_FIELDS = ("question_id", "category", "turns")  # Spec-Bench's own fields
SPADE_FIELDS = ("source", "source_id", "subtask", "n_tokens", "length_tier")
OPTIONAL_FIELDS = ("reference",)
LENGTH_TIERS = ("short", "medium", "long")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_path(path: str | os.PathLike) -> Path:
    """``data/x.jsonl`` -> ``data/x.manifest.json``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.manifest.json")


def validate_row(row: Any, where: str, spade: bool = True) -> dict:
    """Check one row's fields and types; ``where`` (file:line) goes into every error message."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    needed = REQUIRED_FIELDS + (SPADE_FIELDS if spade else ())
    missing = [k for k in needed if k not in row]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}; a row needs {list(needed)}")
    qid = row["question_id"]
    if not isinstance(qid, int) or isinstance(qid, bool):
        raise ValueError(f"{where}: question_id must be an int, got {qid!r}")
    if not isinstance(row["category"], str) or not row["category"]:
        raise ValueError(f"{where}: category must be a non-empty string, got {row['category']!r}")
    turns = row["turns"]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise ValueError(f"{where}: turns must be a non-empty list of strings, got {turns!r:.80}")
    if not turns[0].strip():
        raise ValueError(f"{where}: the first turn is empty")
    if spade:
        n = row["n_tokens"]
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
            raise ValueError(f"{where}: n_tokens must be a non-negative int or null, got {n!r}")
        if row["length_tier"] not in LENGTH_TIERS + (None,):
            raise ValueError(f"{where}: length_tier must be one of {LENGTH_TIERS} or null, "
                             f"got {row['length_tier']!r}")
    return row


def read_jsonl(path: str | os.PathLike, spade: bool = True) -> list[dict]:
    """Read and validate a JSONL file; a bad line raises ``ValueError`` naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"suite file not found: {path}")
    rows = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column "
                                 f"{e.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
            rows.append(validate_row(row, f"{path}:{lineno}", spade=spade))
    if not rows:
        raise ValueError(f"{path}: the file holds no rows")
    ids = [r["question_id"] for r in rows]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise ValueError(f"{path}: duplicate question_id(s) {dup}")
    return rows


def dumps_rows(rows: list[dict]) -> bytes:
    """Canonical JSONL bytes of ``rows``."""
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


@dataclass
class Suite:
    """A benchmark suite: ``rows`` (see the module docstring) and the ``manifest`` describing them."""

    name: str
    rows: list[dict]
    manifest: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def categories(self) -> list[str]:
        """Categories in order of first appearance."""
        return list(dict.fromkeys(r["category"] for r in self.rows))

    @property
    def sha256(self) -> str:
        return sha256_bytes(dumps_rows(self.rows))

    def to_jsonl(self) -> bytes:
        return dumps_rows(self.rows)

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``path`` (JSONL) and ``<stem>.manifest.json`` atomically; return ``path``."""
        path = Path(path)
        if path.suffix != ".jsonl":
            raise ValueError(f"path must end in .jsonl, got {path}")
        data = self.to_jsonl()
        manifest = {**self.manifest, "name": self.name, "file": path.name,
                    "n_prompts": len(self.rows), "sha256": sha256_bytes(data)}
        write_bytes(path, data)
        write_json(manifest_path(path), manifest)
        self.manifest = manifest
        return path

    def to_frame(self):
        """One row per prompt: the row fields plus ``prompt`` (the first turn) and ``n_turns``."""
        import pandas as pd

        cols = list(REQUIRED_FIELDS) + ["subtask", "source", "source_id", "n_tokens", "length_tier"]
        df = pd.DataFrame([{k: r.get(k) for k in cols} for r in self.rows], columns=cols)
        df["prompt"] = [r["turns"][0] for r in self.rows]
        df["n_turns"] = [len(r["turns"]) for r in self.rows]
        return df

    def filter(self, categories: list[str] | None = None, n_per_category: int | None = None) -> "Suite":
        """A sub-suite (rows kept in order) whose manifest notes what it was cut from."""
        known = self.categories
        if categories is not None:
            unknown = [c for c in categories if c not in known]
            if unknown:
                raise ValueError(f"categories: unknown {unknown}; this suite has {known}")
        keep, seen = [], {}
        for r in self.rows:
            c = r["category"]
            if categories is not None and c not in categories:
                continue
            if n_per_category is not None and seen.get(c, 0) >= n_per_category:
                continue
            seen[c] = seen.get(c, 0) + 1
            keep.append(r)
        manifest = {**self.manifest, "subset_of": {"name": self.name, "sha256": self.manifest.get("sha256"),
                                                   "categories": categories, "n_per_category": n_per_category}}
        return Suite(self.name, keep, manifest)


def load_suite(path: str | os.PathLike, verify: bool = True) -> Suite:
    """Load a suite saved by :meth:`Suite.save`, refusing it if its bytes no longer match the manifest."""
    path = Path(path)
    mpath = manifest_path(path)
    if not mpath.is_file():
        raise FileNotFoundError(f"manifest not found beside the suite: {mpath}")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{mpath}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{mpath}: not valid UTF-8 (byte at offset {e.start})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{mpath}: a manifest must be a JSON object, got a JSON {type(manifest).__name__}")
    if not path.is_file():
        raise FileNotFoundError(f"suite file not found: {path}")
    if verify:
        actual = sha256_bytes(path.read_bytes())
        if actual != manifest.get("sha256"):
            raise ValueError(f"{path}: sha256 {actual[:12]}… does not match the manifest's "
                             f"{str(manifest.get('sha256'))[:12]}…; the file was modified after it was "
                             f"built — rebuild it or restore the original")
    rows = read_jsonl(path)
    return Suite(manifest.get("name", path.stem), rows, manifest)
