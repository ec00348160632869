"""Notebook 04's draft-tree section: the runs it compares, made (or read back) under the timing protocol, and
the tables of :mod:`spade_lib.diagnose.tree` over them.

Terms are those of :mod:`spade_lib.decoding.drafts.tree` (node, parent, depth, sibling rank, path). One draft drafts
a **chain** at ``gamma`` and a **wide tree** (a :class:`~spade_lib.decoding.drafts.tree_drafting.TreeConfig` spec,
e.g. ``"eagle2"``: 16 nodes, depth 4, top-4), each at ``T = 0`` and at the notebook's temperature; for the
shapes with a node budget (``eagle2``, ``trie``) the two largest budgets of ``budgets`` below the wide tree's
also run at ``T = 0``, the smaller trees :mod:`spade_lib.whatif.tree_replay` replays from the wide one and
checks against (:func:`plan`, :class:`TreePlan`). A tree's run drafts at most its own depth, so its
``gamma`` is ``TreeConfig.max_depth`` and the spec is what runs.

:func:`run` times each temperature's runs in one interleaved session with that temperature's autoregressive
baseline (:func:`spade_lib.runs.protocol.run_interleaved`), labels every run ``"<label> T=<T>"`` (``"chain
g4 T=0"``, ``"tree 16 T=1"``), and computes over the combined traces (a categorical ``run`` column):
:func:`~spade_lib.diagnose.tree.depth_acceptance`, :func:`~spade_lib.diagnose.tree.sibling_acceptance`,
:func:`~spade_lib.diagnose.tree.tree_accept_length_hist`, :func:`~spade_lib.diagnose.tree.tree_summary`
(``tau = mean N + 1`` per step) and each run's speedup over AR (:func:`spade_lib.runs.protocol.speedup_table`:
ratio of totals with its bootstrap interval), which :meth:`TreeRuns.cost_table` sets beside the verification
width ``nodes`` and the measured verify cost ``r(nodes)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from spade_lib import devices
from spade_lib.decoding.drafts.tree_drafting import TreeConfig
from spade_lib.diagnose.frame import categorize, combine_runs
from spade_lib.diagnose.tree import depth_acceptance, sibling_acceptance, tree_accept_length_hist, tree_summary
from spade_lib.runs import protocol as _protocol, trace as _trace
from spade_lib.runs.config import RunConfig

BUDGET_SHAPES = ("eagle2", "trie")  # shapes whose smaller trees are the same shape with fewer nodes
COST_COLUMNS = ["run", "T", "nodes", "tau", "tau_low", "tau_high", "speedup", "speedup_low", "speedup_high"]


def run_label(label: str, temperature: float) -> str:
    """A tree-section run's name in every table: ``"<label> T=<temperature>"``."""
    return f"{label} T={temperature:g}"


@dataclass(frozen=True)
class TreePlan:
    """The tree section's configurations (module docstring)."""

    wide: TreeConfig                           # the wide tree
    checked: list[int]                         # node budgets of the smaller trees that also run (at T = 0)
    chain_label: str                           # "chain g<gamma>"
    wide_label: str                            # "tree <nodes>"
    configs: dict[tuple[str, float], RunConfig]  # (label, T) -> configuration, per temperature in run order
    ar: dict[float, RunConfig]                   # T -> the AR baseline of that temperature's session

    @property
    def temperatures(self) -> list[float]:
        return list(self.ar)


def plan(tree_spec: str, budgets: Iterable[int], run_config: Callable[..., RunConfig], *, draft: str, gamma: int,
         temperature: float) -> TreePlan:
    """The :class:`TreePlan` of ``tree_spec`` (a tree, not a chain: ``ValueError``) for ``draft``: at ``T = 0``
    and ``temperature`` the chain ``"chain g<gamma>"`` and the wide tree ``"tree <nodes>"``, and at ``T = 0`` the
    trees ``"tree <b>"`` for the two largest ``b`` of ``budgets`` below the wide tree's node count (shapes of
    :data:`BUDGET_SHAPES` only). ``run_config(**fields)``: the experiment's ``RunConfig`` maker."""
    wide = TreeConfig.parse(tree_spec)
    if wide.is_chain:
        raise ValueError(f"tree_spec must name a tree or be empty, got {tree_spec!r}")
    checked = sorted(b for b in set(budgets) if b < wide.total_nodes)[-2:] if wide.shape in BUDGET_SHAPES else []
    chain_label, wide_label = f"chain g{gamma}", f"tree {wide.total_nodes}"

    def tree_config(T: float, nodes: int | None = None) -> RunConfig:
        t = wide if nodes is None else replace(wide, total_nodes=nodes)
        return run_config(method="spade", draft=draft, gamma=t.max_depth, temperature=T, tree=t.spec())

    configs: dict[tuple[str, float], RunConfig] = {}
    ar = {T: run_config(method="ar", temperature=T) for T in dict.fromkeys([0.0, temperature])}
    for T in ar:
        configs[(chain_label, T)] = run_config(method="spade", draft=draft, gamma=gamma, temperature=T)
        configs[(wide_label, T)] = tree_config(T)
    for b in checked:
        configs[(f"tree {b}", 0.0)] = tree_config(0.0, b)
    return TreePlan(wide=wide, checked=checked, chain_label=chain_label, wide_label=wide_label, configs=configs,
                    ar=ar)


@dataclass
class TreeRuns:
    """The tree section's runs and tables (module docstring); runs named by :func:`run_label`."""

    plan: TreePlan
    dirs: dict[tuple[str, float], Path]    # (label, T) -> run folder
    seconds: float                         # seconds to have them (made, or read back)
    speed: pd.DataFrame                    # speedup_table of each temperature's runs, a ``run`` column added
    traces: pd.DataFrame                   # every run's trace, a categorical ``run`` column first
    depth: pd.DataFrame                    # depth_acceptance by run
    sibling: pd.DataFrame                  # sibling_acceptance by run
    lengths: pd.DataFrame                  # tree_accept_length_hist by run
    summary: pd.DataFrame                  # tree_summary by run

    def cost_table(self, r: Mapping[int, float] | None = None) -> pd.DataFrame:
        """One row per run: :data:`COST_COLUMNS` of :attr:`speed` (``nodes``: mean drafted nodes per step, the
        verification width; ``tau`` with its interval over prompts; the speedup over AR with its bootstrap
        interval) and, given ``r`` (verification width -> measured verify cost ``r(g)``, a
        :func:`spade_lib.runs.costs.pair_costs` entry's ``"r"``), ``r_nodes = r(round(nodes))`` (NaN where
        ``r`` has no such width) after ``nodes``: rows of equal ``nodes`` cost the same to verify."""
        out = self.speed.rename(columns={"mean_gamma": "nodes"})[COST_COLUMNS]
        if r is not None:
            out.insert(3, "r_nodes", [r.get(int(round(n)), float("nan")) for n in out["nodes"]])
        return out


def run(pair, suite, tree_plan: TreePlan, *, proto: _protocol.Protocol) -> TreeRuns:
    """Make (or read back) the runs of ``tree_plan``, one interleaved session per temperature with its AR
    baseline, and the tables over them (module docstring)."""
    dirs, speed = {}, []
    t0 = devices.clock()
    for T, ar in tree_plan.ar.items():
        cs = {k: c for k, c in tree_plan.configs.items() if k[1] == T}
        got = _protocol.run_interleaved(pair, suite, list(cs.values()), ar, protocol=proto, progress=False)
        dirs.update({k: got[proto.config(c)] for k, c in cs.items()})
        table = _protocol.speedup_table({proto.config(c): got[proto.config(c)] for c in cs.values()}, ar,
                                        protocol=proto)
        speed.append(table.assign(run=[run_label(label, T) for label, _ in cs]))
    seconds = devices.clock() - t0
    traces = categorize(combine_runs({run_label(*k): _trace.read_trace(d) for k, d in dirs.items()}, key="run"))
    return TreeRuns(plan=tree_plan, dirs=dirs, seconds=seconds, speed=pd.concat(speed, ignore_index=True),
                    traces=traces, depth=depth_acceptance(traces, by="run"), sibling=sibling_acceptance(traces, by="run"),
                    lengths=tree_accept_length_hist(traces, by="run"), summary=tree_summary(traces, by="run"))
