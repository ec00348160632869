"""Decode-speed benchmark: SPADE vs autoregressive, HF assisted vs plain HF, and vs Theorem 3.8.

Not a test: it prints ratios measured in one run on one machine. On the default embedded pair (fp32,
CPU) it decodes the same prompts with four methods, interleaved prompt by prompt so that machine noise
hits them alike, each generation timed ``--repeats`` times after a warm-up (median kept):

- ``ar``: SPADE's autoregressive loop;        ``spade``: SPADE's speculative decoder (gamma, draft);
- ``hf``: plain ``model.generate``;            ``hf_assisted``: HF assisted generation, same draft and
  gamma (constant schedule, threshold 0).

Every speedup is a ratio of totals (``sum new_tokens / sum seconds``, the same token counting for all
methods; ``spade_lib.metrics``). SPADE's prediction is Leviathan et al.'s Theorem 3.8 evaluated at its
own measured acceptance ``alpha`` (``metrics.acceptance_rate`` over its trace) and cost ratio ``c``
(draft seconds per drafted token / AR seconds per token). The last line is exactly::

    spade_vs_hf_assisted=<ratio> fraction_of_prediction=<ratio>

Usage: ``python benchmarks/bench_decode.py [--pair default] [--n-per-category 3] [--max-new-tokens 128]
[--gamma 4] [--temperature 0] [--repeats 3] [--threads 2] [--profile]``. ``--profile`` adds a cProfile
of SPADE's loop (top functions by own time) and the per-phase split of a step.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from spade_lib import metrics, runner, timing  # noqa: E402
from spade_lib.theory import speedup as theory_speedup  # noqa: E402

METHODS = ("ar", "spade", "hf", "hf_assisted")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="default", help="embedded pair name")
    ap.add_argument("--draft", default="distilled", help="draft of the pair")
    ap.add_argument("--suite", default="", help="'embedded', 'humaneval' or a suite .jsonl (default: embedded; "
                                                 "humaneval for the real pair smollm2)")
    ap.add_argument("--n-per-category", type=int, default=3, help="prompts per suite category")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--repeats", type=int, default=3, help="timed generations per prompt and method")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all CPUs of this process)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto (the pair is fp32 either way)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="also cProfile SPADE's decode loop")
    return ap.parse_args(argv)


def verify_cost_ratio(model, gamma: int, context: int = 64, reps: int = 30) -> float:
    """Measured ``r``: seconds of a (gamma+1)-token target forward over a 1-token one, with a
    ``context``-token KV cache (the adapter's extend/rollback, as in decoding)."""
    from spade_lib.adapter import CausalLMAdapter

    ad = CausalLMAdapter(model)
    dev = ad.device
    ctx = torch.randint(1, ad.vocab_size, (context,), generator=torch.Generator().manual_seed(0)).to(dev)
    ad.prefill(ctx)
    out = {}
    for k in (1, gamma + 1):
        ids = ctx[:k]

        def fwd():
            ad.extend(ids)
            ad.rollback(context)

        out[k] = timing.measure(fwd, warmup=3, repeats=reps, device=dev)[1].median
    return out[gamma + 1] / out[1]


def main(argv=None) -> None:
    args = parse_args(argv)
    from spade_lib.bench import default_suite, humaneval_suite, load_suite
    from spade_lib.zoo import load_pair

    threads = timing.fix_threads(args.threads or None)
    device = timing.resolve_device(args.device)
    t0 = time.perf_counter()
    pair = load_pair(args.pair, device=device)
    suite_name = args.suite or ("humaneval" if args.pair == "smollm2" else "embedded")
    if suite_name == "embedded":
        suite = default_suite(tokenizer=args.pair, n_per_category=args.n_per_category, seed=args.seed)
    elif suite_name == "humaneval":
        suite = humaneval_suite(n_per_category=args.n_per_category, seed=args.seed)
    else:
        suite = load_suite(suite_name).filter(n_per_category=args.n_per_category)
    print(f"pair={pair.name} draft={args.draft} suite={suite.name} ({len(suite.rows)} prompts, "
          f"{len(suite.categories)} categories) max_new_tokens={args.max_new_tokens} gamma={args.gamma} "
          f"T={args.temperature:g} repeats={args.repeats} threads={threads} device={device} "
          f"(setup {time.perf_counter() - t0:.1f} s)")
    fp = timing.environment_fingerprint(device)
    print(f"cpu={fp['cpu_model']!r} gpu={fp['gpu']!r} torch={fp['torch']} transformers={fp['transformers']} "
          f"git={str(fp['git_commit'])[:10]}{'+dirty' if fp['git_dirty'] else ''}")
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"] * 3
    print(f"load average before: {' '.join(load)} (other processes share these cores if > {threads})")

    # prompt lookup ("--draft ngram") has no HF assisted counterpart with an assistant model
    methods = METHODS if args.draft != "ngram" else tuple(m for m in METHODS if m != "hf_assisted")
    configs = {m: runner.RunConfig(method=m, draft=args.draft, gamma=args.gamma, temperature=args.temperature,
                                   max_new_tokens=args.max_new_tokens, seed=args.seed, device=str(device),
                                   warmup=0, repeats=args.repeats) for m in methods}
    gens = {m: runner.make_generator(pair, c) for m, c in configs.items()}
    prompts = [(r, runner.prompt_ids(pair.tokenizer, r["turns"][0], configs["ar"])) for r in suite.rows]
    for m in methods:  # warm-up: every method once on the first prompt
        gens[m].timed(prompts[0][1], args.max_new_tokens, 1)

    rows, records = {m: [] for m in methods}, []
    t_bench = time.perf_counter()
    for i, (row, ids) in enumerate(prompts):
        seed = runner.generation_seed(args.seed, row["question_id"], 0)
        order = methods[i % len(methods):] + methods[:i % len(methods)]  # rotate: no method always runs first
        for m in order:
            gen, t = runner.timed_generation(gens[m], ids, configs[m], seed, device)
            rows[m].append({"question_id": row["question_id"], "category": row["category"], "sample": 0,
                            "new_tokens": len(gen.output_ids), "wall_time": t.median,
                            "rel_spread": t.rel_spread, "accept_lengths": gen.accept_lengths,
                            "output_ids": gen.output_ids})
            if m == "spade":
                records += [{"prompt_id": str(row["question_id"]), "sample": 0, **r} for r in gen.records]
    elapsed = time.perf_counter() - t_bench
    s = {m: pd.DataFrame(v) for m, v in rows.items()}
    tr = pd.DataFrame(records)

    same = sum(a == b for a, b in zip(s["spade"]["output_ids"], s["ar"]["output_ids"]))
    print(f"\n{len(prompts)} prompts x {len(methods)} methods x {args.repeats} repeats in {elapsed:.0f} s; "
          f"SPADE output == AR output on {same}/{len(prompts)} prompts"
          + (" (greedy: must be all)" if args.temperature == 0 else ""))
    print(f"{'method':<12} {'tok/s':>8} {'speedup':>8} {'vs':>5}  {'mean-of-ratios':>14}  {'median rel. spread':>18}")
    base_of = {"ar": "ar", "spade": "ar", "hf": "hf", "hf_assisted": "hf"}
    sp = {}
    for m in methods:
        b = base_of[m]
        sp[m] = metrics.speedup_ratio_of_totals(s[m], s[b])
        mor = metrics.speedup_mean_of_ratios(s[m], s[b])
        print(f"{m:<12} {metrics.tokens_per_second(s[m]):8.1f} {sp[m]:8.3f} {b:>5}  {mor:14.3f}  "
              f"{s[m]['rel_spread'].median():18.3f}")

    alpha = metrics.acceptance_rate(tr)
    c = metrics.cost_ratio(tr, s["ar"])
    tau = metrics.mean_accepted_length(s["spade"])
    predicted = metrics.predicted_speedup(alpha, args.gamma, c)
    r = verify_cost_ratio(pair.target, args.gamma)
    predicted_r = float(theory_speedup(alpha, args.gamma, c, verify_cost=r))
    st = metrics.steps(tr)
    per_step = {k: st[k].mean() * 1e3 for k in ("t_draft", "t_verify", "t_overhead")}
    ar_ms = 1e3 / metrics.tokens_per_second(s["ar"])
    print(f"\nSPADE: alpha={alpha:.3f} (expected from 1-TV: {metrics.expected_acceptance_rate(tr):.3f}) "
          f"tau={tau:.3f} (iid prediction {(1 - alpha ** (args.gamma + 1)) / (1 - alpha):.3f}) "
          f"c={c:.4f} block efficiency={metrics.block_efficiency(s['spade']):.3f}")
    print(f"per step (ms): draft {per_step['t_draft']:.2f}, verify {per_step['t_verify']:.2f}, "
          f"overhead {per_step['t_overhead']:.2f}; AR per token {ar_ms:.2f} ms; "
          f"verify cost r = t(fwd {args.gamma + 1} tok) / t(fwd 1 tok) = {r:.3f}")
    print(f"Thm 3.8 prediction {predicted:.3f} (r=1); with measured r: {predicted_r:.3f}; "
          f"measured {sp['spade']:.3f}")

    if args.profile:
        profile_spade(gens["spade"], prompts, args)

    if "hf_assisted" not in sp:
        print(f"fraction_of_prediction={sp['spade'] / predicted:.3f}")
        return
    ratio = sp["spade"] / sp["hf_assisted"]
    fraction = sp["spade"] / predicted
    print(f"spade_vs_hf_assisted={ratio:.3f} fraction_of_prediction={fraction:.3f}")


def profile_spade(generator, prompts, args) -> None:
    """Cost of token-level recording, and a cProfile of SPADE's timed loop (top functions by own time)."""
    sub = prompts[: min(4, len(prompts))]
    for name, fn in (("record='light' (timed)", generator.timed), ("record=True (trace pass)", generator.recorded)):
        t0 = time.perf_counter()
        for row, ids in sub:
            fn(ids, args.max_new_tokens, 1)
        print(f"{name:<26} {time.perf_counter() - t0:.3f} s over {len(sub)} prompts")
    prof = cProfile.Profile()
    prof.enable()
    for row, ids in prompts[: min(4, len(prompts))]:
        generator.timed(ids, args.max_new_tokens, 1)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    print("\n--- cProfile of SPADE (tottime) ---")
    print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main()
