"""Figures: saved as PDF + PNG, byte-identical across saves, with TrueType fonts."""

import matplotlib.pyplot as plt
import numpy as np
import pytest

from spade_lib.plots import figure, save_figure, use_style


def _make_figure():
    use_style()
    fig, ax = figure()
    ax.plot([1, 2, 4, 8], [0.9, 0.8, 0.6, 0.5], marker="o", label="alpha")
    ax.set_xlabel("gamma")
    ax.set_ylabel("acceptance")
    ax.legend()
    return fig


def test_save_figure_is_deterministic(tmp_path):
    first = save_figure(_make_figure(), "det", directory=tmp_path / "a", close=True)
    second = save_figure(_make_figure(), "det", directory=tmp_path / "b", close=True)
    for ext in ("pdf", "png"):
        assert first[ext].read_bytes() == second[ext].read_bytes(), ext
    pdf = first["pdf"].read_bytes()
    assert b"CreationDate" not in pdf
    assert b"/FontFile2" in pdf  # embedded TrueType (pdf.fonttype 42), not Type 3
    assert first["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_save_figure_rejects_bad_names(tmp_path):
    fig = _make_figure()
    for bad in ("", "a/b", "x.pdf"):
        with pytest.raises(ValueError, match="figure name"):
            save_figure(fig, bad, directory=tmp_path)
    plt.close(fig)


def test_one_colour_per_draft_whatever_the_order():
    from spade_lib.plots.palette import color_for, legend_outside

    assert color_for("distilled") != color_for("data_only") != color_for("ngram")
    assert color_for("some_new_draft") == color_for("some_new_draft")
    with pytest.raises(TypeError, match="name"):
        color_for(3)
    use_style()
    fig, ax = figure()
    ax.plot([0, 1], [0, 1], label="x")
    with pytest.raises(ValueError, match="where"):
        legend_outside(ax, where="inside")
    leg = legend_outside(ax)
    fig.canvas.draw()
    # the legend lies right of the axes: it covers no data
    assert leg.get_window_extent().x0 >= ax.get_window_extent().x1
    plt.close(fig)


def test_m2_figures_draw_intervals_and_colours(tmp_path):
    import pandas as pd

    from spade_lib.plots import m2
    from spade_lib.plots.palette import color_for

    use_style()
    rows = []
    for T in (0.0, 1.0):
        for g in (1, 2, 4):
            rows.append(dict(method="spade", draft="distilled", gamma=g, T=T, speedup=1 + 0.1 * g,
                             speedup_low=0.9 + 0.1 * g, speedup_high=1.1 + 0.1 * g, predicted=1.2 + 0.1 * g))
        rows.append(dict(method="spade", draft="ngram", gamma=4, T=T, speedup=1.1, speedup_low=1.0,
                         speedup_high=1.2, predicted=1.3))
    table = pd.DataFrame(rows)
    fig = m2.speedup_vs_gamma(table)
    ax = fig.axes[0]
    blues = [c for c in ax.containers if c.lines[0].get_color() == color_for("distilled")]
    assert len(blues) == 2  # one error-bar series per temperature, in the distilled draft's colour
    x = np.concatenate([np.asarray(c.lines[0].get_xdata(), dtype=float) for c in ax.containers])
    assert len(set(np.round(x, 6))) == len(x)  # dodged: no two points at the same x
    save_figure(fig, "m2_test", directory=tmp_path, close=True)
    cats = pd.DataFrame([dict(category=c, draft=d, T=T, speedup=1.2, speedup_low=1.0, speedup_high=1.4, generations=3)
                         for c in ("a", "b") for d in ("distilled", "data_only") for T in (0.0, 1.0)])
    plt.close(m2.speedup_by_category(cats))
    plt.close(m2.predicted_vs_measured(table))
    with pytest.raises(ValueError, match="missing"):
        m2.speedup_vs_gamma(table.drop(columns=["speedup_low"]))


def test_figures_appear_inline_in_a_kernel_under_agg_and_save_the_same_bytes(tmp_path, monkeypatch):
    """A notebook executed by a Jupyter kernel with ``MPLBACKEND=Agg`` (as ``make run`` exports) shows
    its figures as ``image/png`` outputs (an open one at the end of its cell, a closed one through
    ``save_figure(close=True)``), and the files it saves are the bytes this Agg process saves."""
    import nbformat
    from nbclient import NotebookClient

    from spade_lib import paths

    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", str(paths.REPO_ROOT))
    body = ("from spade_lib.plots import figure, save_figure, use_style\n"
            "use_style()\n"
            "fig, ax = figure()\n"
            "ax.plot([1, 2, 4, 8], [0.9, 0.8, 0.6, 0.5], marker='o', label='alpha')\n"
            "ax.set_xlabel('gamma'); ax.set_ylabel('acceptance'); ax.legend()\n")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(body + f"_ = save_figure(fig, 'k', directory={str(tmp_path / 'k')!r})"),
        nbformat.v4.new_code_cell(body + f"_ = save_figure(fig, 'c', directory={str(tmp_path / 'c')!r}, close=True)"),
        nbformat.v4.new_code_cell("import matplotlib; print(matplotlib.get_backend())"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    for cell in nb.cells[:2]:
        pngs = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        assert len(pngs) == 1, cell.outputs
    assert "inline" in nb.cells[2].outputs[0]["text"]
    here = save_figure(_make_figure(), "h", directory=tmp_path / "h", close=True)
    for ext in ("pdf", "png"):
        assert (tmp_path / "k" / f"k.{ext}").read_bytes() == here[ext].read_bytes(), ext
        assert (tmp_path / "c" / f"c.{ext}").read_bytes() == here[ext].read_bytes(), ext


def _speedups(gammas, drafts=("distilled", "ngram"), temps=(0.0, 1.0)):
    import pandas as pd

    return pd.DataFrame([dict(method="spade", draft=d, gamma=g, T=T, speedup=1 + 0.1 * g, speedup_low=0.9 + 0.1 * g,
                              speedup_high=1.1 + 0.1 * g, predicted=1.3 + 0.1 * g, generations=4)
                         for T in temps for d in drafts for g in gammas])


def _predictions(ax):
    return [line for line in ax.lines if line.get_marker() == "D" and len(line.get_xdata())]


def test_speedup_vs_gamma_with_one_gamma_is_categorical_and_marks_predictions_as_diamonds():
    """One gamma: no 'vs gamma' axis but one labelled slot per configuration and temperature; the
    prediction a hollow diamond (not the '_' marker that read as an error-bar cap) with its own legend entry."""
    from spade_lib.plots import m2

    use_style()
    fig = m2.speedup_vs_gamma(_speedups([4]))
    ax = fig.axes[0]
    fig.canvas.draw()
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["distilled, T=0", "ngram, T=0", "distilled, T=1", "ngram, T=1"]
    assert "draft length" in ax.get_xlabel() and "= 4" in ax.get_xlabel()
    measured = [np.asarray(c.lines[0].get_xdata(), dtype=float) for c in ax.containers if len(c.lines[0].get_xdata())]
    assert sorted(float(x[0]) for x in measured) == [0.0, 1.0, 2.0, 3.0]  # one slot each, at the ticks
    preds = _predictions(ax)
    assert len(preds) == 4 and all(line.get_markerfacecolor() == "none" for line in preds)
    assert [float(p.get_ydata()[0]) for p in preds] == pytest.approx([1.7] * 4)
    assert sorted(round(float(p.get_xdata()[0])) for p in preds) == [0, 1, 2, 3]  # in its configuration's slot
    caps = {id(cap) for c in ax.containers for cap in c.lines[1]}
    assert all(id(line) in caps for line in ax.lines if line.get_marker() == "_")  # "_" only on interval caps
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "cost-model prediction" in labels and "measured (95 % interval)" in labels
    plt.close(fig)
    fig = m2.speedup_vs_gamma(_speedups([1, 2, 4]))  # a sweep keeps gamma on x
    ax = fig.axes[0]
    assert [int(t) for t in ax.get_xticks()] == [1, 2, 4] and "draft length" in ax.get_xlabel()
    assert len(_predictions(ax)) == 4 and "cost-model prediction" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)


def test_one_category_is_one_panel_without_a_category_split():
    """A suite of one category (HumanEval): speedup_by_category draws one panel with a slot per temperature
    (not one panel per temperature with a single category tick), category_summary one bar per draft."""
    import pandas as pd

    from spade_lib import diagnose as dg
    from spade_lib.plots import m2, m3

    use_style()
    one = pd.DataFrame([dict(category="code", draft=d, T=T, speedup=1.2, speedup_low=1.0, speedup_high=1.4, generations=5)
                        for d in ("distilled", "ngram") for T in (0.0, 1.0)])
    fig = m2.speedup_by_category(one, ["code"])
    assert len(fig.axes) == 1 and "code" in fig.axes[0].get_title()
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["T = 0", "T = 1"]
    assert len(fig.axes[0].patches) == 2 * 2  # drafts x temperatures
    plt.close(fig)
    two = pd.concat([one, one.assign(category="prose")], ignore_index=True)
    fig = m2.speedup_by_category(two)
    assert len(fig.axes) == 2 and [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["code", "prose"]
    plt.close(fig)
    trace = dg.synthetic_trace(200, 4, (0.8, 0.7, 0.6, 0.5), n_prompts=4, seed=1)
    both = dg.combine_runs({"distilled": trace, "data_only": trace}, "draft")
    summary = dg.category_summary(both, by="draft")
    summary = summary[summary.category == summary.category.iloc[0]]
    fig = m3.category_summary(summary, by="draft", value="tau_drafting_steps")
    ax = fig.axes[0]
    assert sorted(t.get_text() for t in ax.get_xticklabels()) == ["data_only", "distilled"]
    assert summary.category.iloc[0] in ax.get_title() and ax.get_legend() is None
    plt.close(fig)


def test_early_exit_alpha_has_integer_layer_ticks():
    """m2_early_exit_alpha: the notebook's inline figure drew fractional layer ticks (1.5, 2.5 ...); the
    library figure puts ticks on whole layers only and draws the table's numbers."""
    import pandas as pd

    from spade_lib.plots import m2

    use_style()
    ee = pd.DataFrame({"layer": [1, 2, 3, 4, 5], "alpha_T0": [0.1, 0.2, 0.4, 0.6, 0.8],
                       "alpha_T1": [0.05, 0.1, 0.3, 0.5, 0.7], "c": [0.2, 0.4, 0.6, 0.8, 1.0],
                       "n_positions": [812] * 5})
    fig = m2.early_exit_alpha(ee, n_layers=6)
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    ticks = [x for x in ax.get_xticks() if lo <= x <= hi]
    assert len(ticks) >= 2 and all(float(x).is_integer() for x in ticks)
    assert np.allclose(ax.lines[0].get_ydata(), ee["alpha_T0"]) and "of 6" in ax.get_xlabel()
    assert "812" in ax.get_title()
    plt.close(fig)
    with pytest.raises(ValueError, match="missing"):
        m2.early_exit_alpha(ee.drop(columns=["c"]))
    with pytest.raises(ValueError, match="n_layers"):
        m2.early_exit_alpha(ee, n_layers=0)


def test_speedup_by_category_labels_every_bar_with_its_generations():
    import pandas as pd

    from spade_lib.plots import m2

    use_style()
    t = pd.DataFrame([dict(category=c, draft=d, T=0.0, speedup=1.2, speedup_low=1.0, speedup_high=1.4,
                           generations=n) for (c, d), n in zip([("a", "distilled"), ("a", "ngram"), ("b", "distilled"),
                                                              ("b", "ngram")], (11, 12, 13, 14))])
    fig = m2.speedup_by_category(t)
    ax = fig.axes[0]
    assert sorted(x.get_text() for x in ax.texts) == ["11", "12", "13", "14"]
    assert all(x.xy[1] == pytest.approx(1.4) for x in ax.texts)  # above the interval, not on its whisker
    plt.close(fig)
    assert not m2.speedup_by_category(t, count=None).axes[0].texts
    with pytest.raises(ValueError, match="count"):
        m2.speedup_by_category(t.drop(columns=["generations"]))
    plt.close("all")


def test_speedup_vs_batch_draws_intervals_when_the_table_has_them():
    import pandas as pd

    from spade_lib.plots.batch import plot_speedup_vs_batch

    use_style()
    study = pd.DataFrame({"temperature": [0.0, 0.0, 1.0, 1.0], "batch_size": [1, 4, 1, 4],
                          "ar_tps": [10.0, 30.0, 10.0, 30.0], "spec_tps": [15.0, 33.0, 12.0, 30.0],
                          "speedup": [1.5, 1.1, 1.2, 1.0], "predicted": [1.6, 1.2, 1.3, 1.0]})

    def speedup_bars(fig):
        return [c for c in fig.axes[1].containers if c.has_yerr]

    fig = plot_speedup_vs_batch(study)  # no interval columns: points alone, as before
    assert not speedup_bars(fig) and len(fig.axes[1].containers) == 2
    plt.close(fig)
    fig = plot_speedup_vs_batch(study.assign(speedup_low=study.speedup - 0.1, speedup_high=study.speedup + 0.2))
    bars = speedup_bars(fig)
    assert len(bars) == 2  # one per temperature
    segs = bars[0].lines[2][0].get_segments()
    assert [(round(s[0][1], 6), round(s[1][1], 6)) for s in segs] == [(1.4, 1.7), (1.0, 1.3)]
    assert any("95 % interval" in t.get_text() for t in fig.axes[1].get_legend().get_texts())
    plt.close(fig)
    with pytest.raises(ValueError, match="speedup_high"):
        plot_speedup_vs_batch(study.assign(speedup_low=1.0))
