"""How a notebook shows a table: numbers rounded, and every missing value written as what it is.

A missing value in a results table means "does not apply to this row" (one round has no interval, a greedy
trace draws no uniforms, a mode is not defined on a tree); printed bare it reads as ``NaN``, a failed
computation. :func:`shown` writes it as ``n/a`` instead. Display only: the frame it returns holds object
columns, so compute on the original.
"""

from __future__ import annotations

import numbers

import pandas as pd

NOT_APPLICABLE = "n/a"


def shown(table: pd.DataFrame, decimals: int | None = 3, *, significant: int | None = None,
          na: str = NOT_APPLICABLE) -> pd.DataFrame:
    """``table`` for display: floats rounded to ``decimals`` (or, with ``significant``, written with that many
    significant digits, for errors near 1e-17), every missing value (NaN, None, ``pd.NA``, NaT) written ``na``.
    Index and columns are kept; the values become objects."""
    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"table: a pandas DataFrame, got {type(table).__name__}")
    if decimals is not None and (isinstance(decimals, bool) or not isinstance(decimals, int) or decimals < 0):
        raise ValueError(f"decimals: an integer >= 0 or None, got {decimals!r}")
    if significant is not None and (isinstance(significant, bool) or not isinstance(significant, int)
                                    or significant < 1):
        raise ValueError(f"significant: an integer >= 1 or None, got {significant!r}")
    if not isinstance(na, str):
        raise ValueError(f"na: the text written for a missing value, got {na!r}")

    def cell(v):
        if v is None or (not isinstance(v, (list, tuple, dict)) and pd.isna(v)):
            return na
        if isinstance(v, numbers.Real) and not isinstance(v, (bool, numbers.Integral)):
            if significant is not None:
                return f"{float(v):.{significant}g}"
            return round(float(v), decimals) if decimals is not None else v
        return v

    return table.astype(object).map(cell)
