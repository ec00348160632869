"""Run folders: where a run lives, what makes it the same run, its shards' state, its summary.

Under ``run_dir_for(pair.name, suite_key(suite), config)``::

    <run_dir>/metadata.json          the run: pair, suite (+ sha256), config, environment, schema
    <run_dir>/trace/<id>.parquet     one shard per prompt: its token-level trace (spade_lib.runs.trace),
                                     with the prompt's summary rows and the run's identity (config
                                     hash, schema version) in the file's metadata; ``<id>`` is
                                     ``validate.safe_name(question_id)`` (:func:`shard_path`)
    <run_dir>/trace/<id>.lock        the shard's lock; ``<run_dir>/.meta.lock`` guards metadata.json
    <run_dir>/summary.jsonl          one row per generation (:func:`summary_row`), Spec-Bench's answer
                                     shape plus SPADE's: question_id, category, sample, seed, new_tokens,
                                     wall_time, accept_lengths, wall_times, n_steps, prompt_tokens,
                                     stop_reason, output_ids, text

**One run per folder.** :func:`run_identity` is what makes two runs the same run (config hash, schema
version, pair, suite). :func:`check_existing` refuses a folder whose ``metadata.json`` -- or, if that
file was deleted, any shard -- describes another run; :func:`shard_done` says whether a shard on disk
is a finished shard of this run (an unreadable or partial one is redone). Shards are written
atomically, so a shard on disk is complete; ``summary.jsonl`` is rebuilt from the shards
(:func:`write_summary`), never appended to. :func:`file_lock` is the lock every writer takes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from spade_lib import paths
from spade_lib.decoding.drafts.drafters import drafter_kind
from spade_lib.io import write_text
from spade_lib.runs import timing, trace
from spade_lib.runs.config import RunConfig
from spade_lib.runs.methods import Generation
from spade_lib.validate import safe_name

META_LOCK = ".meta.lock"


def run_dir_for(pair_name: str, suite_name: str, config: RunConfig) -> Path:
    """``RUNS_DIR/traces/<pair>/<suite>/<label>-<config hash>``: where a run of ``config`` lives.

    A ``/`` in a name (a hub id such as ``Qwen/Qwen2.5-7B``) becomes ``--``, as in the HF cache."""
    parts = []
    for arg, v in (("pair_name", pair_name), ("suite_name", suite_name)):
        if not isinstance(v, str) or not v.strip("/") or v.startswith(".") or ".." in v.split("/"):
            raise ValueError(f"{arg} must be a non-empty name, got {v!r}")
        parts.append(v.strip("/").replace("/", "--"))
    return paths.RUNS_DIR / "traces" / parts[0] / parts[1] / f"{config.label}-{config.hash}"


def suite_key(suite) -> str:
    """``<suite name>-<first 8 hex of its sha256>``: a folder name that changes when the prompts do
    (a filtered sub-suite keeps its parent's name but not its hash)."""
    return f"{suite.name}-{suite.sha256[:8]}"


def run_identity(pair, suite, config: RunConfig) -> dict[str, Any]:
    """The facts that make two runs the same run (checked on resume; stored in every shard). The pair's
    feature heads (by build) are among them only for a run a head drafts (``config.draft`` a registered
    drafter whose declared kind reads the target's features, :func:`~spade_lib.decoding.drafts.drafters.drafter_kind`,
    or one of the pair's heads by name): an autoregressive or draft-model run is the same run whether or not
    heads are attached to the pair."""
    manifest = getattr(pair, "manifest", {}) or {}
    heads = manifest.get("heads") or {}
    registered = drafter_kind(config.draft)  # None: not a registered drafter (a draft or head of the pair)
    drafted_by_head = registered.head if registered is not None else config.draft in heads
    return {
        "schema_version": trace.SCHEMA_VERSION,
        "pair": {"name": pair.name, "sha256": manifest.get("sha256") or manifest.get("hash"),
                 "kind": manifest.get("kind", "embedded"),
                 # which heads (by build; a real pair's by folder): a make- and a long-profile head are two runs
                 **({"heads": {n: h.get("build_id") if isinstance(h, dict) else h for n, h in heads.items()}}
                    if heads and drafted_by_head else {})},
        "suite": {"name": suite.name, "sha256": suite.sha256, "n_prompts": len(suite.rows)},
        "config": config.to_dict(),
        "config_hash": config.hash,
    }


def summary_row(row: dict, sample: int, seed: int, ids: list[int], gen: Generation, t: timing.Timing) -> dict:
    return {
        "question_id": row["question_id"], "category": row["category"], "sample": sample, "seed": seed,
        "new_tokens": len(gen.output_ids), "wall_time": t.median, "wall_times": list(t.times),
        "accept_lengths": gen.accept_lengths, "n_steps": len(gen.accept_lengths),
        "prompt_tokens": len(ids), "stop_reason": gen.stop_reason, "output_ids": gen.output_ids,
        "text": gen.text,
        # the prompt's prefill, inside wall_time (the last timed pass's; None where the method hides it)
        "prefill_time": gen.prefill if math.isfinite(gen.prefill) else None,
    }


def clean_temporaries(folder: Path, stems: set[str] | None = None) -> None:
    """Delete temporary files that interrupted writes left (``.<stem>.<random>.parquet`` from
    ``io.atomic_path``, ``.<name>.<random>.tmp`` from ``io.atomic_write``). A temporary is deleted
    only while its shard's lock is free: another process writing that shard now keeps its file. With
    ``stems``, only the temporaries of those shards (a rank's own share) are considered."""
    for p in [*folder.glob(".*.tmp"), *folder.glob(".*.parquet")]:
        stem = p.name[1:].rsplit(".", 2)[0]
        stem = stem[: -len(".parquet")] if stem.endswith(".parquet") else stem
        if stems is not None and stem not in stems:
            continue
        lock = file_lock(folder / f"{stem}.lock", timeout=0)
        try:
            lock.acquire()
        except TimeoutError:
            continue
        try:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        finally:
            lock.release()


def shard_path(run_dir: str | os.PathLike, question_id: Any) -> Path:
    """``<run_dir>/trace/<safe_name(question_id)>.parquet``: a question id from the data never chooses
    a path outside the run folder (``validate.safe_name``)."""
    return Path(run_dir) / "trace" / f"{safe_name(question_id)}.parquet"


def _identity_diff(found: dict, identity: dict) -> list[str]:
    """The identity keys (schema_version, pair, suite, config, config_hash) on which ``found`` differs."""
    return [k for k in identity if found.get(k) != identity[k]]


def shard_done(path: Path, identity: dict) -> bool:
    """Whether ``path`` is a finished shard of *this* run. An unreadable or partial file, or one whose
    columns are not those of ``trace.schema_for`` for its (this run's) schema version, is redone
    (False); a readable shard of another run (other config hash, schema version, pair or suite) is
    refused with a ``ValueError`` naming it, so one folder never mixes two configurations."""
    if not path.is_file():
        return False
    try:
        schema = pq.read_schema(path)
        meta = trace.read_shard_metadata(path)
    except Exception:  # unreadable: redo it
        return False
    diff = _identity_diff(meta, identity)
    if diff:
        raise ValueError(f"run_dir: shard {path} belongs to another run (differs in {diff}: config_hash "
                         f"{meta.get('config_hash')!r} vs {identity['config_hash']!r}, schema_version "
                         f"{meta.get('schema_version')!r} vs {identity['schema_version']!r}); "
                         "choose another run_dir or delete that shard")
    want = trace.schema_for(trace.TOPK_COLUMNS[0] in schema.names)
    return schema.remove_metadata().equals(want.remove_metadata())  # other columns or types: redo it


def check_existing(run_dir: Path, identity: dict) -> None:
    """Refuse ``run_dir`` if its ``metadata.json`` or, when that file is gone, any of its shards
    describes another run."""
    meta_path = run_dir / "metadata.json"
    if meta_path.is_file():
        try:
            old = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"run_dir: {meta_path} is not valid JSON ({e}); delete it or choose another run_dir") from e
        mismatched = _identity_diff(old, identity) if isinstance(old, dict) else ["metadata.json is not a mapping"]
        if mismatched:
            raise ValueError(f"run_dir: {run_dir} holds a different run (differs in {mismatched}); "
                             "choose another run_dir or delete it")
    if (run_dir / "trace").is_dir():
        for shard in trace.shard_paths(run_dir):
            shard_done(shard, identity)


def file_lock(path: Path, timeout: float = -1):
    """A ``filelock`` lock file (released by the OS if the process dies, ``kill -9`` included)."""
    from filelock import FileLock

    return FileLock(str(path), timeout=timeout)


def write_summary(run_dir: str | os.PathLike, suite=None) -> Path:
    """Rebuild ``summary.jsonl`` from the shards' metadata (suite order when ``suite`` is given)."""
    run_dir = Path(run_dir)
    rows = []
    for shard in trace.shard_paths(run_dir):
        rows.extend(trace.read_shard_metadata(shard).get("summary", []))
    if suite is not None:
        order = {r["question_id"]: i for i, r in enumerate(suite.rows)}
        rows.sort(key=lambda s: (order.get(s["question_id"], len(order)), s["sample"]))
    text = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)
    return write_text(run_dir / "summary.jsonl", text)


def read_summary(run_dir: str | os.PathLike):
    """``summary.jsonl`` of a run as a pandas DataFrame (one row per generation)."""
    import pandas as pd

    path = Path(run_dir) / "summary.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"run_dir: no summary.jsonl in {run_dir} (run not finished?)")
    return pd.read_json(path, lines=True, dtype=False)


def list_runs(root: str | os.PathLike | None = None):
    """Every finished run under ``RUNS_DIR/traces`` (or ``root``): one row per run with its folder,
    pair, suite, config fields and config hash — for notebooks that analyse earlier runs."""
    import pandas as pd

    root = Path(root) if root is not None else paths.RUNS_DIR / "traces"
    out = []
    for meta in sorted(root.glob("**/metadata.json")):
        m = json.loads(meta.read_text(encoding="utf-8"))
        if not (meta.parent / "summary.jsonl").is_file():
            continue
        out.append({"run_dir": str(meta.parent), "pair": m["pair"]["name"], "suite": m["suite"]["name"],
                    "suite_sha256": m["suite"]["sha256"], "config_hash": m["config_hash"], **m["config"]})
    return pd.DataFrame(out)
