"""Timing methodology: a speedup is a ratio of two timings, so both are taken the same way, as follows.

- **Threads fixed and recorded**: ``fix_threads(n)`` sets torch's intra-op threads before timing; stored in metadata.
- **Warm-up, repeats, median and spread**: ``measure`` runs ``warmup`` untimed calls, then times ``repeats`` calls and
  reports the median, min, max and IQR; relative spread ``(q75 - q25) / median`` (on a shared host: interference).
- **Stalls** (:class:`StallRule`, :func:`find_stalls`): a reading of ``t`` s for ``N`` new tokens is a stall when
  ``u = t / N > median(U) + max(k * 1.4826 * MAD(U), e * median(U))``, ``U`` every reading of that configuration in
  the session so far (all prompts and rounds; ``1.4826 MAD`` the normal-consistent spread), ``k = 5``, ``e = 0.5`` (at
  least 1.5x the median). Per token: prompts emit different counts; session-wide: a prompt may have one round only.
  :mod:`spade_lib.runs.protocol` re-times a stall (up to ``max_retimes`` times) and reports it.
- **Physical controls on every reading** (:class:`PauseRule`, on each block of readings: one prompt and sample,
  all session members' rounds, before pricing). (1) *A prefill lies inside its generation*: ``p <= t`` (one clock;
  :func:`impossible_prefill`, ``slack`` for float rounding), so ``median p <= median t`` (order statistics keep the
  order). (2) *No clock gaps*: the clock advancing over ``gap`` s between readings of a block is a host pause (later
  readings lose their warm-up). (3) *A reading is not far beyond its own rounds*: with ``m_k = median_{j != k} t_j``
  (``R >= 2``), ``d_k = log(t_k / m_k)``, ``s_c = 1.4826 MAD`` of the ``d`` of member ``c``'s clean blocks so far,
  round ``k`` is paused when ``d_k > max(k s_c, log(1 + min_excess))`` (``log 1.5`` until ``min_reference``
  deviations) **and** ``t_k - m_k > gap``. A pause of ``P`` s adds ``log(1 + P / t)`` to ``d``; only ``d > 0`` is
  judged; a prompt slow in itself is slow in every round; a clean ``d`` has spread ~``sqrt(2) s_c``, so ``k = 5`` flags
  < 1 in 10^3 (Gaussian). A block breaking any is re-timed whole, up to ``max_retimes`` times; if every timing breaks
  one, its generation is dropped: written and reported, never priced.
- **Device synchronisation**: every clock read on a CUDA device is preceded by ``torch.cuda.synchronize``.
- **Same token counting**: ``new_tokens / seconds`` (tokens emitted after the prompt), baseline and method alike.
- **Fingerprint**: ``environment_fingerprint()`` records CPU model, core and thread counts, GPU, library versions and
  the git commit (with a dirty flag) in every run's metadata.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from spade_lib import devices
from spade_lib.decoding.model import kernels
from spade_lib.paths import REPO_ROOT

T = TypeVar("T")


def fix_threads(n: int | None = None) -> int:
    """Set torch's intra-op thread count (default: the CPUs this process may use); return it."""
    if n is None:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if n < 1:
        raise ValueError(f"n (threads) must be >= 1, got {n}")
    torch.set_num_threads(n)
    return torch.get_num_threads()


@dataclass(frozen=True)
class Timing:
    """Seconds of ``repeats`` timed calls and their summary."""

    times: tuple[float, ...]
    median: float
    q25: float
    q75: float
    min: float
    max: float

    @property
    def rel_spread(self) -> float:
        """``(q75 - q25) / median``: the interquartile range relative to the median."""
        return (self.q75 - self.q25) / self.median if self.median > 0 else float("nan")

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["times"] = list(self.times)
        d["rel_spread"] = self.rel_spread
        return d


def summarize_times(times: list[float] | tuple[float, ...]) -> Timing:
    """Median, quartiles (linear interpolation), min and max of ``times``."""
    if len(times) == 0:
        raise ValueError("times must hold at least one measurement")
    a = np.asarray(times, dtype=np.float64)
    q25, q75 = np.percentile(a, [25, 75])
    return Timing(tuple(float(t) for t in a), float(statistics.median(a.tolist())), float(q25),
                  float(q75), float(a.min()), float(a.max()))


def measure(fn: Callable[[], T], *, warmup: int = 1, repeats: int = 3,
            device: str | torch.device | None = None) -> tuple[T, Timing]:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times timed; return (last result, Timing)."""
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    result = []

    def call() -> None:
        result[:] = [fn()]

    times = devices.time_in_turns({"fn": call}, reps=repeats, warmup=warmup, device=device)["fn"]
    return result[0], summarize_times(times)


def _check_rule(rule, numbers: tuple[str, ...], integers: tuple[tuple[str, int], ...]) -> None:
    """A timing rule's fields: ``numbers`` finite and >= 0, ``integers`` integers >= their bound."""
    for name in numbers:
        v = getattr(rule, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")
    for name, low in integers:
        v = getattr(rule, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name}: must be an integer >= {low}, got {v!r}")


@dataclass(frozen=True)
class StallRule:
    """When a timed reading is a stall (module docstring, **Stalls**): seconds per new token above
    ``median + max(k * 1.4826 * MAD, min_excess * median)`` of the configuration's readings."""

    k: float = 5.0           # scaled MADs above the median (a robust z-score)
    min_excess: float = 0.5  # and at least this fraction above the median (0.5: 1.5x)
    min_reference: int = 4   # readings of the configuration needed before one is judged (fewer: none is)
    max_retimes: int = 2     # re-timings of a stalled reading before it is kept as the prompt's own time (0: report only)

    def __post_init__(self) -> None:
        _check_rule(self, ("k", "min_excess"), (("min_reference", 2), ("max_retimes", 0)))

    def threshold(self, reference) -> float:
        """Seconds per token above which a reading is a stall, from the ``reference`` readings (seconds per
        token); ``inf`` when there are fewer than ``min_reference`` of them."""
        u = np.asarray(reference, dtype=np.float64).ravel()
        u = u[np.isfinite(u)]
        if u.size < self.min_reference:
            return float("inf")
        med = float(np.median(u))
        mad = 1.4826 * float(np.median(np.abs(u - med)))
        return med + max(self.k * mad, self.min_excess * med)


@dataclass(frozen=True)
class PauseRule:
    """The physical controls of every block of readings (module docstring, **Physical controls on every
    reading**): prefill inside its reading, no gap in the session's clock, no reading far beyond its rounds."""

    gap: float = 0.5         # seconds the host took: between two readings of a block, or inside one beyond its rounds
    k: float = 5.0           # robust z-score of a round's log-deviation from its prompt's median round
    min_excess: float = 0.5  # and at least 1.5x the prompt's median round (log(1.5))
    min_reference: int = 8   # log-deviations of the member needed before its spread s_c counts (fewer: the floor)
    max_retimes: int = 2     # timings of a block again before its generation is dropped (0: dropped at once)
    slack: float = 1e-6      # seconds: a prefill may exceed its reading by float rounding only

    def __post_init__(self) -> None:
        _check_rule(self, ("gap", "k", "min_excess", "slack"), (("min_reference", 2), ("max_retimes", 0)))

    def round_limit(self, deviations) -> float:
        """The log-deviation from its prompt's median round above which a reading is paused:
        ``max(k * 1.4826 * MAD(deviations), log(1 + min_excess))``, the floor alone with fewer than
        ``min_reference`` finite ``deviations``."""
        d = np.asarray(deviations, dtype=np.float64).ravel()
        d = d[np.isfinite(d)]
        floor = float(np.log1p(self.min_excess))
        if d.size < self.min_reference:
            return floor
        mad = 1.4826 * float(np.median(np.abs(d - np.median(d))))
        return max(self.k * mad, floor)


def _others(t: np.ndarray) -> np.ndarray:
    """``m_k = median_{j != k} t_j`` for every round ``k``."""
    return np.array([np.median(np.delete(t, k)) for k in range(t.size)])


def round_deviations(times) -> np.ndarray:
    """``d_k = log(t_k / m_k)`` of one member's rounds on one prompt, ``m_k`` the median of its other rounds;
    empty for fewer than 2 rounds."""
    t = np.asarray(times, dtype=np.float64).ravel()
    if t.size < 2 or not (np.isfinite(t).all() and (t > 0).all()):
        return np.zeros(0)
    return np.log(t / _others(t))


def paused_rounds(times, limit: float, seconds: float = 0.0) -> np.ndarray:
    """Which of one member's rounds on one prompt lie more than ``limit`` (a log-ratio,
    :meth:`PauseRule.round_limit`) and more than ``seconds`` above the median of its other rounds: a bool
    array; all False below 2 rounds."""
    t = np.asarray(times, dtype=np.float64).ravel()
    if t.size < 2 or not (np.isfinite(t).all() and (t > 0).all()):
        return np.zeros(t.shape, dtype=bool)
    m = _others(t)
    return (np.log(t / m) > limit) & (t - m > seconds)


def clock_gaps(spans, gap: float) -> list[tuple[int, float]]:
    """``(i, seconds)`` for every reading ``i`` of ``spans`` (``(start, end)`` on the session's clock, in the
    order taken) that started more than ``gap`` seconds after the previous one ended: a host pause."""
    return [(i, float(s1 - e0)) for i, ((_, e0), (s1, _)) in enumerate(zip(spans, spans[1:]), start=1)
            if s1 - e0 > gap]


def impossible_prefill(prefill: float, seconds: float, slack: float = 0.0) -> bool:
    """Whether a reading's prefill (the decoder's clock, inside the reading) exceeds the reading
    itself by more than ``slack``: a reading no correct clock can give. A NaN prefill (hidden: HF) is not judged."""
    return bool(np.isfinite(prefill) and prefill > seconds + slack)


def find_stalls(per_token, rule: StallRule = StallRule(), reference=None) -> np.ndarray:
    """Which of ``per_token`` (seconds per new token of timed readings) are stalls under ``rule``, judged
    against ``reference`` (default: ``per_token`` itself, the median and MAD being robust to the few
    stalls among them). A bool array of ``per_token``'s shape; all False with too few references."""
    u = np.asarray(per_token, dtype=np.float64)
    return u > rule.threshold(u if reference is None else reference)


COPY_BYTES = 256 << 20  # a copy far larger than any last-level cache


def copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = 7) -> float:
    """The machine's memory bandwidth as a plain torch copy moves it: ``2 nbytes / t`` (read + write,
    STREAM's convention) for ``dst.copy_(src)`` of ``nbytes`` fp32, median of ``repeats`` after a
    warm-up, at the current thread count. An autoregressive CPU decode step that streams its weights at
    a rate near this is at the machine's limit."""
    n = max(1, int(nbytes) // 4)
    src, dst = torch.randn(n), torch.empty(n)
    times = devices.time_in_turns({"copy": lambda: dst.copy_(src)}, reps=repeats, warmup=1)["copy"]
    return 2 * n * 4 / sorted(times)[len(times) // 2]


def gemm_peak(n: int = 2048, repeats: int = 5) -> float:
    """The host's fp32 arithmetic peak as torch reaches it, in FLOP/s: ``2 n^3 / t`` for one ``[n, n] @ [n, n]``
    product (MKL's SGEMM, compute-bound at this size), the median of ``repeats`` after a warm-up, at the
    current thread count. A ``k``-row forward of ``N`` weights needs ``2 k N`` FLOP, so it cannot take less than
    ``2 k N / peak``: with ``t(1)`` the one-row forward, ``r(k) >= max(1, 2 k N / (peak t(1)))`` (the roofline
    floor ``benchmarks/bench_rows.py`` prints beside the measured ``r``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    times = devices.time_in_turns({"mm": lambda: torch.mm(a, b)}, reps=repeats, warmup=1)["mm"]
    return 2 * n ** 3 / sorted(times)[len(times) // 2]


def streaming_vs_copy(step: Callable[[], object], weight_bytes: int, *, rounds: int = 11, steps: int = 8,
                      nbytes: int = COPY_BYTES) -> dict[str, float]:
    """An AR decode step's weight-streaming rate beside the copy bandwidth, measured **in turns**: each
    round times one ``dst.copy_(src)`` of ``nbytes`` (``2 nbytes / t``, as :func:`copy_bandwidth`) and then
    ``steps`` calls of ``step`` (one decode step each: ``weight_bytes`` read per call; :func:`spade_lib.devices.time_in_turns`,
    the two in a rotated order), so a host whose
    memory bandwidth drifts (a shared VM) moves both sides of a round's ratio alike. Returns medians over
    rounds: ``rate`` and ``copy`` (bytes/s), ``ratio`` (rate / copy, per round) with its ``ratio_q1`` /
    ``ratio_q3``, and ``step_s`` (seconds per step)."""
    n = max(1, int(nbytes) // 4)
    src, dst = torch.randn(n), torch.empty(n)

    def steps_in_a_row() -> None:
        for _ in range(steps):
            step()

    t = devices.time_in_turns({"copy": lambda: dst.copy_(src), "steps": steps_in_a_row}, reps=rounds, warmup=1)
    dt = t["steps"] / steps
    rates, copies = list(weight_bytes / dt), list(2 * n * 4 / t["copy"])
    ratios, secs = [r / c for r, c in zip(rates, copies)], list(dt)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"rate": statistics.median(rates), "copy": statistics.median(copies), "ratio": statistics.median(ratios),
            "ratio_q1": q[0], "ratio_q3": q[2], "step_s": statistics.median(secs)}


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def git_commit() -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the repository holding spade_lib."""
    sha = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if sha else None
    return {"commit": sha, "dirty": None if status is None else bool(status)}


def environment_fingerprint(device: str | torch.device | None = None) -> dict[str, Any]:
    """Where and with what a run was measured (JSON-serialisable)."""
    import transformers

    fp: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_model": devices.cpu().label(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cuda_available": torch.cuda.is_available(),
        "device": str(device) if device is not None else None,
        "gpu": None,
        **{f"git_{k}": v for k, v in git_commit().items()},
    }
    if device is not None and torch.device(device).type == "cuda":
        fp["gpu"] = torch.cuda.get_device_name(torch.device(device))
        fp["cuda"] = torch.version.cuda
    fp["cpu_flags"] = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in devices.cpu().flags]
    return fp


def kernel_plans() -> list[dict]:
    """The linear-kernel plans the lean forwards of this process chose (:mod:`spade_lib.decoding.model.kernels`),
    one per model: its layer count, weight shapes, dtype, threads and the kernel per row class. It depends
    on what the process built so far, so sessions record it, not the run's identity."""
    return [{k: c.get(k) for k in ("layers", "shapes", "dtype", "threads", "one", "many", "plan")} for c in kernels.choices()]
