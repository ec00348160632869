"""Verdicts only from measured intervals: the interval's side of a reference, and the line check the report
runs on every executed notebook."""

from __future__ import annotations

import math

import pytest

from spade_lib.runs import verdicts


def test_side_places_the_interval_against_the_reference():
    assert verdicts.side(1.1, 1.3, 1.0) == "above"
    assert verdicts.side(0.7, 0.9, 1.0) == "below"
    assert verdicts.side(0.9, 1.1, 1.0) == "consistent with"
    assert verdicts.side(1.0, 1.2, 1.0) == "consistent with"  # an end on the reference decides nothing
    assert verdicts.side(math.nan, math.nan, 1.0) == "consistent with"
    with pytest.raises(ValueError, match="reference"):
        verdicts.side(0.0, 1.0, math.nan)


def test_interval_side_places_one_interval_against_another():
    assert verdicts.interval_side(1.2, 1.4, 0.9, 1.1) == "above"
    assert verdicts.interval_side(0.5, 0.7, 0.9, 1.1) == "below"
    assert verdicts.interval_side(1.0, 1.2, 1.1, 1.3) == "overlapping"
    assert verdicts.interval_side(1.1, 1.2, 0.9, 1.1) == "overlapping"  # touching ends decide nothing
    assert verdicts.interval_side(0.9, 1.4, 1.0, 1.1) == "overlapping"  # one inside the other
    assert verdicts.interval_side(math.nan, 1.2, 0.5, 0.6) == "overlapping"
    with pytest.raises(ValueError, match="low must be"):
        verdicts.interval_side(1.2, 1.0, 0.5, 0.6)


@pytest.mark.parametrize("line", [
    "T=0, held-out prompts: the best adaptive rule beats (by 19.5 %) the best fixed gamma",
    "distilled: conditional acceptance by position flat (the i.i.d. model holds)",
    "best layer 20 -> predicted 1.18x at its best gamma: worth timing against HF's assistant_early_exit",
    "speculation stops paying at B = 4 measured",
    "an untrained early-exit draft does not pay on this pair",
    "greedy speedups understate sampled ones (p = 0.021)",
])
def test_a_verdict_without_an_interval_is_flagged(line):
    assert verdicts.unsupported(f"header\n{line}\n  \n") == [line]
    (w,) = verdicts.warnings(line, "smollm2/05_whatif_replay")
    assert w.startswith(verdicts.PREFIX + ":") and "smollm2/05_whatif_replay" in w


@pytest.mark.parametrize("line", [
    "T=1 fixed g=2: measured 0.85x [0.82, 0.87] is below its replayed prediction 1.03x",
    "the rule beats the fixed gamma: 1.21x [1.05, 1.40] against 1.02x [0.95, 1.09]",
    "acceptance 0.71 [0.64, 0.77] at 0.10 -> 0.69 [0.61, 0.75] at 2.30 (end bins' intervals overlap: flat within them)",
    "cannot tell whether it beats (only 3 held-out prompts; at least 5 are needed)",
    "predicted 1.18x at its best gamma (not timed: a prediction, not a verdict)",
    "scoring is 12x faster than generating",  # no verdict word
    "gamma 4: tau 2.31",
])
def test_an_interval_or_a_qualifier_carries_the_verdict(line):
    assert verdicts.unsupported(line) == []


def test_words_match_whole_words_only_and_bad_input_is_refused():
    assert verdicts.unsupported("the flattened table; a payload; threshold holdsworth") == []
    assert verdicts.unsupported("the AR time per token, which holds the prefill too") == []
    with pytest.raises(ValueError, match="text"):
        verdicts.unsupported(None)
