"""Reproducibility of the timing protocol: the same session measured twice, intervals compared.

Not a test: it runs one interleaved session (``spade_lib.runs.protocol``: AR, SPADE at each gamma, prompt
lookup, HF generate and HF assisted generation at one temperature) twice, into two fresh run
folders, and prints per configuration both speedups with their 95 % bootstrap intervals and whether
the two intervals overlap — issue 14's "two runs on the same machine give speedups whose intervals
overlap for every configuration". The last line is exactly::

    overlapping=<k>/<n> max_abs_diff=<ratio>

**A stall, injected** (``--stall SECONDS``): in the second session the first timed generation of the
first SPADE configuration on the second prompt sleeps ``SECONDS`` inside the clock (what a shared
machine does to one generation now and then). The protocol re-times it (:class:`spade_lib.runs.timing.StallRule`;
``--no-retime``: report only, the old protocol) and the line before the last says what happened::

    stall: injected=<s> retimed=<k> persistent=<k> worst_rel_change=<x> within_15pct=<yes|no>

(``worst_rel_change``: the largest ``|speedup_2 / speedup_1 - 1|`` over the configurations, and over
the ends of their intervals; ``within_15pct``: whether it is at most 0.15.)

Usage: ``python benchmarks/bench_protocol.py [--pair tiny] [--n-per-category 1] [--max-new-tokens 32]
[--gammas 1 4] [--temperature 1] [--repeats 3] [--threads 1] [--stall 2.5] [--no-retime]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spade_lib import devices  # noqa: E402
from spade_lib import experiment, paths  # noqa: E402
from spade_lib.runs import protocol, timing  # noqa: E402
from spade_lib.runs.config import RunConfig, generation_seed  # noqa: E402


def inject_stall(seconds: float, config: RunConfig, seed: int):
    """``protocol.make_generator`` whose ``config`` generator sleeps ``seconds`` in its first timed call
    with ``seed`` (inside the protocol's clock): one stalled reading."""
    real = protocol.make_generator

    def make(pair, c, records="separate"):
        g = real(pair, c, records)
        if c != config:
            return g
        timed, done = g.timed, []

        def stalled(ids, n, s):
            if s == seed and not done:
                done.append(True)
                time.sleep(seconds)
            return timed(ids, n, s)

        g.timed = stalled
        return g

    return make


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="tiny")
    ap.add_argument("--suite", default="embedded")
    ap.add_argument("--n-per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--gammas", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--stall", type=float, default=0.0, help="seconds of one stall injected into session 2")
    ap.add_argument("--no-retime", action="store_true", help="report stalls only (the protocol before re-timing)")
    args = ap.parse_args(argv)
    if args.stall < 0:
        ap.error("--stall: must be >= 0 seconds")

    E = experiment.load_experiment(args.pair, suite=args.suite, n_per_category=args.n_per_category,
                                   threads=args.threads)
    print(E.describe())
    proto = protocol.Protocol(warmup=args.warmup, repeats=args.repeats,
                              stalls=timing.StallRule(max_retimes=0) if args.no_retime else timing.StallRule())
    common = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, device=str(E.device),
                  threads=E.threads)
    ar = RunConfig(method="ar", **common)
    draft = "distilled" if "distilled" in E.pair.drafts else next(iter(E.pair.drafts))
    configs = [RunConfig(method="spade", draft=draft, gamma=g, **common) for g in args.gammas]
    configs.append(RunConfig(method="spade", draft="ngram", gamma=max(args.gammas), **common))
    tables, reports = [], []
    real_make = protocol.make_generator
    stall_row = E.suite.rows[min(1, len(E.suite.rows) - 1)]
    for attempt in (1, 2):
        if attempt == 2 and args.stall > 0:
            protocol.make_generator = inject_stall(args.stall, proto.config(configs[0]),
                                                   generation_seed(ar.seed, stall_row["question_id"], 0))
        try:
            with tempfile.TemporaryDirectory(prefix=f"spade-protocol-{attempt}-") as tmp:
                paths.RUNS_DIR = Path(tmp)
                t0 = devices.clock()
                dirs = protocol.run_interleaved(E.pair, E.suite, configs, ar, protocol=proto, progress=False)
                tables.append(protocol.speedup_table(dirs, ar, protocol=proto).set_index("label"))
                reports.append(protocol.session_stalls(dirs[proto.config(configs[0])])[-1])
                print(f"session {attempt}: {devices.clock() - t0:.0f} s; stalled readings re-timed: "
                      f"{reports[-1]['count']} (prompts {reports[-1]['prompts']})")
        finally:
            protocol.make_generator = real_make
    a, b = tables
    n = k = 0
    worst = 0.0
    print(f"{'configuration':<36} {'run 1':>22} {'run 2':>22}  overlap")
    for label in a.index:
        if a.loc[label, "method"] == "ar":
            continue
        r1, r2 = a.loc[label], b.loc[label]
        ok = r1["speedup_low"] <= r2["speedup_high"] and r2["speedup_low"] <= r1["speedup_high"]
        n += 1
        k += int(ok)
        worst = max(worst, abs(r1["speedup"] - r2["speedup"]))
        print(f"{label:<36} {r1['speedup']:6.3f} [{r1['speedup_low']:.3f}, {r1['speedup_high']:.3f}] "
              f"{r2['speedup']:6.3f} [{r2['speedup_low']:.3f}, {r2['speedup_high']:.3f}]  {'yes' if ok else 'NO'}")
    if args.stall > 0:
        rel = max(abs(b.loc[lab, key] / a.loc[lab, key] - 1) for lab in a.index if a.loc[lab, "method"] != "ar"
                  for key in ("speedup", "speedup_low", "speedup_high"))
        print(f"stall: injected={args.stall:g} retimed={reports[1]['count']} persistent={reports[1]['persistent']} "
              f"worst_rel_change={rel:.3f} within_15pct={'yes' if rel <= 0.15 else 'no'}")
    print(f"overlapping={k}/{n} max_abs_diff={worst:.3f}")


if __name__ == "__main__":
    main()
