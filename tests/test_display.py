"""spade_lib.display.shown: no bare NaN in a displayed table, numbers rounded, bad arguments named."""

import numpy as np
import pandas as pd
import pytest

from spade_lib.display import NOT_APPLICABLE, shown


def test_missing_values_are_written_not_applicable_and_floats_rounded():
    t = pd.DataFrame({"speedup": [1.23456, np.nan], "draft": ["coder-0.5b", None], "n": [8, 3],
                      "when": [pd.NaT, pd.Timestamp(0)]}, index=["a", "b"])
    s = shown(t)
    assert s.loc["b", "speedup"] == s.loc["b", "draft"] == s.loc["a", "when"] == NOT_APPLICABLE
    assert s.loc["a", "speedup"] == 1.235 and s.loc["a", "n"] == 8 and s.loc["a", "draft"] == "coder-0.5b"
    assert "NaN" not in s.to_html() and "NaN" not in s.to_string()
    assert list(s.index) == ["a", "b"] and list(s.columns) == list(t.columns)
    assert np.isnan(t.loc["b", "speedup"])  # the original is untouched


def test_significant_digits_keep_tiny_errors_readable():
    s = shown(pd.DataFrame({"max abs error": [1.234e-17, 0.0]}), significant=3)
    assert s["max abs error"].tolist() == ["1.23e-17", "0"]


@pytest.mark.parametrize("kwargs, name", [(dict(decimals=-1), "decimals"), (dict(decimals=True), "decimals"),
                                          (dict(significant=0), "significant"), (dict(na=0), "na")])
def test_bad_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        shown(pd.DataFrame({"a": [1.0]}), **kwargs)
    with pytest.raises(ValueError, match="table"):
        shown([1.0])
