"""M3 figures: each draws its table (checked on the artists), rejects a wrong table, and saves to
byte-identical PDF and PNG files twice in a row."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure

from spade_lib import diagnose as dg
from spade_lib.plots import m3, use_style
from tests.plot_checks import saves_twice_identically


@pytest.fixture(autouse=True)
def _closed_figures():
    """Every figure a test opened is closed after it (pyplot keeps them, and warns past 20)."""
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def tables():
    use_style()
    a = dg.synthetic_trace(600, 4, (0.8, 0.7, 0.6, 0.5), n_prompts=6, entropy_slope=-0.8, seed=1)
    b = dg.synthetic_trace(600, 4, (0.6, 0.5, 0.4, 0.3), n_prompts=6, entropy_slope=-0.4, seed=2)
    return dg.all_tables(dg.combine_runs({"distilled": a, "data_only": b}, "draft"), by="draft", min_support=5)


def _figures(t):
    calib = t["calibration"]
    return {
        "acceptance_by_position": m3.acceptance_by_position(t["position"], by="draft"),
        "accept_length_hist": m3.accept_length_hist(t["accept_length"], by="draft"),
        "entropy_rejected_vs_accepted": m3.entropy_rejected_vs_accepted(t["entropy"], by="draft"),
        "acceptance_vs_entropy": m3.acceptance_vs_measure(t["binned"], by="draft"),
        "logit_coefficients": m3.logit_coefficients(t["logit_coefficients"], by="draft"),
        "calibration": m3.calibration(calib, by="draft", errors=t["calibration_error"]),
        "expected_vs_realised": m3.expected_vs_realised(t["expected_by_position"], x="pos", by="draft"),
        "expected_by_category": m3.expected_vs_realised(t["expected_by_category"], x="category", by="draft"),
        "token_rejections": m3.token_rejections(t["tokens"], by="draft", top=8),
        "acceptance_heatmap": m3.acceptance_heatmap(t["heatmap"], by="draft"),
        "category_summary": m3.category_summary(t["summary"], by="draft", value="tau_drafting_steps"),
    }


def test_every_figure_draws(tables):
    for name, fig in _figures(tables).items():
        assert isinstance(fig, Figure), name
        fig.canvas.draw()  # lays out and renders every artist at screen resolution
        plt.close(fig)


    plt.close(fig)


def test_figures_save_deterministically(tables, tmp_path):
    saves_twice_identically(m3.acceptance_by_position(tables["position"], by="draft"),
                             "m3_acceptance_by_position", tmp_path)
    saves_twice_identically(m3.category_summary(tables["summary"], by="draft", value="tau_drafting_steps"),
                             "m3_category_summary", tmp_path)


@pytest.mark.slow
def test_every_figure_saves_deterministically(tables, tmp_path):
    for name, fig in _figures(tables).items():
        saves_twice_identically(fig, f"m3_{name}", tmp_path)


def test_figures_show_their_tables(tables):
    fig = m3.acceptance_by_position(tables["position"], by="draft")
    ax = fig.axes[0]
    cond = [line for line in ax.lines if line.get_label() == "distilled: conditional"][0]
    expected = tables["position"].query("draft == 'distilled'")["alpha_cond"].to_numpy()
    assert np.allclose(cond.get_ydata(), expected)
    plt.close(fig)

    fig = m3.acceptance_by_position(tables["position"][tables["position"]["draft"] == "distilled"])
    assert [line.get_label() for line in fig.axes[0].lines][:2] == ["conditional", "unconditional"]
    plt.close(fig)

    fig = m3.entropy_rejected_vs_accepted(tables["entropy"], by="draft")
    assert len(fig.axes) == 2 * 2  # groups x measures
    plt.close(fig)

    fig = m3.token_rejections(tables["tokens"], by="draft", top=5)
    assert all(len(ax.patches) == 5 for ax in fig.axes)
    plt.close(fig)

    fig = m3.calibration(tables["calibration"], by="draft", errors=tables["calibration_error"])
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("ECE" in label for label in labels)
    plt.close(fig)


def test_figures_reject_wrong_tables(tables):
    with pytest.raises(ValueError, match="missing column"):
        m3.acceptance_by_position(tables["accept_length"])
    with pytest.raises(ValueError, match="empty"):
        m3.calibration(tables["calibration"].iloc[:0])
    with pytest.raises(ValueError, match="by="):
        m3.accept_length_hist(tables["accept_length"], by="nope")
    with pytest.raises(ValueError, match="top"):
        m3.token_rejections(tables["tokens"], top=0)


def test_crossvocab_figures_show_counts_on_bars(tmp_path):
    """The cross-vocabulary figures: every bar carries its count, and both save byte-identically."""
    import pandas as pd

    from tests.test_diagnose_crossvocab import _hand_trace

    use_style()
    trace, align = _hand_trace()
    two = lambda f: pd.concat([f.assign(rule="text"), f.assign(rule="tli")], ignore_index=True)  # noqa: E731
    bounds = dg.boundary_acceptance(two(trace), two(align), by="rule")
    fig = m3.crossvocab_boundaries(bounds, by="rule")
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert "1/2" in labels and "1/1" in labels  # split: 1 of 2 reached accepted; same, merge: 1 of 1
    assert len(fig.axes[1].texts) == 2 * 2 * 3  # rules x (rejections, tokens) x the kinds present
    saves_twice_identically(fig, "m3_crossvocab_boundaries", tmp_path)
    steps = pd.DataFrame({"prompt_id": "q", "sample": 0, "step": [0, 1], "gamma": [2, 2], "n_accepted": [1, 2],
                          "abs_pos": [0, 2], "draft_tokens": [3, 2], "forwards": [3, 2], "t_forward": [0.02, 0.01],
                          "t_text": [0.004, 0.002], "encode_calls": [3, 2], "decode_calls": [4, 3]})
    tokens = dg.token_acceptance(two(steps), two(align), by="rule")
    costs = dg.step_costs(two(steps), 0.05, by="rule")
    fig = m3.crossvocab_costs(tokens, costs, by="rule")
    assert "3/4" in [t.get_text() for t in fig.axes[0].texts]
    assert any("text 17%" in t.get_text() for t in fig.axes[1].texts)
    saves_twice_identically(fig, "m3_crossvocab_costs", tmp_path)
    with pytest.raises(ValueError, match="missing column"):
        m3.crossvocab_boundaries(tokens)


def test_heatmap_rows_are_labelled_by_category_and_number(tables):
    """The heatmap's rows read 'code 1', 'code 2', ... (not internal 'code | p0003#0' ids), the axis says
    what a row is, and each row shows its generation's rates."""
    heat = tables["heatmap"]
    fig = m3.acceptance_heatmap(heat, by="draft", max_generations=5)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    gens = heat[["category", "prompt_id", "sample"]].drop_duplicates().sort_values(["category", "prompt_id", "sample"])
    first = gens["category"].iloc[0]
    assert labels[:2] == [f"{first} 1", f"{first} 2"] and len(labels) == 5
    assert not any("|" in lab or "#" in lab for lab in labels)
    assert "row" in ax.get_ylabel() and "category" in ax.get_ylabel()
    row0 = gens.iloc[0]
    expected = heat[(heat.draft == "distilled") & (heat.prompt_id == row0.prompt_id) & (heat["sample"] == row0["sample"])]
    data = ax.images[0].get_array()
    assert np.allclose(np.asarray(data[0])[: len(expected)], expected.sort_values("step")["rate"])
    plt.close(fig)
    with pytest.raises(ValueError, match="max_generations"):
        m3.acceptance_heatmap(heat, max_generations=0)


def _count_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_every_bar_and_bin_carries_its_count(tables):
    """Counts on bars and bins: each label is the table's count of that bar or bin."""
    from spade_lib.plots.counts import count_text

    def counts(col, table):
        return sorted(count_text(v) for v in table[col])

    t = tables
    fig = m3.acceptance_by_position(t["position"], by="draft")
    assert sorted(_count_labels(fig.axes[0])) == counts("reached", t["position"])
    fig = m3.accept_length_hist(t["accept_length"], by="draft")
    assert sorted(_count_labels(fig.axes[0])) == counts("steps", t["accept_length"])
    fig = m3.acceptance_vs_measure(t["binned"], by="draft")
    assert sorted(x for ax in fig.axes for x in _count_labels(ax)) == counts("n", t["binned"])
    fig = m3.calibration(t["calibration"], by="draft")
    assert sorted(x for ax in fig.axes for x in _count_labels(ax)) == counts("n", t["calibration"])
    fig = m3.entropy_rejected_vs_accepted(t["entropy"], by="draft")
    assert sorted(x for ax in fig.axes for x in _count_labels(ax)) == counts("n", t["entropy"])
    per_cat = t["summary"][t["summary"].category != "overall"]
    fig = m3.category_summary(per_cat, by="draft", value="tau_drafting_steps")
    assert sorted(_count_labels(fig.axes[0])) == counts("generations", per_cat)
    assert "generations" in fig.axes[0].get_ylabel()
    fig = m3.expected_vs_realised(t["expected_by_position"], x="pos", by="draft")
    assert all(", n=" in x for ax in fig.axes for x in _count_labels(ax))
    plt.close("all")
    with pytest.raises(ValueError, match="count"):
        m3.category_summary(per_cat, by="draft", value="tau_drafting_steps", count="nope")
