"""The fastest linear kernel for each weight shape, chosen by timing on the machine that runs it.

A decoding forward is a chain of ``y = x W^T + b`` with ``x`` of ``k`` rows: ``k = 1`` for an
autoregressive step or a draft step, ``k = g + 1`` for verifying ``g`` drafted tokens. On a CPU at
these sizes each product is bound by streaming ``W`` from memory, so its time should barely depend on
``k``. Which library routine gets there depends on the CPU: on the 2-core AMD EPYC machines of this
project MKL's one-row GEMV (``F.linear``) reads SmolLM2's ``49152 x 576`` LM head in 6.5 ms, the
oneDNN kernel on pre-packed weights (``torch.ops.mkldnn._linear_pointwise``) in 2.0-2.6 ms; on other
CPUs MKL wins. A baseline that runs its single rows on the slow kernel makes verification look cheaper
than a decode step (``r(g) < 1``) and every speedup too large.

So nothing is assumed: for each group of weights of one shape (all layers' ``W_qkv``, say) and each
row count class (``k = 1``; ``k > 1``, timed at :data:`MANY_ROWS` rows), :func:`plan` times every
candidate of :data:`CANDIDATES` that applies, over the whole group in turn (so the weights stream
from memory as they do in a forward, not from cache), ``reps`` rounds in rotating order after a
warm-up, and keeps the one with the smallest median. Candidates:

- ``"mkl"``: ``F.linear(x, W, b)`` (MKL's GEMV for one row, its SGEMM for more);
- ``"onednn"``: ``_linear_pointwise(x, W_packed, b)`` on weights reordered once for oneDNN;
- ``"onednn_pad2"`` (one row only): the row duplicated into two rows for the oneDNN kernel, first row kept.

All compute the same product; they differ in summation order only (fp32: ~1e-6 relative). The choice
is cached per process and on disk (``<CACHE_DIR>/kernels/``, keyed by CPU model, torch version,
thread count, dtype, shape, group size and row class), so every process on one machine uses the same
kernels and their outputs agree bit for bit; :func:`choices` lists what this process chose (run
metadata records it). Only fp32 on CPU with oneDNN available is planned; elsewhere (CUDA, bf16) the
answer is ``"mkl"``, i.e. ``F.linear``, the framework's own dispatch.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from spade_lib import paths
from spade_lib.io import write_json

__all__ = ["CANDIDATES", "MANY_ROWS", "Kernel", "plan", "choices", "cpu_model", "packing_available"]

MANY_ROWS = 5  # rows at which the k > 1 class is timed (a verification forward of gamma = 4)
_REPS, _WARMUP = 9, 2
_CHOSEN: dict[str, dict] = {}  # this process: cache key -> {"kernel", "shape", "rows", "seconds"}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _lp(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


def _lp_pad2(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.expand(2, -1), w, b, "none", [], "")[:1]


def _pack(w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w, 8)


# name -> (prepare the weight once, apply to x [k, in], which row classes it serves)
CANDIDATES: dict[str, tuple[Callable, Callable, tuple[str, ...]]] = {
    "mkl": (lambda w: w, F.linear, ("one", "many")),
    "onednn": (_pack, _lp, ("one", "many")),
    "onednn_pad2": (_pack, _lp_pad2, ("one",)),
}


class Kernel:
    """One planned linear map: ``self(x) = x W^T + b`` on the chosen kernel (``self.name``)."""

    __slots__ = ("name", "fn", "w", "b")

    def __init__(self, name: str, w: torch.Tensor, b: torch.Tensor | None):
        self.name, self.fn, self.w, self.b = name, CANDIDATES[name][1], w, b

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, self.w, self.b)


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the oneDNN candidates can run here (CPU, fp32, oneDNN built and working)."""
    if device.type != "cpu" or dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    try:
        w = _pack(torch.zeros(8, 8))
        _lp(torch.zeros(2, 8), w, None)
        return True
    except (AttributeError, RuntimeError):
        return False


def _key(shape, n: int, rows: str, dtype: torch.dtype) -> tuple[str, dict]:
    facts = {"cpu": cpu_model(), "torch": torch.__version__, "threads": torch.get_num_threads(),
             "dtype": str(dtype), "shape": list(shape), "group": n, "rows": rows}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16], facts


def _disk_path():
    return paths.CACHE_DIR / "kernels" / "choices.json"


def _read_disk() -> dict:
    try:
        return json.loads(_disk_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


@torch.inference_mode()
def _time(candidates: dict[str, list[torch.Tensor]], biases: Sequence, rows: int, in_features: int,
          reps: int) -> dict[str, float]:
    """Median seconds of one pass over the group per candidate, rounds in rotating order."""
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(0))
    names = list(candidates)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(_WARMUP + reps):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = CANDIDATES[name][1]
            t0 = time.perf_counter()
            for w, b in zip(candidates[name], biases):
                fn(x, w, b)
            dt = time.perf_counter() - t0
            if r >= _WARMUP:
                times[name].append(dt)
    return {n: sorted(v)[len(v) // 2] for n, v in times.items()}


def plan(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None] | None = None, *,
         policy: str = "auto", cache: bool = True) -> tuple[list[Kernel], list[Kernel]]:
    """Kernels for a group of equally shaped weights ``[out, in]``: ``(for one row, for k > 1 rows)``,
    one :class:`Kernel` per weight each. ``policy``: ``"auto"`` (time the candidates, module
    docstring), or a candidate name to force it (``"mkl"`` everywhere is plain ``F.linear``)."""
    weights = list(weights)
    biases = list(biases) if biases is not None else [None] * len(weights)
    if not weights:
        return [], []
    w0 = weights[0]
    if policy != "auto" and policy not in CANDIDATES:
        raise ValueError(f"policy: must be 'auto' or one of {sorted(CANDIDATES)}, got {policy!r}")
    packable = packing_available(w0.device, w0.dtype)
    if policy != "auto" and policy != "mkl" and not packable:
        raise ValueError(f"policy: {policy!r} needs oneDNN on a CPU in float32 ({w0.device}, {w0.dtype} here)")
    prepared: dict[str, list[torch.Tensor]] = {}

    def weights_for(name: str) -> list[torch.Tensor]:
        prep = CANDIDATES[name][0]
        key = "onednn" if name.startswith("onednn") else name  # the padded variant shares the packing
        if key not in prepared:
            with torch.inference_mode():
                prepared[key] = [prep(w) for w in weights]
        return prepared[key]

    disk = _read_disk() if cache and policy == "auto" else {}
    chosen_names = {}
    for rows in ("one", "many"):
        if policy != "auto":
            chosen_names[rows] = "mkl" if (policy == "onednn_pad2" and rows == "many") else policy
            continue
        if not packable:
            chosen_names[rows] = "mkl"
            continue
        key, facts = _key(w0.shape, len(weights), rows, w0.dtype)
        hit = _CHOSEN.get(key) or disk.get(key)
        if hit is None:
            names = [n for n, (_, _, classes) in CANDIDATES.items() if rows in classes]
            secs = _time({n: weights_for(n) for n in names}, biases, 1 if rows == "one" else MANY_ROWS,
                         int(w0.shape[1]), _REPS)
            hit = {**facts, "kernel": min(secs, key=secs.get), "seconds": secs}
            if cache:
                disk = {**_read_disk(), key: hit}
                try:
                    write_json(_disk_path(), disk)
                except OSError:
                    pass
        _CHOSEN[key] = hit
        chosen_names[rows] = hit["kernel"]
    out = []
    for rows in ("one", "many"):
        name = chosen_names[rows]
        ws = weights_for(name)
        out.append([Kernel(name, w, b) for w, b in zip(ws, biases)])
    return out[0], out[1]


def choices() -> list[dict]:
    """The kernels this process chose: one dict per (shape, group size, row class) with the CPU model,
    torch version, threads, dtype, the kernel and the median seconds of every candidate."""
    return [dict(v) for v in _CHOSEN.values()]
