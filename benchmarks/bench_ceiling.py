"""The ceiling of a speculative run: its own acceptance priced with every cost a kernel controls at its floor.

Not a timing: it reads the runs notebook 03 wrote (``runs/traces/<pair>/<suite>/``, or ``--runs-dir``) and the
pair's weights. For every SPADE chain run with a model draft of the pair, beside the autoregressive run of its
session's temperature, it prints the measured speedup (whole generations, and the decode phase with each side's
prompt prefill out) and the cost model (:func:`spade_lib.runs.metrics.predicted_speedup`: the run's ``alpha``, the
number drafted at each step, its prompts' prefills as measured, in AR decode steps) with

- the draft's step at its **byte ratio** ``c_bytes`` = the draft's bytes a step over the target's
  (:meth:`~spade_lib.decoding.model.lean.LeanForward.weight_bytes`): its ``c`` if both streamed their weights at
  one rate (a draft held in the caches can run below it, so this is a floor for memory-bound models only);
- verification free, ``r = 1`` (``g + 1`` rows for the price of one), and no loop cost;

as ``ceiling`` (whole generations) and ``ceiling_step`` (a decode step), with ``measured / ceiling``. A whole
generation's speedup is ``(P_AR + n) / (P_run + n / S)`` per prompt (``P``: prefills in AR steps, ``n`` new tokens,
``S`` the decode-phase speedup), so it reaches ``--goal`` from ``n >= (goal P_run - P_AR) / (1 - goal / S)`` new
tokens a prompt (none where ``S <= goal``): printed at the ceiling's ``S`` (``n_goal_floor``) and at the measured
decode phase's (``n_goal_measured``), against the run's own ``n``.

    python benchmarks/bench_ceiling.py --pair qwen2.5-coder [--suite humaneval] [--goal 1.8]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spade_lib.decoding.model.lean import LeanForward  # noqa: E402
from spade_lib.runs import metrics  # noqa: E402
from spade_lib.runs.store import list_runs, read_summary  # noqa: E402
from spade_lib.runs.trace import read_trace  # noqa: E402
from spade_lib.zoo.pairs import load_pair  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="qwen2.5-coder", help="pair name for spade_lib.zoo.pairs.load_pair")
    ap.add_argument("--suite", default="", help="the runs' suite name (e.g. humaneval); empty: every one")
    ap.add_argument("--runs-dir", default="", help="a runs folder (its traces/ are read); empty: SPADE's runs/")
    ap.add_argument("--goal", type=float, default=1.8, help="a whole-generation speedup to reach (> 1)")
    args = ap.parse_args(argv)
    if not (math.isfinite(args.goal) and args.goal > 1):
        ap.error(f"--goal: must be a finite speedup > 1, got {args.goal}")
    return args


def tokens_for(goal: float, p_ar: float, p_run: float, s: float) -> float:
    """New tokens a prompt from which ``(p_ar + n) / (p_run + n / s) >= goal`` (``p``: a prompt's prefills in AR
    decode steps, ``s`` the decode-phase speedup); ``inf`` where ``s <= goal`` (never), 0 where it already holds."""
    if not s > goal:
        return math.inf
    return max(0.0, (goal * p_run - p_ar) / (1.0 - goal / s))


def ceiling_row(trace, summary, baseline, gamma: int, c_bytes: float, goal: float) -> dict:
    """One run's figures (module docstring): measured, the ceiling at ``c_bytes`` and ``r = 1``, tokens for ``goal``."""
    m = metrics.run_metrics(trace, summary, baseline, gamma=gamma)
    drafted = metrics.drafted_per_step(trace, summary)
    pre = metrics.prefill_steps(summary, baseline)
    if pre is None:
        raise ValueError("runs: the run or its baseline recorded no prompt prefills (prefill_time); re-run notebook 03")
    step = metrics.predicted_speedup(m["alpha"], drafted, c_bytes)
    whole = metrics.predicted_speedup(m["alpha"], drafted, c_bytes, prefill=pre)
    n_gen = len(summary)
    p_ar, p_run = pre[0] / n_gen, pre[1] / n_gen
    return {"alpha": m["alpha"], "tau": m["tau"], "c_bytes": c_bytes, "speedup": m["speedup"],
            "speedup_decode": m["speedup_decode"], "ceiling": whole, "ceiling_step": step,
            "of_ceiling": m["speedup"] / whole, "prefill_ar": p_ar, "prefill_run": p_run,
            "new_tokens": float(summary["new_tokens"].mean()),
            "n_goal_floor": tokens_for(goal, p_ar, p_run, step),
            "n_goal_measured": tokens_for(goal, p_ar, p_run, m["speedup_decode"])}


def main(argv=None) -> list[dict]:
    args = parse(argv)
    runs = list_runs(Path(args.runs_dir) / "traces" if args.runs_dir else None)
    pair = load_pair(args.pair)
    if not runs.empty:
        runs = runs[(runs["pair"] == pair.name) & ((runs["suite"] == args.suite) if args.suite else True)]
    if runs.empty:
        raise SystemExit(f"bench_ceiling: no finished runs of pair {pair.name!r}"
                         + (f" on suite {args.suite!r}" if args.suite else "") + " (notebook 03 writes them)")
    target_bytes = LeanForward(pair.target, 2).weight_bytes()
    draft_bytes = {}
    out = []
    print(f"pair {pair.name}: target {target_bytes / 1e6:.0f} MB a step; goal {args.goal:g}x over whole generations")
    for (suite, T), group in runs.groupby(["suite", "temperature"]):
        ar = group[group["method"] == "ar"]
        if ar.empty:
            continue
        base = read_summary(ar["run_dir"].iloc[0])
        chain = group["tree"].fillna("") == "" if "tree" in group else True  # runs before trees: chains
        chains = group[(group["method"] == "spade") & chain & group["draft"].isin(list(pair.drafts))]
        for _, r in chains.iterrows():
            if r["draft"] not in draft_bytes:
                draft_bytes[r["draft"]] = LeanForward(pair.drafts[r["draft"]], 2).weight_bytes()
            row = ceiling_row(read_trace(r["run_dir"]), read_summary(r["run_dir"]), base, int(r["gamma"]),
                              draft_bytes[r["draft"]] / target_bytes, args.goal)
            label = Path(r["run_dir"]).name.rsplit("-", 1)[0]
            out.append({"suite": suite, "T": float(T), "label": label, **row})
            print(f"{suite} T={T:g} {label}: alpha {row['alpha']:.3f} tau {row['tau']:.2f} c_bytes {row['c_bytes']:.3f}; "
                  f"measured {row['speedup']:.3f}x (decode phase {row['speedup_decode']:.3f}x); ceiling "
                  f"{row['ceiling']:.3f}x ({row['ceiling_step']:.3f}x a step): {row['of_ceiling']:.2f} of it; "
                  f"prefills {row['prefill_ar']:.1f} / {row['prefill_run']:.1f} AR steps a prompt; {args.goal:g}x from "
                  f"{row['n_goal_floor']:.0f} new tokens at the floors, {row['n_goal_measured']:.0f} at the measured "
                  f"decode phase (the run: {row['new_tokens']:.0f})")
    if not out:
        raise SystemExit(f"bench_ceiling: no SPADE chain run with a model draft of {pair.name!r} beside an AR run")
    print(json.dumps(out, default=float))
    return out


if __name__ == "__main__":
    main()
