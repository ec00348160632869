"""Run a draft/target pair over a suite: one Parquet trace shard per prompt, resumable, timed.

``run_suite(pair, suite, config)`` decodes the first turn of every suite prompt ``n_samples`` times
with one method and writes, under the run folder ``run_dir_for(pair.name, suite_key(suite), config)``::

    <run_dir>/metadata.json          the run: pair, suite (+ sha256), config, environment, schema
    <run_dir>/trace/<qid>.parquet    one shard per prompt: its token-level trace (spade_lib.trace),
                                     with the prompt's summary rows in the file's metadata
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

**Methods** (``RunConfig.method``), all counted the same way (``new_tokens`` = tokens emitted after
the prompt) and timed the same way (``spade_lib.timing``: ``warmup`` untimed generations on the
first prompt, then each generation timed ``repeats`` times, median kept):

- ``"spade"``: :class:`spade_lib.decode.SpeculativeDecoder` with the draft ``config.draft`` (a draft
  of the pair, or ``"ngram"`` for prompt lookup) and the draft-length ``config.policy``;
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
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from spade_lib import paths, timing, trace
from spade_lib.io import write_json, write_text

METHODS = ("spade", "ar", "hf", "hf_assisted")
POLICIES = ("fixed", "confidence", "entropy")
NGRAM = "ngram"


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's outputs (hashed into its folder name)."""

    method: str = "spade"        # "spade" | "ar" | "hf" | "hf_assisted" (see the module docstring)
    draft: str = "distilled"     # a draft of the pair ("distilled", "data_only", ...) or "ngram"
    gamma: int = 4               # draft length (fixed policy; num_assistant_tokens for hf_assisted)
    policy: str = "fixed"        # "fixed" | "confidence" (stop when max q < threshold) | "entropy" (H(q) > threshold)
    threshold: float = 0.4       # the adaptive policy's threshold (probability, or nats for entropy)
    max_gamma: int = 8           # longest block an adaptive policy may draft
    temperature: float = 0.0     # 0 = greedy
    top_k: int = 0               # 0 = off
    top_p: float = 1.0           # 1 = off
    mode: str = "auto"           # verification mode; "auto": greedy at T=0, one_hot_q for ngram, else exact
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

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        for name in ("gamma", "max_gamma", "max_new_tokens", "n_samples", "repeats", "ngram_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        for name in ("record_topk", "max_prompt_tokens", "warmup", "threads", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if self.method == "hf_assisted" and self.draft == NGRAM:
            raise ValueError("draft 'ngram' is not available for method 'hf_assisted' (use method 'hf' "
                             "with prompt lookup in spade_lib.baselines instead)")
        if self.chat_template not in (True, False, "auto"):
            raise ValueError(f"chat_template must be True, False or 'auto', got {self.chat_template!r}")
        self.sampling()  # validates temperature / top_k / top_p
        timing.resolve_dtype(self.dtype)
        if self.device == "auto":  # resolved before hashing: "auto" and what it means are one run
            object.__setattr__(self, "device", str(timing.resolve_device("auto")))

    def sampling(self):
        """The :class:`spade_lib.sampling.SamplingConfig` of this run."""
        from spade_lib.sampling import SamplingConfig

        return SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def make_policy(self):
        """The draft-length policy (``spade_lib.policies``)."""
        from spade_lib import policies

        if self.policy == "fixed":
            return policies.FixedGamma(gamma=self.gamma)
        if self.policy == "confidence":
            return policies.ConfidenceThreshold(threshold=self.threshold, max_gamma=self.max_gamma)
        return policies.EntropyThreshold(threshold=self.threshold, max_gamma=self.max_gamma)

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
    from spade_lib import baselines, decode

    sampling = config.sampling()
    if config.method in ("spade", "hf_assisted") and config.draft != NGRAM and config.draft not in pair.drafts:
        raise ValueError(f"draft: pair {pair.name!r} has drafts {sorted(pair.drafts)} (or 'ngram'), "
                         f"not {config.draft!r}")
    if config.method == "spade":
        def decoder(record):
            if config.draft == NGRAM:
                from spade_lib.drafters import NGramDrafter

                draft = NGramDrafter(max_ngram=config.ngram_max, device=next(pair.target.parameters()).device)
            else:
                draft = pair.drafts[config.draft]
            return decode.SpeculativeDecoder(
                pair.target, draft, policy=config.make_policy(), sampling=sampling, tokenizer=pair.tokenizer,
                mode=None if config.mode == "auto" else config.mode, record=record,
                record_topk=config.record_topk if record is True else 0)

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
    want_dev = timing.resolve_device(config.device)
    want_dtype = timing.resolve_dtype(config.dtype)
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


def _clean_temporaries(folder: Path) -> None:
    for p in folder.glob(".*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    for p in folder.glob(".*.parquet"):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _shard_done(path: Path) -> bool:
    try:
        pq.read_schema(path)
        trace.read_shard_metadata(path)
        return True
    except Exception:  # unreadable: redo it
        return False


# ---------------------------------------------------------------- the runner

def run_suite(pair, suite, config: RunConfig, run_dir: str | os.PathLike | None = None, *,
              resume: bool = True, progress: bool = True,
              on_shard: Callable[[Path], None] | None = None) -> Path:
    """Run ``config`` on every prompt of ``suite``; return the run folder (see the module docstring).

    ``resume=False`` deletes nothing but re-runs (and overwrites) every shard. ``on_shard(path)`` is
    called after each shard is written (progress hooks, tests).
    """
    if not isinstance(config, RunConfig):
        raise ValueError(f"config must be a RunConfig, got {type(config).__name__}")
    if not suite.rows:
        raise ValueError(f"suite {suite.name!r} has no prompts")
    device = _check_pair_placement(pair, config)
    run_dir = Path(run_dir) if run_dir is not None else run_dir_for(pair.name, suite_key(suite), config)
    trace_dir = paths.ensure_dir(run_dir / "trace")
    _clean_temporaries(trace_dir)

    identity = run_identity(pair, suite, config)
    meta_path = run_dir / "metadata.json"
    sessions = []
    if meta_path.is_file():
        old = json.loads(meta_path.read_text(encoding="utf-8"))
        mismatched = [k for k in identity if old.get(k) != identity[k]]
        if mismatched:
            raise ValueError(f"run_dir {run_dir} holds a different run (differs in {mismatched}); "
                             "choose another run_dir or delete it")
        sessions = old.get("sessions", [])
    if config.threads:
        timing.fix_threads(config.threads)
    env = timing.environment_fingerprint(device)
    sessions.append({"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "environment": env})
    write_json(meta_path, {**identity, "environment": env, "sessions": sessions,
                           "sampling": dataclasses.asdict(config.sampling()),
                           "policy": repr(config.make_policy()) if config.method == "spade" else None,
                           "device": str(device), "dtype": config.dtype,
                           "seeds": "generation_seed(config.seed, question_id, sample) = "
                                    "sha256('seed:question_id:sample')[:8] little-endian >> 1"})

    rows = suite.rows
    todo = [r for r in rows if not (resume and _shard_done(trace_dir / f"{r['question_id']}.parquet"))]
    if todo:
        generator = make_generator(pair, config)
        first = prompt_ids(pair.tokenizer, rows[0]["turns"][0], config)
        for w in range(config.warmup):
            generator.timed(first, config.max_new_tokens, generation_seed(config.seed, "warmup", w))
        bar = _progress(todo, progress, f"{pair.name}/{suite.name} {config.label}")
        for row in bar:
            shard = trace_dir / f"{row['question_id']}.parquet"
            ids = prompt_ids(pair.tokenizer, row["turns"][0], config)
            records, summaries = [], []
            for sample in range(config.n_samples):
                seed = generation_seed(config.seed, row["question_id"], sample)
                gen, t = timed_generation(generator, ids, config, seed, device)
                for r in gen.records:
                    records.append({"prompt_id": str(row["question_id"]), "category": row["category"],
                                    "sample": sample, **r})
                summaries.append(_summary_row(row, sample, seed, ids, gen, t))
            trace.write_shard(records, shard, {**identity, "summary": summaries})
            if on_shard is not None:
                on_shard(shard)
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


def _progress(items, enabled: bool, desc: str):
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="prompt", leave=False)


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
