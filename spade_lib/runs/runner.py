"""Run a draft/target pair over a suite: one Parquet trace shard per prompt, resumable, timed.

``run_suite(pair, suite, config)`` decodes the first turn of every suite prompt ``n_samples`` times
with one method and writes, under the run folder ``run_dir_for(pair.name, suite_key(suite), config)``::

    <run_dir>/metadata.json          the run: pair, suite (+ sha256), config, environment, schema
    <run_dir>/trace/<id>.parquet     one shard per prompt: its token-level trace (spade_lib.runs.trace),
                                     with the prompt's summary rows and the run's identity (config
                                     hash, schema version) in the file's metadata; ``<id>`` is
                                     ``validate.safe_name(question_id)``
    <run_dir>/trace/<id>.lock        the shard's lock; ``<run_dir>/.meta.lock`` guards metadata.json
    <run_dir>/summary.jsonl          one row per generation, Spec-Bench's answer shape plus SPADE's:
                                     question_id, category, sample, seed, new_tokens, wall_time,
                                     accept_lengths, wall_times, n_steps, prompt_tokens, stop_reason,
                                     output_ids, text

**Resumable.** A shard is written atomically (temp file + rename) only once its prompt is finished,
so a shard on disk is complete and a re-run with ``resume=True`` skips it. ``summary.jsonl`` is
rebuilt from the shards at the end, never appended to. Because every generation is seeded from
``(config.seed, question_id, sample)`` alone, a run killed at any point (``kill -9`` included) and
resumed ends with the same trace as an uninterrupted one — every column except the timing columns
``t_draft``, ``t_verify``, ``t_overhead`` (and the summary's ``wall_time``), which are measurements.

**Sharded.** ``run_suite(..., rank=r, world_size=W)`` decodes only the prompts ``rows[r::W]`` (a
disjoint share; the shards do not depend on who wrote them). Rank 0 alone writes ``metadata.json``;
with ``W > 1`` nobody writes ``summary.jsonl`` here: the launcher merges once every rank is done
(``spade_lib.runs.launch.merge_run``). ``python -m spade_lib.runs.cli --config run.yaml --out DIR`` (under
``torchrun`` or ``accelerate launch`` for several processes) is the command line (``spade_lib.runs.cli``).

**One run per folder.** Resuming into a folder whose ``metadata.json`` -- or, if that file was
deleted, any shard -- describes another run (config hash, schema version, pair, suite) is refused
before anything is written. Concurrent processes on one folder (or ranks) share the work: each shard
is computed under its ``filelock`` lock by whichever process takes it first, never twice.

**Methods** (``RunConfig.method``), all counted the same way (``new_tokens`` = tokens emitted after
the prompt) and timed the same way (``spade_lib.runs.timing``: ``warmup`` untimed generations on the
first prompt, then each generation timed ``repeats`` times, median kept):

- ``"spade"``: :class:`spade_lib.decoding.decode.SpeculativeDecoder` with the drafter ``config.draft`` (a draft
  of the pair, or a registered drafter such as ``"ngram"`` for prompt lookup:
  :func:`spade_lib.decoding.drafters.make_drafter`), the draft-length policy ``config.policy`` with
  ``config.policy_options`` (:func:`spade_lib.decoding.policies.get_policy`) and the acceptance rule
  ``config.mode`` with ``config.mode_options`` (:mod:`spade_lib.rules`);
- ``"ar"``: SPADE's autoregressive loop on the same adapter (the baseline for ``"spade"``);
- ``"hf"``: plain ``model.generate``; ``"hf_assisted"``: HF assisted generation with the same draft
  and ``num_assistant_tokens = gamma`` (constant schedule), the baseline a reader asks about.

Baselines draft nothing, so their shards hold no rows; their summaries carry the timings.

**Instrumentation is not timed.** SPADE's token-level statistics (entropies, TV, KL over the
vocabulary at every drafted position) are computed in a separate, untimed pass with the same seed;
the timed passes record step-level facts only and must reproduce its tokens exactly (see
:class:`Generator`). The trace's ``t_*`` columns are the last timed pass's step timings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from spade_lib import devices, paths

from spade_lib.runs import timing, trace
from spade_lib.io import write_json, write_text
from spade_lib.validate import ArgumentTypeError, check_int, safe_name

METHODS = ("spade", "ar", "hf", "hf_assisted")
NGRAM = "ngram"
META_LOCK = ".meta.lock"

# RunConfig fields that fill the policy's option of the same name unless policy_options gives it
_POLICY_FIELDS = ("gamma", "threshold", "max_gamma")


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's outputs (hashed into its folder name)."""

    method: str = "spade"        # "spade" | "ar" | "hf" | "hf_assisted" (see the module docstring)
    draft: str = "distilled"     # a draft of the pair ("distilled", "data_only", ...) or "ngram"
    gamma: int = 4               # draft length (fixed policy; num_assistant_tokens for hf_assisted)
    policy: str = "fixed"        # a registered policy: "fixed" | "confidence" (stop when max q < threshold) | "entropy" (H(q) > threshold) | "adaptive" (cost model, policy_options)
    threshold: float = 0.4       # the adaptive policy's threshold (probability, or nats for entropy)
    max_gamma: int = 8           # longest block an adaptive policy may draft
    temperature: float = 0.0     # 0 = greedy
    top_k: int = 0               # 0 = off
    top_p: float = 1.0           # 1 = off
    mode: str = "auto"           # acceptance rule (spade_lib.rules); "auto": greedy at T=0, one_hot_q for ngram, else exact
    max_new_tokens: int = 64     # tokens generated per prompt (fewer if a stop token comes first)
    n_samples: int = 1           # generations per prompt, seeds derived from (seed, question_id, sample)
    seed: int = 0                # run seed
    record_topk: int = 0         # store the top-k of p and q per drafted position (0 = off)
    ngram_max: int = 3           # prompt lookup: longest n-gram matched
    max_prompt_tokens: int = 0   # keep only the last this many prompt tokens (0 = all)
    chat_template: bool | str = "auto"  # chat template: "auto" (if the tokenizer has one), True, False
    device: str = "auto"         # "cpu" | "cuda" | "cuda:N" | "auto" (resolved on creation); the pair must be there
    dtype: str = "float32"       # the pair's dtype (checked, recorded)
    warmup: int = 1              # untimed generations before the first timed one
    repeats: int = 1             # timed generations per (prompt, sample); wall_time is their median
    threads: int = 0             # torch intra-op threads (0 = leave as set; recorded either way)
    mode_options: dict = field(default_factory=dict)    # the rule's options, e.g. {"lenience": 0.7}
    policy_options: dict = field(default_factory=dict)  # the policy's options beyond gamma/threshold/max_gamma

    def __post_init__(self) -> None:
        from spade_lib import rules
        from spade_lib.decoding import drafters, policies
        from spade_lib import validate as v

        v.check_choice("method", self.method, METHODS)
        v.check_str("draft", self.draft)
        v.check_choice("policy", self.policy, tuple(policies.policy_names()))
        v.check_choice("mode", self.mode, ("auto", *rules.rule_names()))
        for name in ("mode_options", "policy_options"):
            value = getattr(self, name)
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                raise ValueError(f"{name}: must be a dict with string keys, got {value!r}")
            try:
                json.dumps(value, sort_keys=True, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{name}: must hold JSON values (it is hashed), got {value!r}") from e
            object.__setattr__(self, name, dict(value))  # a private copy: the caller's dict may change
        if self.mode == "auto":
            if self.mode_options:
                raise ValueError(f"mode_options: mode 'auto' takes none (name the mode), got {self.mode_options!r}")
        else:
            rules.get_rule(self.mode).check_options(self.mode_options)
        for name in ("gamma", "max_gamma"):
            v.check_gamma(name, getattr(self, name))
        for name in ("max_new_tokens", "n_samples", "repeats", "ngram_max"):
            v.check_int(name, getattr(self, name), min=1)
        for name in ("record_topk", "max_prompt_tokens", "warmup", "threads", "seed"):
            v.check_int(name, getattr(self, name), min=0)
        v.check_float("threshold", self.threshold)
        if self.method == "hf_assisted" and self.draft in drafters.drafter_names():
            raise ValueError(f"draft: {self.draft!r} is not available for method 'hf_assisted', which needs a "
                             "draft model (for prompt lookup use method 'hf' with spade_lib.decoding.baselines instead)")
        v.check_choice("chat_template", self.chat_template, (True, False, "auto"))
        v.check_str("device", self.device)
        self.sampling()  # validates temperature / top_k / top_p
        self.make_policy()  # validates the policy's options against their ranges
        devices.resolve_dtype(self.dtype)
        if self.device == "auto":  # resolved before hashing: "auto" and what it means are one run
            object.__setattr__(self, "device", str(devices.resolve_device("auto")))

    def sampling(self):
        """The :class:`spade_lib.sampling.SamplingConfig` of this run."""
        from spade_lib.sampling import SamplingConfig

        return SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def make_policy(self):
        """The draft-length policy ``get_policy(policy, **options)`` (``spade_lib.decoding.policies``): the fields
        ``gamma``, ``threshold``, ``max_gamma`` fill the policy's options of the same name, then
        ``policy_options`` (which wins)."""
        from spade_lib.decoding import policies

        takes = policies.policy_options(self.policy)
        options = {name: getattr(self, name) for name in _POLICY_FIELDS if name in takes}
        return policies.get_policy(self.policy, **{**options, **self.policy_options})

    def make_drafter(self, pair):
        """A fresh drafter ``config.draft`` for ``pair`` (:func:`spade_lib.decoding.drafters.make_drafter`);
        ``ngram_max`` fills a registered drafter's ``max_ngram``."""
        from spade_lib.decoding import drafters

        options = {"max_ngram": self.ngram_max} if "max_ngram" in drafters.drafter_options(self.draft) else {}
        return drafters.make_drafter(self.draft, pair, **options)

    def __hash__(self) -> int:  # the option dicts are unhashable; equal configs have equal canonical JSON
        return hash(self.hash)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def hash(self) -> str:
        """sha256 (first 12 hex digits) of the canonical JSON of every field."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @property
    def label(self) -> str:
        """A short human-readable name: method, draft, policy, sampling."""
        if self.method in ("ar", "hf"):
            what = self.method
        else:
            g = f"g{self.gamma}" if self.policy == "fixed" else f"{self.policy}{self.threshold:g}m{self.max_gamma}"
            what = f"{self.method}-{self.draft}-{g}"
        return f"{what}-T{self.temperature:g}"


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


def generation_seed(seed: int, question_id: Any, sample: int) -> int:
    """A 63-bit seed from (run seed, question_id, sample): stable across processes and platforms."""
    digest = hashlib.sha256(f"{seed}:{question_id}:{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass
class Generation:
    """What one generation produced, whatever the method."""

    output_ids: list[int]
    text: str
    records: list[dict]        # trace records (DEVELOPERS.md columns minus prompt_id/category/sample)
    accept_lengths: list[int]  # n + 1 per verification step (1s for "ar"; [] for HF, which hides its steps)
    stop_reason: str           # "eos", "max_new_tokens" or "context_limit"
    step_times: list[tuple[float, float, float]] = dataclasses.field(default_factory=list)  # (draft, verify, rest)


@dataclass
class Generator:
    """How a run generates: ``timed(ids, max_new_tokens, seed)`` is what the clock measures;
    ``recorded`` (SPADE only) is the same decoder with token-level recording, run once untimed.

    SPADE's token-level records cost per-position statistics over the vocabulary (entropies, TV,
    KL, top-k) that a deployed decoder would not compute, so they are kept out of the timing: the
    timed decoder records step-level facts only (``record="light"``), and the two must produce the
    same tokens (same seed, same decisions), which :func:`timed_generation` checks.
    """

    timed: Callable[[list[int], int, int], Generation]
    recorded: Callable[[list[int], int, int], Generation] | None = None


# ---------------------------------------------------------------- methods

def _from_result(r, records: bool) -> Generation:
    steps = getattr(r, "steps", [])
    return Generation(list(r.tokens), r.text or "", r.records() if records else [],
                      list(r.accept_lengths) if steps else [], r.stop_reason,
                      [(s.t_draft, s.t_verify, s.t_overhead) for s in steps if s.gamma > 0])


def make_generator(pair, config: RunConfig) -> Generator:
    """The :class:`Generator` of ``config.method`` on ``pair``."""
    from spade_lib.decoding import baselines, decode

    from spade_lib.decoding.drafters import drafter_names

    sampling = config.sampling()
    _check_draft(pair, config)
    if config.method == "spade":
        def decoder(record):
            return decode.SpeculativeDecoder(
                pair.target, config.make_drafter(pair), policy=config.make_policy(), sampling=sampling,
                tokenizer=pair.tokenizer, mode=None if config.mode == "auto" else config.mode, record=record,
                record_topk=config.record_topk if record is True else 0, **config.mode_options)

        light, full = decoder("light"), decoder(True)
        return Generator(lambda ids, n, seed: _from_result(light.generate(ids, n, seed=seed), records=False),
                         lambda ids, n, seed: _from_result(full.generate(ids, n, seed=seed), records=True))
    if config.method == "ar":
        ar = decode.AutoregressiveDecoder(pair.target, sampling=sampling, tokenizer=pair.tokenizer)
        return Generator(lambda ids, n, seed: _from_result(ar.generate(ids, n, seed=seed), records=False))
    assistant = pair.drafts[config.draft] if config.method == "hf_assisted" else None
    return Generator(lambda ids, n, seed: _from_result(
        baselines.hf_generate(pair.target, ids, n, sampling=sampling, assistant=assistant, gamma=config.gamma,
                              seed=seed, tokenizer=pair.tokenizer), records=False))


# ---------------------------------------------------------------- prompts and metadata

def prompt_ids(tokenizer, text: str, config: RunConfig) -> list[int]:
    """Token ids of a prompt as M1 counts them (``spade_lib.bench.render_prompt``: the chat template
    per ``config.chat_template``), then cut to its last ``max_prompt_tokens`` (0 = keep all)."""
    from spade_lib.bench import render_prompt

    rendered = render_prompt(text, tokenizer, config.chat_template)
    # a chat template already carries its special tokens; do not add a second BOS
    ids = [int(i) for i in tokenizer.encode(rendered, add_special_tokens=rendered is text)]
    if config.max_prompt_tokens and len(ids) > config.max_prompt_tokens:
        ids = ids[-config.max_prompt_tokens:]
    if not ids:
        raise ValueError(f"prompt {text[:40]!r}: tokenizes to nothing")
    return ids


def _check_pair_placement(pair, config: RunConfig):
    want_dev = devices.resolve_device(config.device)
    want_dtype = devices.resolve_dtype(config.dtype)
    p = next(pair.target.parameters())
    if p.device.type != want_dev.type or (want_dev.index is not None and p.device != want_dev):
        raise ValueError(f"device: config asks for {want_dev} but the pair's target is on {p.device}; "
                         f"load the pair with load_pair(..., device={str(want_dev)!r})")
    if p.dtype != want_dtype:
        raise ValueError(f"dtype: config asks for {want_dtype} but the pair's target is {p.dtype}; "
                         f"load the pair with load_pair(..., dtype=torch.{str(want_dtype).removeprefix('torch.')})")
    return p.device


def run_identity(pair, suite, config: RunConfig) -> dict[str, Any]:
    """The facts that make two runs the same run (checked on resume; stored in every shard)."""
    manifest = getattr(pair, "manifest", {}) or {}
    return {
        "schema_version": trace.SCHEMA_VERSION,
        "pair": {"name": pair.name, "sha256": manifest.get("sha256") or manifest.get("hash"),
                 "kind": manifest.get("kind", "embedded")},
        "suite": {"name": suite.name, "sha256": suite.sha256, "n_prompts": len(suite.rows)},
        "config": config.to_dict(),
        "config_hash": config.hash,
    }


def _summary_row(row: dict, sample: int, seed: int, ids: list[int], gen: Generation, t: timing.Timing) -> dict:
    return {
        "question_id": row["question_id"], "category": row["category"], "sample": sample, "seed": seed,
        "new_tokens": len(gen.output_ids), "wall_time": t.median, "wall_times": list(t.times),
        "accept_lengths": gen.accept_lengths, "n_steps": len(gen.accept_lengths),
        "prompt_tokens": len(ids), "stop_reason": gen.stop_reason, "output_ids": gen.output_ids,
        "text": gen.text,
    }


def _clean_temporaries(folder: Path, stems: set[str] | None = None) -> None:
    """Delete temporary files that interrupted writes left (``.<stem>.<random>.parquet`` from
    ``io.atomic_path``, ``.<name>.<random>.tmp`` from ``io.atomic_write``). A temporary is deleted
    only while its shard's lock is free: another process writing that shard now keeps its file. With
    ``stems``, only the temporaries of those shards (a rank's own share) are considered."""
    for p in [*folder.glob(".*.tmp"), *folder.glob(".*.parquet")]:
        stem = p.name[1:].rsplit(".", 2)[0]
        stem = stem[: -len(".parquet")] if stem.endswith(".parquet") else stem
        if stems is not None and stem not in stems:
            continue
        lock = _lock(folder / f"{stem}.lock", timeout=0)
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


def _shard_done(path: Path, identity: dict) -> bool:
    """Whether ``path`` is a finished shard of *this* run. An unreadable or partial file, or one whose
    columns are not those of ``trace.TRACE_SCHEMA`` for its (this run's) schema version, is redone
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


def _check_existing(run_dir: Path, identity: dict) -> None:
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
            _shard_done(shard, identity)


def _lock(path: Path, timeout: float = -1):
    """A ``filelock`` lock file (released by the OS if the process dies, ``kill -9`` included)."""
    from filelock import FileLock

    return FileLock(str(path), timeout=timeout)


def _check_draft(pair, config: RunConfig) -> None:
    from spade_lib.decoding.drafters import drafter_names

    if config.method in ("spade", "hf_assisted") and config.draft not in drafter_names(pair):
        raise ValueError(f"draft: pair {pair.name!r} has drafts {sorted(pair.drafts)} (or "
                         f"{list(drafter_names())}), not {config.draft!r}")


# ---------------------------------------------------------------- the runner

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
    device = _check_pair_placement(pair, config)
    _check_draft(pair, config)
    run_dir = Path(run_dir) if run_dir is not None else run_dir_for(pair.name, suite_key(suite), config)
    identity = run_identity(pair, suite, config)
    meta_path = run_dir / "metadata.json"
    if run_dir.is_dir():  # refuse a folder of another run before writing anything into it
        _check_existing(run_dir, identity)
    trace_dir = paths.ensure_dir(run_dir / "trace")
    share = suite.rows[rank::world_size]

    with _lock(run_dir / META_LOCK):
        _check_existing(run_dir, identity)
        _clean_temporaries(trace_dir, None if world_size == 1 else {safe_name(r["question_id"]) for r in share})
        sessions = []
        if meta_path.is_file():
            sessions = json.loads(meta_path.read_text(encoding="utf-8")).get("sessions", [])
        if config.threads:
            timing.fix_threads(config.threads)
        env = timing.environment_fingerprint(device)
        sessions.append({"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "environment": env,
                         "world_size": world_size, "linear_kernels": timing.kernel_plans()})
        if rank == 0:
            write_json(meta_path, {**identity, "environment": env, "sessions": sessions,
                                   "sampling": dataclasses.asdict(config.sampling()),
                                   "policy": repr(config.make_policy()) if config.method == "spade" else None,
                                   "device": str(device), "dtype": config.dtype,
                                   "seeds": "generation_seed(config.seed, question_id, sample) = "
                                            "sha256('seed:question_id:sample')[:8] little-endian >> 1"})

    rows = suite.rows
    todo = [r for r in share if not (resume and _shard_done(shard_path(run_dir, r["question_id"]), identity))]
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
            summaries.append(_summary_row(row, sample, seed, ids, gen, t))
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
        lock = _lock(shard.with_suffix(".lock"), timeout=0)
        try:
            lock.acquire()
        except TimeoutError:  # filelock.Timeout: another process computes this shard now
            deferred.append(row)
            continue
        try:
            # another process may have finished it between the listing and the lock
            if not resume or not _shard_done(shard, identity):
                compute(row, shard)
        finally:
            lock.release()
    for row in deferred:
        shard = shard_path(run_dir, row["question_id"])
        with _lock(shard.with_suffix(".lock")):
            if not _shard_done(shard, identity):
                compute(row, shard)
    if world_size == 1:  # several ranks: the launcher merges once all are done
        with _lock(run_dir / META_LOCK):
            write_summary(run_dir, suite)
    return run_dir


def timed_generation(generator: Generator, ids, config: RunConfig, seed: int, device
                     ) -> tuple[Generation, timing.Timing]:
    """One generation: the recorded pass (if any) once, untimed; then ``config.repeats`` timed passes,
    which must agree with it token for token. The records keep the last timed pass's step timings."""
    rec = generator.recorded(ids, config.max_new_tokens, seed) if generator.recorded is not None else None
    outputs: list[Generation] = []

    def once() -> Generation:
        g = generator.timed(ids, config.max_new_tokens, seed)
        outputs.append(g)
        return g

    gen, t = timing.measure(once, warmup=0, repeats=config.repeats, device=device)
    ref = rec if rec is not None else gen
    if any(o.output_ids != ref.output_ids or o.accept_lengths != ref.accept_lengths for o in outputs):
        raise RuntimeError(f"seed {seed}: repeated generations differ (or differ from the recorded one); "
                           "decoding is not deterministic here")
    if rec is None:
        return gen, t
    by_step: dict[int, tuple[float, float, float]] = {}
    steps_with_rows = sorted({r["step"] for r in rec.records})
    if len(steps_with_rows) != len(gen.step_times):
        raise RuntimeError(f"seed {seed}: recorded and timed passes drafted in different steps")
    by_step = dict(zip(steps_with_rows, gen.step_times))
    for r in rec.records:
        r["t_draft"], r["t_verify"], r["t_overhead"] = by_step[r["step"]]
    return rec, t


def _progress(items, enabled: bool, desc: str, position: int = 0):
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="prompt", leave=False, position=position)


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

