"""Where the time of a k-row forward goes: weight streaming, attention, the rest (dispatch and copies).

Not a test: it prints figures measured in one run on one machine. A verification forward of ``g`` drafted
tokens feeds ``k = g + 1`` rows (a tree: one row per node); its cost over a one-token step is ``r``. For
each ``k`` of ``--rows`` it times, round after round in turns (so a drifting host moves every figure of a
round alike), on a ``--context``-token cache:

- the lean forward of ``k`` rows as decoding runs it (``forward`` then ``rollback``), chain (causal mask)
  and tree (a random tree's ancestor mask, depth ~ log2 k), on the plan the machine chose
  (:mod:`spade_lib.decoding.model.kernels`) and, for comparison, on the generic torch formulation (oneDNN products,
  torch attention; ``--no-torch`` skips it);
- its products alone (the forward's weight matrices times ``k`` rows on the same kernels);
- its attention calls alone (``native.attend`` per layer with the same ``k``, cache and mask);
- the same weights streamed with ``k`` register FMAs per vector chunk and no operand loads
  (:func:`spade_lib.decoding.model.native.stream_fma`): the arithmetic of ``k`` rows beside the weight stream, the
  overlap the roofline floor assumes, as this host delivers it;
- a ``dst.copy_(src)`` of 256 MiB (the copy bandwidth, read + write);
- an fp32 ``[2048, 2048]`` GEMM (the host's arithmetic peak as torch reaches it, :func:`timing.gemm_peak`).

and prints per ``k`` the medians of: forward ms, ``r(k) = forward(k) / forward(1)``, products ms and their
streaming rate as a fraction of the copy bandwidth, attention ms, the rest (forward - products - attention:
dispatch, embedding, norms outside the kernels, copies), the torch formulation's ms and ``r``, the roofline
floor ``max(1, 2 k N / (peak t(1)))`` (``N`` the forward's matrix weights; no ``k``-row forward can cost less)
with ``r / floor``, and the stream floor ``s(k) = stream(k) / stream(1)`` (a kernel of ``k`` rows executes at least
``k`` FMAs per weight chunk: ``s`` near 1 says the host hides that arithmetic under the stream, so an ``r`` above it
is the kernel's, not the host's).

    python benchmarks/bench_rows.py --pair smollm2 [--rows 1 2 5 9 17] [--rounds 7] [--context 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from spade_lib import devices  # noqa: E402
from spade_lib.validate import check_options  # noqa: E402
from spade_lib.decoding.model import kernels, native  # noqa: E402
from spade_lib.decoding.model.lean import LeanForward  # noqa: E402
from spade_lib.runs import timing  # noqa: E402
from spade_lib.zoo.pairs import load_pair  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2", help="pair name for spade_lib.zoo.pairs.load_pair")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 9, 17], help="row counts k to profile")
    ap.add_argument("--rounds", type=int, default=7, help="rounds in turns")
    ap.add_argument("--reps", type=int, default=3, help="forwards per figure and round")
    ap.add_argument("--context", type=int, default=200, help="cached tokens the rows attend over")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: the machine's default)")
    ap.add_argument("--no-torch", action="store_true", help="skip the generic torch formulation")
    args = ap.parse_args(argv)
    check_options(ap, args, {"rounds": 1, "reps": 1, "context": 1, "threads": 0})
    if any(k < 1 for k in args.rows):
        ap.error(f"--rows: every row count must be >= 1, got {args.rows}")
    return args


def random_tree(k: int, seed: int = 0) -> torch.Tensor:
    """``ancestors [k, k]`` of a random tree whose node ``i``'s parent is drawn among ``i // 2 .. i - 1``."""
    g = torch.Generator().manual_seed(seed)
    anc = torch.eye(k, dtype=torch.bool)
    for i in range(1, k):
        p = int(torch.randint(i // 2, i, (1,), generator=g))
        anc[i] |= anc[p]
    return anc


def main(argv=None) -> dict:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_pair(args.pair)
    model = pair.target
    kmax = max(args.rows)
    lean = LeanForward(model, args.context + kmax + 1)
    nbytes = lean.weight_bytes()  # what a step streams: the embedding table is gathered, not read
    packed = kernels.packing_available(torch.device("cpu"), torch.float32) and not lean.in_place
    generic = None if args.no_torch else LeanForward(model, args.context + kmax + 1, kernels="onednn" if packed else "mkl")
    if generic is not None:
        generic.native_attention = False
    print(f"pair={args.pair} threads={torch.get_num_threads()} cpu={devices.cpu().label()!r} weights {nbytes / 1e6:.0f} MB a step; "
          f"plan one={lean.kernel_names['one']} many={lean.kernel_names['many']} native attention={lean.native_attention} "
          f"native isa={native.isa() if native.available() else None}")
    vocab = int(lean.embed.shape[0])
    ids = torch.randint(0, vocab, (args.context + kmax,), generator=torch.Generator().manual_seed(0))
    ctx, new = ids[:args.context], ids[args.context:]
    n = timing.COPY_BYTES // 4
    src, dst = torch.randn(n), torch.empty(n)
    trees = {k: random_tree(k, seed=k) for k in args.rows}
    figures: dict[str, list[float]] = {}

    def rec(name, v):
        figures.setdefault(name, []).append(v)

    with torch.inference_mode():
        for f in (lean, generic):
            if f is not None:
                f.reset()
                f.forward(ctx)

        def fwd(f, k, tree):
            t0 = devices.clock()
            for _ in range(args.reps):
                f.forward(new[:k], last_only=False, ancestors=trees[k] if tree else None)
                f.rollback(args.context)
            return (devices.clock() - t0) / args.reps

        def inputs(k):  # (kernel, x, residual or None) of every product of one forward, the head last
            out = []
            for i, layer in enumerate(lean.layers + [{"lm_head": lean.head}]):
                for nm, (w, *_) in lean._raw[i].items():
                    kern = layer[nm][0 if k == 1 else 1]
                    gated = nm == "down"
                    x = torch.randn(k, w.shape[1] * (2 if gated else 1))
                    out.append((kern, x, torch.randn(k, w.shape[0]) if gated else None))
            return out

        prods = {k: inputs(k) for k in args.rows}
        mats = [w for layer in lean._raw for w, *_ in layer.values()]
        streamable = native.available() and all(w.dtype == torch.float32 and w.is_contiguous() for w in mats)

        def stream(k):  # the forward's weights, k FMAs a chunk, no operand loads
            if not streamable:
                return float("nan")
            t0 = devices.clock()
            for w in mats:
                native.stream_fma(w, k)
            return devices.clock() - t0
        H, KV, hd = lean.n_heads, lean.n_kv, lean.head_dim

        def products(k):
            t0 = devices.clock()
            for _ in range(args.reps):
                for kern, x, res in prods[k]:
                    kern(x) if res is None else kern.add_to(res, x, gated=True)
            return (devices.clock() - t0) / args.reps

        def attention(k, tree):
            if not lean.native_attention:
                return float("nan")
            qkv = torch.randn(k, (H + 2 * KV) * hd)
            kind = lean.layers[0]["rope"]
            cos = lean._cos[kind][args.context:args.context + k].contiguous()
            sin = lean._sin[kind][args.context:args.context + k].contiguous()
            t0 = devices.clock()
            for _ in range(args.reps):
                for kv in lean._kv:
                    native.attend(qkv, kv, args.context, cos, sin, H, args.context, trees[k] if tree else None)
            return (devices.clock() - t0) / args.reps

        for k in args.rows:  # warm-up
            fwd(lean, k, False)
            if generic is not None:
                fwd(generic, k, False)
        for _ in range(args.rounds):
            t0 = devices.clock()
            dst.copy_(src)
            rec("copy GB/s", 2 * n * 4 / (devices.clock() - t0) / 1e9)
            rec("peak GFLOP/s", timing.gemm_peak(repeats=1) / 1e9)
            for k in args.rows:
                for tree in (False, True):
                    if tree and k == 1:
                        continue
                    tag = f"{'tree' if tree else 'chain'} k={k}"
                    rec(f"{tag} forward", fwd(lean, k, tree))
                    rec(f"{tag} attention", attention(k, tree))
                    if generic is not None:
                        rec(f"{tag} torch", fwd(generic, k, tree))
                rec(f"k={k} products", products(k))
                rec(f"k={k} stream", stream(k))
    med = {name: statistics.median(v) for name, v in figures.items()}
    copy = med["copy GB/s"]
    base = med["chain k=1 forward"]
    base_torch = med.get("chain k=1 torch")
    peak = med["peak GFLOP/s"] * 1e9
    flops_row = 2 * sum(w.numel() for w in mats)  # 2 N FLOP a row, N the products' weights
    print(f"{args.rounds} rounds in turns, {args.reps} forwards per figure, {args.context}-token cache; copy {copy:.1f} GB/s; "
          f"fp32 GEMM peak {peak / 1e9:.0f} GFLOP/s ({flops_row / 1e9:.2f} GFLOP a row)")
    print(f"  {'rows':12s} {'forward ms':>10s} {'r':>6s} {'floor':>6s} {'r/floor':>7s} {'stream':>6s} {'r/stream':>8s} "
          f"{'products ms':>11s} {'/copy':>6s} {'attention':>9s} {'rest ms':>8s} {'torch ms':>9s} {'torch r':>8s}")
    out = {}
    for k in args.rows:
        for tree in (False, True):
            if tree and k == 1:
                continue
            tag = f"{'tree' if tree else 'chain'} k={k}"
            t, p, a = med[f"{tag} forward"], med[f"k={k} products"], med[f"{tag} attention"]
            tt = med.get(f"{tag} torch", float("nan"))
            rest = t - p - (a if a == a else 0.0)
            floor = max(1.0, k * flops_row / peak / base)
            sf = med[f"k={k} stream"] / med["k=1 stream"]
            out[tag] = {"forward": t, "r": t / base, "floor": floor, "stream": sf, "products": p, "attention": a,
                        "rest": rest, "torch": tt, "torch_r": tt / base_torch if base_torch else float("nan")}
            print(f"  {tag:12s} {t * 1e3:10.2f} {t / base:6.2f} {floor:6.2f} {t / base / floor:7.2f} {sf:6.2f} "
                  f"{t / base / sf:8.2f} {p * 1e3:11.2f} "
                  f"{nbytes / p / 1e9 / copy:6.2f} "
                  f"{a * 1e3:9.2f} {rest * 1e3:8.2f} {tt * 1e3:9.2f} {out[tag]['torch_r']:8.2f}")
    print("r_chain=" + ",".join(f"{k}:{out[f'chain k={k}']['r']:.3f}" for k in args.rows))
    print("r_over_floor=" + ",".join(f"{k}:{out[f'chain k={k}']['r'] / out[f'chain k={k}']['floor']:.3f}" for k in args.rows))
    print("stream_floor=" + ",".join(f"{k}:{out[f'chain k={k}']['stream']:.3f}" for k in args.rows))
    return out


if __name__ == "__main__":
    main()
