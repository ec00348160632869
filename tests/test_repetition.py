"""Repetition rate of generations (spade_lib.diagnose.repetition) against hand-counted answers."""

import numpy as np
import pandas as pd
import pytest

from spade_lib.diagnose.repetition import (DEGENERATE_ABOVE, attractor, repetition_by_generation,
                                           repetition_rate, repetition_table)


def test_repetition_rate_counts_repeated_ngrams():
    assert repetition_rate(list(range(20))) == 0.0
    # period-3 loop of 21 tokens: 18 4-grams, the first 3 are new, 15 repeat
    loop = [1, 2, 3] * 7
    assert repetition_rate(loop) == pytest.approx(15 / 18)
    assert repetition_rate([5, 5, 5, 5, 5], n=4) == pytest.approx(1 / 2)
    assert repetition_rate([1, 2, 1, 2], n=2) == pytest.approx(1 / 3)  # (1,2),(2,1),(1,2)
    assert np.isnan(repetition_rate([1, 2, 3]))
    with pytest.raises(ValueError, match="n"):
        repetition_rate([1, 2], n=0)


def test_attractor_is_the_ngram_most_generations_share():
    gens = [[9, 1, 2, 3, 4, 8], [1, 2, 3, 4], [7, 7, 1, 2, 3, 4], [5, 6, 7, 8]]
    gram, share = attractor(gens)
    assert gram == (1, 2, 3, 4) and share == pytest.approx(3 / 4)
    none, share = attractor([[1, 2]])
    assert none == () and np.isnan(share)


def test_repetition_table_per_run_and_category():
    loop, text = [1, 2, 3] * 10, list(range(30))
    s = pd.DataFrame({"category": ["code", "code", "prose"], "output_ids": [loop, loop, text]})
    g = repetition_by_generation(s)
    assert g["degenerate"].tolist() == [True, True, False]
    t = repetition_table({"greedy": s, "sampled": s.assign(output_ids=[text, text, text])})
    row = t[(t.run == "greedy") & (t.category == "code")].iloc[0]
    assert row["generations"] == 2 and row["degenerate"] == 1.0 and row["distinct_outputs"] == 1
    assert row["attractor_share"] == 1.0
    overall = t[(t.run == "greedy") & (t.category == "overall")].iloc[0]
    assert overall["degenerate"] == pytest.approx(2 / 3)
    assert (t.loc[t.run == "sampled", "repetition"] == 0).all()
    assert 0 < DEGENERATE_ABOVE < 1
    with pytest.raises(ValueError, match="output_ids"):
        repetition_by_generation(s.drop(columns="output_ids"))
    with pytest.raises(ValueError, match="by"):
        repetition_table({"x": s}, by=("nope",))
    with pytest.raises(ValueError, match="summaries"):
        repetition_table({})
