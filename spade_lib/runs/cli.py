"""The run command line: one :class:`~spade_lib.runs.config.RunConfig` over one suite, in one process or sharded::

    python -m spade_lib.runs.cli --config params/cli/tiny.yaml --out runs/cli/tiny
    torchrun --nproc-per-node 8 -m spade_lib.runs.cli --config params/cli/qwen2.5_0.5b_7b.yaml --out runs/cli/qwen
    accelerate launch --multi_gpu --num_processes 8 -m spade_lib.runs.cli --config ... --out ...
    python -m spade_lib.runs.cli --config ... --out DIR --merge   # after ranks launched as separate jobs

The YAML file is a flat mapping (unknown keys refused) of :class:`~spade_lib.runs.config.RunConfig` fields plus:

=================  ====================================================================================================
``pair``           an embedded pair (``tiny``, ``default``); with ``target_id``, only a label
``target_id``      hub id or local folder of a real target (with ``draft_id`` and/or ``drafts``)
``draft_id``       hub id or local folder of its draft (the draft named ``"draft"``)
``drafts``         ``{name: hub id or folder}``: more drafts of a real pair
``suite``          a file stem under ``data/`` (``embedded``: notebook 01's) or a ``.jsonl`` path (relative to cwd)
``n_per_category`` prompts per category (``null``: every prompt)
``device_map``     big targets: ``auto`` / ``balanced`` / ``sequential`` / ``{module: device}``
``max_memory``     ``{gpu index or cpu: size}`` for ``device_map`` (e.g. ``{0: 70GiB, cpu: 200GiB}``)
``offload_folder`` where ``device_map`` puts weights mapped to ``disk``
``resume``         reuse finished shards (default ``true``)
=================  ====================================================================================================

Under ``torchrun`` / ``accelerate launch`` each process takes the prompts ``rows[rank::world_size]`` and, on GPUs,
``cuda:LOCAL_RANK`` (``device: cuda`` or ``auto``); rank 0 merges after a barrier and prints the summary
(``spade_lib.runs.launch``). The run folder is the same whatever the number of processes (only timings differ).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spade_lib import devices, measures, paths

from spade_lib.devices import clock
from spade_lib.runs import launch, runner
from spade_lib.runs.config import RunConfig
from spade_lib.runs.store import read_summary, run_dir_for, run_identity, suite_key

EXTRA_KEYS = ("pair", "target_id", "draft_id", "drafts", "suite", "n_per_category", "device_map", "max_memory",
              "offload_folder", "resume", "heads", "head_profile")


@dataclass
class RunSpec:
    """A run as the YAML file describes it: which pair and suite, and the :class:`RunConfig`."""

    config: RunConfig
    pair: str | None = None
    target_id: str | None = None
    draft_id: str | None = None
    drafts: dict[str, str] = field(default_factory=dict)
    suite: str = "embedded"
    n_per_category: int | None = None
    device_map: str | dict | None = None
    max_memory: dict | None = None
    offload_folder: str | None = None
    resume: bool = True
    heads: list[str] = field(default_factory=list)  # feature heads to attach (built if needed): "eagle3", "medusa", ...
    head_profile: str = "make"                      # their recipe (spade_lib.zoo.heads)


def _coerce(value: Any, kind: str) -> Any:
    """YAML's ``0`` for a float field becomes ``0.0`` (so the config hash equals Python's ``0.0``)."""
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def spec_from_dict(data: Any, where: str = "config") -> RunSpec:
    """A :class:`RunSpec` from the YAML mapping; ``ValueError`` naming any unknown or bad key."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of settings, got {type(data).__name__}")
    config_fields = {f.name: f.type for f in dataclasses.fields(RunConfig)}
    known = list(config_fields) + list(EXTRA_KEYS)
    unknown = [k for k in data if k not in known]
    if unknown:
        hints = [f"{k!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(str(k), known, 1)) else repr(k)
                 for k in unknown]
        raise ValueError(f"{where}: unknown keys {', '.join(hints)}; known keys: RunConfig fields "
                         f"{list(config_fields)} and {list(EXTRA_KEYS)}")
    try:
        config = RunConfig(**{k: _coerce(v, config_fields[k]) for k, v in data.items() if k in config_fields})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    extra = {k: v for k, v in data.items() if k in EXTRA_KEYS}
    for key in ("pair", "target_id", "draft_id", "suite", "offload_folder"):
        if extra.get(key) is not None and (not isinstance(extra[key], str) or not extra[key]):
            raise ValueError(f"{where}: {key} must be a non-empty string, got {extra[key]!r}")
    if extra.get("drafts") is None:
        extra.pop("drafts", None)
    elif not isinstance(extra["drafts"], dict) or not all(isinstance(v, str) for v in extra["drafts"].values()):
        raise ValueError(f"{where}: drafts must map draft names to hub ids or folders, got {extra['drafts']!r}")
    n = extra.get("n_per_category")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"{where}: n_per_category must be an integer >= 1 or null, got {n!r}")
    heads = extra.get("heads", [])
    if not isinstance(heads, list) or not all(isinstance(h, str) and h for h in heads):
        raise ValueError(f"{where}: heads must be a list of head kinds, got {heads!r}")
    if not isinstance(extra.get("head_profile", "make"), str):
        raise ValueError(f"{where}: head_profile must be a string, got {extra['head_profile']!r}")
    if not isinstance(extra.get("resume", True), bool):
        raise ValueError(f"{where}: resume must be true or false, got {extra['resume']!r}")
    spec = RunSpec(config=config, **extra)
    if spec.target_id is None and (spec.draft_id is not None or spec.drafts):
        raise ValueError(f"{where}: draft_id/drafts need target_id (a real pair)")
    if spec.target_id is not None and spec.draft_id is None and not spec.drafts:
        raise ValueError(f"{where}: target_id needs draft_id or drafts")
    if spec.target_id is None and spec.pair is None:
        raise ValueError(f"{where}: give pair (an embedded pair name) or target_id + draft_id")
    return spec


def load_spec(path: str | os.PathLike) -> RunSpec:
    """Read a run YAML file (see the module docstring)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config: no such file {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"config: {path} is not valid YAML: {e}") from None
    return spec_from_dict(data, where=str(path))


def load_suite_for(spec: RunSpec):
    """The suite named by ``spec.suite``, cut to ``spec.n_per_category`` prompts per category."""
    from spade_lib.bench import default_suite, load_suite

    name = spec.suite
    path = Path(name).expanduser() if name.endswith(".jsonl") else paths.DATA_DIR / f"{name}.jsonl"
    if path.is_file():
        suite = load_suite(path)
    elif name == "embedded":  # notebook 01 not run: the same suite, built in memory (deterministic)
        suite = default_suite(tokenizer="default")
    else:
        raise FileNotFoundError(f"suite: no file {path}")
    return suite.filter(n_per_category=spec.n_per_category)


def rank_device(spec: RunSpec, ranks: launch.Ranks) -> str | None:
    """The device this rank loads the pair on (``None``: placed by ``device_map``)."""
    if spec.device_map is not None:
        if ranks.world_size > 1:
            raise ValueError("device_map: a target spread over devices runs in one process; "
                             f"launch 1 process, not {ranks.world_size}")
        return None
    dev = devices.resolve_device(spec.config.device)
    if dev.type == "cuda" and ranks.world_size > 1:
        if dev.index is not None:
            raise ValueError(f"device: with {ranks.world_size} processes give 'cuda' or 'auto' (each rank "
                             f"takes cuda:LOCAL_RANK), not {spec.config.device!r}")
        import torch

        torch.cuda.set_device(ranks.local_rank)
        return f"cuda:{ranks.local_rank}"
    return str(dev)


def load_pair_for(spec: RunSpec, ranks: launch.Ranks):
    from spade_lib.zoo.pairs import load_pair

    kwargs = dict(device=rank_device(spec, ranks), dtype=devices.resolve_dtype(spec.config.dtype),
                  device_map=spec.device_map, max_memory=spec.max_memory, offload_folder=spec.offload_folder)
    if spec.heads:
        kwargs.update(heads=tuple(spec.heads), head_profile=spec.head_profile)
    if spec.target_id is None:
        return load_pair(spec.pair, **kwargs)
    return load_pair(spec.pair, target=spec.target_id, draft=spec.draft_id, drafts=spec.drafts or None, **kwargs)


def summarize(run_dir: Path, world_size: int, seconds: float, decoded: int) -> dict[str, Any]:
    """What the run produced, from its ``summary.jsonl`` (one row per generation)."""
    s = read_summary(run_dir)
    tokens, steps = int(s["new_tokens"].sum()), int(s["n_steps"].sum())
    decode_s = float(s["wall_time"].sum())
    return {
        "run_dir": str(run_dir), "prompts": int(s["question_id"].nunique()), "generations": len(s),
        # tokens emitted per target verification (block efficiency: tau of the tokens left after truncation)
        "new_tokens": tokens, "tokens_per_step": float(measures.tau(tokens - steps, steps)) if steps else None,
        "decode_seconds": decode_s, "tokens_per_second": tokens / decode_s if decode_s > 0 else None,
        "stop_reasons": {str(k): int(v) for k, v in s["stop_reason"].value_counts().sort_index().items()},
        "processes": world_size, "decoded_now": decoded, "elapsed_seconds": seconds,
    }


def _print_summary(info: dict[str, Any], config: RunConfig) -> None:
    tps = f"{info['tokens_per_step']:.2f} tokens/step, " if info["tokens_per_step"] else ""
    rate = f"{info['tokens_per_second']:.1f}" if info["tokens_per_second"] else "n/a"
    print(f"\nSPADE run {config.label} (config {config.hash}) finished in {info['elapsed_seconds']:.1f} s "
          f"with {info['processes']} process(es)\n"
          f"  {info['run_dir']}\n"
          f"  {info['prompts']} prompts, {info['generations']} generations ({info['decoded_now']} prompts decoded "
          f"now, the rest resumed), {info['new_tokens']} new tokens, stop reasons {info['stop_reasons']}\n"
          f"  {tps}{rate} tokens/s over {info['decode_seconds']:.2f} s of timed decoding "
          f"(sum of per-generation medians)", flush=True)


def merge_only(spec: RunSpec, run_dir: Path) -> Path:
    """``--merge``: check and merge the shards of ``run_dir`` against its ``metadata.json``."""
    meta_path = run_dir / "metadata.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"out: no metadata.json in {run_dir} (rank 0 has not started there)")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("config_hash") != spec.config.hash:
        raise ValueError(f"config: {run_dir} holds config {meta.get('config_hash')}, the YAML gives {spec.config.hash}")
    suite = load_suite_for(spec)
    if meta.get("suite", {}).get("sha256") != suite.sha256:
        raise ValueError(f"suite: {run_dir} was run on another suite (sha256 {meta.get('suite', {}).get('sha256')})")
    identity = {k: meta[k] for k in ("schema_version", "pair", "suite", "config", "config_hash")}
    return launch.merge_run(run_dir, suite, identity)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    """Run (or merge) the YAML's run; return the summary on rank 0 (``None`` on other ranks)."""
    parser = argparse.ArgumentParser(prog="python -m spade_lib.runs.cli", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="run YAML (RunConfig fields, pair, suite, ...)")
    parser.add_argument("--out", help="run folder (default: runs/traces/<pair>/<suite key>/<label>-<hash>)")
    parser.add_argument("--merge", action="store_true", help="only check and merge the shards in --out")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    start = clock()
    spec = load_spec(args.config)
    ranks = launch.ranks_from_env()
    if args.merge:
        if not args.out:
            parser.error("--merge needs --out")
        merge_only(spec, Path(args.out))
        info = summarize(Path(args.out), 1, clock() - start, 0)
        _print_summary(info, spec.config)
        return info

    grouped = launch.init_group(ranks)
    try:
        suite = load_suite_for(spec)
        pair = load_pair_for(spec, ranks)
        run_dir = Path(args.out) if args.out else run_dir_for(pair.name, suite_key(suite), spec.config)
        decoded: list[Path] = []
        runner.run_suite(pair, suite, spec.config, run_dir, resume=spec.resume, progress=not args.no_progress,
                         on_shard=decoded.append, rank=ranks.rank, world_size=ranks.world_size)
        if ranks.world_size > 1:
            print(f"[rank {ranks.rank}/{ranks.world_size}] done: {len(decoded)} prompts decoded", flush=True)
            if not grouped:
                print(f"[rank {ranks.rank}/{ranks.world_size}] no process group (MASTER_ADDR unset): once every "
                      f"rank has finished, merge with --merge", flush=True)
                return None
            n_decoded = launch.sum_over_ranks(len(decoded))  # every rank's count, once all have finished
            if not ranks.is_main:
                return None
            launch.merge_run(run_dir, suite, run_identity(pair, suite, spec.config))
        else:
            n_decoded = len(decoded)
        info = summarize(run_dir, ranks.world_size, clock() - start, n_decoded)
        _print_summary(info, spec.config)
        return info
    finally:
        if grouped:
            launch.close_group()


def console(argv: list[str] | None = None) -> int:
    """:func:`main` for a shell: bad input or an incomplete run prints one line and exits with 2."""
    try:
        main(argv)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        where = f"[rank {os.environ['RANK']}] " if os.environ.get("WORLD_SIZE", "1") != "1" else ""
        print(f"{where}error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(console())
