"""SPADE's own decoding kernels on the CPU (``native.cpp``), compiled once per machine: :func:`linear`, :func:`attend`.

A forward multiplies ``k`` rows ``x`` by each weight matrix ``W``, ``Y = x W^T`` (``k = 1`` for an AR or draft step,
``k = g + 1`` to verify ``g`` drafted tokens or a tree's nodes). On a CPU at these sizes that is bound by reading ``W``,
so the best kernel reads ``W`` once, at memory bandwidth, for all ``k`` rows: a verification forward then costs about
an AR step (``r(g)`` near 1) until the ``2 k`` flops per weight catch up. For each row ``r``, :func:`linear` computes

    ``Y_r = s_r (W u_r) + b + R_r``,   ``u_r = x_r`` (or ``gain * x_r``) or ``u_r = silu(x_r1) * x_r2`` (``gated``),
    ``s_r = 1 / sqrt(mean(x_r^2) + eps)`` when ``eps`` is given (RMSNorm, gain folded into ``W`` or passed), else 1,

each thread of torch's pool reading one contiguous block of weight rows front to back, a tile of weight rows x input
rows in registers (AVX-512, else AVX2); weights come in :func:`pack`'s layout (four rows interleaved chunk by chunk),
one sequential stream per core. :func:`attend` does the rest of a layer's token mixing in one call: rotary embedding of
the new query/key heads, their keys and values into the cache, ``softmax(q K^T) V`` per query head over the slots each
row sees (causal, or a draft tree's ancestors; grouped-query heads read their group's KV head).

**One summation order.** Every output is summed in one order whatever ``k`` (see ``native.cpp``), so a row's result is
bit-identical alone or among ``k`` rows: verification sees exactly the AR loop's logits, and greedy speculative decoding
reproduces greedy decoding exactly. Both kernels equal their torch form up to fp32 summation order (~1e-6 relative).

:func:`linear` is the ``"native"`` candidate of :mod:`spade_lib.decoding.model.kernels`, used where timing says it is not
slower (the lean forward then attends with :func:`attend`). It needs x86-64 with AVX2 and FMA, a C++ compiler and
``ninja``; built into ``<CACHE_DIR>/ext/<key>`` (key: source, torch version, flags) under a file lock; where it cannot
be, :func:`available` is ``False`` (one warning) and library kernels remain. ``SPADE_NATIVE=0`` turns it off;
``SPADE_NATIVE_REQUIRED=1`` (``make test``) makes a failed build on a machine with the compiler an error.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import warnings
from pathlib import Path
from typing import Callable

import torch

from spade_lib import devices, paths

__all__ = ["ISA_FLAGS", "attend", "available", "isa", "linear", "module_weights", "pack", "stream_fma"]

SOURCE = Path(__file__).with_name("native.cpp")
# -fopenmp: at::parallel_for is inline code that runs on torch's OpenMP pool only when compiled with OpenMP (without
# it every product ran on one core); -ffp-contract=off: one rounding per scalar operation, so a row's result cannot
# depend on how the code around it was inlined (the FMAs of the products are explicit intrinsics).
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off")
# The products' vector width: AVX-512 where the CPU has it (``native.cpp`` then sums in 16-float chunks), else AVX2.
ISA_FLAGS = {"avx512": ("-mavx512f",), "avx2": ()}
GRAIN = 64  # rows per task of torch's pool: a 576-row product still splits over two threads
# One input row over row-major weights with rows shorter than this (floats): one weight row a tile, one sequential
# stream per thread; longer rows, four a tile (linear's ``short_row``; which is faster depends on the host: native.cpp)
SHORT_ROW = 1024
_MODULE: list = []  # [] before the first try; then [module] or [None]


def isa() -> str:
    """The instruction set the products are built for: ``"avx512"`` where the CPU has AVX-512F, else ``"avx2"``;
    the environment variable ``SPADE_NATIVE_ISA`` (``"avx2"`` or ``"avx512"``) overrides it (``"avx2"`` on an
    AVX-512 CPU: the other build, for before/after comparisons and its tests)."""
    want = os.environ.get("SPADE_NATIVE_ISA", "auto")
    if want not in ("auto", *ISA_FLAGS):
        raise ValueError(f"SPADE_NATIVE_ISA: must be one of {['auto', *ISA_FLAGS]}, got {want!r}")
    has = "avx512f" in devices.cpu().flags
    if want == "avx512" and not has:
        raise ValueError("SPADE_NATIVE_ISA: 'avx512' asked for on a CPU without AVX-512F (see /proc/cpuinfo)")
    return want if want != "auto" else "avx512" if has else "avx2"


def _flags() -> tuple[str, ...]:
    return (*FLAGS, *ISA_FLAGS[isa()])


def _key() -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"{torch.__version__}|{' '.join(_flags())}|{platform.python_version()}".encode())
    return h.hexdigest()[:12]


def _build():
    """The compiled module, or ``None`` with a warning saying why it is not there."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not {"avx2", "fma"} <= devices.cpu().flags:
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
            return cpp_extension.load(name, [str(SOURCE)], extra_cflags=list(_flags()), build_directory=str(folder),
                                      verbose=False)
    except Exception as exc:  # noqa: BLE001  (no compiler, no ninja, a failed build: the library kernels remain)
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if os.environ.get("SPADE_NATIVE_REQUIRED", "0") == "1":
            raise RuntimeError(f"SPADE's native kernels could not be built ({why}) and SPADE_NATIVE_REQUIRED=1") from exc
        warnings.warn(f"SPADE's native kernels could not be built ({why}); using the library kernels only",
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


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
           residual: torch.Tensor | None = None, eps: float | None = None, gated: bool = False,
           gain: torch.Tensor | None = None, packed: bool = False, scale: torch.Tensor | None = None,
           short_row: int = SHORT_ROW) -> torch.Tensor:
    """``[k, N]``: row ``r`` is ``s_r (W u_r) + bias + residual_r`` for ``k`` rows of ``x`` and ``w [N, K]``, all
    contiguous fp32 on the CPU; ``u_r = x_r`` (``K`` values a row; ``gain * x_r`` with a ``gain [K]``) or, if
    ``gated``, ``u_r = silu(x_r[:K]) * x_r[K:]`` (``2K`` values a row); ``s_r = 1 / sqrt(mean(x_r^2) + eps)``
    (over ``u_r`` when gated) if ``eps`` is given, else 1: with a gain, an RMSNorm with that gain before the
    product. Every output is summed in one order whatever ``k`` is, so a row's result does not depend on
    the rows beside it. ``packed``: ``w`` is :func:`pack`'s layout of the weights (the same result, bit for
    bit, read as one stream per core). ``w`` may also be narrow (row-major, not packed: a draft held in fewer
    bytes, :mod:`spade_lib.zoo.narrow`): bf16, or int8 with ``scale [N]`` (fp32, one per weight row: ``W[n] =
    scale[n] W8[n]``, applied to each sum, ``s_r (scale[n] (W8[n] u_r))``); each weight widened to fp32 exactly,
    the sums as for fp32 weights. ``short_row``: one row over fp32 row-major weights with rows shorter than this
    is read one weight row a tile (one stream per thread), else four rows a tile (four streams; ``0``: always);
    the results are the same either way."""
    return _module().linear(x, w, bias, residual, gain, -1.0 if eps is None else eps, gated, GRAIN, packed, scale,
                            short_row)


def stream_fma(w: torch.Tensor, fmas: int, ahead: int = 2048) -> float:
    """``fmas * sum(w ** 2)``, computed by streaming ``w`` (contiguous fp32 on the CPU) front to back on torch's
    threads with ``fmas`` (1 .. 32) register FMAs per vector chunk and no other loads, prefetching ``ahead`` floats
    ahead (0: none). A ``k``-row product executes at least ``k`` FMAs per weight chunk, so the time of
    ``stream_fma(w, k)`` over ``stream_fma(w, 1)`` is what streaming ``w`` with that arithmetic beside it costs on
    the host: the overlap of memory and arithmetic that the roofline floor takes as perfect
    (``benchmarks/bench_rows.py`` prints it beside ``r(k)``)."""
    return float(_module().stream_fma(w, fmas, ahead))


def pack(w: torch.Tensor) -> torch.Tensor:
    """``w [N, K]`` (contiguous fp32 on the CPU) laid out for ``linear(..., packed=True)``: each group of four
    weight rows interleaved chunk by chunk (the build's vector width ``L``: chunk ``c`` of the group's row ``i``
    at ``(4 c + i) L``, then the group's ``K % L`` tails), the rows after the last whole group as they are. A
    tile of four weight rows then reads one sequential stream instead of four interleaved ones (on a 2-core
    AMD EPYC Zen 4 the products' stream rose from ~14 to ~25 GB/s a core); each output is summed in the same
    order, so the results equal the unpacked product's exactly. Same shape as ``w``; only this build's
    :func:`linear` reads it."""
    return _module().pack(w)


def module_weights(module: torch.nn.Module, build: Callable[[], dict]) -> dict:
    """``build()`` (a module's weights prepared for these kernels, e.g. :func:`pack`'s copies), kept on ``module``
    until one of its parameters changes (another tensor, or an in-place edit: the version counter), so a
    drafter reset or a cost measurement does not repack a head's weights; never stored for a module whose
    parameters keep no version counter (made under ``torch.inference_mode``)."""
    try:
        key = tuple((p.data_ptr(), p._version) for p in module.parameters())
    except RuntimeError:  # inference tensors keep no version counter
        key = None
    hit = module.__dict__.get("_native_weights")
    if key is not None and hit is not None and hit[0] == key:
        return hit[1]
    weights = build()
    if key is not None:
        module.__dict__["_native_weights"] = (key, weights)
    return weights


def attend(qkv: torch.Tensor, kv: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor, n_heads: int,
           tree_from: int | None = None, ancestors: torch.Tensor | None = None, *, window: int | None = None,
           qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None, q_scale: float = 1.0) -> torch.Tensor:
    """``k`` new tokens' attention, ``[k, H hd]``. ``qkv [k, (H + 2 KV) hd]``: their fused projections (queries
    already scaled by ``1 / sqrt(hd)``); ``kv [2, KV, capacity, hd]``: the cache, written in place at slots
    ``start .. start + k - 1`` with the rotated keys and the values; ``cos, sin [k, hd]``: each token's rotation.
    Query head ``h`` of row ``i`` attends over KV head ``h // (H / KV)`` at the slots ``<= start + i`` (causal), or,
    given ``ancestors [k, M]`` (bool, a draft tree's rows at slots ``tree_from .. start + k - 1``), at the slots
    before ``tree_from`` and ``tree_from + m`` for each ``ancestors[i, m]``.

    ``window`` (a sliding-window layer): row ``i`` at position ``p_i`` sees only the cached slots ``t > p_i -
    window`` (``p_i = start + i``, or ``tree_from - 1 +`` its depth in a tree, which must be below ``window``).
    ``qk_norm = (q_gain [hd], k_gain [hd], eps)``: each query and key head ``x`` is first
    ``x * gain / sqrt(mean(x^2) + eps)`` (Gemma-3's QK-norm; the query scale may be folded into ``q_gain``).
    ``q_scale``: each rotated query head is multiplied by it (for queries not scaled before, e.g. ``1 / sqrt(hd)``
    where the weights are held in place)."""
    if window is not None and window < 1:
        raise ValueError(f"window: must be >= 1 positions, got {window}")
    q_gain, k_gain, eps = qk_norm if qk_norm is not None else (None, None, 0.0)
    if ancestors is None:
        return _module().attend(qkv, kv, start, cos, sin, n_heads, -1, None, window or 0, q_gain, k_gain, eps,
                                float(q_scale))
    return _module().attend(qkv, kv, start, cos, sin, n_heads, start if tree_from is None else tree_from,
                            ancestors.contiguous(), window or 0, q_gain, k_gain, eps, float(q_scale))


def _module():
    """The built module (building it if needed); an error where it cannot run. Once built, the kernels'
    hot path (~150 calls an AR step of SmolLM2) reads it without checking the environment again."""
    if _MODULE and _MODULE[0] is not None:
        return _MODULE[0]
    if not available():
        raise RuntimeError("SPADE's native kernels are not available on this machine (see native.available())")
    return _MODULE[0]
