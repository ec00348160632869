"""Build (or verify and load) embedded pairs from the command line.

    python -m spade_lib.zoo default        # what `make run` does before the notebooks
    python -m spade_lib.zoo tiny default

Building alone, before any notebook starts, keeps the two CPU cores for training: a build that shares
them with a running notebook is much slower.
"""

from __future__ import annotations

import argparse
import json
import time

from spade_lib.zoo import load_pair, pair_names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", help=f"embedded pairs to build: {pair_names()}")
    args = parser.parse_args(argv)
    for name in args.names:
        start = time.perf_counter()
        pair = load_pair(name)
        print(f"{pair!r} ready in {time.perf_counter() - start:.1f} s at {pair.path}")
        m = pair.manifest
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
