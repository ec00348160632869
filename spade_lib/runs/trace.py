"""Token-level traces of speculative decoding runs, stored as Parquet.

One row per *drafted* token, keeping every verifier decision, so acceptance can be re-analysed without re-running a
model. Notation (Leviathan et al. 2023): ``p`` target, ``q`` draft, ``gamma`` a step's draft length, ``x`` the drafted
token.

**Columns** (name, type, group, meaning, formula, the schema version that added each) are defined once, in
:mod:`spade_lib.decoding.records` (:func:`describe` tabulates them); this module gives each its Arrow type (``string``,
``bool``, ``int16``, ``int32``, ``float32``, ``float64``) and persists them. Optional top-k slices (``record_topk = k >
0``): length-``k`` list columns of the adjusted distributions by decreasing probability, ``p_topk_ids`` (list<int32>),
``p_topk_probs`` (list<float32>), ``q_topk_ids``, ``q_topk_probs``.

**Schema versions** (``SCHEMA_VERSION``; bump it when a column is added, removed or changes meaning):

- 1: identity (``prompt_id``, ``category``, ``sample``, ``step``), the block (``pos``, ``abs_pos``, ``gamma``), the
  verifier's decision and the per-position statistics, the step's timings;
- 2: adds a step's draft tree per drafted token: ``node``, ``parent``, ``depth``, ``sibling_rank``; a chain has ``node
  = pos``, ``parent = pos - 1``, ``depth = pos``, ``sibling_rank = 0``, the values (each column's ``fill``) a version-1
  file is read with; every other column keeps its version-1 meaning.

:func:`read_trace` checks every shard (version, columns and types, and that the tree columns form a tree in every step,
:func:`check_tree`) and names the file in every error. Files are plain Parquet (pandas, Polars, DuckDB, Arrow read them
without SPADE); run metadata (pair, suite and its sha256, sampling, policy, seeds, device, dtype, versions, git commit)
is JSON under the key ``spade`` of each file's key-value metadata, and in the run folder's ``metadata.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from spade_lib.decoding import records as registry
from spade_lib.io import atomic_path

SCHEMA_VERSION = 2
METADATA_KEY = b"spade"
SCHEMA_VERSION_KEY = b"spade_schema_version"
SORT_COLUMNS = [*registry.STEP_KEYS, "pos"]
TIMING_COLUMNS = ["t_draft", "t_verify", "t_overhead"]  # measurements; every other column is a deterministic
#                                                         function of seeds and inputs

ARROW_TYPES: dict[str, pa.DataType] = {"string": pa.string(), "bool": pa.bool_(), "int16": pa.int16(),
                                       "int32": pa.int32(), "float32": pa.float32(), "float64": pa.float64()}
TOPK_FIELDS = [
    pa.field("p_topk_ids", pa.list_(pa.int32())),
    pa.field("p_topk_probs", pa.list_(pa.float32())),
    pa.field("q_topk_ids", pa.list_(pa.int32())),
    pa.field("q_topk_probs", pa.list_(pa.float32())),
]
TOPK_COLUMNS = [f.name for f in TOPK_FIELDS]
if (tuple(TOPK_COLUMNS) != registry.TOPK_NAMES or set(registry.DTYPES) != set(ARROW_TYPES)
        or not set(TIMING_COLUMNS) <= set(registry.STEP_COLUMNS)
        or max(c.since for c in registry.columns()) > SCHEMA_VERSION):
    raise RuntimeError("spade_lib.runs.trace and spade_lib.decoding.records disagree on the trace's columns")


def trace_columns() -> list[str]:
    """The trace's columns, in order (the registered columns of :mod:`spade_lib.decoding.records`)."""
    return list(registry.names())


def schema_for(topk: bool = False) -> pa.Schema:
    """The trace schema of the registered columns, with the four top-k list columns appended when ``topk``."""
    fields = [pa.field(c.name, ARROW_TYPES[c.dtype]) for c in registry.columns()] + (TOPK_FIELDS if topk else [])
    return pa.schema(fields, metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()})


def describe() -> pd.DataFrame:
    """The trace's columns as a table: name, Arrow type, group, the schema version that added it, meaning."""
    return pd.DataFrame([{"column": c.name, "type": str(ARROW_TYPES[c.dtype]), "group": c.group, "since": c.since,
                          "meaning": c.meaning} for c in registry.columns()])


def records_to_table(records: Sequence[dict[str, Any]]) -> pa.Table:
    """Columnar Arrow table of ``records`` under :func:`schema_for` (plus top-k columns if present).

    Every record must carry exactly the schema's columns; a missing or unknown column is a
    ``ValueError`` naming it, so a decoder change cannot silently drop or invent data. The tree
    columns must describe a tree in every step (:func:`check_tree`).
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
        table = pa.Table.from_pydict(columns, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"records do not fit the trace schema v{SCHEMA_VERSION}: {e}") from e
    check_tree(table, "records")
    return table


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
    A run with no shards gives an empty frame with the schema's columns. A version-1 shard is read
    with the tree columns filled with their chain values (:func:`conform`). Refused with a
    ``ValueError`` naming the shard: another schema version (or no SPADE version key), columns or
    types other than the schema's, tree columns that describe no tree (:func:`check_tree`), a file
    that is not readable Parquet (corrupt, truncated).
    """
    paths = shard_paths(run_dir_or_paths)
    tables = []
    for p in paths:
        version = check_schema_version(p)
        with _readable("run_dir_or_paths", p):
            table = pq.read_table(p)
        tables.append(conform(table.replace_schema_metadata(None), version, f"run_dir_or_paths: {p}"))
    if not tables:
        return schema_for().empty_table().to_pandas()
    if any(TOPK_COLUMNS[0] in t.column_names for t in tables):
        schema = schema_for(True)
        tables = [t if TOPK_COLUMNS[0] in t.column_names else _add_null_topk(t) for t in tables]
        tables = [t.select(schema.names) for t in tables]
    table = pa.concat_tables(tables)
    df = table.to_pandas()
    return df.sort_values(SORT_COLUMNS, kind="stable").reset_index(drop=True)


def as_frame(trace, columns: Sequence[str] = (), *, arg: str = "trace") -> pd.DataFrame:
    """``trace`` as a DataFrame: a DataFrame as it is, a run directory or shard(s) read with
    :func:`read_trace`; checked to hold ``columns`` (a ValueError naming ``arg`` and the missing ones)."""
    if isinstance(trace, (str, os.PathLike)):
        trace = read_trace(trace)
    if not isinstance(trace, pd.DataFrame):
        raise ValueError(f"{arg} must be a DataFrame or a run directory, got {type(trace).__name__}")
    missing = [c for c in columns if c not in trace.columns]
    if missing:
        raise ValueError(f"{arg} is missing column(s) {missing}; see spade_lib.decoding.records "
                         "(spade_lib.runs.trace.describe())")
    return trace


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


def check_schema_version(path: str | os.PathLike) -> int:
    """A shard's schema version, once it is one this SPADE reads (1 .. :data:`SCHEMA_VERSION`); refuse
    any other, or an unreadable file, naming the file."""
    version = _version(_read_schema(path, "run_dir_or_paths"))
    if version is None or not 1 <= version <= SCHEMA_VERSION:
        found = "no SPADE schema version" if version is None else f"trace schema version {version}"
        raise ValueError(f"run_dir_or_paths: {path} has {found}; this SPADE reads versions 1 to {SCHEMA_VERSION} "
                         "(re-run it, or read it with the SPADE version that wrote it)")
    return version


def conform(table: pa.Table, version: int, where: str) -> pa.Table:
    """``table``, a shard of schema ``version``, under the current schema: the columns added after
    ``version`` are filled from its columns (each column's ``fill``: the tree columns get their chain
    values); then its columns and their types must be the schema's (with or without the top-k columns)
    and its tree columns a tree in every step (:func:`check_tree`). ``where`` (the file) starts every
    error's message."""
    want = schema_for(TOPK_COLUMNS[0] in table.column_names)
    if version < SCHEMA_VERSION:
        cols = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
        for c in registry.columns():
            if c.since <= version or c.name in table.column_names:
                continue
            if c.fill is None:
                raise ValueError(f"{where}: a version-{version} trace has no column {c.name!r}, which cannot be "
                                 "filled (re-run it)")
            try:
                filled = c.fill(cols)
            except KeyError:
                continue  # a column the fill reads is missing: refused below, by name
            filled = np.ascontiguousarray(np.broadcast_to(filled, (table.num_rows,)))
            table = table.append_column(want.field(c.name), pa.array(filled, type=ARROW_TYPES[c.dtype]))
    found = {f.name: f.type for f in table.schema}
    missing = [f.name for f in want if f.name not in found]
    unknown = [n for n in found if n not in want.names]
    mistyped = [f"{f.name} ({found[f.name]}, not {f.type})" for f in want if f.name in found and found[f.name] != f.type]
    if missing or unknown or mistyped:
        raise ValueError(f"{where}: its columns are not the trace schema v{SCHEMA_VERSION}'s: missing {missing}, "
                         f"unknown {unknown}, of another type {mistyped}")
    table = table.select(want.names)
    check_tree(table, where)
    return table


def check_tree(table: pa.Table, where: str) -> None:
    """Refuse tree columns that do not describe one draft tree per step (``STEP_KEYS``): its nodes are
    ``0 .. n-1``, each once; ``-1 <= parent < node``; ``depth = 0`` under the root (``parent = -1``),
    else ``depth(parent) + 1``; the sibling ranks of a parent's children are ``0 .. k-1``, each once.
    ``where`` (the records, or the file) starts the ``ValueError``'s message."""
    n = table.num_rows
    if n == 0:
        return
    get = {name: table.column(name).to_numpy(zero_copy_only=False)
           for name in [*registry.STEP_KEYS, "node", "parent", "depth", "sibling_rank"]}
    step_id = pd.DataFrame({k: get[k] for k in registry.STEP_KEYS}).groupby(
        registry.STEP_KEYS, sort=False).ngroup().to_numpy()
    node, parent, depth, rank = (get[k].astype(np.int64) for k in ("node", "parent", "depth", "sibling_rank"))
    order = np.lexsort((node, step_id))  # by step, then node
    first = np.r_[0, np.flatnonzero(np.diff(step_id[order])) + 1]
    start = np.repeat(first, np.diff(np.r_[first, n]))  # for each sorted row, where its step begins
    node_s, parent_s, depth_s = node[order], parent[order], depth[order]

    def refuse(bad: np.ndarray, rows: np.ndarray, what: str) -> None:
        row = rows[np.flatnonzero(bad)[0]]  # bad[k] is about row rows[k]
        at = ", ".join(f"{k} {getattr(get[k][row], 'item', lambda: get[k][row])()!r}" for k in registry.STEP_KEYS)
        raise ValueError(f"{where}: the tree columns describe no draft tree at {at}, node {node[row]} "
                         f"(parent {parent[row]}, depth {depth[row]}, sibling_rank {rank[row]}): {what}")

    bad = node_s != np.arange(n) - start
    if bad.any():
        refuse(bad, order, "the nodes of a step must be 0 .. n-1, each once")
    bad = (parent_s < -1) | (parent_s >= node_s)
    if bad.any():
        refuse(bad, order, "parent must lie in [-1, node)")
    expected = np.where(parent_s < 0, 0, depth_s[start + np.maximum(parent_s, 0)] + 1)
    bad = depth_s != expected
    if bad.any():
        refuse(bad, order, "depth must be 0 under the root, else depth(parent) + 1")
    by_parent = np.lexsort((rank, parent, step_id))
    key = np.stack([step_id[by_parent], parent[by_parent]])
    first = np.r_[0, np.flatnonzero((np.diff(key, axis=1) != 0).any(axis=0)) + 1]
    within = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
    bad = rank[by_parent] != within
    if bad.any():
        refuse(bad, by_parent, "the sibling ranks of a parent's children must be 0 .. k-1, each once")


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
