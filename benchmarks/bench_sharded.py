"""Wall time of one run of the CLI in 1 process vs N processes (torchrun, gloo), same config.

    .venv/bin/python benchmarks/bench_sharded.py --config params/cli/tiny.yaml --n-per-category 10 --procs 2

Each round runs ``python -m spade_lib.runs.cli`` (1 process) and ``torchrun --standalone
--nproc-per-node N -m spade_lib.runs.cli`` into fresh folders, in alternating order (1, N, N, 1, ...), and
times the whole command (interpreter start, imports, model loading, decoding, merge). The two run
folders are then compared: equal in every trace and summary column except the timings. Ratios are
measured in one run; on a CPU the N processes share its cores (each gets ``threads`` of the YAML), so
the gain is bounded by the cores that are free.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from spade_lib import devices, paths
from spade_lib.runs import trace
from spade_lib.runs.store import read_summary

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run(config: Path, out: Path, procs: int) -> tuple[float, float]:
    """(wall seconds of the whole command, seconds the CLI reports after its imports)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(paths.REPO_ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    launcher = [sys.executable] if procs == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs)]
    cmd = launcher + ["-m", "spade_lib.runs.cli", "--config", str(config), "--out", str(out), "--no-progress"]
    start = devices.clock()
    done = subprocess.run(cmd, cwd=paths.REPO_ROOT, env=env, capture_output=True, text=True)
    wall = devices.clock() - start
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    inner = float(re.search(r"finished in ([0-9.]+) s", done.stdout).group(1))
    return wall, inner


def same_run(a: Path, b: Path) -> None:
    pd.testing.assert_frame_equal(trace.read_trace(a).drop(columns=trace.TIMING_COLUMNS),
                                  trace.read_trace(b).drop(columns=trace.TIMING_COLUMNS))
    timed = ["wall_time", "wall_times"]
    pd.testing.assert_frame_equal(read_summary(a).drop(columns=timed),
                                  read_summary(b).drop(columns=timed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(paths.PARAMS_DIR / "cli" / "tiny.yaml"), help="run YAML")
    ap.add_argument("--n-per-category", type=int, default=10, help="overrides the YAML's n_per_category")
    ap.add_argument("--procs", type=int, default=2, help="processes of the sharded run")
    ap.add_argument("--rounds", type=int, default=1, help="pairs of runs (1 process, N processes)")
    args = ap.parse_args()
    spec = yaml.safe_load(Path(args.config).read_text())
    spec["n_per_category"] = args.n_per_category
    times: dict[int, list[tuple[float, float]]] = {1: [], args.procs: []}
    with tempfile.TemporaryDirectory(prefix="spade-bench-sharded-") as tmp:
        config = Path(tmp) / "run.yaml"
        config.write_text(yaml.safe_dump(spec))
        for r in range(args.rounds):
            order = (1, args.procs) if r % 2 == 0 else (args.procs, 1)
            for procs in order:
                out = Path(tmp) / f"run{r}-{procs}p"
                times[procs].append(run(config, out, procs))
                print(f"round {r}: {procs} process(es): {times[procs][-1][0]:.1f} s wall "
                      f"({times[procs][-1][1]:.1f} s after imports)", flush=True)
            same_run(Path(tmp) / f"run{r}-1p", Path(tmp) / f"run{r}-{args.procs}p")
        n = len(read_summary(Path(tmp) / "run0-1p"))
    one, many = (statistics.median(t[0] for t in times[p]) for p in (1, args.procs))
    one_in, many_in = (statistics.median(t[1] for t in times[p]) for p in (1, args.procs))
    print(f"\n{n} generations of {args.config} (n_per_category={args.n_per_category}); {os.cpu_count()} CPUs")
    print(f"1 process: {one:.1f} s wall; {args.procs} processes: {many:.1f} s wall; "
          f"ratio 1p/{args.procs}p = {one / many:.2f} (after imports: {one_in / many_in:.2f})")
    print("merged run equals the one-process run in every column except the timings: yes")


if __name__ == "__main__":
    main()
