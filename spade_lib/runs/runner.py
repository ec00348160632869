"""The suite loop: run one config of a draft/target pair over a suite, one Parquet shard per prompt.

``run_suite(pair, suite, config)`` decodes the first turn of every suite prompt ``n_samples`` times with the method
``config.method`` (:mod:`spade_lib.runs.methods`) and writes the run folder
``run_dir_for(pair.name, suite_key(suite), config)`` (its layout: :mod:`spade_lib.runs.store`).

**Resumable.** A shard is written atomically (temp file + rename) only once its prompt is finished, so a shard on disk
is complete and a re-run with ``resume=True`` skips it; ``summary.jsonl`` is rebuilt from the shards at the end, never
appended to. Every generation is seeded from ``(config.seed, question_id, sample)`` alone
(:func:`spade_lib.runs.config.generation_seed`), so a run killed at any point (``kill -9`` included) and resumed ends
with the same trace as an uninterrupted one — every column except the timing columns ``t_draft``, ``t_verify``,
``t_overhead`` (and the summary's ``wall_time``), which are measurements.

**Sharded.** ``run_suite(..., rank=r, world_size=W)`` decodes only the prompts ``rows[r::W]`` (a disjoint share; the
shards do not depend on who wrote them). Rank 0 alone writes ``metadata.json``; with ``W > 1`` nobody writes
``summary.jsonl`` here: the launcher merges once every rank is done (``spade_lib.runs.launch.merge_run``). The command
line is ``python -m spade_lib.runs.cli --config run.yaml --out DIR`` (under ``torchrun`` or ``accelerate launch`` for
several processes; ``spade_lib.runs.cli``).

**One run per folder.** Every check comes before anything is written (a refused run leaves its folder as it was, or
absent): the pair's placement, its drafts (:func:`spade_lib.decoding.drafts.drafters.check_draft`), and resuming into a folder
whose ``metadata.json`` -- or, if that file was deleted, any shard -- describes another run (config hash, schema
version, pair, suite) is refused (:func:`spade_lib.runs.store.check_existing`). Concurrent processes on one folder (or
ranks) share the work: each shard is computed under its ``filelock`` lock by whichever process takes it first, never
twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spade_lib import paths
from spade_lib.decoding.drafts import crossvocab  # noqa: F401 (registers the cross-vocabulary drafters check_draft resolves)
from spade_lib.decoding.baselines import assistant_model
from spade_lib.decoding.drafts.drafters import check_draft
from spade_lib.io import write_json
from spade_lib.runs import timing, trace
from spade_lib.runs.config import RunConfig, check_pair_placement, generation_seed, prompt_ids
from spade_lib.runs.methods import Generator, make_generator, timed_generation
from spade_lib.runs.store import (META_LOCK, check_existing, clean_temporaries, file_lock, run_dir_for, run_identity,
                                  shard_done, shard_path, suite_key, summary_row, write_summary)
from spade_lib.validate import ArgumentTypeError, check_int, safe_name


def run_suite(pair, suite, config: RunConfig, run_dir: str | os.PathLike | None = None, *,
              resume: bool = True, progress: bool = True,
              on_shard: Callable[[Path], None] | None = None, rank: int = 0, world_size: int = 1) -> Path:
    """Run ``config`` on every prompt of ``suite``; return the run folder (see the module docstring).

    ``resume=False`` deletes nothing but re-runs (and overwrites) every shard. ``on_shard(path)`` is
    called after each shard is written (progress hooks, tests). ``rank``/``world_size``: this process
    takes the prompts ``rows[rank::world_size]``; only rank 0 writes ``metadata.json``, and only a
    one-process run (``world_size == 1``) writes ``summary.jsonl`` (see "Sharded" above).
    """
    if not isinstance(config, RunConfig):
        raise ArgumentTypeError(f"config: must be a RunConfig, got {type(config).__name__}")
    check_int("world_size", world_size, min=1)
    check_int("rank", rank, min=0, max=world_size - 1)
    if not suite.rows:
        raise ValueError(f"suite: {suite.name!r} has no prompts")
    names: dict[str, Any] = {}
    for row in suite.rows:  # two ids with one file name would share a shard
        name = safe_name(row["question_id"])
        if names.setdefault(name, row["question_id"]) != row["question_id"]:
            raise ValueError(f"suite: question_ids {names[name]!r} and {row['question_id']!r} map to one shard name")
    # every check before anything is written: a refused run leaves its folder as it was (or absent)
    device = check_pair_placement(pair, config)
    if config.method == "spade":  # all that make_drafter would refuse by name, tree and options
        check_draft(pair, config.draft, **config.draft_kwargs())
    elif config.method == "hf_assisted":  # a draft model of the pair (never a head or a model-free drafter)
        assistant_model(pair, config.draft)
    run_dir = Path(run_dir) if run_dir is not None else run_dir_for(pair.name, suite_key(suite), config)
    identity = run_identity(pair, suite, config)
    meta_path = run_dir / "metadata.json"
    if run_dir.is_dir():  # refuse a folder of another run
        check_existing(run_dir, identity)
    trace_dir = paths.ensure_dir(run_dir / "trace")
    share = suite.rows[rank::world_size]

    with file_lock(run_dir / META_LOCK):
        check_existing(run_dir, identity)
        clean_temporaries(trace_dir, None if world_size == 1 else {safe_name(r["question_id"]) for r in share})
        sessions = []
        if meta_path.is_file():
            sessions = json.loads(meta_path.read_text(encoding="utf-8")).get("sessions", [])
        if config.threads:
            timing.fix_threads(config.threads)
        env = timing.environment_fingerprint(device)
        sessions.append({"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "environment": env,
                         "world_size": world_size, "linear_kernels": timing.kernel_plans(),
                         "prepared": getattr(pair, "prepared", [])})
        if rank == 0:
            write_json(meta_path, {**identity, "environment": env, "sessions": sessions,
                                   "sampling": dataclasses.asdict(config.sampling()),
                                   "policy": repr(config.make_policy()) if config.method == "spade" else None,
                                   "device": str(device), "dtype": config.dtype,
                                   "seeds": "generation_seed(config.seed, question_id, sample) = "
                                            "sha256('seed:question_id:sample')[:8] little-endian >> 1"})

    rows = suite.rows
    todo = [r for r in share if not (resume and shard_done(shard_path(run_dir, r["question_id"]), identity))]
    state: dict[str, Generator] = {}

    def generator() -> Generator:  # built (and warmed up) only once this process computes a shard
        if "g" not in state:
            state["g"] = make_generator(pair, config)
            first = prompt_ids(pair.tokenizer, rows[0]["turns"][0], config)
            for w in range(config.warmup):
                state["g"].timed(first, config.max_new_tokens, generation_seed(config.seed, "warmup", w))
        return state["g"]

    def compute(row: dict, shard: Path) -> None:
        ids = prompt_ids(pair.tokenizer, row["turns"][0], config)
        records, summaries = [], []
        for sample in range(config.n_samples):
            seed = generation_seed(config.seed, row["question_id"], sample)
            gen, t = timed_generation(generator(), ids, config, seed, device)
            for r in gen.records:
                records.append({"prompt_id": str(row["question_id"]), "category": row["category"],
                                "sample": sample, **r})
            summaries.append(summary_row(row, sample, seed, ids, gen, t))
        trace.write_shard(records, shard, {**identity, "summary": summaries})
        if on_shard is not None:
            on_shard(shard)

    # Each shard is computed under its own lock ``trace/<safe id>.lock``, so concurrent processes on
    # one run folder never compute a shard twice. First pass: the prompts no other process holds;
    # second pass: wait for the ones another process was computing and redo them only if it did not
    # finish them (it may have been killed).
    deferred: list[dict] = []
    where = f"[rank {rank}/{world_size}] " if world_size > 1 else ""
    for row in _progress(todo, progress, f"{where}{pair.name}/{suite.name} {config.label}", position=rank):
        shard = shard_path(run_dir, row["question_id"])
        lock = file_lock(shard.with_suffix(".lock"), timeout=0)
        try:
            lock.acquire()
        except TimeoutError:  # filelock.Timeout: another process computes this shard now
            deferred.append(row)
            continue
        try:
            # another process may have finished it between the listing and the lock
            if not resume or not shard_done(shard, identity):
                compute(row, shard)
        finally:
            lock.release()
    for row in deferred:
        shard = shard_path(run_dir, row["question_id"])
        with file_lock(shard.with_suffix(".lock")):
            if not shard_done(shard, identity):
                compute(row, shard)
    if world_size == 1:  # several ranks: the launcher merges once all are done
        with file_lock(run_dir / META_LOCK):
            write_summary(run_dir, suite)
    return run_dir


def _progress(items, enabled: bool, desc: str, position: int = 0):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="prompt", leave=False, position=position)
