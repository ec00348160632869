"""Drafts with another vocabulary, timed in notebook 03's sessions beside Hugging Face's generators.

A *cross-vocabulary* draft keeps its own tokenizer (``pair.draft_tokenizers[name]``: SmolLM2's embedded
4,096-token draft, ``load_pair("smollm2").drafts["embedded"]``; SmolLM2-135M as a draft of Gemma-3,
``load_pair("gemma3").drafts["smollm2"]``). SPADE drafts with it through the text (rule ``"text"``) or
through the token-level intersection of the two vocabularies (``"tli"``; ``"slrs"`` enumerates every
draft-token path of a target token and is tractable on small vocabularies only):
:mod:`spade_lib.decoding.drafts.crossvocab`. Hugging Face's assisted generation with the same draft runs its
generators for different tokenizers (:mod:`spade_lib.decoding.baselines`): UAG when greedy, USD when sampling.

Each is a run of the session it is timed in (:func:`cross_configs`, in notebook 03 beside the other runs: the
same prompts, the same autoregressive baseline, bootstrap intervals), so :func:`cross_report` reads them as any
run: alpha, tau and the speedup over autoregressive with their 95 % intervals, the cost-model prediction
(``tau / (gamma c + r(gamma) + o)``; a cross-vocabulary step also re-encodes text, which ``c`` leaves out), the
physical controls (:mod:`spade_lib.runs.controls`), HF assisted generation against plain HF generate where one
ran, SPADE's rules against HF's generator interval against interval, and at ``T = 0`` the greedy-equality
check (:mod:`spade_lib.runs.greedy`).

Which HF generator is exact is a fact established by tests, recorded in :data:`HF_GENERATORS` (one
:class:`GeneratorFact` each, naming its test) and printed from there by :func:`generator_lines`;
``tests/test_cross_drafts.py`` checks the records against the tests they name and against how the runs call HF.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from spade_lib.runs import controls, protocol as protocols, verdicts
from spade_lib.runs.config import RunConfig
from spade_lib.runs.greedy import greedy_check
from spade_lib.runs.store import read_summary

__all__ = ["GeneratorFact", "HF_GENERATORS", "CrossReport", "check_cross_drafts", "cross_configs",
           "generator_lines", "with_speedup_vs_hf", "cross_report", "COLUMNS"]

COLUMNS = ["label", "method", "draft", "rule", "gamma", "T", "speedup", "speedup_low", "speedup_high", "speedup_vs_hf",
           "alpha", "alpha_low", "alpha_high", "tau", "tau_low", "tau_high", "c", "r", "overhead", "predicted"]


@dataclass(frozen=True)
class GeneratorFact:
    """What a test established about one of HF's cross-tokenizer generators."""

    name: str         # short name: "UAG", "USD"
    hf_class: str     # the class transformers picks
    sampling: bool    # picked when sampling (do_sample=True), else when greedy
    call: str         # how it is called
    runs_use: bool    # whether SPADE's hf_assisted runs call it this way
    exact: bool       # whether its output law is the target's
    evidence: str     # what the test measured
    tests: tuple[str, ...] = field(default_factory=tuple)  # tests/<file>::<test>

    def sentence(self) -> str:
        """``"<when>: HF's <name> (<class>, <call>) is exact|is not exact: <evidence> (<tests>)"``."""
        when = "T > 0 (sampling)" if self.sampling else "T = 0 (greedy)"
        return (f"{when}: HF's {self.name} ({self.hf_class}, {self.call}) is "
                f"{'exact' if self.exact else 'not exact'}: {self.evidence} ({', '.join(self.tests)})"
                + ("; SPADE's hf_assisted runs call it this way" if self.runs_use else
                   "; not what SPADE's runs call"))


_TESTS = "tests/test_hf_crossvocab.py"
HF_GENERATORS: tuple[GeneratorFact, ...] = (
    GeneratorFact("UAG", "AssistedCandidateGeneratorDifferentTokenizers", False, "generate(do_sample=False)", True,
                  True, "its output equals the target's greedy output token for token (24 tokens, with candidates "
                  "both accepted and rejected): the verifier keeps a candidate only while it is the target's argmax",
                  (f"{_TESTS}::test_uag_greedy_equals_target_greedy",)),
    GeneratorFact("USD", "UniversalSpeculativeDecodingGenerator", True,
                  "generate(do_sample=True) as shipped, assistant LM head pruned to the intersection", False, False,
                  "the pruned head's columns follow get_vocab()'s iteration order while the draft's q is written "
                  "onto target ids in ascending id order, so q(x) is attached to the wrong tokens unless the "
                  "vocabulary iterates in id order: chi-square of the first two tokens against the target's exact "
                  "law rejects it (p < 1e-6 asserted; 1e-169 at N = 300) with a reverse-ordered vocabulary and "
                  "passes it with an id-ordered one (p > 1e-3 asserted; 0.67 at N = 1000)",
                  (f"{_TESTS}::test_usd_sampling_law", f"{_TESTS}::test_usd_column_order_follows_get_vocab_order")),
    GeneratorFact("USD", "UniversalSpeculativeDecodingGenerator", True,
                  "with HF's unpruned translator (baselines.hf_generate(prune_lm_head=False))", True, True,
                  "both sides map in id order: chi-square of the first two tokens against the target's exact law "
                  "passes on the reverse-ordered vocabulary (p > 1e-3 asserted; 0.69 at N = 1000), and the "
                  "caller's draft is left as it was",
                  (f"{_TESTS}::test_usd_sampling_law", f"{_TESTS}::test_usd_leaves_the_callers_draft_alone")),
)


def check_cross_drafts(pair, drafts: Sequence[str], rules: Sequence[str]) -> None:
    """``ValueError`` unless every name of ``drafts`` is a cross-vocabulary draft of ``pair``
    (``pair.draft_tokenizers``) and every rule one a cross-vocabulary draft drafts by."""
    from spade_lib.decoding.drafts.drafters import CROSS_VOCAB_RULES

    cross = sorted(getattr(pair, "draft_tokenizers", {}) or {})
    bad = [d for d in drafts if d not in cross]
    if bad:
        raise ValueError(f"cross_drafts: {bad} not cross-vocabulary drafts of pair {pair.name!r} (those: {cross})")
    bad = [r for r in rules if r not in CROSS_VOCAB_RULES]
    if bad:
        raise ValueError(f"cross_rules: {bad} not among {list(CROSS_VOCAB_RULES)}")
    if drafts and not rules:
        raise ValueError("cross_rules: empty, so SPADE would time no cross-vocabulary draft")


def cross_configs(run_config: Callable[..., RunConfig], drafts: Sequence[str], rules: Sequence[str], gamma: int,
                  temperature: float) -> list[RunConfig]:
    """The runs of the cross-vocabulary drafts in one session at ``temperature``: per draft, SPADE with each
    rule (``draft_options={"rule": rule}``) and HF assisted generation (UAG when greedy, USD when sampling),
    all at ``gamma``. ``run_config`` makes a :class:`~spade_lib.runs.config.RunConfig` of the session (e.g.
    :meth:`spade_lib.experiment.Experiment.run_config`)."""
    out = []
    for d in drafts:
        out += [run_config(method="spade", draft=d, gamma=gamma, temperature=temperature, draft_options={"rule": r})
                for r in rules]
        out.append(run_config(method="hf_assisted", draft=d, gamma=gamma, temperature=temperature))
    return out


def generator_lines(temperatures: Sequence[float]) -> list[str]:
    """The facts of :data:`HF_GENERATORS` that bear on ``temperatures``: at ``T = 0`` UAG, at ``T > 0`` the
    USD SPADE's runs call and the USD ``generate`` runs by default."""
    greedy, sampled = any(T == 0 for T in temperatures), any(T > 0 for T in temperatures)
    lines = []
    for f in HF_GENERATORS:
        if (f.sampling and sampled) or (not f.sampling and greedy):
            lines.append(f.sentence())
    return lines


def with_speedup_vs_hf(table: pd.DataFrame, runs: Mapping[RunConfig, Any], *,
                       protocol: protocols.Protocol) -> pd.DataFrame:
    """``table`` (a speedup table) with ``speedup_vs_hf`` and its interval (``_low``, ``_high``) on every HF
    assisted row whose temperature has a plain HF generate run among ``runs`` (config -> run folder): HF
    assisted generation over its own baseline, timed in the same session
    (:func:`spade_lib.runs.protocol.speedup_over`). Rows without one keep NaN."""
    table = table.copy()
    for col in ("speedup_vs_hf", "speedup_vs_hf_low", "speedup_vs_hf_high"):
        if col not in table.columns:
            table[col] = float("nan")
    for i, row in table[table["method"] == "hf_assisted"].iterrows():
        hf_cfg = next((c for c in runs if c.method == "hf" and c.temperature == row["T"]), None)
        if hf_cfg is None:
            continue
        b = protocols.speedup_over(runs[row["config"]], hf_cfg, protocol=protocol)
        table.loc[i, ["speedup_vs_hf", "speedup_vs_hf_low", "speedup_vs_hf_high"]] = (
            b["ratio_of_totals"], b["ratio_of_totals_low"], b["ratio_of_totals_high"])
    return table


@dataclass
class CrossReport:
    """:func:`cross_report`'s result."""

    table: pd.DataFrame          # one row per cross-vocabulary run (COLUMNS and the speedup table's others)
    greedy: dict[str, dict]      # label of each T = 0 run -> counts of identical / near_tie / bug generations
    warnings: list[str]          # the physical controls' violations (cost table, then speedups)
    lines: list[str]             # what the notebook prints


def _iv(r, col: str, spec: str = ".2f", unit: str = "") -> str:
    v, lo, hi = r.get(col), r.get(f"{col}_low"), r.get(f"{col}_high")
    if v is None or v != v:
        return "-"
    if lo is None or hi is None or lo != lo or hi != hi:
        return f"{v:{spec}}{unit} (no interval)"
    return f"{v:{spec}}{unit} [{lo:{spec}}, {hi:{spec}}]"


def _generator(row) -> str:
    if row["method"] != "hf_assisted":
        return f"SPADE, rule {row['rule']}"
    fact = next(f for f in HF_GENERATORS if f.sampling == (row["T"] > 0) and f.runs_use)
    return f"HF {fact.name}{' (unpruned translator)' if fact.sampling else ''}"


def cross_report(pair, rows: Sequence[Mapping[str, Any]], cross_dirs: Mapping[RunConfig, Path],
                 session_dirs: Mapping[RunConfig, Path], baselines: Mapping[float, RunConfig], *,
                 protocol: protocols.Protocol, costs: Mapping[str, Mapping] | None = None) -> CrossReport:
    """The cross-vocabulary runs ``cross_dirs`` (config -> run folder, :func:`cross_configs` as run by
    :func:`spade_lib.runs.protocol.run_interleaved`) of sessions whose autoregressive baseline per temperature
    is ``baselines[T]`` (its folder and any plain HF generate run in ``session_dirs``): their speedup table
    (``costs``, :func:`spade_lib.runs.costs.pair_costs` of the drafts, prices the SPADE rows' predictions),
    the physical controls, the greedy-equality check of the ``T = 0`` runs against the baseline (``rows``:
    the suite's rows), and the lines to print (module docstring)."""
    if not cross_dirs:
        return CrossReport(pd.DataFrame(columns=COLUMNS), {}, [], ["cross-vocabulary drafts: none to run "
                                                                   "(cross_drafts is empty)"])
    tables = []
    for T in dict.fromkeys(c.temperature for c in cross_dirs):
        base = protocol.config(baselines[T])
        members = {base: session_dirs[base], **{c: d for c, d in cross_dirs.items() if c.temperature == T}}
        t = protocols.speedup_table(members, baselines[T], protocol=protocol, costs=dict(costs or {}))
        tables.append(t[t["method"] != "ar"])
    table = pd.concat(tables, ignore_index=True)
    table["rule"] = [c.draft_options.get("rule", "-") if c.method == "spade" else "-" for c in table["config"]]
    table = with_speedup_vs_hf(table, {**session_dirs, **cross_dirs}, protocol=protocol)
    found = controls.cost_warnings(costs or {}, pair=pair.name) + controls.speedup_warnings(table)

    greedy: dict[str, dict] = {}
    greedy_lines = []
    base0 = protocol.config(baselines[0.0]) if 0.0 in baselines else None
    for cfg, d in cross_dirs.items():
        if cfg.temperature != 0 or base0 is None:
            continue
        counts, found_lines = greedy_check(pair.target, pair.tokenizer, rows, {cfg: read_summary(d)},
                                           read_summary(session_dirs[base0]))
        greedy[cfg.label] = counts
        greedy_lines += found_lines

    lines = ["!!! " + w for w in found]
    for _, r in table.iterrows():
        vs_hf = (f"; over plain HF generate {_iv(r, 'speedup_vs_hf', unit='x')}"
                 if r["method"] == "hf_assisted" and r.get("speedup_vs_hf") == r.get("speedup_vs_hf") else "")
        steps = (f"alpha {_iv(r, 'alpha')}, tau {_iv(r, 'tau')}, " if r["method"] == "spade"
                 else "alpha and tau not recorded (HF does not expose its steps), ")
        pred = r.get("predicted")
        pred = (f"; cost-model prediction {pred:.2f}x (c = {r['c']:.3f}, r = {r['r']:.3f}, o = {r['overhead']:.3f}: "
                "a prediction, not a measurement)" if r["method"] == "spade" and pred == pred else "")
        same = (f"; greedy tokens equal to AR's on {greedy[r['label']]['identical']} of "
                f"{sum(greedy[r['label']].values())} prompts" if r["label"] in greedy else "")
        lines.append(f"{r['label']} ({_generator(r)}): {steps}speedup {_iv(r, 'speedup', unit='x')} over "
                     f"autoregressive{vs_hf}{pred}{same}")
    # SPADE's rules against HF's generator of the same draft and temperature, interval against interval
    for (d, T), g in table.groupby(["draft", "T"], sort=False):
        hf = g[g["method"] == "hf_assisted"]
        if not len(hf):
            continue
        h = hf.iloc[0]
        for _, s in g[g["method"] == "spade"].iterrows():
            where = verdicts.interval_side(s["speedup_low"], s["speedup_high"], h["speedup_low"], h["speedup_high"])
            lines.append(f"{d}, T={T:g}: SPADE {s['rule']} {_iv(s, 'speedup', unit='x')} vs {_generator(h)} "
                         f"{_iv(h, 'speedup', unit='x')}: "
                         + ({"above": "SPADE's interval lies above HF's",
                             "below": "SPADE's interval lies below HF's"}.get(where)
                            or "the intervals overlap: cannot tell which is faster"))
    lines += greedy_lines
    return CrossReport(table, greedy, found, lines)
