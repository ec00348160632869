"""Build (or verify and load) pairs from the command line.

    python -m spade_lib.zoo default        # what `make run` does before the notebooks
    python -m spade_lib.zoo tiny default
    python -m spade_lib.zoo smollm2        # the real pair: converts the target, distils its drafts
    python -m spade_lib.zoo gemma3         # Gemma-3-270M: assembles and converts the target (~1.5 min)
    python -m spade_lib.zoo qwen2.5-coder  # Qwen2.5-Coder 1.5B + 0.5B: assembles and converts both (~3 min)

A real pair prints its record's ``describe`` of its manifest (``smollm2``: a table per draft with
teacher-forced alpha at T=0 and T=1, c, r, the predicted speedup at gamma 4 and the build time).

Building alone, before any notebook starts, keeps the two CPU cores for training: a build that shares
them with a running notebook is much slower.
"""

from __future__ import annotations

import argparse
import json

from spade_lib.devices import clock
from spade_lib.zoo.pairs import all_pair_names, load_pair
from spade_lib.zoo.registry import real_pair, real_pairs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", help=f"pairs to build: {all_pair_names()}")
    args = parser.parse_args(argv)
    for name in args.names:
        start = clock()
        pair = load_pair(name)
        print(f"{pair!r} ready in {clock() - start:.1f} s at {pair.path}")
        m = pair.manifest
        if name in real_pairs() and real_pair(name).describe is not None:
            print(real_pair(name).describe(m))
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


if __name__ == "__main__":
    main()
