"""Peak memory of a loaded pair against its weights (issue 53's bound: peak RSS <= 1.15 x weights + 1 GB).

Not a test: it loads the named pair (``load_pair``), builds a decoding adapter for the target and every draft
(the lean forward where it runs, its kernel plan chosen or read from the cache), prefills each with 8 tokens, and
prints the process's peak resident set (``ru_maxrss``: file-backed pages count too) beside the bytes of every
parameter and buffer of the models.

    .venv/bin/python benchmarks/bench_memory.py --pair qwen2.5-coder
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from spade_lib import devices  # noqa: E402
from spade_lib.decoding.model.adapter import CausalLMAdapter  # noqa: E402
from spade_lib.zoo.pairs import load_pair  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="qwen2.5-coder", help="pair name for spade_lib.zoo.pairs.load_pair")
    args = ap.parse_args(argv)
    t0 = devices.clock()
    pair = load_pair(args.pair)
    models = {"target": pair.target, **pair.drafts}
    # each tensor once: a trimmed draft (coder-0.5b-fr32k) shares its body with the full one
    held = {t.data_ptr(): t for m in models.values() for t in (*m.parameters(), *m.buffers()) if t.numel()}
    weights = sum(t.numel() * t.element_size() for t in held.values())
    adapters = {name: CausalLMAdapter(m) for name, m in models.items()}
    with torch.inference_mode():
        for ad in adapters.values():
            ad.prefill(torch.arange(8))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    bound = 1.15 * weights + 1e9
    print(f"{args.pair}: weights {weights / 1e9:.2f} GB ({', '.join(models)}), peak RSS {peak / 1e9:.2f} GB = "
          f"{peak / weights:.2f}x the weights; bound 1.15x + 1 GB = {bound / 1e9:.2f} GB: "
          f"{'within' if peak <= bound else 'ABOVE'}; backends {[ad.backend for ad in adapters.values()]}; "
          f"{devices.clock() - t0:.0f} s")
    return {"weights": weights, "peak": peak, "bound": bound}


if __name__ == "__main__":
    main()
