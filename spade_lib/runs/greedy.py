"""Greedy runs against the greedy baseline, read from their run folders: token for token, or a near tie.

At ``T = 0`` every speculative method (SPADE with any drafter, HF assisted generation with any draft, a
draft with its own vocabulary included) must emit the target's greedy tokens, which the autoregressive
baseline of the same session wrote. :func:`greedy_check` compares each generation of each run with the
baseline's for the same prompt through :func:`spade_lib.decoding.studies.divergence.classify_greedy`: the first
differing token is classified by a fresh forward of the target as ``"near_tie"`` (a rounding-level flip of
two almost equal logits) or ``"bug"`` (a token the target does not prefer). The prompt ids are rebuilt as
the run tokenised them (:func:`spade_lib.runs.config.prompt_ids`, with the run's chat template and cut).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from spade_lib.decoding.studies.divergence import classify_greedy
from spade_lib.runs.config import RunConfig, prompt_ids

__all__ = ["greedy_check"]


def greedy_check(target, tokenizer, rows: Sequence[Mapping[str, Any]], runs: Mapping[RunConfig, pd.DataFrame],
                 baseline: pd.DataFrame | None) -> tuple[dict[str, int], list[str]]:
    """Every generation of ``runs`` (config -> its ``summary.jsonl`` as read by
    :func:`spade_lib.runs.store.read_summary`) against ``baseline``'s (the greedy AR run's summary) for the
    same ``question_id``; ``rows`` are the suite's rows (``question_id``, ``turns``). Returns the count of
    each class (``identical``, ``near_tie``, ``bug``, per generation) and one line per generation that is
    not identical, naming the run, the question and where and why it differs. ``baseline`` may be None
    only when ``runs`` is empty."""
    if runs and baseline is None:
        raise ValueError("baseline: the greedy autoregressive run's summary is needed to check greedy runs")
    by_qid = {r["question_id"]: r for r in rows}
    ref = baseline.set_index("question_id")["output_ids"] if baseline is not None else None
    missing = sorted({str(q) for s in runs.values() for q in s["question_id"] if q not in by_qid or q not in ref})
    if missing:
        raise ValueError(f"runs: generations of questions that the suite rows or the baseline lack: {missing[:5]}")

    def cases():
        for cfg, summary in runs.items():
            for _, s in summary.iterrows():
                ids = prompt_ids(tokenizer, by_qid[s["question_id"]]["turns"][0], cfg)
                yield (cfg.label, s["question_id"]), s["output_ids"], ref.loc[s["question_id"]], ids

    counts, found = classify_greedy(cases(), target)
    lines = []
    for (label, qid), d in found:
        lines.append(f"{label} question {qid}: {d.describe()}")
    return counts, lines
