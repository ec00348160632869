"""Forward costs ``c`` and ``r(g)`` from paired micro-benchmarks: the numbers every prediction uses.

The cost model (:mod:`spade_lib.theory`) prices one speculative step at ``g c + r(g)`` target forwards:

- ``c``    = t(draft, 1 token) / t(target, 1 token), each with a ``context``-token KV cache;
- ``r(g)`` = t(target, ``g + 1`` tokens) / t(target, 1 token), the verification forward.

:func:`measure_costs` times the three kinds of forward **in turns** (a 1-token target forward, every
``g + 1``-token one, a 1-token draft forward, each rolled back), so load hits numerator and
denominator alike, and reports the **median over rounds of the paired ratios**. This is what
``benchmarks/bench_decode.py`` and the notebooks use. Costs taken from a run's step timings instead
are normalised by the autoregressive run's time per token, which also holds the prompt's prefill and
the loop's per-token work: on short generations of long prompts that made ``r`` < 1 (``r_trace`` in
:func:`spade_lib.runs.metrics.run_metrics`, kept for comparison).

:func:`pair_costs` measures each draft of a pair once and caches the result as JSON under
``runs/costs/`` (keyed by pair and its folder, draft, device, dtype, threads, ``max_gamma`` and ``context``), so every
notebook of one ``make run`` predicts from the same numbers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch

from spade_lib import paths
from spade_lib.io import write_json
from spade_lib.runs import timing

__all__ = ["MIN_GAMMA", "measure_costs", "pair_costs", "read_costs", "verify_cost_fn"]

MIN_GAMMA = 12  # pair_costs measures r(g) at least up to this g (05's max_gamma: one measurement per draft)


@torch.inference_mode()
def measure_costs(target, draft, max_gamma: int, context: int = 128, clock: Callable[[], float] | None = None,
                  reps: int = 30, device=None) -> dict:
    """Interleaved micro-benchmarks of decoding adapters (:class:`spade_lib.decoding.adapter.CausalLMAdapter`).

    ``draft=None`` (a drafter without a model, e.g. prompt lookup) gives ``c = 0``. Returns ``{"c",
    "r": {g: r(g) for g = 1 .. max_gamma}, "t_target", "t_draft", "t_verify": {g: s}, "context",
    "reps"}`` (times in seconds, medians; ratios are medians of per-round ratios)."""
    if isinstance(max_gamma, bool) or not isinstance(max_gamma, int) or max_gamma < 1:
        raise ValueError(f"max_gamma: must be an integer >= 1, got {max_gamma!r}")
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps: must be an integer >= 1, got {reps!r}")
    clock = clock or (lambda: timing.clock(device))
    models = [target] + ([draft] if draft is not None else [])
    vocab = min(m.vocab_size for m in models)
    limit = min(x for x in [m.max_length for m in models] + [context + max_gamma + 2] if x is not None)
    ctx_len = max(1, limit - max_gamma - 2)
    ids = torch.randint(0, vocab, (ctx_len + max_gamma + 1,), generator=torch.Generator().manual_seed(0))
    ids = ids.to(target.device)
    for m in models:
        m.prefill(ids[:ctx_len])
    new = ids[ctx_len:]

    def tfwd(k):
        target.extend(new[:k], last_only=k == 1).argmax(-1)
        target.rollback(ctx_len)

    def dfwd():
        if draft is not None:
            draft.extend(new[:1], last_only=True).argmax(-1)
            draft.rollback(ctx_len)

    def timed(fn):
        timing.synchronize(device)
        t0 = clock()
        fn()
        timing.synchronize(device)
        return clock() - t0

    for _ in range(3):  # warm-up
        tfwd(1), tfwd(max_gamma + 1), dfwd()
    t1, tk, d1 = [], {g: [] for g in range(1, max_gamma + 1)}, []
    for _ in range(reps):
        t1.append(timed(lambda: tfwd(1)))
        for g in tk:
            tk[g].append(timed(lambda g=g: tfwd(g + 1)))
        d1.append(timed(dfwd) if draft is not None else 0.0)
    t1a = np.maximum(np.asarray(t1), 1e-9)
    r = {g: float(np.median(np.asarray(v) / t1a)) for g, v in tk.items()}
    c = float(np.median(np.asarray(d1) / t1a))
    return {"c": c, "r": r, "t_target": float(np.median(t1)), "t_draft": float(np.median(d1)),
            "t_verify": {g: float(np.median(v)) for g, v in tk.items()}, "context": ctx_len, "reps": reps}


def verify_cost_fn(costs: dict) -> Callable[[int], float]:
    """``r(g)`` from :func:`measure_costs`' table; 1 at ``g = 0`` (a step that drafted nothing is one
    target forward) and linear beyond the largest measured ``g`` (through its last two points)."""
    table = {int(g): float(v) for g, v in costs["r"].items()}
    top = max(table)
    slope = table[top] - table[top - 1] if top - 1 in table else 0.0

    def r(g) -> float:
        g = int(g)
        if g <= 0:
            return 1.0
        return table[g] if g in table else table[top] + slope * (g - top)

    return r


def read_costs(path) -> dict:
    """A cost table :func:`pair_costs` cached as JSON, with its ``r`` and ``t_verify`` keyed by int ``g``."""
    saved = json.loads(Path(path).read_text(encoding="utf-8"))
    saved["r"] = {int(g): v for g, v in saved["r"].items()}
    saved["t_verify"] = {int(g): v for g, v in saved["t_verify"].items()}
    return saved


def pair_costs(pair, drafts: Iterable[str], max_gamma: int, *, context: int = 128, reps: int = 20,
               cache: bool = True, progress: bool = False) -> dict[str, dict]:
    """:func:`measure_costs` for each draft of ``pair`` (a pair draft model or a registered model-free
    drafter such as ``"ngram"``: ``c = 0``), cached under ``runs/costs/`` (see the module docstring).
    ``r(g)`` is measured for ``g = 1 .. max(max_gamma, MIN_GAMMA)``, so notebooks asking for different
    ``max_gamma`` below that share one measurement (and one prediction per configuration)."""
    from spade_lib.decoding.adapter import CausalLMAdapter

    max_gamma = max(int(max_gamma), MIN_GAMMA)
    device = next(pair.target.parameters()).device
    dtype = str(next(pair.target.parameters()).dtype).replace("torch.", "")
    out = {}
    target = None
    for name in dict.fromkeys(drafts):
        model = (getattr(pair, "drafts", {}) or {}).get(name)
        key = dict(pair=pair.name, path=str(getattr(pair, "path", None)), draft=name, device=str(device), dtype=dtype,
                   threads=torch.get_num_threads(), max_gamma=int(max_gamma), context=int(context), reps=int(reps))
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        path = paths.RUNS_DIR / "costs" / pair.name / f"{name}-{digest}.json"
        if cache and path.is_file():
            out[name] = read_costs(path)
            continue
        target = target or CausalLMAdapter(pair.target)
        got = measure_costs(target, CausalLMAdapter(model) if model is not None else None, int(max_gamma),
                            context, reps=reps, device=device)
        got.update(key=key)
        if progress:
            print(f"costs of {pair.name}/{name}: c = {got['c']:.3f}, r(1..{max_gamma}) = "
                  + " ".join(f"{v:.2f}" for v in got["r"].values()))
        if cache:
            write_json(path, got)
        out[name] = got
    return out
