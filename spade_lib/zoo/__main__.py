"""Build (or verify and load) pairs from the command line.

    python -m spade_lib.zoo default        # what `make run` does before the notebooks
    python -m spade_lib.zoo tiny default
    python -m spade_lib.zoo smollm2        # the real pair: converts the target, distils its drafts
    python -m spade_lib.zoo gemma3         # Gemma-3-270M: assembles and converts the target (~1.5 min)

For ``smollm2`` it prints a table per draft: teacher-forced alpha at T=0 (greedy top-1 agreement)
and T=1 on held-out target generations, the cost ratio c, the verify-cost ratio r, the predicted
speedup at gamma 4 and the build time (teacher data included).

Building alone, before any notebook starts, keeps the two CPU cores for training: a build that shares
them with a running notebook is much slower.
"""

from __future__ import annotations

import argparse
import json
import time

from spade_lib.zoo.pairs import REAL_PAIRS, load_pair, pair_names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", help=f"pairs to build: {pair_names() + list(REAL_PAIRS)}")
    args = parser.parse_args(argv)
    for name in args.names:
        start = time.perf_counter()
        pair = load_pair(name)
        print(f"{pair!r} ready in {time.perf_counter() - start:.1f} s at {pair.path}")
        m = pair.manifest
        if m.get("kind") == "smollm2":
            print(draft_table(m))
            continue
        if m.get("kind") == "gemma3":
            print(gemma3_summary(m))
            continue
        summary = {
            "build_seconds": m.get("seconds"),
            "costs": {k: v for k, v in (m.get("costs") or {}).items() if k in ("verify_cost_ratio", "target_step_s")},
            "models": {
                name: {k: v for k, v in info.items() if k in ("alpha", "alpha_by_temperature", "c", "val_ppl",
                                                             "perplexity", "top1_agreement", "n_parameters")}
                for name, info in (m.get("models") or {}).items()
            },
        }
        print(json.dumps(summary, indent=1, default=str))


def draft_table(m: dict) -> str:
    """One line per draft of a real pair's manifest: alpha(T=0), alpha(T=1), c, r, predicted speedup, build time."""
    r = m["costs"]["verify_cost_ratio"]
    lines = [f"target {m['models']['target']['n_parameters'] / 1e6:.1f} M params, converted in "
             f"{m['seconds']['target']:.0f} s; verify-cost ratio r(gamma={m['costs']['gamma']}) = {r:.2f}, "
             f"target step {1e3 * m['costs']['target_step_s']:.1f} ms",
             f"{'draft':10s} {'params':>8s} {'alpha T=0':>9s} {'alpha T=1':>9s} {'c':>6s} {'r':>5s} "
             f"{'pred. speedup T=0/T=1':>22s} {'build s':>8s}"]
    for name in m["drafts"]:
        d = m["models"][name]
        a, s = d["alpha_by_temperature"], d["predicted_speedup"]
        lines.append(f"{name:10s} {d['n_parameters'] / 1e6:7.1f}M {a['0']:9.3f} {a['1.0']:9.3f} {d['c']:6.3f} "
                     f"{r:5.2f} {s['T=0']:10.2f} / {s['T=1']:<9.2f} {d['build_seconds']:8.0f}")
        g = d.get("alpha_on_generations")
        if g:
            lines.append(f"{'':10s} alpha on held-out target generations only: T=0 {g['0']:.3f}, T=1 {g['1.0']:.3f}")
    lines.append("ngram      prompt lookup (a runner draft, no model): alpha depends on the prompt; see notebook 03")
    return "\n".join(lines)


def gemma3_summary(m: dict) -> str:
    """The Gemma-3 pair's target facts, build time and drafts (from its manifest)."""
    t = m["target"]
    return (f"target {t['n_parameters'] / 1e6:.1f} M params, {t['n_layers']} layers, vocabulary {t['vocab_size']}, "
            f"sliding window {t['sliding_window']}; assembled and converted in {t['seconds']['total']:.0f} s\n"
            f"drafts: {', '.join(m['drafts'])} (default {m['default_draft']}); {m['drafts_note']}")


if __name__ == "__main__":
    main()
