"""The fastest linear kernels for a model's decoding forward, chosen by timing it on the machine that runs it.

A decoding forward is a chain of ``y = x W^T + b``, ``x`` of ``k`` rows (``k = 1``: an AR or draft step;
``k = g + 1``: verifying ``g`` drafted tokens); each product streams ``W`` from memory, so its time should
barely depend on ``k``. Which routine gets there depends on the CPU, and a baseline whose single rows run on
the slow one makes verification look cheaper than a decode step (``r(g) < 1``). So :func:`choose` times the
:data:`CANDIDATES` of a row class (``"one"``; ``"many"``, timed at :data:`MANY_ROWS` rows) **on the model's
whole forward**, back to back as decoding runs it: every product on one candidate, in :data:`ROUNDS`
interleaved rounds (median); then one pass over the products, largest first, moving a product to a
candidate within :data:`PRUNE` of the fastest where the forward gains more than :data:`MIN_GAIN`, a move kept
only if it still wins when timed again in rounds. ``"native"`` (SPADE's kernel, :mod:`.native`) is kept
unless another uniform plan beats it by more than :data:`NATIVE_MARGIN`, so one host keeps one plan.
Candidates: ``"mkl"`` (``F.linear``), ``"onednn"`` (oneDNN on weights packed once), ``"onednn_pad2"`` (one
row padded to two), ``"native"`` (on its own packed copy, RMSNorm and residual fused; a row's result does not
depend on its neighbours, so verification reproduces the AR logits bit for bit), ``"native_rows"`` (the
same kernel on the weights in place) and ``"native_rows_wide"`` (in place; one row over short weight rows
read four a tile). A model held in place (every model by default) is timed on :data:`IN_PLACE` only.
``policy="legacy"``: MKL one row, oneDNN more; ``SPADE_LINEAR_KERNELS`` sets the policy (default ``"auto"``).

All compute one product up to summation order (fp32: ~1e-6 relative). A choice is cached per process and on
disk (``<CACHE_DIR>/kernels/choices.json``, keyed by CPU, torch, threads, dtype and weight shapes);
:func:`choices` lists this process's. Timing is an explicit step (``LeanForward.prepare``, ``lean.prepare``,
``Pair.prepare``): a constructor takes the :func:`recorded` plan, else the :func:`untimed` default; only fp32 on CPU
is timed. A prefill runs on MKL's SGEMM; a **draft's** (opt-in) in bf16 where :func:`choose_prefill` times it faster,
never a target's. Measured history: ``docs/measurements.md``.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F

from spade_lib import devices, paths
from spade_lib.decoding.model import native
from spade_lib.io import write_json

__all__ = ["CANDIDATES", "COPYING", "IN_PLACE", "MANY_ROWS", "NARROW", "NATIVE", "NATIVE_LAYOUTS", "PREFILLS", "SCALE", "POLICIES", "TIMED", "Kernel", "choose", "choose_prefill", "choices", "packing_available", "prepare", "summary", "usable"]

MANY_ROWS = 5  # rows at which the k > 1 class is timed (a verification forward of gamma = 4)
ROW_CLASSES = ("one", "many")
MIN_GAIN = 0.02  # a product moves to another kernel only if the whole forward gets faster by more than this
PRUNE = 1.25  # the per-product pass tries only candidates whose uniform plan was within this of the best
ROUNDS = 3  # the uniform plans, and the kept plan against the best of them, are timed in this many interleaved rounds
NATIVE_MARGIN = 0.05  # the native plan is kept unless another uniform plan is faster by more than this
PLAN_VERSION = 9  # part of the cache key: 9 "native_rows_wide"; 8 "native_rows" (in place); 7 native weights packed (native.pack); 6 "native" renamed "native" (AVX-512 builds); 5 native for many rows + its margin; 4 rounds; 3 added it (2: per product)
_CHOSEN: dict[str, dict] = {}  # this process: cache key -> {"one", "many", "seconds", facts...}
PREFILL_ROWS = 64  # a prompt's prefill, as :func:`choose_prefill` times it (a HumanEval prompt: 100-200 tokens)
PREFILL_GAIN = 1.2  # a draft's prefill moves to bf16 only where its forward gets this much faster
PREFILLS = ("fp32", "bf16")  # the precisions of a prefill's products (bf16: a draft's only, where it pays)
_PREFILL: dict[str, dict] = {}  # this process: cache key -> choose_prefill's record


def _lp(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


def _lp_pad2(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.expand(2, -1), w, b, "none", [], "")[:1]


def _pack(w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w, 8)


# SPADE's own kernel (:func:`native.linear`) as candidates, name -> its layout arguments: "native" on its packed copy,
# "native_rows" on the weights in place, "native_rows_wide" in place with one row over short weight rows read four
# rows a tile (four streams) where "native_rows" reads one (one stream per thread): which is faster depends on the host
# (native.SHORT_ROW); the results are the same
NATIVE_LAYOUTS: dict[str, dict] = {"native": {"packed": True}, "native_rows": {}, "native_rows_wide": {"short_row": 0}}


def _on_native(layout: dict) -> Callable:
    def apply(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
              scale: torch.Tensor | None = None) -> torch.Tensor:
        return native.linear(x, w, b, scale=scale, **layout)

    return apply


def _mkl_widened(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                 scale: torch.Tensor | None = None) -> torch.Tensor:
    if scale is None:
        return F.linear(x, w.to(x.dtype), b)
    y = F.linear(x, w.to(x.dtype)) * scale  # an int8 row's scale on its outputs: no second [N, K] temporary
    return y if b is None else y + b


def _mkl_bf16(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
              scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T + b`` with ``x`` and ``W`` rounded to bf16 (``W`` per call: fp32, or int8 exactly), the products summed
    in fp32 by oneDNN's bf16 GEMM (AMX / AVX-512-BF16) and rounded to bf16 (torch's CPU GEMM returns its inputs'
    dtype), then widened to ``x``'s dtype for the scale and bias: a draft's prefill only."""
    y = F.linear(x.to(torch.bfloat16), w.to(torch.bfloat16)).to(x.dtype)
    if scale is not None:
        y = y * scale
    return y if b is None else y + b


# name -> (how its weights are prepared: "raw", "packed" (oneDNN's layout) or "tiles" (the
# native kernel's, native.pack), apply to x [k, in], row classes it serves)
CANDIDATES: dict[str, tuple[str, Callable, tuple[str, ...]]] = {
    "mkl": ("raw", F.linear, ("one", "many")),
    "onednn": ("packed", _lp, ("one", "many")),
    "onednn_pad2": ("packed", _lp_pad2, ("one",)),
    "native": ("tiles", _on_native(NATIVE_LAYOUTS["native"]), ("one", "many")),
    "native_rows": ("raw", _on_native(NATIVE_LAYOUTS["native_rows"]), ("one", "many")),
    "native_rows_wide": ("raw", _on_native(NATIVE_LAYOUTS["native_rows_wide"]), ("one",)),  # differs at one row only
    # narrow weights (bf16, or int8 with per-row scales: a draft's, ``LeanForward``'s ``weight_dtype``): widened
    # per call for a prefill's SGEMM (never timed: no row class; one and many rows run on "native_rows", which
    # reads them directly)
    "mkl_widened": ("raw", _mkl_widened, ()),
    # a draft's prefill in bf16 (never timed as a row class: :func:`choose_prefill` decides it per model and host)
    "mkl_bf16": ("raw", _mkl_bf16, ()),
}
NATIVE = tuple(NATIVE_LAYOUTS)  # SPADE's own kernel, on its packed copy or on the weights in place
NARROW = ("native_rows", "mkl_widened", "mkl_bf16")  # the candidates that read narrow weights (and an int8 weight's scales)
SCALE = "weight_scale"  # an int8 weight's module holds its fp32 scale per weight row as this buffer (zoo.narrow)
TIMED = tuple(n for n, (_, _, rows) in CANDIDATES.items() if rows)  # the candidates a plan may choose or force
IN_PLACE = tuple(n for n in TIMED if CANDIDATES[n][0] == "raw")  # candidates that copy nothing
COPYING = tuple(n for n in TIMED if n not in NATIVE or n not in IN_PLACE)  # the default: the packed native kernel
POLICIES = ("auto", "legacy", *TIMED)


class Kernel:
    """One linear map on a chosen kernel: ``self(x) = x W^T + b`` (``self.name`` says which). ``scale``: an int8
    ``w``'s fp32 scale per weight row (``W = scale[:, None] * w``), read by the :data:`NARROW` candidates only."""

    __slots__ = ("name", "fn", "w", "b", "s")

    def __init__(self, name: str, w: torch.Tensor, b: torch.Tensor | None, scale: torch.Tensor | None = None):
        fn = CANDIDATES[name][1]
        if scale is not None:  # bound once: the call path stays one call
            if name not in NARROW:
                raise ValueError(f"scale: int8 weights run on {list(NARROW)}, not {name!r}")
            fn = functools.partial(fn, scale=scale)
        self.name, self.fn, self.w, self.b, self.s = name, fn, w, b, scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, self.w, self.b)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor, *, gated: bool = False) -> torch.Tensor:
        """``residual + u W^T + b`` with ``u = x``, or ``u = silu(x_1) * x_2`` for the halves of ``x`` if
        ``gated`` (a gated MLP's down projection); one call on the MKL kernel (``addmm``, beta = 1) and on
        ``"native"``, which also applies the gate."""
        if self.name in NATIVE:
            return native.linear(x, self.w, self.b, residual, gated=gated, scale=self.s, **NATIVE_LAYOUTS[self.name])
        if gated:
            half = x.shape[-1] // 2
            x = F.silu(x[..., :half]) * x[..., half:]
        if self.name == "mkl" and self.b is None:
            return torch.addmm(residual, x, self.w.t())
        return residual + self(x)

    def normed(self, x: torch.Tensor, eps: float, gain: torch.Tensor | None = None) -> torch.Tensor:
        """``rmsnorm(x) W^T + b`` with ``rmsnorm(x) = gain * x / sqrt(mean(x^2) + eps)`` (``gain`` None: none, as
        where the lean forward folds it into ``W``); one call on ``"native"``, which scales the product instead
        of ``x``."""
        if self.name in NATIVE:
            return native.linear(x, self.w, self.b, eps=eps, gain=gain, scale=self.s, **NATIVE_LAYOUTS[self.name])
        return self(F.rms_norm(x, (x.shape[-1],), gain, eps))


def prepare(family: str, w: torch.Tensor) -> torch.Tensor:
    """``w`` as a weight family of :data:`CANDIDATES` reads it: ``"raw"`` (itself), ``"packed"`` (a oneDNN-packed
    copy) or ``"tiles"`` (the native kernel's copy, :func:`native.pack`: groups of four rows interleaved); a
    candidate's family is ``CANDIDATES[name][0]``."""
    with torch.inference_mode():
        if family == "packed":
            return _pack(w)
        return native.pack(w.contiguous()) if family == "tiles" else w


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the oneDNN candidates can run here (CPU, fp32, oneDNN built and working)."""
    if device.type != "cpu" or dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    try:
        _lp(torch.zeros(2, 8), _pack(torch.zeros(8, 8)), None)
        return True
    except (AttributeError, RuntimeError):
        return False


def usable(name: str) -> bool:
    """Whether candidate ``name`` runs here (``"native"`` only where :func:`native.available`; the oneDNN ones
    are only timed where :func:`packing_available`)."""
    return name not in NATIVE or native.available()


def fixed(policy: str, packable: bool) -> dict[str, str]:
    """The kernels of a non-timed ``policy``: ``{"one": name, "many": name}``."""
    if policy not in POLICIES or policy == "auto":
        raise ValueError(f"policy: must be one of {list(POLICIES)}, got {policy!r}")
    if not usable(policy):
        raise ValueError(f"policy: {policy!r} is not available on this machine (an x86-64 CPU with AVX2 and FMA, "
                         "a C++ compiler and ninja)")
    if policy == "legacy":
        return {"one": "mkl", "many": "onednn" if packable else "mkl"}
    if policy.startswith("onednn") and not packable:
        raise ValueError(f"policy: {policy!r} needs oneDNN on a CPU in float32")
    many = policy if "many" in CANDIDATES[policy][2] else (
        "native_rows" if policy in NATIVE else "onednn" if packable else "mkl")
    return {"one": policy, "many": many}


def _disk_path():
    return paths.CACHE_DIR / "kernels" / "choices.json"


def _read_disk() -> dict:
    try:
        return json.loads(_disk_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def choose(model_facts: dict, timer: Callable[[str, dict[str, str]], float], products: list[str], *,
           cache: bool = True, candidates: dict[str, list[str]] | None = None) -> dict:
    """The fastest plan per row class for one model: ``{"one": summary, "many": summary, "plan": {row class:
    {product: candidate}}, "seconds": {row class: {label: median seconds of one forward}}, "confirmed": {row
    class: {"uniform": s, "refined": s, "kept": "uniform" | "refined"}} (classes whose plan moved), ...facts}``.

    ``timer(row_class, plan)`` returns the median seconds of the model's whole forward with each product
    of that row class on ``plan[product]`` (back to back, as decoding runs it); ``products`` names them,
    largest first. Each class is timed with every product on one candidate, then refined one product at a
    time (see the module docstring); a summary is the candidate's name where the plan uses one, else
    ``"product=candidate,..."``. ``candidates`` restricts each class's candidates (default: all serving
    it). ``model_facts`` (weight shapes, dtype, ...) plus the CPU model, torch version, thread count and
    whether the native kernels run (``SPADE_NATIVE``) key the cache."""
    facts, key = _keyed(model_facts)
    return _cached(_CHOSEN, key, lambda: _time_plans(facts, timer, products, candidates),
                   lambda hit: _valid(hit, products), cache)


def _cached(memo: dict[str, dict], key: str, make: Callable[[], dict], valid: Callable[[dict], bool],
            cache: bool) -> dict:
    """``memo[key]``, else the disk cache's record (when ``valid``), else ``make()`` written to both: one process at a
    time times a model and writes the file, the others read it (``cache`` False: the disk is neither read nor
    written)."""
    hit = memo.get(key)
    if hit is None and cache:
        from filelock import FileLock

        path = _disk_path()
        paths.ensure_dir(path.parent)
        with FileLock(str(path) + ".lock"):
            hit = _read_disk().get(key)
            if hit is not None and not valid(hit):  # written by another SPADE version: time again
                hit = None
            if hit is None:
                hit = make()
                try:
                    write_json(path, {**_read_disk(), key: hit})
                except OSError:
                    pass
    elif hit is None:
        hit = make()
    memo[key] = hit
    return hit


def choose_prefill(model_facts: dict, timer: Callable[[str], float], *, cache: bool = True) -> dict:
    """Whether a **draft's** prefill runs its products in bf16: ``{"prefill": "fp32" | "bf16", "seconds": {precision:
    median seconds of one prefill forward of PREFILL_ROWS rows}, "why": ..., ...facts}``.

    A prefill is compute-bound (``2 N k`` flops over ``N`` weights for ``k`` rows); where the CPU multiplies bf16
    natively (AMX: ~2.2 TFLOP/s against ~0.4 for fp32 SGEMM on the 2-core Xeon of
    ``docs/measurements.md``) the draft's prompt costs a fraction. It rounds the draft's activations and weights
    to bf16 for the prompt's keys and values, so it changes the draft's proposals, never the target's output
    (the rejection rule judges whatever ``q`` the draft proposes from); a target's prefill stays fp32, because its
    logits are the output distribution. ``timer(precision)`` returns the median seconds of one prefill (its setup
    left out); bf16 is timed only where oneDNN runs it (:func:`spade_lib.devices.bf16_matmul`) and kept where it is
    faster by :data:`PREFILL_GAIN` (an emulated bf16 GEMM is not). Cached like :func:`choose`."""
    facts, key = _keyed({**model_facts, "prefill_rows": PREFILL_ROWS, "choice": "prefill"})

    def make() -> dict:
        if not devices.bf16_matmul():
            return {**facts, "prefill": "fp32", "seconds": {}, "why": "no bf16 matmul on this CPU (oneDNN)"}
        sec = _rounds(lambda _, precision: timer(precision), "prefill", {p: p for p in PREFILLS})
        fast = sec["bf16"] * PREFILL_GAIN < sec["fp32"]
        return {**facts, "prefill": "bf16" if fast else "fp32", "seconds": sec,
                "why": f"bf16 {sec['fp32'] / sec['bf16']:.2f}x as fast as fp32 (kept above {PREFILL_GAIN}x)"}

    return _cached(_PREFILL, key, make, lambda hit: hit.get("prefill") in PREFILLS, cache)


def _keyed(model_facts: dict) -> tuple[dict, str]:
    """``(facts, key)``: ``model_facts`` with what else a plan depends on (CPU, torch, threads, plan version,
    native ISA), and the cache key hashed from them."""
    facts = {"cpu": devices.cpu().label(), "torch": torch.__version__, "threads": torch.get_num_threads(),
             "plan_version": PLAN_VERSION, "native": native.available() and native.isa(), **model_facts}
    return facts, hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def recorded(model_facts: dict, products: list[str]) -> dict | None:
    """The plan :func:`choose` recorded for these facts (this process's, else the disk cache's), read without
    timing anything; ``None`` when none is recorded or the recorded one is not a plan of today's candidates."""
    facts, key = _keyed(model_facts)
    hit = _CHOSEN.get(key)
    if hit is None:
        hit = _read_disk().get(key)
        if hit is None or not _valid(hit, products):
            return None
        _CHOSEN[key] = hit
    return hit


def untimed(in_place: bool) -> dict[str, str]:
    """The plan of a model no plan was recorded for (:func:`recorded`), chosen without timing: SPADE's native
    kernel where it runs (on the weights in place, or on its packed copy), else MKL, for both row classes."""
    name = next((n for n in (("native_rows",) if in_place else ("native",)) if usable(n)), "mkl")
    return {"one": name, "many": name}


def _time_plans(facts: dict, timer: Callable[[str, dict[str, str]], float], products: list[str],
                candidates: dict[str, list[str]] | None) -> dict:
    """The choice of :func:`choose` for one model, timed now (see the module docstring)."""
    seconds: dict[str, dict[str, float]] = {}
    plans: dict[str, dict[str, str]] = {}
    confirmed: dict[str, dict] = {}
    for rows in ROW_CLASSES:
        names = (candidates or {}).get(rows) or [n for n in COPYING if rows in CANDIDATES[n][2] and usable(n)]
        uniform = {n: {p: n for p in products} for n in names}
        sec = _rounds(timer, rows, uniform)
        best = min(sec, key=sec.get)
        mine = min((n for n in NATIVE if n in sec), key=sec.get, default=None)  # the fastest of SPADE's own
        if mine is not None and sec[mine] <= sec[best] * (1 + NATIVE_MARGIN):
            best = mine  # kept within the margin: one stable plan, and rows that do not depend on k
        plan, t_best = uniform[best], sec[best]
        near = [] if best in NATIVE else [n for n in names if sec[n] <= PRUNE * sec[best]]
        for p in products:
            for n in near:
                if n == plan[p]:
                    continue
                trial = {**plan, p: n}
                t = sec[f"{p}={n}"] = float(timer(rows, trial))
                if t < t_best * (1 - MIN_GAIN):
                    plan, t_best = trial, t
        if plan != uniform[best]:  # a move timed once may ride on noise: keep it only if it holds in rounds
            again = _rounds(timer, rows, {"uniform": uniform[best], "refined": plan})
            confirmed[rows] = {**again, "kept": "refined" if again["refined"] < again["uniform"] * (1 - MIN_GAIN)
                               else "uniform"}
            plan = plan if confirmed[rows]["kept"] == "refined" else uniform[best]
        seconds[rows], plans[rows] = sec, plan
    return {**facts, "seconds": seconds, "confirmed": confirmed, "plan": plans,
            **{rows: summary(plans[rows]) for rows in ROW_CLASSES}}


def _rounds(timer: Callable[[str, object], float], rows: str, plans: dict[str, object]) -> dict[str, float]:
    """``{label: median over ROUNDS}`` of ``timer(rows, plan)`` (seconds it reads itself, its setup left out), the
    plans taken in turn in every round (:func:`spade_lib.devices.time_in_turns`), so a drift of the host's speed or
    a slow first call weighs on every plan alike instead of on one."""
    times = devices.time_in_turns({label: (lambda plan=plan: timer(rows, plan)) for label, plan in plans.items()},
                                  reps=ROUNDS, warmup=0, self_timed=True)
    return {label: float(sorted(t)[len(t) // 2]) for label, t in times.items()}


def _valid(hit: dict, products: list[str]) -> bool:
    """Whether a cached choice is a plan of today's candidates for these products."""
    plan = hit.get("plan")
    return isinstance(plan, dict) and all(
        isinstance(plan.get(rows), dict) and set(plan[rows]) == set(products)
        and all(n in CANDIDATES and rows in CANDIDATES[n][2] and usable(n) for n in plan[rows].values())
        for rows in ROW_CLASSES)


def summary(plan: dict[str, str]) -> str:
    """A plan's name: its one candidate, or ``"product=candidate,..."`` when the products differ."""
    used = set(plan.values())
    return next(iter(used)) if len(used) == 1 else ",".join(f"{p}={n}" for p, n in plan.items())


def choices() -> list[dict]:
    """The kernels this process chose: one dict per model (its facts, the CPU model, torch version,
    threads, the kernel per row class and every candidate's median seconds)."""
    return [dict(v) for v in _CHOSEN.values()]
