"""Benchmark (not a test): batched ``spade_lib.verify.verify`` against a plain per-row reference and
against the memory bandwidth of a plain torch copy of the same tensors, measured in one run.

Setup: ``B=64`` rows, ``gamma=8``, ``V=32000``, float32 on the CPU; ``p`` and ``q`` are softmaxes of
correlated random logits (acceptance around 0.6), drafts sampled from ``q``.

- ``speedup_vs_reference`` = time of :func:`python_reference` (plain Python per row: loops over rows
  and positions, Python floats, the residual and its inverse-CDF draw as loops over the ``V``-row
  read with ``tolist``; the same math and the same uniforms) / time of ``verify``. The stronger
  :func:`spade_lib.exactness.verify_reference` (the same loops, but ``torch`` vector ops on each
  ``V``-row) is timed too and printed as ``speedup_vs_torch_rows``;
- ``bandwidth_fraction`` = effective bandwidth of ``verify`` (bytes of ``p`` and ``q`` / its time)
  over that of ``dst.copy_(src)`` on the same tensors (bytes / copy time), i.e. copy time / verify time.

Both are reported for the default call (``validate=True``, which reads all of ``p`` and ``q``: the
row sums and minima) and the decoder's hot path (``validate=False``, which reads only the drafted
probabilities and one ``V``-row per batch row). The last line, for the default call, is exactly
``speedup_vs_reference=<x> bandwidth_fraction=<y>``.

Usage: ``.venv/bin/python benchmarks/bench_verify.py [--repeats 7] [--threads N] [--device cpu]``
"""

from __future__ import annotations

import argparse

import torch

from spade_lib.devices import resolve_device
from spade_lib.exactness import verify_reference
from spade_lib.runs.timing import fix_threads, measure
from spade_lib.verify import verify


def python_reference(p, q, draft_tokens, uniforms, next_uniforms) -> tuple[list[int], list[int]]:
    """Exact verification in plain Python, one row at a time (Leviathan et al. 2023, Alg. 1)."""
    B, gamma = draft_tokens.shape
    drafts, u, u_next = draft_tokens.tolist(), uniforms.tolist(), next_uniforms.tolist()
    n_accepted, next_token = [], []
    for b in range(B):
        n = 0
        for i in range(gamma):
            x = drafts[b][i]
            p_x, q_x = float(p[b, i, x]), float(q[b, i, x])
            a = min(1.0, p_x / q_x) if q_x > 0 else float(p_x > 0)
            if not u[b][i] < a:
                break
            n += 1
        p_row = p[b, n].tolist()
        if n == gamma:
            weights = p_row
        else:
            weights = [max(0.0, pv - qv) for pv, qv in zip(p_row, q[b, n].tolist())]
            if not sum(weights) > 0:
                weights = p_row
        target, acc, token = u_next[b] * sum(weights), 0.0, len(weights) - 1
        for v, w in enumerate(weights):
            acc += w
            if acc > target and w > 0:
                token = v
                break
        n_accepted.append(n)
        next_token.append(token)
    return n_accepted, next_token


def make_inputs(B: int, gamma: int, V: int, device: torch.device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    z_p = 4.0 * torch.randn(B, gamma + 1, V, generator=gen)
    z_q = z_p[:, :gamma] + 2.0 * torch.randn(B, gamma, V, generator=gen)
    p, q = z_p.softmax(-1), z_q.softmax(-1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(B, gamma)
    return p.to(device), q.to(device), drafts.to(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    device = resolve_device(args.device)
    threads = fix_threads(args.threads)
    p, q, drafts = make_inputs(args.batch, args.gamma, args.vocab, device)
    nbytes = p.numel() * p.element_size() + q.numel() * q.element_size()
    p_dst, q_dst = torch.empty_like(p), torch.empty_like(q)

    def copy() -> None:
        p_dst.copy_(p)
        q_dst.copy_(q)

    gen = torch.Generator(device=device).manual_seed(0)
    result, t_verify = measure(lambda: verify(p, q, drafts, generator=gen), warmup=2,
                               repeats=args.repeats, device=device)
    _, t_fast = measure(lambda: verify(p, q, drafts, generator=gen, validate=False), warmup=2,
                        repeats=args.repeats, device=device)
    _, t_copy = measure(copy, warmup=2, repeats=args.repeats, device=device)
    (n_ref, next_ref), t_ref = measure(
        lambda: python_reference(p, q, drafts, result.uniforms, result.next_uniforms),
        warmup=1, repeats=3, device=device)
    _, t_rows = measure(lambda: verify_reference(p, q, drafts, result.uniforms, result.next_uniforms),
                        warmup=1, repeats=3, device=device)
    agree_n = sum(int(a == b) for a, b in zip(n_ref, result.n_accepted.tolist()))
    agree_t = sum(int(a == b) for a, b in zip(next_ref, result.next_token.tolist()))

    print(f"B={args.batch} gamma={args.gamma} V={args.vocab} dtype=float32 device={device} threads={threads}")
    print(f"p+q bytes: {nbytes / 1e6:.1f} MB; mean accepted {result.n_accepted.float().mean():.2f} of "
          f"{args.gamma}; the Python reference agrees on n_accepted for {agree_n}/{args.batch} rows "
          f"and on next_token for {agree_t}/{args.batch}")
    for name, t in (("copy (p, q)", t_copy), ("verify validate=True", t_verify),
                    ("verify validate=False", t_fast), ("torch per-row reference", t_rows),
                    ("Python reference", t_ref)):
        print(f"{name:24s} median {t.median * 1e3:9.3f} ms  [min {t.min * 1e3:.3f}, max {t.max * 1e3:.3f}]  "
              f"effective {nbytes / t.median / 1e9:7.2f} GB/s")
    print(f"validate=False: speedup_vs_reference={t_ref.median / t_fast.median:.1f} "
          f"speedup_vs_torch_rows={t_rows.median / t_fast.median:.1f} "
          f"bandwidth_fraction={t_copy.median / t_fast.median:.2f}")
    print(f"validate=True:  speedup_vs_torch_rows={t_rows.median / t_verify.median:.1f}")
    speedup, fraction = t_ref.median / t_verify.median, t_copy.median / t_verify.median
    print(f"speedup_vs_reference={speedup:.1f} bandwidth_fraction={fraction:.2f}")


if __name__ == "__main__":
    main()
