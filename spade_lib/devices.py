"""Where models run and in what precision: ``device`` and ``dtype`` arguments resolved to torch objects.

``resolve_device("auto")`` is ``cuda`` when available, else ``cpu``; a CUDA device that is not there is
refused by name. ``resolve_dtype`` takes one of the names in :data:`DTYPES` or their ``torch.dtype``.
Everything that places a model (``zoo.pairs.load_pair``, ``runs.config``, ``runs.runner``, ``runs.cli``, the
experiments) resolves its arguments here, before any model loads.
"""

from __future__ import annotations

import time

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
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: str | torch.device | None = None) -> float:
    """``time.perf_counter()`` after synchronising ``device``."""
    synchronize(device)
    return time.perf_counter()
