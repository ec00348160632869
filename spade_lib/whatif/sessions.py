"""The runs notebook 05 replays, made (or read back) under the timing protocol, and the checks of its parameters that
a declared range cannot express.

Notation of Leviathan et al. (2023): ``p`` target, ``q`` draft, ``gamma`` draft length, ``c`` the draft/target cost
ratio, ``r(g)`` the verify-cost ratio. For one draft of the pair the what-if sections need four kinds of run
(:func:`plan`, :class:`Configs`):

- ``fixed[g]``: a fixed-``gamma`` run per ``g`` of the sweep at ``temperature`` (``tau`` predicted from teacher-forced
  alphas and measured);
- ``replay``: one run at ``max_gamma`` with top-``k`` slices of ``p`` and ``q`` (re-decided under the acceptance rules);
- ``stop[T]``: one run at ``max_gamma`` per temperature ``T`` of the stop-rule study (a stop rule drafting
  ``g <= max_gamma`` tokens replays the first ``g`` positions of each block);
- ``ar[T]``: the autoregressive baseline of each temperature.

:func:`run` times them in one interleaved session per temperature (:func:`spade_lib.runs.protocol.run_interleaved`;
finished runs, notebook 03's included, are read back), so every speedup is paired with its own session's AR generations;
:meth:`Runs.trace_costs` gives a run's ``c_trace`` / ``r_trace`` (:func:`spade_lib.runs.metrics.trace_costs`) against
that baseline. :func:`run_chosen_rules` runs the stop rules a study chose, for real, and compares each with its replay.

Checks (:func:`alignable`, :func:`check_gammas`): every ``gamma`` of the sweep is at most ``max_gamma``, and the draft
drafts the pair's own vocabulary with its own ``q`` (:data:`REPLAYABLE`, from the drafter's declared kind via
:func:`spade_lib.decoding.drafts.drafters.check_draft`): a draft *model* (every section; the teacher-forced alignment re-scores
its ``q`` on the target's tokens) or a feature *head* (``"eagle"`` / ``"medusa"`` or a head by name, pair's heads
attached: re-verification and stop rules replay its traces; the alignment is skipped, :data:`NO_ALIGNMENT`, since a
head's ``q`` depends on its depth in the block and the target's features, which the alignment does not re-run).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spade_lib import devices
from spade_lib.decoding.drafts import crossvocab  # noqa: F401 (registers the cross-vocabulary drafters check_draft resolves)
from spade_lib.decoding.drafts.drafters import check_draft
from spade_lib.runs import metrics, protocol as _protocol, trace as _trace
from spade_lib.runs.config import RunConfig
from spade_lib.runs.store import read_summary
from spade_lib.whatif import stoprules


NO_ALIGNMENT = ("section 1 (teacher-forced alignment, predicted tau) is skipped: {draft!r} is a feature head, whose "
                "q at a position depends on its depth in the block and on the target's features there, which the "
                "alignment does not re-run; sections 2 and 3 replay its recorded traces, which hold its q")


# what notebook 05 replays: the draft's own q (the rules are re-decided on it, the stop rules read its signals),
# on the pair's vocabulary (the trace's p and q slices are over the target's tokens)
REPLAYABLE = {"q": True, "vocabulary": "same"}


def alignable(pair, draft: str) -> bool:
    """Whether notebook 05's teacher-forced alignment can score ``draft`` (module docstring), once
    :func:`~spade_lib.decoding.drafts.drafters.check_draft` has refused one whose declared kind is not
    :data:`REPLAYABLE` (a cross-vocabulary draft, a model-free drafter: its ``q`` is a point mass, or over
    another vocabulary) with a ``ValueError`` naming those that are: ``True`` for a draft model of ``pair``
    (the alignment runs ``pair.drafts[draft]``), ``False`` for a feature head (the replays only,
    :data:`NO_ALIGNMENT`)."""
    kind = check_draft(pair, draft, needs=REPLAYABLE,
                       why=": notebook 05 replays a draft's own probabilities q on the pair's vocabulary")
    return not kind.head and draft in pair.drafts


def check_gammas(gammas: Sequence[int], max_gamma: int) -> list[int]:
    """``gammas`` as a list, if not empty and none exceeds ``max_gamma`` (the stop-rule and rule replays read
    the ``max_gamma`` trace), else ``ValueError``."""
    gammas = list(gammas)
    if not gammas:
        raise ValueError("gammas: at least one draft length")
    if max_gamma < max(gammas):
        raise ValueError(f"max_gamma ({max_gamma}) must be >= every entry of gammas ({gammas})")
    return gammas


@dataclass(frozen=True)
class Configs:
    """The configurations of notebook 05's runs (module docstring), each as run (``protocol.config``)."""

    ar: dict[float, RunConfig]        # temperature -> the AR baseline of that temperature's session
    fixed: dict[int, RunConfig]       # gamma -> the fixed-gamma run at the notebook's temperature
    replay: RunConfig                 # max_gamma, with top-k slices, at the notebook's temperature
    stop: dict[float, RunConfig]      # temperature -> the max_gamma run of the stop-rule study

    def members(self, temperature: float) -> list[RunConfig]:
        """The SPADE runs of one temperature's session, in the order fixed, replay, stop."""
        return [c for c in [*self.fixed.values(), self.replay, *self.stop.values()] if c.temperature == temperature]

    @property
    def names(self) -> dict[str, RunConfig]:
        """``{"g<gamma>": fixed run, ..., "replay": replay run}``: the runs whose text is scored."""
        return {**{f"g{g}": c for g, c in self.fixed.items()}, "replay": self.replay}


def plan(run_config: Callable[..., RunConfig], proto: _protocol.Protocol, *, draft: str, gammas: Iterable[int],
         max_gamma: int, record_topk: int, temperature: float, stop_temperatures: Iterable[float]) -> Configs:
    """The :class:`Configs` of notebook 05; ``run_config(**fields)`` makes a ``RunConfig`` with the
    experiment's shared fields (``spade_lib.experiment.Experiment.run_config``)."""
    stop_temperatures = list(stop_temperatures)
    spade = dict(method="spade", draft=draft)
    return Configs(
        ar={T: proto.config(run_config(method="ar", temperature=T))
            for T in dict.fromkeys([temperature, *stop_temperatures])},
        fixed={g: proto.config(run_config(**spade, gamma=g, temperature=temperature)) for g in gammas},
        replay=proto.config(run_config(**spade, gamma=max_gamma, record_topk=record_topk, temperature=temperature)),
        stop={T: proto.config(run_config(**spade, gamma=max_gamma, temperature=T)) for T in stop_temperatures},
    )


@dataclass
class Runs:
    """Notebook 05's runs: folders, summaries, traces (SPADE runs only) and each session's size and seconds."""

    configs: Configs
    dirs: dict[RunConfig, Path]                    # every run, the baselines included
    summaries: dict[RunConfig, pd.DataFrame]       # summary.jsonl of every run
    traces: dict[RunConfig, pd.DataFrame]          # the token-level trace of every SPADE run
    sessions: dict[float, tuple[int, float]]       # temperature -> (runs in its session, seconds to have them)

    def trace_costs(self, cfg: RunConfig) -> dict[str, float]:
        """``{"c_trace", "r_trace"}`` of run ``cfg`` (:func:`spade_lib.runs.metrics.trace_costs`) over the AR
        generations of its session (:func:`spade_lib.runs.protocol.paired_baseline`)."""
        base, _ = _protocol.paired_baseline(self.summaries[cfg], self.configs.ar[cfg.temperature])
        return metrics.trace_costs(self.traces[cfg], base)


def run(pair, suite, configs: Configs, *, proto: _protocol.Protocol, resume: bool = True) -> Runs:
    """Make (or read back) every run of ``configs``: one interleaved session per temperature of ``configs.ar``
    with its members (:meth:`Configs.members`) and its AR baseline."""
    dirs, sessions = {}, {}
    for T, ar_cfg in configs.ar.items():
        members = configs.members(T)
        t0 = devices.clock()
        dirs.update(_protocol.run_interleaved(pair, suite, members, ar_cfg, protocol=proto, resume=resume,
                                              progress=False))
        sessions[T] = (len(members) + 1, devices.clock() - t0)
    return Runs(configs=configs, dirs=dirs, summaries={cfg: read_summary(d) for cfg, d in dirs.items()},
                traces={cfg: _trace.read_trace(d) for cfg, d in dirs.items() if cfg.method == "spade"},
                sessions=sessions)


def run_chosen_rules(pair, suite, studies: Mapping[float, stoprules.StopStudy], runs: Runs,
                     base: Mapping[float, RunConfig], *, proto: _protocol.Protocol, max_gamma: int,
                     gamma_c: float, costs: Mapping[str, dict] | None = None, resume: bool = True) -> pd.DataFrame:
    """Each stop rule a study chose, run for real and compared with its replay: one row per temperature ``T``
    of ``studies`` and policy with a decoder form (:func:`spade_lib.whatif.stoprules.chosen_configs` of
    ``base[T]``, the SPADE configuration of that temperature), the columns of
    :func:`spade_lib.whatif.stoprules.replay_vs_run` after ``T``: ``tau`` and speedup replayed vs measured
    (the speedup from :func:`spade_lib.runs.protocol.speedup_table` against the session's AR baseline, priced
    with ``costs``) and ``decisions_replayed``, the share of the run's steps whose draft length the rule's
    replay gives back from the run's own signals (1 unless the decoder and the replay disagree)."""
    rows = []
    for T, study in studies.items():
        cfgs = stoprules.chosen_configs(study.chosen, base[T], max_gamma=max_gamma, gamma_c=gamma_c)
        ar = runs.configs.ar[T]
        got = _protocol.run_interleaved(pair, suite, list(cfgs.values()), ar, protocol=proto, resume=resume,
                                        progress=False)
        table = _protocol.speedup_table({proto.config(c): got[proto.config(c)] for c in cfgs.values()}, ar,
                                        protocol=proto, costs=dict(costs) if costs is not None else None)
        for (policy, cfg), (_, measured) in zip(cfgs.items(), table.iterrows()):
            actual = _trace.read_trace(got[proto.config(cfg)])
            rows.append({"T": T, **stoprules.replay_vs_run(study.front, study.chosen, policy, actual, measured,
                                                             run_policy=cfg.make_policy())})
    return pd.DataFrame(rows)
