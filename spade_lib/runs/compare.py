"""Every speedup in a runs folder, and whether two runs folders agree: the reproducibility check.

``python -m spade_lib.runs.compare RUNS_A [RUNS_B]`` reads every finished run under
``RUNS/traces/<pair>/<suite>/`` and prints, per configuration, its speedup over the autoregressive
baseline it was interleaved with (ratio of totals, 95 % two-level bootstrap interval:
:func:`spade_lib.runs.protocol.speedup_table`), its ``alpha`` and ``tau``, and the prediction priced
with the pair's cached cost micro-benchmarks (``RUNS/costs/<pair>/``). With two folders (say, two
fresh-clone ``make run``s on one machine) it pairs the configurations and reports, for each, whether
the two intervals overlap; ``--strict`` makes any configuration whose intervals are disjoint an exit
status of 1.

A configuration is identified by the pair, the suite folder, its run folder's name (label and config
hash) and its baseline's label.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from spade_lib.runs import protocol
from spade_lib.runs.config import RunConfig
from spade_lib.runs.costs import select_costs
from spade_lib.runs.store import read_summary

__all__ = ["compare", "main", "speedups"]

KEYS = ["pair", "suite", "run", "baseline"]




def speedups(runs: str | Path) -> pd.DataFrame:
    """One row per (configuration, AR baseline it was interleaved with) of every finished run in
    ``runs``: :func:`spade_lib.runs.protocol.speedup_table`'s columns plus ``pair``, ``suite``,
    ``baseline`` and ``costs_file`` (the cost table that priced a SPADE row's prediction,
    :func:`spade_lib.runs.costs.select_costs`); HF assisted runs also get ``vs_hf`` (and its interval)
    over plain HF generate."""
    runs = Path(runs)
    if not (runs / "traces").is_dir():
        raise FileNotFoundError(f"runs: no traces/ folder in {runs}")
    tables = []
    for suite_dir in sorted(p for p in (runs / "traces").glob("*/*") if p.is_dir()):
        dirs = {}
        for meta in sorted(suite_dir.glob("*/metadata.json")):
            if (meta.parent / "summary.jsonl").is_file():
                config = json.loads(meta.read_text(encoding="utf-8"))["config"]
                dirs[RunConfig(**config)] = meta.parent
        summaries = {c: read_summary(d) for c, d in dirs.items()}
        for ar in (c for c in dirs if c.method == "ar"):
            # the tables measured where the baseline ran (device, dtype, threads): the predictions' costs
            costs = select_costs(runs / "costs" / suite_dir.parent.name, device=ar.device, dtype=ar.dtype,
                                 threads=ar.threads)
            members = {c: d for c, d in dirs.items() if c == ar or (
                c.method != "ar" and c.temperature == ar.temperature and protocol.interleaved_with(summaries[c], ar))}
            proto = protocol.Protocol(warmup=ar.warmup, repeats=ar.repeats)
            t = protocol.speedup_table(members, ar, protocol=proto, costs=costs)
            t = t.assign(pair=suite_dir.parent.name, suite=suite_dir.name, baseline=ar.label,
                         run=[members[c].name for c in t["config"]],
                         costs_file=[(costs.get(c.draft) or {}).get("file") if c.method == "spade" else None
                                     for c in t["config"]])
            hf = [c for c in members if c.method == "hf"]
            for i in t.index[t["method"] == "hf_assisted"]:
                if hf and protocol.interleaved_with(summaries[t.at[i, "config"]], hf[0]):
                    b = protocol.speedup_over(members[t.at[i, "config"]], hf[0], protocol=proto)
                    t.loc[i, ["vs_hf", "vs_hf_low", "vs_hf_high"]] = [
                        b["ratio_of_totals"], b["ratio_of_totals_low"], b["ratio_of_totals_high"]]
            tables.append(t)
    if not tables:
        raise FileNotFoundError(f"runs: no finished autoregressive baseline under {runs / 'traces'}")
    return pd.concat(tables, ignore_index=True).drop(columns=["config"])


def compare(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Configurations present in both :func:`speedups` tables, side by side (suffixes ``_a`` / ``_b``),
    with ``overlap``: whether the two speedup intervals share a point."""
    cols = KEYS + ["T", "alpha", "tau", "speedup", "speedup_low", "speedup_high", "speedup_rounds"]
    m = a.reindex(columns=cols).merge(b.reindex(columns=cols), on=KEYS + ["T"], suffixes=("_a", "_b"))
    m["overlap"] = (m["speedup_low_a"] <= m["speedup_high_b"]) & (m["speedup_low_b"] <= m["speedup_high_a"])
    return m


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spade_lib.runs.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="one or two runs folders (SPADE_RUNS_DIR of a make run)")
    ap.add_argument("--csv", type=Path, help="also write the table here")
    ap.add_argument("--strict", action="store_true", help="exit 1 when two folders disagree on any configuration")
    args = ap.parse_args(argv)
    if len(args.runs) > 2:
        ap.error("give one or two runs folders")
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 500)
    tables = [speedups(r) for r in args.runs]
    if len(tables) == 1:
        out = tables[0].reindex(columns=KEYS + ["T", "tokens_per_s", "alpha", "tau", "speedup", "speedup_low",
                                                "speedup_high", "predicted", "vs_hf"])
        print(out.round(3).to_string(index=False))
    else:
        out = compare(*tables)
        print(out.round(3).to_string(index=False))
        bad = out[~out["overlap"]]
        print(f"\n{len(out) - len(bad)} of {len(out)} configurations have overlapping speedup intervals"
              + ("" if bad.empty else ": not " + ", ".join(f"{r.pair}/{r.run} vs {r.baseline}"
                                                          for r in bad.itertuples())))
    if args.csv is not None:
        from spade_lib.io import atomic_write

        with atomic_write(args.csv, "w") as f:
            out.to_csv(f, index=False)
    return 1 if args.strict and len(tables) == 2 and not out["overlap"].all() else 0


if __name__ == "__main__":
    sys.exit(main())
