"""Time every M3 table on a large synthetic trace (target: all tables of 10 M rows in <= 10 s).

    .venv/bin/python benchmarks/bench_diagnose.py                # 10 M rows (2.5 M steps x gamma 4)
    .venv/bin/python benchmarks/bench_diagnose.py --rows 1000000

Prints the wall and CPU time of each table and the total, including the one-off conversion of the string key
columns to categoricals (``categorize``); generating the trace is not counted. Speed lives here,
not in tests (no wall-clock thresholds in tests). Timings on a shared machine vary run to run:
quote the machine's load (``uptime``) next to them.
"""

from __future__ import annotations

import argparse
import os
import time

import pandas as pd

from spade_lib import devices  # noqa: E402
from spade_lib.diagnose import (
    accept_length_hist, acceptance_by_bins, acceptance_heatmap, acceptance_logit, calibration_error,
    calibration_table, categorize, category_summary, entropy_by_outcome, expected_vs_realised,
    position_acceptance, synthetic_trace, token_class_acceptance, token_table,
)

JOBS = {
    "position": lambda d: position_acceptance(d),
    "position x category": lambda d: position_acceptance(d, "category"),
    "accept_length": lambda d: accept_length_hist(d),
    "entropy_by_outcome": lambda d: entropy_by_outcome(d),
    "acceptance_by_bins": lambda d: acceptance_by_bins(d),
    "acceptance_logit": lambda d: acceptance_logit(d),
    "calibration (q_x, accept_prob)": lambda d: calibration_error(
        pd.concat([calibration_table(d, score=s) for s in ("q_x", "accept_prob")])),
    "expected_vs_realised (all, pos, category)": lambda d: [expected_vs_realised(d, b)
                                                          for b in (None, "pos", "category")],
    "token_table": lambda d: token_table(d),
    "token_class_acceptance": lambda d: token_class_acceptance(d),
    "category_summary": lambda d: category_summary(d),
    "acceptance_heatmap": lambda d: acceptance_heatmap(d, step_bin=8),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000, help="trace rows (drafted tokens)")
    ap.add_argument("--gamma", type=int, default=4, help="draft length of the synthetic run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    t0 = devices.clock()
    df = synthetic_trace(args.rows // args.gamma, args.gamma, [0.85 - 0.08 * i for i in range(args.gamma)],
                         n_prompts=2000, categories=("code", "math", "qa", "summary", "translation", "writing"),
                         entropy_slope=-0.8, seed=args.seed)
    print(f"generated {len(df):,} rows ({df.memory_usage(deep=False).sum() / 2**20:.0f} MiB) "
          f"in {devices.clock() - t0:.1f} s; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

    print(f"{'table':45s} {'wall':>7s} {'cpu':>7s}")
    jobs = {"categorize (string keys -> categorical)": None, **JOBS}
    wall = cpu = 0.0
    for name, job in jobs.items():
        t, c = devices.clock(), time.process_time()
        if job is None:
            df = categorize(df)
        else:
            job(df)
        dt, dc = devices.clock() - t, time.process_time() - c
        wall, cpu = wall + dt, cpu + dc
        print(f"{name:45s} {dt:6.2f}s {dc:6.2f}s")
    print(f"{'all tables':45s} {wall:6.2f}s {cpu:6.2f}s  ({len(df) / wall / 1e6:.1f} M rows/s wall)")


if __name__ == "__main__":
    main()
