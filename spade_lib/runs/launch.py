"""Several processes, one run: ranks from the launcher's environment, a barrier, and the merge.

``torchrun --nproc-per-node N -m spade_lib.runs.cli ...`` and ``accelerate launch --multi_gpu
--num_processes N -m spade_lib.runs.cli ...`` (which starts torchrun) run N copies of the command with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set. (``accelerate launch
--cpu`` starts one process; its multi-CPU mode goes through MPI: on a CPU use torchrun.) Each copy runs ``run_suite(..., rank, world_size)`` on its
share ``rows[rank::world_size]`` of the prompts (one Parquet shard per prompt, written atomically), so
the ranks never write the same file and need no communication while they decode. They meet once, at a
``gloo`` barrier after the last shard (``gloo`` runs on any machine, GPUs or not, and a barrier is all
that is exchanged); then rank 0 merges (:func:`merge_run`).

Without ``MASTER_ADDR`` (ranks started as independent jobs, e.g. a scheduler's job array with
``RANK``/``WORLD_SIZE`` set by hand) there is no barrier: each rank writes its shards and stops, and
``python -m spade_lib.runs.cli --config ... --out DIR --merge`` merges once all have finished.

A rank that dies leaves its finished shards; the launcher stops the others (torchrun does), and the
same command run again (with any number of processes) redoes only the prompts without a shard.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from spade_lib.runs import trace
from spade_lib.runs.config import generation_seed
from spade_lib.runs.store import write_summary

# Ranks finish their shares at different times (a rerun may leave all remaining prompts to one
# rank); the barrier must outwait the slowest one. A dead rank ends the job through the launcher.
BARRIER_TIMEOUT = timedelta(days=7)


@dataclass(frozen=True)
class Ranks:
    """This process's place in a launch: ``rank`` of ``world_size``, ``local_rank`` on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    rendezvous: bool = False  # MASTER_ADDR/MASTER_PORT are set: a process group can be formed

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(env, name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}: expected an integer in the environment, got {value!r}") from None


def ranks_from_env(env: dict[str, str] | None = None) -> Ranks:
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` as torchrun and ``accelerate launch`` set them
    (absent: one process, rank 0)."""
    env = os.environ if env is None else env
    world_size = _env_int(env, "WORLD_SIZE", 1)
    rank = _env_int(env, "RANK", 0)
    local_rank = _env_int(env, "LOCAL_RANK", rank)
    if world_size < 1:
        raise ValueError(f"WORLD_SIZE: must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK: must be in [0, WORLD_SIZE={world_size}), got {rank}")
    if local_rank < 0:
        raise ValueError(f"LOCAL_RANK: must be >= 0, got {local_rank}")
    rendezvous = bool(env.get("MASTER_ADDR")) and bool(env.get("MASTER_PORT"))
    return Ranks(rank, world_size, local_rank, rendezvous)


def init_group(ranks: Ranks) -> bool:
    """Join the launch's ``gloo`` process group when there is one to join; True if joined."""
    if ranks.world_size == 1 or not ranks.rendezvous:
        return False
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this torch build; run one process per job "
                           "and merge with --merge")
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=ranks.rank, world_size=ranks.world_size, timeout=BARRIER_TIMEOUT)
    return True


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def sum_over_ranks(n: int, key: str = "spade/decoded") -> int:
    """The sum of ``n`` over every rank, returned to each once all have added theirs (``n`` itself without a
    process group). It goes through the launch's key-value store, not a collective: a gloo all-reduce's work
    holds its tensor's Python object, and its worker thread freeing that during interpreter shutdown aborted a
    rank now and then ("terminate called without an active exception"; pytorch/pytorch#179291)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return int(n)
    store = dist.distributed_c10d._get_default_store()
    store.add(key, int(n))
    barrier()
    return int(store.add(key, 0))


def close_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def merge_run(run_dir: str | os.PathLike, suite, identity: dict[str, Any]) -> Path:
    """Check that the shards in ``run_dir`` make up the whole run, then write ``summary.jsonl``.

    The checks (each failure names what is wrong):

    - every shard's stored identity (schema version, pair and its hash, suite and its sha256, the full
      config and its hash) equals ``identity`` (:func:`spade_lib.runs.store.run_identity`): no shard of
      another run or of an older schema slipped in;
    - every suite prompt has exactly one shard, and no shard belongs to a prompt outside the suite;
    - each shard holds the summaries of samples ``0 .. n_samples - 1`` of its own prompt, once each,
      seeded with ``generation_seed(seed, question_id, sample)``;
    - its trace rows, if any, carry that prompt's id and only those samples.

    A run with prompts missing (a rank died) raises ``RuntimeError`` naming them: the same command
    again completes it. Returns the path of ``summary.jsonl``.
    """
    run_dir = Path(run_dir)
    config = identity["config"]
    n_samples, seed = config["n_samples"], config["seed"]
    wanted = {str(r["question_id"]): r["question_id"] for r in suite.rows}
    seen: dict[str, Path] = {}
    problems: list[str] = []
    for shard in trace.shard_paths(run_dir / "trace") if (run_dir / "trace").is_dir() else []:
        try:
            meta = trace.read_shard_metadata(shard)
        except Exception as e:  # unreadable: a rerun redoes it
            problems.append(f"{shard.name}: unreadable ({e})")
            continue
        differs = [k for k in identity if meta.get(k) != identity[k]]
        if differs:
            problems.append(f"{shard.name}: belongs to another run (differs in {differs})")
            continue
        summaries = meta.get("summary") or []
        qids = {str(s.get("question_id")) for s in summaries}
        if len(qids) != 1:
            problems.append(f"{shard.name}: summaries of {len(qids)} prompts, expected 1")
            continue
        qid = qids.pop()
        if qid not in wanted:
            problems.append(f"{shard.name}: prompt {qid!r} is not in suite {suite.name!r}")
            continue
        if qid in seen:
            problems.append(f"{shard.name}: prompt {qid!r} already in {seen[qid].name}")
            continue
        samples = sorted(s.get("sample") for s in summaries)
        seeds = [s.get("seed") for s in sorted(summaries, key=lambda s: s.get("sample"))]
        if samples != list(range(n_samples)) or \
                seeds != [generation_seed(seed, wanted[qid], i) for i in range(n_samples)]:
            problems.append(f"{shard.name}: samples {samples} / seeds do not match n_samples={n_samples}, seed={seed}")
            continue
        rows = trace.read_trace(shard)
        if len(rows) and (set(rows["prompt_id"]) != {qid} or not set(rows["sample"]) <= set(range(n_samples))):
            problems.append(f"{shard.name}: trace rows of other prompts or samples")
            continue
        seen[qid] = shard
    if problems:
        raise RuntimeError(f"run_dir {run_dir}: cannot merge: " + "; ".join(problems))
    missing = [q for q in wanted if q not in seen]
    if missing:
        shown = ", ".join(missing[:10]) + (", ..." if len(missing) > 10 else "")
        raise RuntimeError(f"run_dir {run_dir}: incomplete: {len(missing)} of {len(wanted)} prompts have no shard "
                           f"({shown}); run the same command again to complete it")
    return write_summary(run_dir, suite)
