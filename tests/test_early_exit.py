"""The early-exit sweep of notebook 03, against the notebook's former inline code on the tiny pair
(a two-layer Llama: exit layer 1 of 2)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spade_lib import theory
from spade_lib.zoo.early_exit import early_exit_alpha, early_exit_sweep, layer_cost_ratio, supports_early_exit


@pytest.fixture(scope="module")
def tiny():
    from spade_lib.zoo.pairs import load_pair

    return load_pair("tiny")


def _notebook_sweep(the_pair, ee_texts, r_ee):
    """Notebook 03's early-exit cell, as it was before early_exit_sweep (the reference)."""
    target_model = the_pair.target
    n_layers = int(target_model.config.num_hidden_layers)
    layer_params = sum(p.numel() for p in target_model.model.layers[0].parameters())
    head_params = target_model.get_output_embeddings().weight.numel()
    ee = early_exit_alpha(the_pair, ee_texts, temperatures=[1.0], max_tokens=512)
    ee["c"] = (ee["layer"] * layer_params + head_params) / (n_layers * layer_params + head_params)
    for t in ("T0", "T1"):
        best_g = [theory.optimal_gamma(a, c, max_gamma=8, verify_cost=r_ee) for a, c in zip(ee[f"alpha_{t}"], ee["c"])]
        ee[f"gamma_{t}"] = best_g
        ee[f"predicted_{t}"] = [float(theory.speedup(a, g, c, verify_cost=r_ee))
                                for a, g, c in zip(ee[f"alpha_{t}"], best_g, ee["c"])]
    return ee[ee["layer"] < n_layers]


def test_early_exit_sweep_equals_the_notebooks_inline_sweep(tiny):
    texts = [tiny.tokenizer.encode(s) for s in ("def add(a, b):\n    return a + b", "The cat sat on the mat because")]
    r = lambda g: 1.0 + 0.07 * g  # noqa: E731
    got = early_exit_sweep(tiny, texts, r, max_gamma=8, max_tokens=512)
    pd.testing.assert_frame_equal(got, _notebook_sweep(tiny, texts, r))
    assert list(got["layer"]) == [1] and 0 < got["c"].iloc[0] < 1
    assert list(got.columns) == ["layer", "c_layers", "alpha_T0", "alpha_T1", "n_positions", "c", "gamma_T0",
                                 "predicted_T0", "gamma_T1", "predicted_T1"]


def test_early_exit_sweep_prices_the_loop_overhead(tiny):
    """With the loop's per-step cost o, each layer's prediction is E[tokens] / (gamma c + r(gamma) + o) at the
    gamma that maximises it (a brute-force search over gamma is the reference), and never above o = 0's."""
    texts = [tiny.tokenizer.encode("The cat sat on the mat because it was warm")]
    r = lambda g: 1.0 + 0.07 * g  # noqa: E731
    free = early_exit_sweep(tiny, texts, r, max_gamma=8)
    got = early_exit_sweep(tiny, texts, r, max_gamma=8, overhead=0.5)
    for t in ("T0", "T1"):
        for a, c, g, s in zip(got[f"alpha_{t}"], got["c"], got[f"gamma_{t}"], got[f"predicted_{t}"]):
            ref = [theory.expected_tokens(a, k) / (k * c + r(k) + 0.5) for k in range(1, 9)]
            assert g == 1 + int(np.argmax(ref)) and s == pytest.approx(max(ref))
        assert (got[f"predicted_{t}"] < free[f"predicted_{t}"]).all()


def test_supports_early_exit_and_layer_costs(tiny):
    assert supports_early_exit(tiny.target)
    assert not supports_early_exit(tiny.target.model)  # no .model.norm one level down
    c = layer_cost_ratio(tiny.target, [0, 1, 2])
    assert c[-1] == pytest.approx(1.0) and c[0] > 0 and (c[1:] > c[:-1]).all()


def _sweep_table():
    return pd.DataFrame({"layer": [1, 2, 3], "c_layers": [0.25, 0.5, 0.75], "alpha_T0": [0.1, 0.5, 0.9],
                         "alpha_T1": [0.05, 0.6, 0.8], "n_positions": 40, "c": [0.3, 0.55, 0.8],
                         "gamma_T0": [1, 3, 5], "predicted_T0": [0.6, 1.1, 0.9], "gamma_T1": [1, 3, 4],
                         "predicted_T1": [0.5, 1.3, 0.8]}, index=[4, 5, 6])  # a filtered frame: labels, not positions


def test_best_layer_and_sweep_lines_print_what_the_notebook_printed():
    from spade_lib.runs import verdicts
    from spade_lib.zoo.early_exit import best_layer, sweep_lines

    ee = _sweep_table()
    best = best_layer(ee)
    # the notebook's former lines (the reference)
    best_ee = ee.loc[ee[["predicted_T0", "predicted_T1"]].max(axis=1).idxmax()]
    best_ee_speedup = max(best_ee["predicted_T0"], best_ee["predicted_T1"])
    assert int(best["layer"]) == int(best_ee["layer"]) == 2 and best["predicted"] == best_ee_speedup == 1.3
    ref = [f"early exit on {int(best_ee['n_positions'])} teacher-forced positions of 7 greedy generations: "
           f"alpha at T=0 from {ee['alpha_T0'].iloc[0]:.2f} (layer {int(ee['layer'].iloc[0])}) to "
           f"{ee['alpha_T0'].iloc[-1]:.2f} (layer {int(ee['layer'].iloc[-1])} of 4)",
           f"best layer by predicted speedup: {int(best_ee['layer'])} (alpha {best_ee['alpha_T0']:.2f} at T=0, "
           f"{best_ee['alpha_T1']:.2f} at T=1; c = {best_ee['c']:.2f}) -> predicted {best_ee_speedup:.2f}x at its best "
           "gamma (not timed: a prediction, not a verdict; SPADE ships no early-exit draft, HF's assistant_early_exit "
           "is the baseline to time it against)"]
    assert sweep_lines(ee, 7, 4) == ref
    assert verdicts.unsupported("\n".join(ref)) == []
    with pytest.raises(ValueError, match=r"^sweep: an empty early-exit table"):
        best_layer(ee.iloc[:0])
