"""One timing protocol for every wall-clock number: methods interleaved per prompt, one shared baseline.

Timing all of method A, then all of B turns the machine's speed drift into a fake speedup, so :func:`run_interleaved`
times every configuration of a *session* on the same prompt, one after the other, before the next prompt:

1. **Warm-up** (``Protocol.warmup`` untimed runs each on the first prompt, ``<= warmup_tokens``), then per prompt and
   sample ``Protocol.repeats`` (>= 3) **rounds**, each configuration once, order rotated; ``wall_time``: their median.
2. **Stalls re-timed** (:class:`spade_lib.runs.timing.StallRule`): a reading above ``median + max(5 scaled MADs, 0.5
   median)`` s/token of its configuration's session readings (once ``min_reference`` exist) is re-timed up to
   ``max_retimes``; the first non-stall replaces it (all stalls: median of all). Rows: ``stalls``, ``stall_readings``.
3. **Physical controls** per *block* (a prompt and sample, all rounds; ``Protocol.pauses``, math in
   :class:`spade_lib.runs.timing.PauseRule`): ``prefill <= wall``, no clock jump between readings, no reading far past
   its rounds' robust spread. A failing block is re-timed whole up to ``max_retimes``, then its rows get ``priced =
   False`` and :func:`speedup_table` drops it for the session's runs (as rows with ``prefill_time > wall_time``, own or
   baseline's); ``prefill_time`` = median of kept prefills; token counts unlike the baseline's are flagged. Events:
   :func:`spade_lib.runs.controls.reading_warnings` (``physical control: <pair>/<run>: prompt <id> (sample <s>): ...``,
   at session end), ``reading_controls`` a row, ``metadata.json``: ``controls`` (:func:`session_controls`), ``stalls``.
4. **One baseline per session** (AR), re-timed in every session (an existing run's folder untouched). Rows carry
   ``session`` and, per member (config hash), ``session_wall_time``, ``session_wall_times`` (rounds),
   ``session_new_tokens``, ``session_prefill_time`` (``None``: hidden); :func:`paired_baseline` rebuilds a run's
   baseline from them (one speedup wherever read); :func:`speedup_table`: both estimators, bootstrap intervals
   (:func:`spade_lib.runs.metrics.bootstrap_speedup`: prompts, then rounds resampled), disagreement flagged.

Run folders: :func:`spade_lib.runs.store.run_dir_for`; records per ``Protocol.records``. ``RunConfig.repeats`` /
``.warmup`` take the protocol's (run identity) and ``device="auto"`` resolves at creation: one request, one run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from spade_lib import devices, paths

from spade_lib.runs import controls, metrics, timing, trace
from spade_lib.runs.config import RunConfig, check_pair_placement, generation_seed, prompt_ids
from spade_lib.runs.methods import RECORDS, Generator, make_generator, timed_generation
from spade_lib.runs.store import (check_existing, read_summary, run_dir_for, run_identity, shard_done, shard_path,
                                  suite_key, summary_row, write_summary)
from spade_lib.io import write_json


@dataclass(frozen=True)
class Protocol:
    """How every wall-clock number is taken (see the module docstring)."""

    warmup: int = 1        # untimed generations per configuration before the first timed one
    repeats: int = 3       # timed rounds per (prompt, sample); the median is kept
    warmup_tokens: int = 16  # new tokens of each warm-up generation at most (0: the run's max_new_tokens)
    records: str = "separate"  # SPADE's token records: an untimed pass, or "timed" (spade_lib.runs.methods)
    stalls: timing.StallRule = timing.StallRule()  # which timed readings are stalls, re-timed (module docstring, 2b)
    pauses: timing.PauseRule = timing.PauseRule()  # the physical controls of every block of readings (2c)

    def __post_init__(self) -> None:
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0, got {self.warmup!r}")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"repeats must be an integer >= 1, got {self.repeats!r}")
        if isinstance(self.warmup_tokens, bool) or not isinstance(self.warmup_tokens, int) or self.warmup_tokens < 0:
            raise ValueError(f"warmup_tokens must be an integer >= 0, got {self.warmup_tokens!r}")
        if self.records not in RECORDS:
            raise ValueError(f"records must be one of {RECORDS}, got {self.records!r}")
        if not isinstance(self.stalls, timing.StallRule):
            raise ValueError(f"stalls: must be a spade_lib.runs.timing.StallRule, got {self.stalls!r}")
        if not isinstance(self.pauses, timing.PauseRule):
            raise ValueError(f"pauses: must be a spade_lib.runs.timing.PauseRule, got {self.pauses!r}")

    def config(self, config: RunConfig) -> RunConfig:
        """``config`` with this protocol's warm-up and repeats (both are part of its identity)."""
        if not isinstance(config, RunConfig):
            raise TypeError(f"config must be a RunConfig, got {type(config).__name__}")
        return dataclasses.replace(config, warmup=self.warmup, repeats=self.repeats)


def _finished(run_dir: Path, suite) -> bool:
    if not (run_dir / "summary.jsonl").is_file():
        return False
    return all(shard_path(run_dir, r["question_id"]).is_file() for r in suite.rows)


def _session_id(configs: Sequence[RunConfig]) -> str:
    return hashlib.sha256(" ".join(sorted(c.hash for c in configs)).encode()).hexdigest()[:12]


def _open_run(pair, suite, config: RunConfig, run_dir: Path, device, session: str, records: str) -> dict:
    """Write (or extend) ``metadata.json`` as :func:`spade_lib.runs.runner.run_suite` does; return the run identity."""
    identity = run_identity(pair, suite, config)
    meta_path = run_dir / "metadata.json"
    sessions = []
    if run_dir.is_dir():
        check_existing(run_dir, identity)  # metadata or any shard of another run: refused
    if meta_path.is_file():
        sessions = json.loads(meta_path.read_text(encoding="utf-8")).get("sessions", [])
    env = timing.environment_fingerprint(device)
    sessions.append({"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "environment": env,
                     "protocol_session": session, "linear_kernels": timing.kernel_plans(),
                     "prepared": getattr(pair, "prepared", []),
                     "records": records})
    write_json(meta_path, {**identity, "environment": env, "sessions": sessions,
                           "sampling": dataclasses.asdict(config.sampling()),
                           "policy": repr(config.make_policy()) if config.method == "spade" else None,
                           "device": str(device), "dtype": config.dtype, "protocol": "interleaved"})
    return identity


def _replayer(outputs: list, generator: Generator, records: bool) -> Generator:
    """``generator`` whose timed calls return already-timed outputs (for timed_generation's checks);
    without ``records``, without its recorded pass."""
    it = iter(outputs)
    return Generator(lambda ids, n, seed: next(it), generator.recorded if records else None, generator.token_records)


def run_interleaved(pair, suite, configs: Iterable[RunConfig], baseline: RunConfig, *,
                    protocol: Protocol = Protocol(), resume: bool = True, progress: bool = True
                    ) -> dict[RunConfig, Path]:
    """Run ``configs`` and ``baseline`` under ``protocol``; return ``{config: run folder}``.

    Keys are the configurations as run (``protocol.config(c)``), in the order given, baseline first.
    Finished runs (``resume=True``) are read back; the others are timed in one interleaved session
    with the baseline (re-timed if its run is already finished, see the module docstring).
    """
    base = protocol.config(baseline)
    wanted = [base] + [protocol.config(c) for c in configs]
    wanted = list(dict.fromkeys(wanted))
    if not suite.rows:
        raise ValueError(f"suite {suite.name!r} has no prompts")
    if len({(c.n_samples, c.seed, c.max_new_tokens) for c in wanted}) != 1:
        raise ValueError("configs: every configuration of a session needs the same n_samples, seed and "
                         "max_new_tokens (the generations are paired)")
    key = suite_key(suite)
    dirs = {c: run_dir_for(pair.name, key, c) for c in wanted}
    todo = [c for c in wanted if not (resume and _finished(dirs[c], suite))]
    if not todo:
        return dirs
    session = todo if base in todo else [base, *todo]
    sid = _session_id(session)
    device = None
    for c in session:
        device = check_pair_placement(pair, c)
    if session[0].threads:
        timing.fix_threads(session[0].threads)
    generators = {c: make_generator(pair, c, protocol.records) for c in session}  # first: their kernels are then chosen
    identities = {c: _open_run(pair, suite, c, dirs[c], device, sid, protocol.records) for c in todo}
    for c in todo:
        paths.ensure_dir(dirs[c] / "trace")
    first = suite.rows[0]["turns"][0]
    for w in range(protocol.warmup):
        for c in session:
            n_warm = min(c.max_new_tokens, protocol.warmup_tokens) if protocol.warmup_tokens > 0 else c.max_new_tokens
            generators[c].timed(prompt_ids(pair.tokenizer, first, c), n_warm, generation_seed(c.seed, "warmup", w))
    rows = suite.rows
    if progress:
        from tqdm import tqdm

        rows = tqdm(rows, desc=f"{pair.name}/{suite.name} {len(session)} configs interleaved", unit="prompt",
                    leave=False)
    n_samples, seed0, n_new = session[0].n_samples, session[0].seed, session[0].max_new_tokens
    rule, pause = protocol.stalls, protocol.pauses
    pool: dict[RunConfig, list[float]] = {c: [] for c in session}  # seconds per token of every clean reading
    spread: dict[RunConfig, list[float]] = {c: [] for c in session}  # log-deviations of clean rounds (2c)
    pending: list[dict] = []  # prompts timed, not yet judged for stalls (too few readings) nor written
    log: list[dict] = []      # every stalled reading: prompt, sample, config, round, seconds, re-timings
    events: list[dict] = []   # every reading control broken (2c): controls.reading_warnings prints them

    def time_one(c, ids_c, seed, spans=None):
        t0 = devices.clock(device)
        g = generators[c].timed(ids_c, n_new, seed)
        t1 = devices.clock(device)
        if spans is not None:  # where the reading lies on the session's clock
            spans.append((t0, t1))
        return t1 - t0 - g.untimed, g  # minus its instrumentation

    def block_events(row, sample, times, outputs, order, spans):
        """The reading controls (2c) a block breaks: prefill > wall, a gap in the clock, a paused round."""
        where = {"question_id": row["question_id"], "sample": sample}
        found = []
        for c in session:
            limit = pause.round_limit(spread[c])
            paused = timing.paused_rounds(times[c], limit, pause.gap)
            for k, (t, g) in enumerate(zip(times[c], outputs[c])):
                if timing.impossible_prefill(g.prefill, t, pause.slack):
                    found.append({**where, "control": "prefill", "label": c.label, "hash": c.hash, "round": k,
                                  "prefill": float(g.prefill), "seconds": t})
                if paused[k]:
                    found.append({**where, "control": "round", "label": c.label, "hash": c.hash, "round": k,
                                  "seconds": t, "median": float(np.median(np.delete(times[c], k))), "limit": limit})
        for j, jump in timing.clock_gaps(spans, pause.gap):
            (c, k), (before, _) = order[j], order[j - 1]
            found.append({**where, "control": "gap", "label": c.label, "hash": c.hash, "round": k,
                          "seconds": jump, "after": before.label})
        return found

    def time_block(i, row, ids, sample, seed):
        """Every member's rounds of one prompt and sample, interleaved, timed again while they break a reading
        control (2c): the sample's entry, ``priced`` False where every timing of it broke one."""
        for attempt in range(pause.max_retimes + 1):
            times = {c: [] for c in session}
            outputs = {c: [] for c in session}
            order, spans = [], []
            for rep in range(protocol.repeats):
                k = (i + sample + rep) % len(session)
                for c in session[k:] + session[:k]:
                    t, g = time_one(c, ids[c], seed, spans)
                    times[c].append(t)
                    outputs[c].append(g)
                    order.append((c, rep))
            found = block_events(row, sample, times, outputs, order, spans)
            for e in found:
                e.update(attempt=attempt, action="dropped" if attempt == pause.max_retimes else "retimed")
            events.extend(found)
            if not found:
                break
        priced = not found
        if priced:  # only clean readings set what the next ones are judged against
            for c in session:
                pool[c].extend(t / max(1, len(g.output_ids)) for t, g in zip(times[c], outputs[c]))
                spread[c].extend(timing.round_deviations(times[c]).tolist())
        mine = [e for e in events if (e["question_id"], e["sample"]) == (row["question_id"], sample)]
        return {"sample": sample, "seed": seed, "times": times, "outputs": outputs,
                "stalls": {c: [] for c in session}, "priced": priced, "controls": mine}

    def judge(p):
        """Re-time the stalled readings of prompt ``p`` (module docstring, 2b), in place."""
        for smp in p["samples"]:
            if not smp["priced"]:  # dropped by the reading controls (2c): reported, never priced
                continue
            for c in session:
                limit = rule.threshold(pool[c])
                for k, (t, g) in enumerate(zip(smp["times"][c], smp["outputs"][c])):
                    n = max(1, len(g.output_ids))
                    if not t / n > limit:
                        continue
                    readings, outs, kept = [], [], None
                    for _ in range(rule.max_retimes):
                        t2, g2 = time_one(c, p["ids"][c], smp["seed"])
                        if g2.output_ids != g.output_ids:
                            raise RuntimeError(f"seed {smp['seed']}: a re-timed generation differs from the first; "
                                               "decoding is not deterministic here")
                        readings.append(t2)
                        if timing.impossible_prefill(g2.prefill, t2, pause.slack):
                            continue  # an impossible re-timing is never kept (2c)
                        outs.append((t2, g2))
                        if not t2 / n > limit:
                            kept, smp["outputs"][c][k] = t2, g2
                            break
                    if kept is None and readings:  # slow every time: the prompt's own cost, not a stall;
                        # the median reading with its own output, so the prefill kept lies inside the time kept
                        kept, smp["outputs"][c][k] = sorted([(t, g), *outs], key=lambda x: x[0])[len(outs) // 2]
                    if kept is not None:
                        smp["times"][c][k] = kept
                    smp["stalls"][c].append(t)
                    log.append({"question_id": p["row"]["question_id"], "sample": smp["sample"], "config": c.label,
                                "hash": c.hash, "round": k, "seconds": t, "limit_per_token": limit,
                                "retimes": readings, "kept": kept if kept is not None else t,
                                "persistent": bool(readings) and not any(r / n <= limit for r in readings)})

    def write(p):
        row, need = p["row"], p["need"]
        records = {c: [] for c in need}
        summaries = {c: [] for c in need}
        for smp in p["samples"]:
            sample, seed, times, outputs = smp["sample"], smp["seed"], smp["times"], smp["outputs"]
            medians = {c: timing.summarize_times(times[c]) for c in session}
            checked = {}
            for c in session:  # token checks of every member; records (off the clock) of the written runs
                gen, _ = timed_generation(_replayer(outputs[c], generators[c], c in need), p["ids"][c], c, seed,
                                          device, records=c in need)
                checked[c] = gen
            for c in (m for m in session if m != base):  # tokens counted on both sides (2c): the same work, or the pairing is flagged
                n_c, n_b = len(checked[c].output_ids), len(checked[base].output_ids)
                if n_c != n_b:
                    e = {"question_id": row["question_id"], "sample": sample, "control": "tokens", "label": c.label,
                         "hash": c.hash, "tokens": n_c, "baseline": base.label, "baseline_tokens": n_b,
                         "action": "flagged"}
                    events.append(e)
                    smp["controls"].append(e)
            partners_t = {c.hash: medians[c].median for c in session}
            partners_rounds = {c.hash: list(medians[c].times) for c in session}
            partners_n = {c.hash: len(checked[c].output_ids) for c in session}
            # the median of the readings' own prefills: each lies inside its reading, so it lies inside wall_time (2c)
            partners_p = {c.hash: _median_prefill(outputs[c]) for c in session}
            said = controls.reading_warnings(smp["controls"], pair=pair.name)
            for c in need:
                gen = checked[c]
                for r in gen.records:
                    records[c].append({"prompt_id": str(row["question_id"]), "category": row["category"],
                                       "sample": sample, **r})
                s = summary_row(row, sample, seed, p["ids"][c], gen, medians[c])
                s.update(session=sid, session_wall_time=partners_t, session_wall_times=partners_rounds,
                         session_new_tokens=partners_n, session_prefill_time=partners_p,
                         prefill_time=partners_p[c.hash], stalls=len(smp["stalls"][c]),
                         stall_readings=list(smp["stalls"][c]), priced=smp["priced"], reading_controls=said)
                summaries[c].append(s)
        for c in need:
            trace.write_shard(records[c], p["shards"][c], {**identities[c], "summary": summaries[c]})

    def flush():
        for p in pending:
            judge(p)
            write(p)
        pending.clear()

    for i, row in enumerate(rows):
        shards = {c: shard_path(dirs[c], row["question_id"]) for c in todo}
        need = [c for c in todo if not (resume and shard_done(shards[c], identities[c]))]
        if not need:
            continue
        ids = {c: prompt_ids(pair.tokenizer, row["turns"][0], c) for c in session}
        samples = [time_block(i, row, ids, sample, generation_seed(seed0, row["question_id"], sample))
                   for sample in range(n_samples)]
        pending.append({"row": row, "shards": shards, "need": need, "ids": ids, "samples": samples})
        if min(len(v) for v in pool.values()) >= rule.min_reference:
            flush()
    flush()
    _record_stalls(dirs, todo, log, rule, sid, events, pause)
    if log:  # always said, bars or not: a re-timed reading is part of how the numbers were taken
        print(stall_summary(log))
    for line in controls.reading_warnings(events, pair=pair.name):  # each once, here: the session owns them
        print(line)
    for c in todo:
        write_summary(dirs[c], suite)
    return dirs


def stall_summary(log: list[dict]) -> str:
    """One line on a session's stalled readings (the ``stalls`` entries of :func:`run_interleaved`)."""
    if not log:
        return "timing: no stalled reading"
    persistent = sum(e["persistent"] for e in log)
    where = ", ".join(f"{e['config']} on {e['question_id']} ({e['seconds']:.3f} s -> {e['kept']:.3f} s)" for e in log[:8])
    return (f"timing: {len(log)} stalled reading(s) re-timed ({persistent} slow on every re-timing, kept as the "
            f"median of its readings): {where}" + (" ..." if len(log) > 8 else ""))


def _median_prefill(outputs) -> float | None:
    """The median of the readings' prefills (``None`` where the method hides them)."""
    p = [g.prefill for g in outputs]
    return float(np.median(p)) if p and all(math.isfinite(x) for x in p) else None


def _record_stalls(dirs: dict, todo: list[RunConfig], log: list[dict], rule, sid: str, events: list[dict],
                   pause: timing.PauseRule) -> None:
    """The session's stall report in each written run's ``metadata.json`` (its last session entry): the rule,
    the readings re-timed (every member's: a baseline stall changes the runs' ratios too), their prompts;
    and its reading controls (2c): the rule, every event, the generations dropped."""
    report = {"rule": dataclasses.asdict(rule), "count": len(log), "persistent": sum(e["persistent"] for e in log),
              "prompts": sorted({str(e["question_id"]) for e in log}), "readings": log}
    dropped = sorted({(str(e["question_id"]), e["sample"]) for e in events if e["action"] == "dropped"})
    checked = {"rule": dataclasses.asdict(pause), "count": len(events), "dropped": [list(d) for d in dropped],
               "prompts": sorted({str(e["question_id"]) for e in events}), "events": events}
    for c in todo:
        meta_path = dirs[c] / "metadata.json"
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        sessions = meta.get("sessions") or []
        if sessions and sessions[-1].get("protocol_session") == sid:
            sessions[-1]["stalls"] = report
            sessions[-1]["controls"] = checked
            write_json(meta_path, meta)


def session_stalls(run_dir: str | Path) -> list[dict]:
    """The stall report of every session of a run (``metadata.json``; sessions timed before stalls were
    detected have none and are left out)."""
    meta = json.loads((Path(run_dir) / "metadata.json").read_text(encoding="utf-8"))
    return [s["stalls"] for s in meta.get("sessions") or [] if isinstance(s.get("stalls"), dict)]


def session_controls(run_dir: str | Path) -> list[dict]:
    """The reading controls' report (2c) of every session of a run (``metadata.json``; sessions timed before
    those controls have none and are left out)."""
    meta = json.loads((Path(run_dir) / "metadata.json").read_text(encoding="utf-8"))
    return [s["controls"] for s in meta.get("sessions") or [] if isinstance(s.get("controls"), dict)]


def interleaved_with(summary: pd.DataFrame, baseline: RunConfig) -> bool:
    """Whether every row of ``summary`` holds ``baseline``'s times (the two were timed in one session)."""
    return "session_wall_time" in summary.columns and bool(
        summary["session_wall_time"].map(lambda d: isinstance(d, dict) and baseline.hash in d).all())


def paired_baseline(summary: pd.DataFrame, baseline: RunConfig,
                    baseline_summary: pd.DataFrame | None = None) -> tuple[pd.DataFrame, bool]:
    """The baseline generations ``summary``'s run was timed with: ``(frame, interleaved)``.

    From the run's own ``session_*`` columns when every row holds ``baseline``'s times
    (``interleaved=True``; with the baseline's per-round ``wall_times`` when the rows hold them, and its
    ``prefill_time`` from the rows' ``session_prefill_time`` (runs timed before it: ``baseline_summary``'s
    rows of the same session, where they are there), so a prediction can add the
    prefills the measured ratio holds: without them every prediction was the decode steps' alone, ~20 % of
    the AR time on both pairs' make runs, and missed its control by up to a fifth);
    otherwise ``baseline_summary`` (a separately timed run,
    ``interleaved=False``: its speedup mixes two moments of the machine)."""
    h = baseline.hash
    if interleaved_with(summary, baseline):
        frame = summary[["question_id", "category", "sample"]].copy()
        frame["wall_time"] = summary["session_wall_time"].map(lambda d: d[h]).astype(float)
        frame["new_tokens"] = summary["session_new_tokens"].map(lambda d: d[h]).astype(int)
        # per-round times and prefills: the session's columns; runs written before those columns existed: the
        # baseline's own rows of the same session, where it has them (never another session's)
        for col, present, conv in (("wall_times", lambda x: isinstance(x, list), list),
                                   ("prefill_time", pd.notna, float)):
            got = _from_session(summary, h, f"session_{col}")
            if got is None:
                got = _from_own_rows(frame, summary, baseline_summary, col, present)
            if got is not None:
                frame[col] = pd.Series(list(got), index=frame.index).map(conv)
        return frame, True
    if baseline_summary is None:
        raise ValueError(f"summary: its rows hold no times of baseline {baseline.label} and no "
                         "baseline_summary was given")
    return baseline_summary, False


def _from_session(summary: pd.DataFrame, h: str, col: str) -> pd.Series | None:
    """Config ``h``'s entry of the session column ``col`` on every row, or ``None`` where a row lacks it."""
    if col in summary.columns and summary[col].map(lambda d: isinstance(d, dict) and d.get(h) is not None).all():
        return summary[col].map(lambda d: d[h])
    return None


def _from_own_rows(frame: pd.DataFrame, summary: pd.DataFrame, baseline_summary: pd.DataFrame | None, col: str,
                   present) -> list | None:
    """``baseline_summary``'s ``col`` for ``frame``'s generations, from its rows of the same session as
    ``summary``'s, or ``None`` unless every generation has one (``present``)."""
    keys = ["question_id", "sample", "session"]
    if (baseline_summary is None or "session" not in summary.columns
            or not {"session", col} <= set(baseline_summary.columns)):
        return None
    own = baseline_summary[keys + [col]].drop_duplicates(keys, keep="last")
    merged = frame.assign(session=summary["session"].to_numpy()).merge(own, on=keys, how="left")
    if len(merged) == len(frame) and merged[col].map(present).all():
        return merged[col].tolist()
    return None


def speedup_table(run_dirs: dict[RunConfig, Path], baseline: RunConfig, *,
                  protocol: Protocol = Protocol(), by: str | None = None, traces: dict | None = None,
                  costs: dict[str, dict] | None = None) -> pd.DataFrame:
    """One row per run (per run and ``by`` group, e.g. ``"category"``): its
    :func:`spade_lib.runs.metrics.run_metrics` against the baseline it was interleaved with (bootstrap
    intervals, predictions with measured ``c`` and ``r``), plus ``interleaved``. ``costs`` (draft name ->
    :func:`spade_lib.runs.costs.pair_costs` entry) prices the predictions of SPADE runs with those
    micro-benchmarked costs (and the pair's loop overhead) instead of the runs' step timings, each chain
    run's verification and loop cost **at its session's level** where its session partners allow
    (:func:`loop_priced`; ``r_source`` ``"loop"``, else ``"table"``, ``""`` without costs).
    ``physical_control`` holds the physical controls of the row (:func:`spade_lib.runs.controls.speedup_warnings`
    with ``model=False``; empty when the physics holds), ``model_control`` the two-sided cost-model control
    (:func:`spade_lib.runs.controls.prediction_warnings`: the prediction outside the measured interval).
    Generations the reading controls dropped (module docstring, 2c: ``priced`` False, or a prefill beyond its
    wall time on either side) are left out of everything the row prices (:func:`priced_generations`):
    ``unpriced`` counts them, ``reading_control`` says why (the session printed it when it was timed)."""
    base = protocol.config(baseline)
    base_summary = read_summary(run_dirs[base]) if base in run_dirs else None
    read, left_out = {}, {}
    for cfg, d in run_dirs.items():
        summ = read_summary(d)
        tr = traces[cfg] if traces is not None and cfg in traces else trace.read_trace(d)
        b, interleaved = paired_baseline(summ, base, base_summary)
        summ, tr, b, left_out[cfg] = priced_generations(summ, tr, b, label=cfg.label)
        read[cfg] = (summ, tr, b, interleaved)
    rows = []
    for cfg, (summ, tr, b, interleaved) in read.items():
        table_c = (costs or {}).get(cfg.draft) if cfg.method == "spade" else None
        table_c, r_source = loop_priced(cfg, table_c, read) if table_c is not None else (None, "")
        groups = [(None, summ, tr, b)] if by is None else [
            (k, summ[summ[by] == k], tr[tr[by] == k] if len(tr) else tr, b[b[by] == k])
            for k in dict.fromkeys(summ[by])]
        for key, s_k, t_k, b_k in groups:
            m = metrics.run_metrics(t_k, s_k, b_k, gamma=cfg.gamma if cfg.method == "spade" else None,
                                    costs=table_c)
            row = {"config": cfg, "label": cfg.label, "method": cfg.method,
                   "draft": cfg.draft if cfg.method in ("spade", "hf_assisted") else "-",
                   "policy": cfg.policy if cfg.method == "spade" else "-",
                   "gamma": cfg.gamma if cfg.method in ("spade", "hf_assisted") else 0,
                   "T": cfg.temperature, "interleaved": interleaved, "r_source": r_source,
                   "loop_level": table_c.get("loop_level", float("nan")) if table_c else float("nan"),
                   "loop_partners": len(table_c.get("loop_partners", [])) if table_c else 0,
                   "unpriced": len(left_out[cfg]), "reading_control": "; ".join(left_out[cfg].values())}
            if by is not None:
                row[by] = key
            rows.append({**row, **m})
    table = pd.DataFrame(rows)
    # physics before ratios (spade_lib.runs.controls): a speculative speedup above tau, or a null draft
    # faster than AR, is a defect of the baseline; the column names it for every row that shows one
    table["physical_control"] = ["; ".join(controls.speedup_warnings(table.loc[[i]], model=False))
                                 for i in table.index] if len(table) else []
    # the cost model, two-sided (controls (d)): measured vs predicted beyond the interval; no defect
    table["model_control"] = ["; ".join(controls.prediction_warnings(table.loc[[i]])) for i in table.index] \
        if len(table) else []
    return table


def priced_generations(summary: pd.DataFrame, trace_frame: pd.DataFrame, baseline: pd.DataFrame, *, label: str = "",
                       slack: float = timing.PauseRule().slack
                       ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[tuple, str]]:
    """``(summary, trace, baseline, left_out)`` without the generations no speedup may price (module docstring,
    2c): those the session dropped (``priced`` False, on the run's rows), and those whose ``prefill_time``
    exceeds their ``wall_time`` by more than ``slack``, the run's own or its paired ``baseline``'s (rows read back
    from sessions timed before the controls, whose prefill was one pass's). The same generations leave all
    three frames, so the speedup's interval, its prediction and the loop levels a partner is priced with stay
    paired. ``left_out``: ``{(question_id, sample): why}``. A run left with no generation is refused."""
    why: dict[tuple, str] = {}
    if "priced" in summary.columns:
        said = summary["reading_controls"] if "reading_controls" in summary.columns else [None] * len(summary)
        for q, smp, priced, lines in zip(summary["question_id"], summary["sample"], summary["priced"], said):
            if priced is False or priced == 0:
                why[(q, smp)] = ("; ".join(lines) if isinstance(lines, list) and lines
                                 else "dropped by the session's reading controls")
    for side, frame in (("its", summary), ("its baseline's", baseline)):
        if not {"prefill_time", "wall_time"} <= set(frame.columns):
            continue
        pre = pd.to_numeric(frame["prefill_time"], errors="coerce").to_numpy(np.float64)
        wall = frame["wall_time"].to_numpy(np.float64)
        for q, smp, p, t in zip(frame["question_id"], frame["sample"], pre, wall):
            if timing.impossible_prefill(p, t, slack):
                why.setdefault((q, smp), f"{controls.PREFIX}: {label or 'run'}: prompt {q} (sample {smp}): {side} "
                                         f"prefill {p:.3f} s exceeds {side} wall time {t:.3f} s, inside which it "
                                         "was timed; the generation is not priced")
    if not why:
        return summary, trace_frame, baseline, why
    if len(why) >= len(summary):
        raise ValueError(f"run {label or '?'}: every generation broke a reading control, none can be priced: "
                         + "; ".join(list(why.values())[:3]))
    gone = {(str(q), int(smp)) for q, smp in why}

    def keep(frame, qid="question_id"):
        if not len(frame) or qid not in frame.columns:
            return frame
        return frame[[(str(q), int(smp)) not in gone for q, smp in zip(frame[qid], frame["sample"])]]

    return keep(summary), keep(trace_frame, "prompt_id"), keep(baseline), why


MIN_LOOP_STEPS = 20  # partner steps (drafting >= 1 token) that loop_priced needs, else the table prices alone


def _session_of(summary: pd.DataFrame) -> str | None:
    if "session" not in summary.columns or summary["session"].nunique(dropna=False) != 1:
        return None
    return summary["session"].iloc[0]


def loop_priced(cfg: RunConfig, table: dict, read: dict) -> tuple[dict, str]:
    """``(costs, r_source)``: ``table`` (the draft's cost table) at the level the verification ran at in
    ``cfg``'s session, measured in the loops of its **partners** (every other chain SPADE run of the same
    session and temperature in ``read``, ``{config: (summary, trace, paired baseline, interleaved)}``),
    never in ``cfg``'s own steps, so each run, the null-draft control too, is predicted from what others paid:

    - ``k = sum_s t_verify_s / (t_AR sum_s r(g_s))`` over the partners' steps that drafted ``g_s >= 1``
      (:func:`spade_lib.runs.metrics.loop_costs`: ``t_AR`` the session's AR seconds per decode step,
      ``r`` the table's): the loop's verification over the micro-benchmark's, and the priced ``r(g)`` is
      ``k r(g)`` (the table's curve, at the session's level);
    - ``o = sum_s t_overhead_s / (t_AR n_steps)``: the loop's bookkeeping per step beyond its forwards,
      as the partners' loops paid it (it replaces the table's ``overhead``, which was set against the
      micro-benchmark's ``r(1)``); ``c`` stays the table's (a property of the draft).

    Why: a cost table is measured once, in another process, minutes from the session, on a shared host whose
    ``r(4)`` moved 1.30-1.51 (SmolLM2) between such measurements, and a micro-benchmark timed inside the
    session missed the loops' verification by 4-16 % (bursts of one forward are not the loop), while a
    session's speedup interval is +-3-5 %; the partners' steps are the same forwards on the same machine in
    the same minutes. With fewer than :data:`MIN_LOOP_STEPS` partner steps (a session with one SPADE run,
    trees, runs without step times or prefills) the table prices alone (``"table"``). The table's own
    ``r`` and ``overhead`` are kept as ``r_table`` / ``overhead_table``; ``loop_level`` is ``k``,
    ``loop_partners`` their labels."""
    from spade_lib.decoding.studies.costs import verify_cost_fn

    summ = read[cfg][0]
    sid = _session_of(summ)
    if cfg.method != "spade" or cfg.tree or sid is None:
        return table, "table"
    r_fn = verify_cost_fn(table)
    got, partners = [], []
    for other, (s_o, t_o, b_o, inter_o) in read.items():
        if (other == cfg or other.method != "spade" or other.tree or not inter_o or other.temperature != cfg.temperature
                or _session_of(s_o) != sid):
            continue
        lc = metrics.loop_costs(t_o, b_o, r_fn)
        if lc is not None:
            got.append(lc)
            partners.append(other.label)
    n = sum(x["steps"] for x in got)
    if n < MIN_LOOP_STEPS:
        return table, "table"
    k = sum(x["verify"] for x in got) / sum(x["table"] for x in got)
    o = sum(x["rest"] for x in got) / n
    return {**table, "r": {g: k * float(v) for g, v in table["r"].items()}, "overhead": o,
            "r_table": dict(table["r"]), "overhead_table": table.get("overhead"), "loop_level": k,
            "loop_partners": partners, "loop_steps": n}, "loop"


def speedup_over(run_dir: Path, other: RunConfig, *, protocol: Protocol = Protocol()) -> dict:
    """:func:`spade_lib.runs.metrics.bootstrap_speedup` of a run over another member of its session
    (e.g. HF assisted generation over plain HF generate)."""
    summ = read_summary(run_dir)
    b, _ = paired_baseline(summ, protocol.config(other))
    summ, _, b, _ = priced_generations(summ, pd.DataFrame(), b)
    return metrics.bootstrap_speedup(summ, b)
