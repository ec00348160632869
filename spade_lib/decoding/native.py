"""SPADE's own kernels for one new token on the CPU (``native.cpp``), compiled once per machine.

An autoregressive step (and every draft step) multiplies one row ``x`` by each weight matrix ``W`` of
the model: ``y = x W^T``. On a CPU that is bound by reading ``W`` from memory, so the best a kernel can
do is to read it at the machine's bandwidth. On the project's 2-core AMD EPYC machines neither library
kernel torch offers gets there for one row: MKL's GEMV (``F.linear``) reads SmolLM2's weights at ~12
GB/s, oneDNN's packed kernel at 20-30 GB/s, while a plain ``sum`` over the same bytes reads 35-40 GB/s.
:func:`linear_one` computes

    ``y = s (W u) + b + r``,   ``u = x`` or ``u = silu(x_1) * x_2`` (``gated``: a gated MLP's input),
    ``s = 1 / sqrt(mean(u^2) + eps)`` when ``eps`` is given (an RMSNorm without gain), else ``s = 1``

with each thread of torch's own pool reading one contiguous block of rows front to back (one
sequential stream per core, prefetched 8 KiB ahead) through four AVX2 FMA accumulators per row. The
prologues (the lean forward folds the norms' gains into the weights) and the residual epilogue save
the small kernel calls around the products that an AR step is otherwise full of. :func:`attend_one`
does the rest of a layer's token mixing in one call: the rotary embedding of the new token's query
and key heads, its key and value written into the cache, and ``softmax(q K^T) V`` per query head over
the cached positions (grouped-query heads read their group's KV head). Both equal their torch
formulation up to fp32 summation order (~1e-6 relative; ``tests/test_native.py``).

:func:`linear_one` is one candidate among the library kernels of :mod:`spade_lib.decoding.kernels`,
used only where timing the whole forward says it is faster; the lean forward's one-token path then
also attends with :func:`attend_one`. It exists only where it can be built: an x86-64 CPU with
AVX2 and FMA, a C++ compiler and ``ninja`` (the project's machines have both). The build (~45 s on two
cores) goes to ``<CACHE_DIR>/ext/<key>`` (keyed by the source, torch version and flags), under a file
lock so concurrent processes build it once; anywhere it cannot be built :func:`available` is ``False``
(one warning says why) and the library kernels remain; ``SPADE_NATIVE=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import warnings
from pathlib import Path

import torch

from spade_lib import paths

__all__ = ["attend_one", "available", "linear_one", "cpu_flags"]

SOURCE = Path(__file__).with_name("native.cpp")
FLAGS = ("-O3", "-mavx2", "-mfma")
GRAIN = 64  # rows per task of torch's pool: a 576-row product still splits over two threads
_MODULE: list = []  # [] before the first try; then [module] or [None]


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``), empty where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _key() -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"{torch.__version__}|{' '.join(FLAGS)}|{platform.python_version()}".encode())
    return h.hexdigest()[:12]


def _build():
    """The compiled module, or ``None`` with a warning saying why it is not there."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not {"avx2", "fma"} <= cpu_flags():
        return None  # not this CPU's kernel: nothing to warn about
    from filelock import FileLock
    from torch.utils import cpp_extension

    key = _key()
    name = f"spade_native_{key}"
    folder = paths.ensure_dir(paths.CACHE_DIR / "ext" / name)
    try:
        with FileLock(str(folder) + ".lock"):
            built = next(folder.glob(f"{name}*.so"), None)
            if built is not None:  # built before (by this or another process): load it without a compiler
                spec = importlib.util.spec_from_file_location(name, built)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                return module
            return cpp_extension.load(name, [str(SOURCE)], extra_cflags=list(FLAGS), build_directory=str(folder),
                                      verbose=False)
    except Exception as exc:  # noqa: BLE001  (no compiler, no ninja, a failed build: the library kernels remain)
        warnings.warn(f"SPADE's native one-token kernels could not be built ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''}); using the library kernels only",
                      RuntimeWarning, stacklevel=3)
        return None


def available() -> bool:
    """Whether the native kernels run here (built on the first call); the environment variable
    ``SPADE_NATIVE=0`` turns them off (for before/after comparisons)."""
    if os.environ.get("SPADE_NATIVE", "1") == "0":
        return False
    if not _MODULE:
        _MODULE.append(_build())
    return _MODULE[0] is not None


def linear_one(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, eps: float | None = None, gated: bool = False) -> torch.Tensor:
    """``[1, N]``: ``s (W u) + bias + residual`` for one row ``x`` and ``w [N, K]``, all contiguous fp32 on the
    CPU; ``u = x`` (``K`` values) or, if ``gated``, ``u = silu(x[:K]) * x[K:]`` (``2K`` values); ``s = 1 /
    sqrt(mean(u^2) + eps)`` if ``eps`` is given, else 1."""
    return _module().linear_one(x, w, bias, residual, -1.0 if eps is None else eps, gated, GRAIN)


def attend_one(qkv: torch.Tensor, kv: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor,
               n_heads: int) -> torch.Tensor:
    """One new token's attention, ``[1, H hd]``. ``qkv [(H + 2 KV) hd]``: its fused projection (queries
    already scaled by ``1 / sqrt(hd)``); ``kv [2, KV, capacity, hd]``: the cache, written in place at
    position ``start`` with the rotated key and the value; ``cos, sin [hd]``: the rotation of ``start``.
    Query head ``h`` attends over positions ``0 .. start`` of KV head ``h // (H / KV)``."""
    return _module().attend_one(qkv, kv, start, cos, sin, n_heads)


def _module():
    """The built module (building it if needed); an error where it cannot run. Once built, the kernels'
    hot path (~150 calls an AR step of SmolLM2) reads it without checking the environment again."""
    if _MODULE and _MODULE[0] is not None:
        return _MODULE[0]
    if not available():
        raise RuntimeError("SPADE's native kernels are not available on this machine (see native.available())")
    return _MODULE[0]
