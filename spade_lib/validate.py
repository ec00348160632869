"""Argument validation at SPADE's boundaries: one checker per concept, one message format.

Every public entry point checks its arguments with these helpers *before* doing any work or writing
any file. A failed check raises

- :class:`ArgumentTypeError` (a ``TypeError`` that is also a ``ValueError``, so older callers that
  catch ``ValueError`` keep working) when the value has the wrong type, or
- ``ValueError`` when it has the right type but is out of range,

and the message always starts with ``"<name>: "``, then states what was expected and the value got,
e.g. ``"gamma: must be an integer >= 1, got 0"``.

:func:`safe_name` maps an id that comes from data (a suite's ``question_id``) to a file name that
cannot leave its folder.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "ArgumentTypeError", "check_int", "check_float", "check_choice", "check_bool", "check_str",
    "check_prob_tensor", "check_token_ids", "check_identifier", "check_gamma", "check_costs", "check_finite_columns",
    "check_dtype", "check_options", "MAX_GAMMA", "safe_name",
]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (both a ``TypeError`` and, for older callers, a ``ValueError``)."""


def _range_text(min: Any, max: Any, min_open: bool = False, max_open: bool = False) -> str:
    parts = []
    if min is not None:
        parts.append(f"{'>' if min_open else '>='} {min:g}" if isinstance(min, float) else
                     f"{'>' if min_open else '>='} {min}")
    if max is not None:
        parts.append(f"{'<' if max_open else '<='} {max:g}" if isinstance(max, float) else
                     f"{'<' if max_open else '<='} {max}")
    return " and ".join(parts)


def check_int(name: str, value: Any, *, min: int | None = None, max: int | None = None) -> int:
    """``value`` as a Python ``int`` in ``[min, max]``. ``bool``, floats (``4.0`` too) and strings are
    refused; numpy integers are accepted."""
    want = "an integer" + (f" {_range_text(min, max)}" if min is not None or max is not None else "")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{name}: must be {want}, got {value!r} ({type(value).__name__})")
    value = int(value)
    if (min is not None and value < min) or (max is not None and value > max):
        raise ValueError(f"{name}: must be {want}, got {value!r}")
    return value


def check_float(name: str, value: Any, *, min: float | None = None, max: float | None = None,
                finite: bool = True, min_open: bool = False, max_open: bool = False) -> float:
    """``value`` (int or float, not bool) as a Python ``float``: never NaN, finite unless
    ``finite=False``, within ``[min, max]`` (``min_open`` / ``max_open`` exclude the bound)."""
    bounds = _range_text(min, max, min_open, max_open)
    want = ("a finite number" if finite else "a number (not NaN)") + (f" {bounds}" if bounds else "")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(f"{name}: must be {want}, got {value!r} ({type(value).__name__})")
    v = float(value)
    if math.isnan(v) or (finite and math.isinf(v)):
        raise ValueError(f"{name}: must be {want}, got {v!r}")
    if min is not None and (v < min or (min_open and v == min)):
        raise ValueError(f"{name}: must be {want}, got {v!r}")
    if max is not None and (v > max or (max_open and v == max)):
        raise ValueError(f"{name}: must be {want}, got {v!r}")
    return v


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices`` (compared with ``==``, and by type for strings)."""
    choices = tuple(choices)
    for c in choices:
        if type(value) is type(c) and value == c:
            return value
    raise ValueError(f"{name}: must be one of {list(choices)}, got {value!r}")


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a ``bool`` (not ``0``/``1``, not ``"true"``)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name}: must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_str(name: str, value: Any, *, nonempty: bool = True) -> str:
    """``value`` if it is a ``str`` (non-empty unless ``nonempty=False``)."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name}: must be a string, got {value!r} ({type(value).__name__})")
    if nonempty and not value.strip():
        raise ValueError(f"{name}: must be a non-empty string, got {value!r}")
    return value


def check_identifier(name: str, value: Any) -> str:
    """``value`` if it is a valid, non-keyword Python identifier (a parameter name that is safe to
    paste into code: papermill writes ``<name> = <value>`` into the notebook)."""
    import keyword

    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name}: must be a Python identifier, got {value!r} ({type(value).__name__})")
    if not value.isidentifier() or keyword.iskeyword(value) or not value.isascii():
        raise ValueError(f"{name}: must be a Python identifier (letters, digits, _; not a keyword), got {value!r}")
    return value


def check_prob_tensor(name: str, t: Any, *, sum_tol: float = 1e-4) -> Any:
    """``t`` if it is a floating-point ``torch.Tensor`` of shape ``[..., V]`` whose entries are finite,
    non-negative and whose rows sum to 1 within ``sum_tol`` (itself a finite number >= 0)."""
    import torch

    sum_tol = check_float("sum_tol", sum_tol, min=0.0)
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        what = f"tensor of dtype {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ArgumentTypeError(f"{name}: must be a floating-point torch.Tensor of probabilities, got {what}")
    if t.ndim < 1 or t.shape[-1] < 1:
        raise ValueError(f"{name}: must have shape [..., V] with V >= 1, got {tuple(t.shape)}")
    if t.numel() == 0:
        return t
    if not torch.isfinite(t).all():
        raise ValueError(f"{name}: must be finite, got {'NaN' if torch.isnan(t).any() else 'inf'} entries")
    if t.amin() < 0:
        raise ValueError(f"{name}: must be non-negative, got min {t.amin().item():.3g}")
    err = (t.sum(dim=-1) - 1).abs()
    if err.max() > sum_tol:
        raise ValueError(f"{name}: rows must sum to 1 (tolerance {sum_tol:g}), got a row summing to "
                         f"{t.sum(dim=-1).flatten()[int(err.argmax())].item():.6g}")
    return t


def check_token_ids(name: str, ids: Any, vocab_size: int | None = None) -> list[int]:
    """``ids`` (a sequence of ints or a 1-D integer tensor/array) as a list of ints in
    ``[0, vocab_size)``. A ``str`` is refused (it is text, not token ids: tokenize it first)."""
    if isinstance(ids, (str, bytes)):
        raise ArgumentTypeError(f"{name}: must be a sequence of token ids, got {type(ids).__name__} {ids[:40]!r} "
                                "(tokenize text first)")
    if hasattr(ids, "tolist") and not isinstance(ids, (list, tuple)):
        if getattr(ids, "dtype", None) is not None and ("float" in str(ids.dtype) or "bool" in str(ids.dtype)):
            raise ArgumentTypeError(f"{name}: token ids must be integers, got dtype {ids.dtype}")
        ids = ids.tolist()
    if isinstance(ids, (set, frozenset)):
        ids = list(ids)
    if not isinstance(ids, Sequence):
        raise ArgumentTypeError(f"{name}: must be a sequence of token ids, got {type(ids).__name__}")
    out = []
    for i, v in enumerate(ids):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise ArgumentTypeError(f"{name}: token ids must be integers, got {v!r} ({type(v).__name__}) at index {i}")
        out.append(int(v))
    if out and vocab_size is not None:
        lo, hi = min(out), max(out)
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name}: token ids must lie in [0, {vocab_size}) (the vocabulary), got {bad}")
    elif out and min(out) < 0:
        raise ValueError(f"{name}: token ids must be >= 0, got {min(out)}")
    return out


def check_costs(name: str, values: Any) -> np.ndarray:
    """Cost ratios (a number or an array, e.g. ``r(gamma)`` evaluated on a grid) as a float64 array,
    every entry finite and > 0: a zero, negative or NaN cost gives infinite or negative speedups."""
    try:
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"{name}: must be a positive number (or numbers), got {values!r}") from None
    if v.size and (not np.all(np.isfinite(v)) or np.any(v <= 0)):
        raise ValueError(f"{name}: must be finite and > 0, got {values!r}")
    return v


def check_finite_columns(name: str, frame: Any, columns: Iterable[str], *, nan_ok: Iterable[str] = (),
                         keys: Sequence[str] = ()) -> Any:
    """``frame`` (a pandas ``DataFrame``) if its numeric ``columns`` (those it has) hold no NaN and no
    ``+-inf``; a column of ``nan_ok`` may hold NaN (its meaning: "not recorded"), never an infinity. The error
    names the column and the first bad row: its index label and, where ``frame`` has them, the ``keys``
    columns' values (e.g. the trace's step keys), e.g. ``"trace: column 'accept_prob' is NaN at row 3
    (prompt_id='0', sample=0, step=1, pos=0)"``."""
    nan_ok = set(nan_ok)
    for col in columns:
        if col not in frame.columns or frame[col].dtype.kind not in "fc":  # ints and bools are finite
            continue
        v = frame[col].to_numpy(dtype=np.float64)
        bad = np.isinf(v) if col in nan_ok else ~np.isfinite(v)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            plain = lambda x: x.item() if isinstance(x, np.generic) else x  # noqa: E731 (np.int32(0) -> 0)
            where = ", ".join(f"{k}={plain(frame[k].iloc[i])!r}" for k in keys if k in frame.columns)
            what = "NaN" if math.isnan(v[i]) else ("inf" if v[i] > 0 else "-inf")
            allowed = " (NaN means not recorded there; an infinity never)" if col in nan_ok else ""
            raise ValueError(f"{name}: column {col!r} is {what} at row {plain(frame.index[i])!r}"
                             f"{f' ({where})' if where else ''}; it must be finite{allowed}")
    return frame


def check_dtype(name: str, value: Any, *, floating: bool = True) -> Any:
    """``value`` if it is a ``torch.dtype`` (a floating-point one when ``floating``): a probability or a
    weight in an integer dtype is not one."""
    import torch

    if not isinstance(value, torch.dtype):
        raise ArgumentTypeError(f"{name}: must be a torch.dtype, got {value!r} ({type(value).__name__})")
    if floating and not value.is_floating_point:
        raise ArgumentTypeError(f"{name}: must be a floating-point torch.dtype (float32, float64, ...), got {value}")
    return value


MAX_GAMMA = 1024
"""The longest draft block any SPADE entry point accepts (a larger ``gamma`` / ``max_gamma`` is refused
up front instead of allocating ``gamma``-sized buffers)."""


def check_gamma(name: str, value: Any) -> int:
    """A draft length: an integer in ``[1, MAX_GAMMA]``."""
    return check_int(name, value, min=1, max=MAX_GAMMA)


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME = 120


def check_options(parser: Any, args: Any, minimums: dict[str, int]) -> None:
    """A command line's integer options at their minimums (``minimums``: option's attribute name -> least value):
    each one below is refused through ``parser.error`` (argparse's usage message, exit status 2) as
    ``"--<name>: must be >= <least>, got <value>"``, the name's ``_`` written ``-`` as on the command line."""
    for name, least in minimums.items():
        value = getattr(args, name)
        if value < least:
            parser.error(f"--{name.replace('_', '-')}: must be >= {least}, got {value}")


def safe_name(text: Any) -> str:
    """A file-system-safe name for an id that comes from data (e.g. a suite's ``question_id``).

    Ids made only of ``A-Z a-z 0-9 . _ -`` that do not start with ``.`` and are at most 120
    characters keep their name (so existing run folders stay valid). Anything else (``/``, ``..``,
    spaces, non-ASCII, an empty or over-long id) has the other characters replaced by ``_``, is cut
    to 100 characters and gets ``-<first 10 hex of sha256(id)>`` appended, so two different ids never
    share a name and the result never contains a path separator or starts with ``.``.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int, np.integer)):
        raise ArgumentTypeError(f"text: must be a string or an integer id, got {type(text).__name__}")
    s = str(text)
    if s and len(s) <= _MAX_NAME and not _UNSAFE.search(s) and not s.startswith(".") and not s.startswith("-"):
        return s
    digest = hashlib.sha256(s.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    stem = _UNSAFE.sub("_", s)[:100].lstrip(".-")
    return f"{stem}-{digest}" if stem else f"id-{digest}"
