"""Where models run and in what precision: ``device`` and ``dtype`` arguments resolved to torch objects.

``resolve_device("auto")`` is ``cuda`` when available, else ``cpu``; a CUDA device that is not there is
refused by name. ``resolve_dtype`` takes one of the names in :data:`DTYPES` or their ``torch.dtype``.
Everything that places a model (``zoo.pairs.load_pair``, ``runs.config``, ``runs.runner``, ``runs.cli``, the
experiments) resolves its arguments here, before any model loads.

:func:`cpu` is the one probe of the CPU a run measures on (``/proc/cpuinfo`` and the last-level cache size
in ``/sys``): the hosts of one project can share a model name ("AMD EPYC") while being Zen 2, Zen 4 or Zen 5
parts with and without AVX-512, so a label that names only the model cannot tell their timings apart, and a
kernel plan keyed by it would be reused on another host. :meth:`CpuInfo.label` names vendor family/model,
AVX-512 and the L3; the kernel plans, the run fingerprints, the report and the benchmarks use it.

Timing: :func:`clock` is the one clock and :func:`time_in_turns` the one timing loop (warm-up, rounds in a rotated
order, bursts, a time bound); the cost measurement, the kernel plans, the protocol's bandwidth probes and
``runs.timing.measure`` are all calls of it.
"""

from __future__ import annotations

import functools
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from spade_lib.validate import ArgumentTypeError, check_choice


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` → ``cuda`` when available else ``cpu``; otherwise ``torch.device(device)``."""
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise ArgumentTypeError(f"device: must be 'cpu', 'cuda', 'cuda:N', 'auto' or a torch.device, got {device!r}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device: must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {device!r}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available here (use 'cpu' or 'auto')")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device: {device!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
    return dev


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"``/``"bfloat16"``/``"float16"`` (or fp32/bf16/fp16, or that ``torch.dtype``) →
    ``torch.dtype``. Anything else (``"int8"``, ``torch.int8``, ``torch.float64``) is refused here, naming
    ``dtype``, instead of by transformers naming the model it was loading."""
    names = list(dict.fromkeys(str(d).removeprefix("torch.") for d in DTYPES.values()))
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    check_choice("dtype", str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else dtype, names)
    return dtype  # one of the supported torch.dtypes


def synchronize(device: str | torch.device | None) -> None:
    """Wait for queued kernels on ``device`` (a no-op on CPU)."""
    if device is None:
        return
    if not isinstance(device, torch.device):  # a torch.device is used as is: the decoders call this per step
        device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: str | torch.device | None = None) -> float:
    """``time.perf_counter()`` after synchronising ``device``: the one clock of every timing in SPADE (the
    decoders' per-step ``t_draft`` / ``t_verify``, the cost measurement, the timing protocol), so a CUDA
    interval ends when its kernels do, not when they were queued."""
    synchronize(device)
    return time.perf_counter()


_device_clock = clock  # what time_in_turns reads when its caller passes no clock (its parameter shadows the name)


def time_in_turns(forwards: dict[str, Callable[[], object]], *, reps: int, warmup: int = 3, burst: int = 1,
                  clock: Callable[[], float] | None = None, device=None, max_seconds: float | None = None,
                  min_reps: int = 5, self_timed: bool = False) -> dict[str, np.ndarray]:
    """Seconds of each callable in ``forwards`` over ``reps`` rounds (after ``warmup`` untimed ones): every round
    runs each in turn, in an order rotated by the round. Returns ``{name: times [n]}``; round ``k`` of every name
    was timed close together, so ratios should be taken round by round. The one timing loop of SPADE.

    ``max_seconds`` bounds the work for large models: once that much time has passed, no new round starts past
    ``min_reps`` timed ones (``n = min(reps, max(min_reps, rounds done))``), and one warm-up round that already
    took ``max_seconds / (warmup + min_reps)`` or more is the only one.

    ``burst > 1`` runs each callable ``burst`` times in a row per round and keeps the median of all but the first
    call: decoding calls one forward again and again, so its weights are as warm as they are there, not as the
    previous, different forward of the round left the caches. ``self_timed``: a callable returns its own seconds
    (read on :func:`clock` around its inner loop, its setup left out), which is the reading."""
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps: must be an integer >= 1, got {reps!r}")
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise ValueError(f"burst: must be an integer >= 1, got {burst!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup: must be an integer >= 0, got {warmup!r}")
    clock = clock or functools.partial(_device_clock, device)
    names = list(forwards)
    times: dict[str, list[float]] = {n: [] for n in names}
    start = clock()
    k = 0
    while k < warmup + reps:
        if max_seconds is not None and k > warmup and len(times[names[0]]) >= min_reps \
                and clock() - start > max_seconds:
            break
        if max_seconds is not None and k == 1 and warmup > 1 and clock() - start >= max_seconds / (warmup + min_reps):
            k = warmup  # one slow warm-up round is warm-up enough
        for name in names[k % len(names):] + names[:k % len(names)]:
            calls = []
            for _ in range(burst):
                synchronize(device)
                t0 = clock()
                out = forwards[name]()
                synchronize(device)
                calls.append(float(out) if self_timed else clock() - t0)
            if k >= warmup:
                times[name].append(float(np.median(calls[1:] if burst > 1 else calls)))
        k += 1
    return {n: np.asarray(v) for n, v in times.items()}


@dataclass(frozen=True)
class CpuInfo:
    """What a timing depends on in a CPU: its model name, family and model numbers (x86 ``cpu family`` /
    ``model``; ``None`` where unknown), its feature flags and its last-level cache in bytes (``None``)."""

    name: str
    family: int | None = None
    model: int | None = None
    flags: frozenset[str] = frozenset()
    l3_bytes: int | None = None

    def label(self) -> str:
        """``"AMD EPYC (family 25 model 17, AVX-512, 32 MiB L3)"``: enough to tell hosts of one name apart."""
        facts = []
        if self.family is not None and self.model is not None:
            facts.append(f"family {self.family} model {self.model}")
        if self.flags:
            facts.append("AVX-512" if "avx512f" in self.flags else "AVX2" if "avx2" in self.flags else "no AVX2")
        if self.l3_bytes:
            facts.append(f"{self.l3_bytes / 2**20:g} MiB L3")
        return f"{self.name} ({', '.join(facts)})" if facts else self.name


def _cache_bytes(text: str) -> int | None:
    """``"32768K"`` / ``"32M"`` / ``"1024"`` (sysfs cache sizes) in bytes, ``None`` if unreadable."""
    text = text.strip()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale != 1 else text
    return int(digits) * scale if digits.isdigit() else None


def parse_cpuinfo(text: str, l3: str | None = None) -> CpuInfo:
    """:class:`CpuInfo` from the text of ``/proc/cpuinfo`` (its first processor) and a sysfs L3 size string."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough: the others repeat it
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())

    def number(key: str) -> int | None:
        value = fields.get(key, "")
        return int(value) if value.isdigit() else None

    name = fields.get("model name") or platform.processor() or platform.machine()
    return CpuInfo(name=name, family=number("cpu family"), model=number("model"),
                   flags=frozenset(fields.get("flags", "").split()), l3_bytes=None if l3 is None else _cache_bytes(l3))


@functools.cache
def cpu() -> CpuInfo:
    """This machine's CPU (read once per process); a machine without ``/proc/cpuinfo`` gets what
    ``platform`` knows and no flags."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")[:200_000]
    except OSError:
        text = ""
    l3 = None
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "level").read_text().strip() == "3":
                l3 = (index / "size").read_text()
        except OSError:
            continue
    return parse_cpuinfo(text, l3)


def bf16_matmul() -> bool:
    """Whether oneDNN runs bf16 matrix products on this CPU (torch's check: an AVX-512 core; natively fast with
    AVX-512-BF16 or AMX, emulated on plain AVX-512; never on AVX2). Where it does not, bf16 training autocast and a
    draft's bf16 prefill are not used; where it does, the prefill is still timed against fp32 before it is taken."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
