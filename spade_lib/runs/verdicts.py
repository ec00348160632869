"""Verdicts only from measured intervals: how a notebook words a comparison, and the check that it did.

A *verdict* is a sentence that ranks or classifies ("beats", "worth timing", "stops paying", "flat",
"holds", "understates", "pays"). SPADE prints one only when a measured interval supports it:

- :func:`side` places a reference value (a prediction, a replay, a rival's speedup) against a measured
  interval ``[low, high]``: ``"above"`` if ``high < reference`` ... precisely, the *measurement* is
  ``"above"`` the reference when ``low > reference``, ``"below"`` when ``high < reference``, else
  ``"consistent with"`` it (the interval covers it: no verdict either way);
- :func:`interval_side` places one measured interval against another (two runs' speedups): ``"above"``
  when the first lies wholly above the second, ``"below"`` wholly below, else ``"overlapping"`` (no verdict);
- :func:`unsupported` reads printed text line by line and returns each line that uses a verdict word
  (:data:`VERDICT`) without an interval in it (``[a, b]``, :data:`INTERVAL`) and without saying that it
  cannot tell (:data:`QUALIFIERS`: "cannot tell", "not timed", "no interval", ...). The report runs it on
  every executed notebook (:mod:`spade_lib.report`): each such line is a *verdict control* warning in
  the run's summary, beside the physical controls.

A failure to reject is not a verdict: "no position's interval excludes the pooled rate" is what the data
say; "the i.i.d. model holds" is not, and the check flags it.
"""

from __future__ import annotations

import math
import re

__all__ = ["PREFIX", "VERDICT", "INTERVAL", "QUALIFIERS", "side", "interval_side", "unsupported", "warnings"]

PREFIX = "verdict control"  # the warnings' prefix in a run's summary

# words that rank or classify; matched as whole words, case-insensitive ("holds" only of a model: "the folder
# holds ..." is no verdict)
VERDICT = re.compile(r"\b(worth timing|beats?|stops? paying|pays?|flat|(?:model|assumption|theory|prediction) holds|"
                     r"understates?|overstates?|outperforms?|wins?)\b", re.IGNORECASE)
# a printed interval: "[0.71, 0.75]" (numbers with optional sign, decimals, exponent, a trailing x or %)
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*[x×%]?"
INTERVAL = re.compile(rf"\[\s*{_NUM}\s*,\s*{_NUM}\s*\]")
# a line that says it cannot decide carries no verdict
QUALIFIERS = ("cannot tell", "can't tell", "not timed", "no interval", "untimed", "not decided",
              "a prediction, not a measurement", "not a verdict")


def side(low: float, high: float, reference: float) -> str:
    """Where a measured interval ``[low, high]`` lies against ``reference``: ``"above"`` (``low > reference``),
    ``"below"`` (``high < reference``), else ``"consistent with"`` (no verdict). NaN bounds: consistent."""
    low, high, reference = float(low), float(high), float(reference)
    if math.isnan(reference):
        raise ValueError("reference: NaN")
    if not math.isnan(low) and low > reference:
        return "above"
    if not math.isnan(high) and high < reference:
        return "below"
    return "consistent with"


def interval_side(low: float, high: float, other_low: float, other_high: float) -> str:
    """Where the measured interval ``[low, high]`` lies against another, ``[other_low, other_high]``:
    ``"above"`` (``low > other_high``), ``"below"`` (``high < other_low``), else ``"overlapping"`` (no verdict;
    also when a bound is NaN). Two 95 % intervals that do not overlap differ at a level below 5 %."""
    values = [float(v) for v in (low, high, other_low, other_high)]
    if any(math.isnan(v) for v in values):
        return "overlapping"
    low, high, other_low, other_high = values
    if low > high or other_low > other_high:
        raise ValueError(f"intervals: each low must be <= its high, got [{low}, {high}] and [{other_low}, {other_high}]")
    if side(low, high, other_high) == "above":
        return "above"
    if side(low, high, other_low) == "below":
        return "below"
    return "overlapping"


def unsupported(text: str) -> list[str]:
    """Every line of ``text`` with a verdict word but neither an interval nor a qualifier (module docstring)."""
    if not isinstance(text, str):
        raise ValueError(f"text: expected a str, got {type(text).__name__}")
    out = []
    for line in text.splitlines():
        s = line.strip()
        if not s or not VERDICT.search(s) or INTERVAL.search(s):
            continue
        if any(q in s.lower() for q in QUALIFIERS):
            continue
        out.append(s)
    return out


def warnings(text: str, where: str) -> list[str]:
    """:func:`unsupported` lines of ``text`` as the summary's warnings, naming ``where`` they were printed."""
    return [f"{PREFIX}: a verdict without a measured interval: {s!r} (printed by {where})" for s in unsupported(text)]
