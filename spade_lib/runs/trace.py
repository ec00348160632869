"""Token-level traces of speculative decoding runs, stored as Parquet.

One row per *drafted* token: every decision the verifier made is kept, so acceptance can be
re-analysed later without re-running a model. Notation follows Leviathan et al. (2023): ``p`` is the
target distribution, ``q`` the draft's, ``gamma`` the draft length of a step, ``x`` the drafted token.
All probabilities are of the *adjusted* (temperature / top-k / top-p warped) distributions unless the
column ends in ``_raw`` (temperature 1, no truncation).

Schema version ``SCHEMA_VERSION`` (bump it when a column is added, removed or changes meaning):

================  =========  ===================================================================
column            type       meaning (formula)
================  =========  ===================================================================
``prompt_id``     string     suite ``question_id`` (as a string)
``category``      string     suite category
``sample``        int32      repeat index of this prompt; the generation seed is derived from
                             (run seed, prompt_id, sample)
``step``          int32      verification step within the generation, 0-based
``pos``           int16      draft position ``i`` in the block, 0-based
``abs_pos``       int32      index of ``x`` in the generated continuation
                             (tokens emitted before the step + ``pos``)
``gamma``         int16      tokens drafted in this step
``draft_token``   int32      drafted token ``x``
``p_x``           float32    ``p(x)`` under the adjusted target distribution
``q_x``           float32    ``q(x)`` under the adjusted draft distribution
``accept_prob``   float32    the rule's accept probability ``a(x)`` (``spade_lib.rules``):
                             ``min(1, p(x) / q(x))`` for ``exact``
``uniform``       float32    the uniform ``r`` drawn for this position; accepted iff
                             ``r < accept_prob`` (NaN in deterministic modes)
``reached``       bool       all positions ``< pos`` of the block were accepted, so ``x`` was judged
``accepted``      bool       ``reached`` and accepted
``n_accepted``    int16      accepted draft tokens in this step (step-level, repeated per row)
``next_token``    int32      residual sample ``~ norm(max(0, p - q))`` at the first rejection, or
                             the bonus token ``~ p`` after ``gamma`` acceptances (step-level)
``h_p``, ``h_q``  float32    entropies ``-sum p log p`` (nats) of adjusted ``p`` and ``q``
``tv``            float32    ``TV(p, q) = 1/2 sum |p - q|``; ``1 - tv`` is the expected acceptance
                             of a reached position
``kl``            float32    ``KL(p || q) = sum p log(p / q)`` (nats)
``p_top1``        int32      argmax of the target's raw logits
``p_margin``      float32    target top-1 minus top-2 probability at temperature 1
``q_top_prob``    float32    the draft's max probability at temperature 1 (a policy signal)
``p_x_raw``,      float32    ``p(x)``, ``q(x)``, ``H(p)``, ``H(q)``, ``TV(p, q)`` at temperature 1
``q_x_raw``,                 without top-k / top-p
``h_p_raw``,
``h_q_raw``,
``tv_raw``
``t_draft``,      float64    seconds spent drafting / verifying / in the rest of the step
``t_verify``,                (step-level, repeated per row). Measurements: they differ run to run,
``t_overhead``               every other column is a deterministic function of seeds and inputs.
================  =========  ===================================================================

Optional top-k slices (a run with ``record_topk = k > 0``), list columns of length ``k`` sorted by
decreasing probability, of the adjusted distributions: ``p_topk_ids`` (list<int32>),
``p_topk_probs`` (list<float32>), ``q_topk_ids``, ``q_topk_probs``.

Files are plain Parquet: pandas, Polars, DuckDB or Arrow read them without SPADE. Run metadata (pair,
suite and its sha256, sampling, policy, seeds, device, dtype, versions, git commit) is stored as JSON
under the key ``spade`` of each file's key-value metadata, and in ``metadata.json`` of a run folder.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from spade_lib.decoding.records import BOOL_STATS, INT_STATS, POSITION_STATS, RECORD_COLUMNS, ROW_KEYS, STEP_KEYS
from spade_lib.io import atomic_path

SCHEMA_VERSION = 1
METADATA_KEY = b"spade"
SCHEMA_VERSION_KEY = b"spade_schema_version"
SORT_COLUMNS = [*STEP_KEYS, "pos"]

# Identity of a row, then the verifier's decision, then diagnostics, then timings.
TRACE_SCHEMA = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("category", pa.string()),
        ("sample", pa.int32()),
        ("step", pa.int32()),
        ("pos", pa.int16()),
        ("abs_pos", pa.int32()),
        ("gamma", pa.int16()),
        ("draft_token", pa.int32()),
        ("p_x", pa.float32()),
        ("q_x", pa.float32()),
        ("accept_prob", pa.float32()),
        ("uniform", pa.float32()),
        ("reached", pa.bool_()),
        ("accepted", pa.bool_()),
        ("n_accepted", pa.int16()),
        ("next_token", pa.int32()),
        ("h_p", pa.float32()),
        ("h_q", pa.float32()),
        ("tv", pa.float32()),
        ("kl", pa.float32()),
        ("p_top1", pa.int32()),
        ("p_margin", pa.float32()),
        ("q_top_prob", pa.float32()),
        ("p_x_raw", pa.float32()),
        ("q_x_raw", pa.float32()),
        ("h_p_raw", pa.float32()),
        ("h_q_raw", pa.float32()),
        ("tv_raw", pa.float32()),
        ("t_draft", pa.float64()),
        ("t_verify", pa.float64()),
        ("t_overhead", pa.float64()),
    ],
    metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()},
)
# The column names and their groups are the decoder's (spade_lib.decoding.records); the types are here.
if (TRACE_SCHEMA.names != [*ROW_KEYS, *RECORD_COLUMNS]
        or {n for n in POSITION_STATS if pa.types.is_integer(TRACE_SCHEMA.field(n).type)} != INT_STATS
        or {n for n in POSITION_STATS if pa.types.is_boolean(TRACE_SCHEMA.field(n).type)} != BOOL_STATS):
    raise RuntimeError("TRACE_SCHEMA and spade_lib.decoding.records disagree on the trace's columns or their kinds")

TOPK_FIELDS = [
    pa.field("p_topk_ids", pa.list_(pa.int32())),
    pa.field("p_topk_probs", pa.list_(pa.float32())),
    pa.field("q_topk_ids", pa.list_(pa.int32())),
    pa.field("q_topk_probs", pa.list_(pa.float32())),
]
TIMING_COLUMNS = ["t_draft", "t_verify", "t_overhead"]
TRACE_COLUMNS = TRACE_SCHEMA.names
TOPK_COLUMNS = [f.name for f in TOPK_FIELDS]


def schema_for(topk: bool = False) -> pa.Schema:
    """The trace schema, with the four top-k list columns appended when ``topk``."""
    if not topk:
        return TRACE_SCHEMA
    schema = TRACE_SCHEMA
    for f in TOPK_FIELDS:
        schema = schema.append(f)
    return schema.with_metadata(TRACE_SCHEMA.metadata)


def records_to_table(records: Sequence[dict[str, Any]]) -> pa.Table:
    """Columnar Arrow table of ``records`` under :data:`TRACE_SCHEMA` (plus top-k columns if present).

    Every record must carry exactly the schema's columns; a missing or unknown column is a
    ``ValueError`` naming it, so a decoder change cannot silently drop or invent data.
    """
    has_topk = bool(records) and TOPK_COLUMNS[0] in records[0]
    schema = schema_for(has_topk)
    expected = set(schema.names)
    for i, r in enumerate(records):
        keys = set(r)
        if keys != expected:
            missing, extra = sorted(expected - keys), sorted(keys - expected)
            raise ValueError(
                f"records[{i}] does not match the trace schema v{SCHEMA_VERSION}: "
                f"missing columns {missing}, unknown columns {extra}"
            )
    columns = {name: [r[name] for r in records] for name in schema.names}
    try:
        return pa.Table.from_pydict(columns, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"records do not fit the trace schema v{SCHEMA_VERSION}: {e}") from e


def write_shard(records: Sequence[dict[str, Any]], path: str | os.PathLike, metadata: dict) -> Path:
    """Write ``records`` as one Parquet file at ``path``, atomically (temp file + rename).

    ``metadata`` (JSON-serialisable) goes into the file's key-value metadata under ``spade``; the
    schema version under ``spade_schema_version``. An empty ``records`` writes a valid empty shard
    (a generation that drafted nothing still marks its prompt as done).
    """
    path = Path(path)
    if path.suffix != ".parquet":
        raise ValueError(f"path must end in .parquet, got {path}")
    table = records_to_table(records)
    try:
        meta_json = json.dumps(metadata, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ValueError(f"metadata must be JSON-serialisable: {e}") from e
    kv = dict(table.schema.metadata or {})
    kv[METADATA_KEY] = meta_json.encode()
    kv[SCHEMA_VERSION_KEY] = str(SCHEMA_VERSION).encode()
    table = table.replace_schema_metadata(kv)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    return path


def shard_paths(run_dir_or_paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Finished shards of a run: ``<run_dir>/trace/*.parquet`` (or ``<dir>/*.parquet``), sorted.

    Temporary files of an interrupted write (hidden, ``.``-prefixed) are never included.
    """
    if isinstance(run_dir_or_paths, (str, os.PathLike)):
        p = Path(run_dir_or_paths)
        if p.is_file():
            return [p]
        if not p.is_dir():
            raise FileNotFoundError(f"run_dir_or_paths: no such file or folder: {p}")
        folder = p / "trace" if (p / "trace").is_dir() else p
        return sorted(q for q in folder.glob("*.parquet") if not q.name.startswith("."))
    return [Path(q) for q in run_dir_or_paths]


def read_trace(run_dir_or_paths: str | os.PathLike | Iterable[str | os.PathLike]) -> pd.DataFrame:
    """All shards of a run concatenated, sorted by (prompt_id, sample, step, pos), fresh index.

    Columns keep their Arrow types mapped to numpy dtypes (int16 stays int16, bool stays bool).
    A run with no shards gives an empty frame with the schema's columns. A shard written under
    another schema version (or without SPADE's version key), or that is not readable Parquet (corrupt,
    truncated), is refused with a ``ValueError`` naming it.
    """
    paths = shard_paths(run_dir_or_paths)
    tables = []
    for p in paths:
        check_schema_version(p)
        with _readable("run_dir_or_paths", p):
            tables.append(pq.read_table(p))
    tables = [t.replace_schema_metadata(None) for t in tables]
    if not tables:
        return TRACE_SCHEMA.empty_table().to_pandas()
    if any(TOPK_COLUMNS[0] in t.column_names for t in tables):
        schema = schema_for(True)
        tables = [t if TOPK_COLUMNS[0] in t.column_names else _add_null_topk(t) for t in tables]
        tables = [t.select(schema.names) for t in tables]
    table = pa.concat_tables(tables)
    df = table.to_pandas()
    return df.sort_values(SORT_COLUMNS, kind="stable").reset_index(drop=True)


@contextlib.contextmanager
def _readable(name: str, path: str | os.PathLike) -> Iterator[None]:
    """Turn pyarrow's error on an unreadable file (which does not name it) into a ``ValueError`` that
    does, pyarrow's as its cause; a missing file stays a ``FileNotFoundError``."""
    try:
        yield
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{name}: {path} is not a readable Parquet trace shard (corrupt or truncated?): {e}") from e


def _read_schema(path: str | os.PathLike, name: str = "path") -> pa.Schema:
    with _readable(name, path):
        return pq.read_schema(path)


def _version(schema: pa.Schema) -> int | None:
    raw = (schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def schema_version_of(path: str | os.PathLike) -> int | None:
    """The trace schema version stored in a shard's key-value metadata (None if it has none)."""
    return _version(_read_schema(path))


def check_schema_version(path: str | os.PathLike) -> None:
    """Refuse a shard whose schema version is not :data:`SCHEMA_VERSION`, or that is unreadable (naming the file)."""
    version = _version(_read_schema(path, "run_dir_or_paths"))
    if version != SCHEMA_VERSION:
        found = "no SPADE schema version" if version is None else f"trace schema version {version}"
        raise ValueError(f"run_dir_or_paths: {path} has {found}; this SPADE reads version {SCHEMA_VERSION} "
                         "(re-run it, or read it with the SPADE version that wrote it)")


def _add_null_topk(table: pa.Table) -> pa.Table:
    for f in TOPK_FIELDS:
        table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table


def read_shard_metadata(path: str | os.PathLike) -> dict:
    """The ``spade`` key-value metadata of one shard, as a dict."""
    kv = _read_schema(path).metadata or {}
    if METADATA_KEY not in kv:
        raise KeyError(f"{path} has no SPADE metadata (key {METADATA_KEY!r})")
    try:
        return json.loads(kv[METADATA_KEY])
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"path: {path} has unreadable SPADE metadata ({e})") from e


def read_metadata(run_dir: str | os.PathLike) -> dict:
    """Run metadata: ``<run_dir>/metadata.json`` if present, else the first shard's metadata."""
    p = Path(run_dir)
    if p.is_file() and p.suffix == ".parquet":
        return read_shard_metadata(p)
    if (p / "metadata.json").is_file():
        return json.loads((p / "metadata.json").read_text(encoding="utf-8"))
    shards = shard_paths(p)
    if not shards:
        raise FileNotFoundError(f"run_dir: no metadata.json and no shards in {p}")
    return read_shard_metadata(shards[0])
