"""The batch study's speedup intervals: its timed rounds resampled by SPADE's one speedup bootstrap.

:func:`spade_lib.decoding.studies.batch_study.batch_study` measures every round's tokens and seconds of batched
autoregressive and batched speculative decoding (its module docstring: round ``k`` decodes its own
prompts, both methods one after the other). :func:`with_intervals` treats each timed round as one paired
generation (``new_tokens`` = the batch's tokens, ``wall_time`` = its seconds) and hands them to
:func:`spade_lib.runs.metrics.bootstrap_speedup` with the round as the unit (``by=None``): the speedup is its
ratio of totals ``(sum_k N_spec,k / sum_k t_spec,k) / (sum_k N_AR,k / sum_k t_AR,k)`` and ``speedup_low`` /
``speedup_high`` its percentile interval. With ``R`` rounds there are at most ``R^R`` distinct resamples, so a
few rounds give a coarse interval; one round gives none (NaN). The decoding layer measures and cannot
import this layer (the import-linter contract), hence the separate step.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from spade_lib.runs.metrics import bootstrap_speedup

__all__ = ["ROUND_COLUMNS", "with_intervals"]

ROUND_COLUMNS = ("ar_round_tokens", "spec_round_tokens", "ar_round_s", "spec_round_s")


def with_intervals(study: pd.DataFrame, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """``study`` with ``speedup_low`` and ``speedup_high`` after ``speedup`` (module docstring); ``speedup`` is
    checked to be the bootstrap's ratio of totals of the same rounds."""
    missing = [c for c in ("speedup", *ROUND_COLUMNS) if c not in study.columns]
    if missing:
        raise ValueError(f"study: needs batch_study's per-round columns, missing {missing}")
    lo, hi = [], []
    for i, row in study.iterrows():
        frames = {}
        for name in ("ar", "spec"):
            tokens, seconds = list(row[f"{name}_round_tokens"]), list(row[f"{name}_round_s"])
            if not tokens or len(tokens) != len(seconds):
                raise ValueError(f"study: row {i} has {len(tokens)} {name} round token counts and {len(seconds)} times")
            frames[name] = pd.DataFrame({"question_id": [f"round{k}" for k in range(len(tokens))], "sample": 0,
                                         "new_tokens": tokens, "wall_time": seconds})
        boot = bootstrap_speedup(frames["spec"], frames["ar"], n_boot=n_boot, level=level, seed=seed, by=None,
                                 rounds=False)
        if not np.isclose(boot["ratio_of_totals"], row["speedup"], rtol=1e-9):
            raise ValueError(f"study: row {i}'s speedup {row['speedup']} is not the ratio of totals of its rounds "
                             f"({boot['ratio_of_totals']})")
        one = len(frames["ar"]) < 2
        lo.append(math.nan if one else boot["ratio_of_totals_low"])
        hi.append(math.nan if one else boot["ratio_of_totals_high"])
    out = study.copy()
    at = list(out.columns).index("speedup") + 1
    out.insert(at, "speedup_low", lo)
    out.insert(at + 1, "speedup_high", hi)
    return out
