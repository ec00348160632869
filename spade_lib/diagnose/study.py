"""The runs notebook 04 analyses, made (or read back) under the timing protocol, and the check of its drafts.

Notation of Leviathan et al. (2023): ``p`` target, ``q`` draft, ``gamma`` draft length, ``alpha`` the
acceptance rate. The M3 tables of :mod:`spade_lib.diagnose` read token-level traces; this module makes them:

- :func:`run_drafts`: one SPADE run per draft at ``gamma`` and ``temperature`` and the autoregressive baseline,
  timed in one interleaved session (:func:`spade_lib.runs.protocol.run_interleaved`; notebook 03's finished
  runs of the same configuration are read back), their traces combined with a ``draft`` column
  (:func:`~spade_lib.diagnose.frame.combine_runs`) and their ``summary.jsonl`` rows (:class:`DraftRuns`);
- :meth:`DraftRuns.category_speedups`: the speedup over AR per draft and category and overall (ratio of
  totals with its bootstrap interval, :func:`spade_lib.runs.protocol.speedup_table`, predictions priced
  with the pair's measured costs);
- :func:`position_runs`: the runs of EAGLE's per-position table, every draft at ``position_gamma`` at each
  temperature (one session per temperature), as one trace with ``draft`` and ``T`` columns.

The check a declared parameter range cannot make -- every draft must be one the pair can draft with (its draft
models and heads, or a registered drafter; a head drafter only when the pair carries heads) -- is
:func:`spade_lib.decoding.drafts.drafters.check_draft`, per draft (:func:`run_drafts` and :func:`position_runs` make it
before they run anything).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spade_lib import devices
from spade_lib.decoding.drafts import crossvocab  # noqa: F401 (registers the cross-vocabulary drafters check_draft resolves)
from spade_lib.decoding.drafts.drafters import check_draft
from spade_lib.diagnose.frame import categorize, combine_runs
from spade_lib.runs import protocol as _protocol, trace as _trace
from spade_lib.runs.config import RunConfig
from spade_lib.runs.store import read_summary

SPEED_COLUMNS = ["draft", "category", "tokens_per_s", "speedup", "speedup_low", "speedup_high", "speedup_prompts",
                 "speedup_rounds"]


@dataclass
class DraftRuns:
    """The runs of :func:`run_drafts`: each draft's and the AR baseline's."""

    configs: dict[str, RunConfig]          # draft -> its SPADE configuration (as asked; protocol.config gives it as run)
    ar: RunConfig                          # the AR baseline's configuration
    dirs: dict[str, Path]                  # draft -> run folder, then "ar" -> the baseline's
    traces: pd.DataFrame                   # every draft's trace, a categorical ``draft`` column first
    summaries: dict[str, pd.DataFrame]     # draft (and "ar") -> its summary.jsonl rows
    seconds: float                         # seconds to have the runs (made, or read back)

    def category_speedups(self, pair, proto: _protocol.Protocol) -> pd.DataFrame:
        """One row per draft and category, and per draft with ``category = "overall"``: :data:`SPEED_COLUMNS`
        of :func:`spade_lib.runs.protocol.speedup_table` against the AR generations of the runs' session
        (``speedup``: tokens per second over AR's, ratio of totals, with its bootstrap interval
        ``speedup_low`` / ``speedup_high`` over ``speedup_prompts`` prompts and ``speedup_rounds`` timed
        rounds), priced with the pair's measured costs (:func:`spade_lib.runs.costs.pair_costs`)."""
        from spade_lib.runs.costs import pair_costs

        costs = pair_costs(pair, list(dict.fromkeys(c.draft for c in self.configs.values())),
                           max(c.gamma for c in self.configs.values()))
        dirs = {proto.config(c): self.dirs[d] for d, c in self.configs.items()}
        by_cat = _protocol.speedup_table(dirs, self.ar, protocol=proto, by="category", costs=costs)
        overall = _protocol.speedup_table(dirs, self.ar, protocol=proto, costs=costs).assign(category="overall")
        return pd.concat([by_cat, overall], ignore_index=True)[SPEED_COLUMNS]


def run_drafts(pair, suite, run_config: Callable[..., RunConfig], drafts: Sequence[str], *, gamma: int,
               temperature: float, proto: _protocol.Protocol) -> DraftRuns:
    """Each draft of ``drafts`` at ``gamma`` and ``temperature`` and the AR baseline, in one interleaved session
    (module docstring); ``run_config(**fields)``: the experiment's ``RunConfig`` maker
    (``spade_lib.experiment.Experiment.run_config``). Every draft is checked first (``check_draft``)."""
    for d in drafts:
        check_draft(pair, d)
    ar = run_config(method="ar", temperature=temperature)
    configs = {d: run_config(method="spade", draft=d, gamma=gamma, temperature=temperature) for d in drafts}
    t0 = devices.clock()
    got = _protocol.run_interleaved(pair, suite, list(configs.values()), ar, protocol=proto)
    dirs = {d: got[proto.config(c)] for d, c in configs.items()}
    dirs["ar"] = got[proto.config(ar)]
    seconds = devices.clock() - t0
    traces = categorize(combine_runs({d: _trace.read_trace(dirs[d]) for d in drafts}, key="draft"))
    return DraftRuns(configs=configs, ar=ar, dirs=dirs, traces=traces,
                     summaries={name: read_summary(d) for name, d in dirs.items()}, seconds=seconds)


def position_runs(pair, suite, run_config: Callable[..., RunConfig], drafts: Sequence[str], *, gamma: int,
                  temperatures: Iterable[float], proto: _protocol.Protocol) -> pd.DataFrame:
    """The traces of every draft at draft length ``gamma`` (notebook 04's ``position_gamma``: 5 or more fills
    EAGLE's positions 0-4) at each of ``temperatures`` (duplicates once), one interleaved session with its AR
    baseline per temperature, concatenated with columns ``draft`` and ``T`` (in the order drafts within
    temperatures). Every draft is checked first (``check_draft``)."""
    for d in drafts:
        check_draft(pair, d)
    dirs = {}
    for T in dict.fromkeys(temperatures):
        ar = run_config(method="ar", temperature=T)
        cs = {d: run_config(method="spade", draft=d, gamma=gamma, temperature=T) for d in drafts}
        got = _protocol.run_interleaved(pair, suite, list(cs.values()), ar, protocol=proto, progress=False)
        dirs.update({(d, T): got[proto.config(c)] for d, c in cs.items()})
    return pd.concat([_trace.read_trace(p).assign(draft=d, T=T) for (d, T), p in dirs.items()], ignore_index=True)
