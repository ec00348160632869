"""SPADE's native one-token kernels against the library kernels alone, paired in turns with the copy.

Not a test: it prints ratios measured in one run on one machine. It builds the target's lean forward
twice from the same weights: once as SPADE ran before the native kernels (``SPADE_NATIVE=0`` while it
is built: the chooser times MKL and oneDNN only, the one-token attention runs as torch ops), once as it
runs now (the chooser also times the ``"native"`` kernel, the attention is one native call). Then, round
after round, it times a plain ``dst.copy_(src)`` of 256 MiB (the machine's copy bandwidth, read + write),
``--steps`` AR decode steps (one 1-token forward + argmax at a ``--context``-token cache) on each
forward, and the native plan's matrix products alone, so a host whose speed drifts moves every figure
of a round alike. It prints medians and quartiles over rounds of

- each step's weight-streaming rate as a fraction of the round's copy bandwidth (``bytes / step / copy``;
  issue 24 asks for >= 0.8 on SmolLM2),
- the native step's time over the library step's (paired, per round),
- the native products alone over the copy (what the step would reach with no work between products),

and a last line ``native_vs_library=<x> native_vs_copy=<x> library_vs_copy=<x>``. The logits of the two
forwards are compared once (fp32 summation order only).

    python benchmarks/bench_native.py --pair smollm2 [--rounds 15] [--context 200] [--threads 0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from spade_lib import devices  # noqa: E402
from spade_lib.validate import check_options  # noqa: E402
from spade_lib.decoding.model import native  # noqa: E402
from spade_lib.decoding.model.lean import LeanForward  # noqa: E402
from spade_lib.runs import timing  # noqa: E402
from spade_lib.zoo.pairs import load_pair  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2", help="pair name for spade_lib.zoo.pairs.load_pair")
    ap.add_argument("--rounds", type=int, default=15, help="rounds of copy + steps on each forward")
    ap.add_argument("--steps", type=int, default=6, help="AR steps per forward and round")
    ap.add_argument("--context", type=int, default=200, help="cached tokens the steps attend over")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: the machine's default)")
    ap.add_argument("--copy-mib", type=int, default=timing.COPY_BYTES >> 20, help="size of the copy")
    args = ap.parse_args(argv)
    check_options(ap, args, {"rounds": 1, "steps": 1, "context": 1, "copy_mib": 1, "threads": 0})
    return args


def _quartiles(v: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return q[0], statistics.median(v), q[2]


def main(argv=None) -> dict:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not native.available():
        raise SystemExit("bench_native: SPADE's native kernels do not build here (an x86-64 CPU with AVX2 and FMA, "
                         "a C++ compiler and ninja are needed); nothing to compare")
    pair = load_pair(args.pair)
    model = pair.target
    capacity = args.context + 8
    os.environ["SPADE_NATIVE"] = "0"
    try:
        library = LeanForward(model, capacity)
    finally:
        del os.environ["SPADE_NATIVE"]
    fast = LeanForward(model, capacity)
    nbytes = fast.weight_bytes()  # what a step streams: the embedding table is gathered, not read
    forwards = {"library": library, "native": fast}
    print(f"pair={args.pair} threads={torch.get_num_threads()} cpu={devices.cpu().label()!r} "
          f"weights {nbytes / 1e6:.0f} MB a step; kernels: library one={library.kernel_names['one']} | native "
          f"one={fast.kernel_names['one']} (attention native: {fast.native_attention}; isa {native.isa()})")
    vocab = int(library.embed.shape[0])
    ids = torch.randint(0, vocab, (args.context,), generator=torch.Generator().manual_seed(0))
    tok = torch.tensor([int(ids[-1])])
    names = [n for n in fast._products() if n != "lm_head"]
    products = [layer[n][0] for layer in fast.layers for n in names] + [fast.head[0]]
    xs = {k.w.shape[1]: torch.randn(1, k.w.shape[1]) for k in products}
    n = (args.copy_mib << 20) // 4
    src, dst = torch.randn(n), torch.empty(n)
    rows: dict[str, list[float]] = {}
    with torch.inference_mode():
        logits = {}
        for name, f in forwards.items():
            f.reset()
            f.forward(ids)
            logits[name] = f.forward(tok, last_only=True).clone()
            f.rollback(args.context)
        diff = float((logits["native"] - logits["library"]).abs().max())

        def step(f):
            f.forward(tok, last_only=True).argmax(dim=-1)
            f.rollback(args.context)

        for f in forwards.values():
            step(f), step(f)
        for _ in range(args.rounds):
            t0 = devices.clock()
            dst.copy_(src)
            copy = 2 * n * 4 / (devices.clock() - t0)
            secs = {}
            for name, f in forwards.items():
                t0 = devices.clock()
                for _ in range(args.steps):
                    step(f)
                secs[name] = (devices.clock() - t0) / args.steps
                rows.setdefault(f"{name} step / copy", []).append(nbytes / secs[name] / copy)
                rows.setdefault(f"{name} step ms", []).append(secs[name] * 1e3)
            t0 = devices.clock()
            for _ in range(args.steps):
                for k in products:
                    k(xs[k.w.shape[1]])
            rows.setdefault("native products alone / copy", []).append(
                nbytes / ((devices.clock() - t0) / args.steps) / copy)
            rows.setdefault("native / library step time", []).append(secs["native"] / secs["library"])
            rows.setdefault("copy GB/s", []).append(copy / 1e9)
    print(f"{args.rounds} rounds in turns, {args.steps} AR steps per forward per round, {args.context}-token cache; "
          f"max |logit difference| native vs library {diff:.2e}")
    for name, v in rows.items():
        q1, med, q3 = _quartiles(v)
        print(f"  {name:30s} {med:7.3f}  [{q1:.3f}, {q3:.3f}]")
    out = {k: statistics.median(v) for k, v in rows.items()}
    print(f"native_vs_library={out['native / library step time']:.3f} native_vs_copy={out['native step / copy']:.3f} "
          f"library_vs_copy={out['library step / copy']:.3f}")
    return out


if __name__ == "__main__":
    main()
