"""Batch benchmark: throughput of batched speculative vs batched autoregressive decoding against batch size.

Not a test: it prints ratios measured in one run on one machine. On an embedded pair it runs
:func:`spade_lib.decoding.studies.batch_study.batch_study` (for each batch size ``B``, ``--repeats`` timed rounds after a
warm-up, each decoding its own ``B`` suite prompts with both methods, alternating; throughput = all rows' new
tokens / the rounds' wall time; the speedup's bootstrap interval over the rounds from
:func:`spade_lib.runs.batch_speedup.with_intervals`) with the theory's prediction ``E[tokens] / (gamma c(B) +
r(B))`` from the measured ``alpha``, draft cost ``c(B)`` and verification cost ``r(B)``. Then it decodes
one batch of 8 prompts and counts the rows identical to single-sequence ``generate`` with the same seed.
The last line is exactly::

    batch_speedup_b1=<x> batch_speedup_b8=<x> rows_identical=<n>/<m>

Usage: ``python benchmarks/bench_batch.py [--pair default] [--draft distilled] [--n-per-category 2]
[--max-new-tokens 32] [--gamma 4] [--temperature 0] [--batch-sizes 1,2,4,8,16] [--repeats 3]
[--threads 0] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402

from spade_lib import devices  # noqa: E402
from spade_lib.runs import timing  # noqa: E402
from spade_lib.runs.config import RunConfig, prompt_ids  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="default", help="embedded pair name")
    ap.add_argument("--draft", default=None, help="draft model of the pair (default: the pair's default draft)")
    ap.add_argument("--n-per-category", type=int, default=2, help="prompts per suite category")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="tokens per row")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16", help="comma-separated batch sizes (include 1 and 8)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds per point, each on its own prompts")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all CPUs of this process)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    from spade_lib.bench import default_suite
    from spade_lib.decoding.decode import SpeculativeDecoder
    from spade_lib.decoding.studies.batch_study import BatchStudyConfig, batch_study, stops_paying
    from spade_lib.runs.batch_speedup import ROUND_COLUMNS, with_intervals
    from spade_lib.sampling import SamplingConfig
    from spade_lib.zoo.pairs import load_for_timing

    sizes = tuple(int(b) for b in args.batch_sizes.split(","))
    threads = timing.fix_threads(args.threads or None)
    device = devices.resolve_device(args.device)
    t0 = devices.clock()
    try:  # the target and this draft model prepared (their kernel plans)
        pair, args.draft = load_for_timing(args.pair, args.draft, device=device)
    except ValueError as e:
        raise SystemExit(f"--{e}") from None
    suite = default_suite(tokenizer=args.pair, n_per_category=args.n_per_category, seed=args.seed)
    cfg = RunConfig(max_new_tokens=args.max_new_tokens)
    prompts = [prompt_ids(pair.tokenizer, r["turns"][0], cfg) for r in suite.rows]
    print(f"pair={pair.name} draft={args.draft} prompts={len(prompts)} (lengths {min(map(len, prompts))}-"
          f"{max(map(len, prompts))}) max_new_tokens={args.max_new_tokens} gamma={args.gamma} "
          f"T={args.temperature:g} batch_sizes={list(sizes)} repeats={args.repeats} threads={threads} "
          f"device={device} (setup {devices.clock() - t0:.1f} s)")
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"] * 3
    print(f"load average before: {' '.join(load)} (other processes share these cores if > {threads})")

    draft = pair.drafts[args.draft]
    study_cfg = BatchStudyConfig(batch_sizes=sizes, gamma=args.gamma, temperatures=(args.temperature,),
                                 max_new_tokens=args.max_new_tokens, repeats=args.repeats, seed=args.seed)
    t1 = devices.clock()
    study = with_intervals(batch_study(pair.target, draft, prompts, study_cfg, tokenizer=pair.tokenizer), seed=args.seed)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(study.drop(columns=list(ROUND_COLUMNS)).round(3).to_string(index=False))
    T = float(args.temperature)
    print(f"speculation stops paying at B = {stops_paying(study)[T]} (measured: its interval below 1), "
          f"{stops_paying(study, 'predicted')[T]} (predicted); study {devices.clock() - t1:.0f} s")

    dec = SpeculativeDecoder(pair.target, draft, gamma=args.gamma, sampling=SamplingConfig(temperature=T),
                             record=False)
    rows8 = [prompts[b % len(prompts)] for b in range(8)]
    seeds = [args.seed + b for b in range(8)]
    batched = dec.generate_batch(rows8, args.max_new_tokens, seed=seeds)
    same = sum(r.tokens == dec.generate(p, args.max_new_tokens, seed=s).tokens
               for r, p, s in zip(batched, rows8, seeds))
    at = study.set_index("batch_size")["speedup"]
    b1 = at.get(1, float("nan"))
    b8 = at.get(8, float("nan"))
    print(f"batch_speedup_b1={b1:.3f} batch_speedup_b8={b8:.3f} rows_identical={same}/{len(rows8)}")


if __name__ == "__main__":
    main()
