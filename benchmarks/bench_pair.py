"""Figures of a pair: held-out quality from its build manifest, costs measured afresh.

    .venv/bin/python benchmarks/bench_pair.py --pair default --rounds 5 --reps 100
    .venv/bin/python benchmarks/bench_pair.py --pair smollm2 --rounds 3 --reps 20 --early-exit

For a registered real pair it prints its record's description of the built pair (``smollm2``: the per-draft
table of ``python -m spade_lib.zoo smollm2``: alpha at T=0 and T=1 on held-out target generations, c, r, build
time); ``--early-exit`` adds the
teacher-forced alpha of the target's own early exit by layer (``spade_lib.zoo.early_exit.early_exit_alpha``) on
a few HumanEval prompts in the chat template, each followed by the target's greedy answer.

Costs (see ``spade_lib.zoo.evaluate``): ``c = t_draft(1) / t_target(1)`` per draft and the target's
``verify_cost_ratio = t_target(gamma + 1) / t_target(1)``, each the median over ``reps`` cached
forwards, repeated over ``rounds`` (median and range printed). Ratios measured in one run; absolute
times depend on the machine and on whatever else it is running.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from spade_lib.zoo.evaluate import cost_ratios
from spade_lib.zoo.pairs import load_pair
from spade_lib.zoo.registry import real_pair, real_pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="default", help="pair name (embedded or a registered real pair)")
    ap.add_argument("--early-exit", action="store_true", help="a real pair: early-exit alpha by layer")
    ap.add_argument("--early-exit-prompts", type=int, default=4, help="HumanEval prompts for --early-exit")
    ap.add_argument("--rounds", type=int, default=5, help="repetitions of the whole cost measurement")
    ap.add_argument("--reps", type=int, default=100, help="timed forwards per model and shape per round")
    ap.add_argument("--gamma", type=int, default=4, help="draft length of the verify-cost ratio")
    ap.add_argument("--context", type=int, default=64, help="tokens in the KV cache")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_pair(args.pair)
    m = pair.manifest
    print(f"pair {pair.name} at {pair.path}")
    if pair.name in real_pairs():
        registered(pair, args)
    else:
        embedded_pair(pair, args)


def registered(pair, args) -> None:
    """A registered real pair: its record's description of the built pair, the early exit, the costs."""
    describe = real_pair(pair.name).describe
    if describe is not None:
        print(describe(pair.manifest))
    if args.early_exit:
        early_exit_table(pair, args.early_exit_prompts)
    costs(pair, args)


@torch.no_grad()
def early_exit_table(pair, n_prompts: int, new_tokens: int = 64) -> None:
    from spade_lib.bench import humaneval_suite, render_prompt
    from spade_lib.zoo.early_exit import early_exit_alpha

    tok = pair.tokenizer
    texts = []
    for row in humaneval_suite(n_per_category=n_prompts).rows:
        ids = tok.encode(render_prompt(row["turns"][0], tok), add_special_tokens=False)
        out = pair.target.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)
        texts.append(out[0].tolist())
    n_layers = pair.target.config.num_hidden_layers
    df = early_exit_alpha(pair, texts, [1, 2, 4, 8, 12, 15, 20, 25, 28, n_layers - 1], temperatures=(1.0,))
    print(f"early exit (target's norm + head after layer k), teacher-forced on {n_prompts} HumanEval prompts + "
          f"greedy answers ({int(df['n_positions'].iloc[0])} positions):")
    print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))


def embedded_pair(pair, args) -> None:
    m = pair.manifest
    print(f"build: {m['seconds']['total']:.0f} s wall, {m['seconds'].get('cpu_total', float('nan')):.0f} s CPU, "
          f"{m['environment']['threads']} threads, python {m['environment']['python_version']}, "
          f"corpus {m['corpus']['sha256'][:12]}")
    for name, s in m["models"].items():
        extra = f"  alpha(T=1) {s['alpha']:.3f}  top-1 {s['top1_agreement']:.3f}" if "alpha" in s else ""
        print(f"  {name:10s} {s['n_parameters'] / 1e6:6.2f} M params  val ppl {s['val_ppl']:8.2f}{extra}")
    costs(pair, args)


def costs(pair, args) -> None:
    runs = [cost_ratios(pair.target, pair.drafts, gamma=args.gamma, context=args.context, reps=args.reps)
            for _ in range(args.rounds)]
    table = {"verify_cost_ratio": [r["verify_cost_ratio"] for r in runs],
             "target_step_ms": [1e3 * r["target_step_s"] for r in runs]}
    for name in pair.drafts:
        table[f"c[{name}]"] = [r["drafts"][name]["c"] for r in runs]
    print(f"costs over {args.rounds} rounds x {args.reps} reps (threads {torch.get_num_threads()}):")
    for key, values in table.items():
        print(f"  {key:22s} median {statistics.median(values):.4f}  range [{min(values):.4f}, {max(values):.4f}]")
    for name in pair.drafts:  # the draft's bytes a step over the target's: c if both streamed at one rate
        cb = runs[0]["drafts"][name]["c_bytes"]
        table[f"c_bytes[{name}]"] = [cb]
        print(f"  c by bytes[{name}] {cb:.4f}: measured c / c by bytes {statistics.median(table[f'c[{name}]']) / cb:.2f}")
    print(json.dumps({k: statistics.median(v) for k, v in table.items()}, sort_keys=True))


if __name__ == "__main__":
    main()
