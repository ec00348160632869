"""Counts on figures: every bar and every bin of a SPADE figure says how many observations it rests on.

A rate of 0.9 over 3 judged positions and one over 3,000 look the same as points or bars; the count
written beside each makes the difference visible. One helper for every figure:
:func:`label_counts` writes ``n`` (or any short label) above points or bar tops, in the series' colour
and stacked by series so dodged groups do not overwrite each other; :func:`bars` draws bars and labels
them. Which count a figure shows (judged positions, steps, generations) its docstring and axis say.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

FONT_SIZE = 4.5  # points: readable in a PDF at column width, small beside the data


def count_text(n) -> str:
    """A count as written on a figure: ``1234`` -> ``"1,234"``; a string is kept; NaN/None -> ``""``."""
    if n is None:
        return ""
    if isinstance(n, str):
        return n
    v = float(n)
    if not math.isfinite(v):
        return ""
    return f"{int(round(v)):,}"


def label_counts(ax, x, y, counts: Sequence, *, series: int = 0, color: str = "0.25", rotation: float = 0,
                 fontsize: float = FONT_SIZE) -> list:
    """Write each of ``counts`` just above its point ``(x, y)`` (a bar's top or interval end); ``series``
    (0, 1, ...) lifts a dodged group's labels one line per series so they stay apart. Points whose ``y``
    is NaN or whose count is empty are skipped. Returns the annotations."""
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    counts = list(counts)
    if not len(x) == len(y) == len(counts):
        raise ValueError(f"counts: {len(counts)} labels for {len(x)} x and {len(y)} y values")
    out = []
    for xi, yi, n in zip(x, y, counts):
        text = count_text(n)
        if not text or not (math.isfinite(xi) and math.isfinite(yi)):
            continue
        out.append(ax.annotate(text, (xi, yi), textcoords="offset points", xytext=(0, 1.5 + series * fontsize),
                               ha="center", va="bottom", fontsize=fontsize, color=color, rotation=rotation,
                               annotation_clip=False))
    return out


def bars(ax, x, heights, width, color, counts: Sequence, *, top=None, **kwargs):
    """``ax.bar(x, heights, width, color=color, **kwargs)`` with each bar's count written above it (above
    ``top``, e.g. the interval's upper end, when given); counts of narrow bars are written upright."""
    container = ax.bar(x, heights, width=width, color=color, **kwargs)
    h = np.asarray(heights, dtype=np.float64)
    top = np.fmax(h, np.asarray(top, dtype=np.float64)) if top is not None else h  # NaN bar: no label
    label_counts(ax, np.broadcast_to(np.asarray(x, dtype=np.float64), h.shape), top, counts,
                 rotation=90 if np.max(width) < 0.2 else 0)
    return container
