"""Spec-Bench answer files, both ways: SPADE runs out, any Spec-Bench method's answers in.

Spec-Bench (Xia et al., 2024) has every method write one JSON line per question (``evaluation/eval.py``)::

    {"question_id": 81, "category": "writing", "answer_id": "<22 chars>", "model_id": "...", "tstamp": 1712345678.9,
     "choices": [{"index": 0, "turns": ["text of turn 1", ...], "decoding_steps": [s1, ...],
                  "new_tokens": [n1, ...], "wall_time": [t1, ...], "accept_lengths": [l, l, ...]}]}

``turns``, ``decoding_steps``, ``new_tokens``, ``wall_time``: one entry per turn; ``accept_lengths``: one per
verification step of all turns, the tokens it emitted (``n + 1`` for ``n`` accepted drafts; 1 for AR decoding).
**speed.py's arithmetic** (``evaluation/speed.py``; per subtask: a category, ``mt_bench`` = the eight MT-bench
categories, ``overall`` = all; over ``choices[0]``): ``tau = mean(accept_lengths)`` pooled over all steps of all
answers; per answer ``g``, ``tps_g = sum(new_tokens) / sum(wall_time)`` for the method and
``tps0_g = T_g / sum(wall_time)`` for the baseline, ``T_g = sum over turns of len(tokenizer(turn).input_ids) - 1``
(re-tokenised, minus the Llama BOS); ``speedup = mean_g(tps_g) / mean_g(tps0_g)``, neither SPADE's ratio of totals
(``metrics.speedup_ratio_of_totals``) nor its mean of ratios (``metrics.speedup_mean_of_ratios``).

**Export** (:func:`write_specbench_answers`): one line per prompt of a SPADE run, one choice per sample
(``index = sample``), one list entry per choice (first turn only). ``turns`` is the decoded continuation exactly as
``summary.jsonl`` holds it (special tokens kept), so re-tokenising it counts the emitted tokens when the tokenizer
round-trips (sampled text from a weak model often does not: then speed.py's baseline count differs from
``new_tokens``). An ``"ar"`` run's file is the baseline file (``accept_lengths`` all 1). **Import**
(:func:`read_specbench_answers`): per-category tau, throughput, all three speedups, accepted-length distribution;
answer files carry no token-level trace, so per-position acceptance, entropies and calibration need a SPADE run.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spade_lib import measures
from spade_lib.bench.sources import MT_BENCH_CATEGORIES
from spade_lib.io import write_text
from spade_lib.runs import trace
from spade_lib.runs.config import RunConfig
from spade_lib.runs.store import read_summary

ANSWER_KEYS = ("question_id", "category", "answer_id", "model_id", "choices", "tstamp")
CHOICE_KEYS = ("index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths")
PER_TURN_KEYS = ("turns", "new_tokens", "wall_time")
MT_BENCH = "mt_bench"
OVERALL = "overall"
NO_TRACE_NOTE = ("Spec-Bench answer files hold per-turn totals and per-step accepted lengths only: no "
                 "token-level trace (no drafted tokens, p, q, positions or step timings), so per-position "
                 "acceptance, entropies and calibration need a SPADE run.")


# ---------------------------------------------------------------- export

def _answer_id(config_hash: str, question_id: Any) -> str:
    """A deterministic stand-in for Spec-Bench's random ``shortuuid`` (22 characters)."""
    return hashlib.sha256(f"{config_hash}:{question_id}".encode()).hexdigest()[:22]


def _timestamp(meta: dict) -> float:
    sessions = meta.get("sessions") or []
    started = sessions[-1].get("started") if sessions else None
    return datetime.fromisoformat(started).timestamp() if started else 0.0


def model_id_for(meta: dict) -> str:
    """Spec-Bench-style model id of a run: ``<pair>-<config label>-<dtype>``, e.g.
    ``tiny-spade-distilled-g4-T0-float32`` or ``tiny-ar-T0-float32`` (the baseline)."""
    pair = meta["pair"]["name"].replace("/", "--")
    try:
        config = RunConfig(**meta["config"])
    except (TypeError, ValueError):  # a run written by another SPADE version: fall back to its hash
        return f"{pair}-{meta['config'].get('method', 'run')}-{meta['config_hash']}"
    return f"{pair}-{config.label}-{config.dtype}"


def specbench_answers(run_dir: str | os.PathLike, model_id: str | None = None) -> list[dict]:
    """The Spec-Bench answer lines of a SPADE run (see the module docstring), as dicts."""
    run_dir = Path(run_dir)
    if not (run_dir / "summary.jsonl").is_file():
        raise FileNotFoundError(f"run_dir: no summary.jsonl in {run_dir} (not a finished SPADE run)")
    meta = trace.read_metadata(run_dir)
    if model_id is None:
        model_id = model_id_for(meta)
    elif not isinstance(model_id, str) or not model_id:
        raise ValueError(f"model_id must be a non-empty string, got {model_id!r}")
    summary = read_summary(run_dir)
    tstamp = _timestamp(meta)
    lines: dict[Any, dict] = {}
    for row in summary.to_dict("records"):
        qid = row["question_id"]
        line = lines.setdefault(qid, {
            "question_id": qid, "category": row["category"], "answer_id": _answer_id(meta["config_hash"], qid),
            "model_id": model_id, "choices": [], "tstamp": tstamp})
        line["choices"].append({
            "index": int(row["sample"]), "turns": [row["text"]], "decoding_steps": [int(row["n_steps"])],
            "new_tokens": [int(row["new_tokens"])], "wall_time": [float(row["wall_time"])],
            "accept_lengths": [int(a) for a in row["accept_lengths"]]})
    for line in lines.values():
        line["choices"].sort(key=lambda c: c["index"])
    return list(lines.values())


def write_specbench_answers(run_dir: str | os.PathLike, path: str | os.PathLike,
                            model_id: str | None = None) -> Path:
    """Write a SPADE run as a Spec-Bench answer file at ``path`` (atomically) and return its path.

    ``path`` may be a folder: the file is then ``<path>/<model_id>.jsonl``, Spec-Bench's layout
    (``data/spec_bench/model_answer/<model_id>.jsonl``). ``model_id`` defaults to
    :func:`model_id_for` the run. Export an ``"ar"`` run of the same suite and seed as the baseline
    file; speed.py then computes tau and speedup from SPADE's runs.
    """
    lines = specbench_answers(run_dir, model_id)
    path = Path(path)
    if path.is_dir():
        path = path / f"{lines[0]['model_id']}.jsonl"
    elif path.suffix != ".jsonl":
        raise ValueError(f"path must be a folder or end in .jsonl, got {path}")
    return write_text(path, "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))


# ---------------------------------------------------------------- import

def _check_answer(obj: Any, where: str) -> dict:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: an answer line must be a JSON object, got {type(obj).__name__}")
    missing = [k for k in ("question_id", "category", "choices") if k not in obj]
    if missing:
        raise ValueError(f"{where}: answer lacks key(s) {missing}")
    if not isinstance(obj["choices"], list) or not obj["choices"]:
        raise ValueError(f"{where}: 'choices' must be a non-empty list")
    for j, ch in enumerate(obj["choices"]):
        w = f"{where}: choices[{j}]"
        if not isinstance(ch, dict):
            raise ValueError(f"{w} must be an object")
        missing = [k for k in (*PER_TURN_KEYS, "accept_lengths") if k not in ch]
        if missing:
            raise ValueError(f"{w} lacks key(s) {missing}")
        lengths = {k: len(ch[k]) if isinstance(ch[k], list) else -1 for k in PER_TURN_KEYS}
        if min(lengths.values()) < 1 or len(set(lengths.values())) != 1:
            raise ValueError(f"{w}: turns, new_tokens and wall_time must be lists of one entry per turn, "
                             f"got lengths {lengths}")
        if not isinstance(ch["accept_lengths"], list):
            raise ValueError(f"{w}: accept_lengths must be a list")
        if any(not isinstance(t, (int, float)) or not t > 0 for t in ch["wall_time"]):
            raise ValueError(f"{w}: wall_time entries must be positive numbers, got {ch['wall_time']}")
        if any(isinstance(a, bool) or not isinstance(a, (int, float)) or a < 1 for a in ch["accept_lengths"]):
            raise ValueError(f"{w}: accept_lengths entries must be numbers >= 1")
    return obj


def load_answers(path: str | os.PathLike) -> list[dict]:
    """The lines of a Spec-Bench answer file, checked (a bad line is a ``ValueError`` naming it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: no such answer file: {path}")
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
            out.append(_check_answer(obj, f"{path}:{lineno}"))
    if not out:
        raise ValueError(f"{path}: the answer file holds no answers")
    return out


def specbench_token_count(tokenizer: Callable, text: str) -> int:
    """Tokens of ``text`` counted as speed.py counts the baseline's: ``len(tokenizer(text).input_ids)``
    minus the special tokens the tokenizer adds (speed.py subtracts 1, the BOS of its Llama tokenizers;
    here ``len(tokenizer("").input_ids)`` is subtracted, the same for those and right for tokenizers
    that add none)."""
    return len(tokenizer(text).input_ids) - len(tokenizer("").input_ids)


def _generations(answers: list[dict], choice: int | None, tokenizer) -> pd.DataFrame:
    rows = []
    for a in answers:
        choices = a["choices"] if choice is None else [_pick(a, choice)]
        for ch in choices:
            new_tokens = float(sum(ch["new_tokens"]))
            row = {"question_id": a["question_id"], "category": str(a["category"]),
                   "choice": int(ch.get("index", 0)), "model_id": a.get("model_id"),
                   "turns": len(ch["turns"]), "new_tokens": new_tokens,
                   "wall_time": float(sum(ch["wall_time"])), "accept_lengths": list(ch["accept_lengths"]),
                   "steps": len(ch["accept_lengths"])}
            if tokenizer is not None:
                row["retokenised_tokens"] = float(sum(specbench_token_count(tokenizer, t) for t in ch["turns"]))
            rows.append(row)
    df = pd.DataFrame(rows)
    df["tokens_per_s"] = df["new_tokens"] / df["wall_time"]
    key = df["question_id"].map(repr) + "#" + df["choice"].map(str)
    if key.duplicated().any():
        raise ValueError(f"duplicate answers for (question_id, choice) {sorted(set(key[key.duplicated()]))[:5]}")
    return df


def _pick(answer: dict, choice: int) -> dict:
    if not 0 <= choice < len(answer["choices"]):
        raise ValueError(f"choice {choice}: question {answer['question_id']!r} has "
                         f"{len(answer['choices'])} choice(s)")
    return answer["choices"][choice]


def _subtasks(categories: pd.Series) -> list[tuple[str, np.ndarray]]:
    """(name, row mask) per category, then ``mt_bench`` (if any MT-bench category), then ``overall``."""
    cats = list(dict.fromkeys(categories))
    out = [(c, (categories == c).to_numpy()) for c in cats]
    mt = categories.isin(MT_BENCH_CATEGORIES).to_numpy()
    if mt.any() and MT_BENCH not in cats:
        out.append((MT_BENCH, mt))
    out.append((OVERALL, np.ones(len(categories), dtype=bool)))
    return out


@dataclass
class SpecBenchAnswers:
    """Tables of one Spec-Bench method's answers (and its baseline's), per category.

    ``generations``: one row per answer (``question_id``, ``category``, ``choice``, ``new_tokens``,
    ``wall_time``, ``tokens_per_s``, ``accept_lengths``, ``steps``; with a baseline also
    ``baseline_tokens`` (its ``new_tokens``, or re-tokenised ``turns`` when a tokenizer was given),
    ``baseline_wall_time``, ``baseline_tokens_per_s``).
    ``summary``: one row per category, ``mt_bench`` (when MT-bench categories are present) and
    ``overall``: ``generations``, ``steps``, ``tau`` (mean accepted length with the bonus token,
    pooled over steps; NaN without steps), ``tokens_per_s`` (mean per answer, speed.py's) and, with a
    baseline, ``baseline_tokens_per_s``, ``speedup`` (speed.py's ratio of means),
    ``speedup_ratio_of_totals`` and ``speedup_mean_of_ratios`` (SPADE's two, :mod:`spade_lib.runs.metrics`).
    ``accept_length``: per category and ``overall``, the distribution of accepted lengths ``L = n + 1``
    (``accept_length``, ``n_accepted = L - 1``, ``steps``, ``fraction = P(L = k)``,
    ``survival = P(L >= k)``), zero counts kept; the columns of
    :func:`spade_lib.diagnose.accept_length_hist`, so :func:`spade_lib.plots.m3.accept_length_hist`
    draws it too (``by="category"``).
    """

    generations: pd.DataFrame
    summary: pd.DataFrame
    accept_length: pd.DataFrame
    model_id: str | None = None
    baseline_model_id: str | None = None
    note: str = field(default=NO_TRACE_NOTE)


def _summary(gen: pd.DataFrame, has_baseline: bool) -> pd.DataFrame:
    rows = []
    for name, mask in _subtasks(gen["category"]):
        sub = gen[mask]
        lengths = np.concatenate([np.asarray(a, dtype=np.float64) for a in sub["accept_lengths"]] or [np.zeros(0)])
        row = {"category": name, "generations": len(sub), "steps": len(lengths),
               "tau": float(measures.tau(lengths.sum() - len(lengths), len(lengths))) if len(lengths) else math.nan,
               "new_tokens": float(sub["new_tokens"].sum()), "wall_time": float(sub["wall_time"].sum()),
               "tokens_per_s": float(sub["tokens_per_s"].mean())}
        if has_baseline:
            row["baseline_tokens_per_s"] = float(sub["baseline_tokens_per_s"].mean())
            row["speedup"] = row["tokens_per_s"] / row["baseline_tokens_per_s"]
            row["speedup_ratio_of_totals"] = ((sub["new_tokens"].sum() / sub["wall_time"].sum())
                                              / (sub["baseline_tokens"].sum() / sub["baseline_wall_time"].sum()))
            row["speedup_mean_of_ratios"] = float((sub["tokens_per_s"] / sub["baseline_tokens_per_s"]).mean())
        rows.append(row)
    return pd.DataFrame(rows)


def _accept_length_table(gen: pd.DataFrame) -> pd.DataFrame:
    all_lengths = [int(v) for a in gen["accept_lengths"] for v in a]
    k_max = max(all_lengths, default=1)
    parts = []
    for name, mask in _subtasks(gen["category"]):
        lengths = np.array([int(v) for a in gen.loc[mask, "accept_lengths"] for v in a], dtype=np.int64)
        counts = np.bincount(lengths, minlength=k_max + 1)[1:]
        frac = counts / max(counts.sum(), 1)
        parts.append(pd.DataFrame({
            "category": name, "accept_length": np.arange(1, k_max + 1), "n_accepted": np.arange(k_max),
            "steps": counts, "fraction": frac, "survival": np.cumsum(frac[::-1])[::-1]}))
    return pd.concat(parts, ignore_index=True)


def read_specbench_answers(path: str | os.PathLike, baseline: str | os.PathLike | None = None, *,
                           tokenizer: Callable | None = None, choice: int | None = 0) -> SpecBenchAnswers:
    """Per-category tables of a Spec-Bench answer file (any method's) and its baseline's.

    ``choice``: which choice of each answer to use (0, as speed.py), or ``None`` for all of them (one
    generation each, paired with the baseline's choice of the same ``index``). ``tokenizer`` (a
    callable returning ``.input_ids``, e.g. an HF tokenizer) counts the baseline's tokens as speed.py
    does, by re-tokenising its ``turns`` (:func:`specbench_token_count`); without it the baseline's own
    ``new_tokens`` are used (what SPADE's metrics use). The baseline must answer the same questions
    (and choices). There is no token-level trace in answer files (``.note``).
    """
    if choice is not None and (isinstance(choice, bool) or not isinstance(choice, int) or choice < 0):
        raise ValueError(f"choice must be an integer >= 0 or None, got {choice!r}")
    answers = load_answers(path)
    gen = _generations(answers, choice, None)
    base_model = None
    if baseline is not None:
        base_answers = load_answers(baseline)
        base = _generations(base_answers, choice, tokenizer)
        base_model = base["model_id"].iloc[0]
        mk = set(zip(gen["question_id"].map(repr), gen["choice"]))
        bk = set(zip(base["question_id"].map(repr), base["choice"]))
        if mk != bk:
            raise ValueError(f"baseline must answer the same (question_id, choice) pairs as path; only in path: "
                             f"{sorted(mk - bk)[:5]}, only in baseline: {sorted(bk - mk)[:5]}")
        tokens = base["retokenised_tokens"] if tokenizer is not None else base["new_tokens"]
        base = base.assign(baseline_tokens=tokens, baseline_wall_time=base["wall_time"])
        base["baseline_tokens_per_s"] = base["baseline_tokens"] / base["baseline_wall_time"]
        cols = ["baseline_tokens", "baseline_wall_time", "baseline_tokens_per_s"]
        gen = gen.assign(_k=gen["question_id"].map(repr)).merge(
            base.assign(_k=base["question_id"].map(repr))[["_k", "choice", *cols]],
            on=["_k", "choice"], how="left", sort=False).drop(columns="_k")
    return SpecBenchAnswers(generations=gen, summary=_summary(gen, baseline is not None),
                            accept_length=_accept_length_table(gen), model_id=gen["model_id"].iloc[0],
                            baseline_model_id=base_model)


# ---------------------------------------------------------------- figure

def plot_specbench(answers: SpecBenchAnswers):
    """Tau per category, speedup per category (with a baseline) and the accepted-length distribution
    ``P(L = k)`` per category, side by side; returns the ``Figure`` (save it with
    ``spade_lib.plots.save_figure``)."""
    import matplotlib.pyplot as plt

    from spade_lib.plots.style import DOUBLE_COLUMN

    if not isinstance(answers, SpecBenchAnswers):
        raise TypeError(f"answers must be a SpecBenchAnswers (read_specbench_answers), got {type(answers).__name__}")
    s = answers.summary
    has_speedup = "speedup" in s.columns
    n = 3 if has_speedup else 2
    fig, axes = plt.subplots(1, n, figsize=(DOUBLE_COLUMN, 2.3))
    cats = s["category"].tolist()
    x = np.arange(len(cats))
    panels = [("tau", "mean accepted length tau")] + ([("speedup", "speedup (speed.py)")] if has_speedup else [])
    for ax, (col, label) in zip(axes, panels):
        colors = ["0.55" if c in (MT_BENCH, OVERALL) else f"C{i}" for i, c in enumerate(cats)]
        ax.bar(x, s[col], color=colors)
        ax.set_xticks(x)
        ax.set_xticklabels(cats, rotation=35, ha="right", fontsize=6)
        ax.set_ylabel(label)
        if col == "speedup":
            ax.axhline(1.0, color="k", lw=0.6, ls=":")
    ax = axes[-1]
    h = answers.accept_length
    for i, c in enumerate(cats):
        sub = h[h["category"] == c]
        if sub.empty:
            continue
        style = dict(color="k", lw=1.4) if c == OVERALL else dict(color=f"C{i}", lw=0.8)
        if c == MT_BENCH:
            style = dict(color="0.55", lw=0.8, ls="--")
        ax.plot(sub["accept_length"], sub["fraction"], marker="o", ms=2, label=c, **style)
    ax.set_xlabel("accepted length L = n + 1")
    ax.set_ylabel("P(L = k)")
    ax.legend(fontsize=5)
    title = answers.model_id or "answers"
    if answers.baseline_model_id:
        title += f" vs {answers.baseline_model_id}"
    fig.suptitle(title, fontsize=7)
    fig.tight_layout()
    return fig
