"""What-if figures (notebook 05): each draws the tables of spade_lib.whatif, shows their numbers and counts,
rejects a wrong table by name, and saves byte-identical files twice."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from spade_lib import diagnose as dg
from spade_lib.plots import use_style
from spade_lib.plots import whatif as whatif_plots
from spade_lib.plots.counts import count_text
from spade_lib.rules import lossless_map
from spade_lib.whatif import align, replay, stoprules
from tests.plot_checks import saves_twice_identically

GAMMAS = (1, 2, 4)


@pytest.fixture(scope="module")
def tables():
    use_style()
    trace = dg.synthetic_trace(300, 4, [0.8, 0.7, 0.6, 0.5], n_prompts=6, seed=3)
    rng = np.random.default_rng(0)
    scores = pd.DataFrame([{"seq": s, "i": i, "alpha": a} for s in range(4)
                           for i, a in enumerate(rng.uniform(0.3, 0.95, 30))])
    rows = []
    for g in GAMMAS:  # the measured sweep: full-block tau from synthetic traces, speedups typed in
        tau, se, n = align.measured_tau(dg.synthetic_trace(100 + 10 * g, g, [0.7] * g, seed=g), g)
        rows.append({"gamma": g, "steps": n, "tau_full_blocks": tau, "se": se, "speedup_measured": 1.0 + 0.1 * g,
                     "speedup_low_measured": 0.9 + 0.1 * g, "speedup_high_measured": 1.2 + 0.1 * g})
    study = stoprules.study(trace, 0.1, 1.2, stoprules.StudyConfig(max_gamma=4, grid_points=4))
    return {"curve": align.predict(scores, range(1, 7), c=0.1, verify_cost=1.2), "measured": pd.DataFrame(rows),
            "rules": replay.counterfactual(trace, by=["category"]), "fronts": {0.0: study.front, 1.0: study.front}}


@pytest.fixture(scope="module")
def figures(tables):
    return {"predicted_tau": whatif_plots.predicted_tau(tables["curve"], tables["measured"]),
            "rules": whatif_plots.rules_replayed(tables["rules"], lossless=lossless_map(), max_gamma=4),
            "stop_frontier": whatif_plots.stop_frontier(tables["fronts"])}


def test_every_figure_draws_and_saves_deterministically(figures, tmp_path):
    for name, fig in figures.items():
        assert isinstance(fig, Figure) and fig.axes, name
        saves_twice_identically(fig, f"m3_whatif_{name}", tmp_path / name)


def test_predicted_tau_draws_every_method_and_labels_the_measured_blocks(tables, figures):
    ax_tau, ax_speed = figures["predicted_tau"].axes
    lines = {line.get_label(): line for line in ax_tau.get_lines() if line.get_label().startswith("predicted")}
    assert sorted(lines) == [f"predicted ({m})" for m in sorted(align.PREDICTION_METHODS)]
    renewal = tables["curve"][tables["curve"].method == "renewal"]
    assert np.allclose(lines["predicted (renewal)"].get_ydata(), renewal["tau"])
    assert [t.get_text() for t in ax_tau.texts] == [count_text(n) for n in tables["measured"]["steps"]]
    assert "full blocks" in ax_tau.get_xlabel()
    legend = ax_speed.get_legend() or figures["predicted_tau"].legends[0]
    assert "measured (wall clock, 95 % CI)" in [t.get_text() for t in legend.get_texts()]
    assert np.allclose(ax_speed.containers[0].lines[0].get_ydata(), tables["measured"]["speedup_measured"])


def test_rules_bars_show_tau_expected_with_their_steps(tables, figures):
    table = tables["rules"]
    ax = figures["rules"].axes[0]
    heights = sorted(round(p.get_height(), 9) for p in ax.patches)
    assert heights == sorted(round(v, 9) for v in table["tau_expected"])
    assert sorted(t.get_text() for t in ax.texts) == sorted(count_text(n) for n in table["steps"])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    lossless = lossless_map()
    assert legend == [f"{r}{'' if lossless[r] else ' (lossy)'}" for r in dict.fromkeys(table["rule"])]
    hatched = {p.get_hatch() for p in ax.patches}
    assert hatched == ({"///", None} if not all(lossless.values()) else {None})
    assert "4" in ax.get_title() and "steps" in ax.get_ylabel()


def test_stop_frontier_has_one_panel_per_temperature_with_its_steps(tables, figures):
    axes = figures["stop_frontier"].axes
    assert [ax.get_title() for ax in axes] == [f"T = {T:g} ({int(f['steps'].max()):,} steps)"
                                               for T, f in tables["fronts"].items()]
    front = tables["fronts"][0.0]
    fixed = [line for line in axes[0].get_lines() if line.get_label() == "fixed"][0]
    assert np.allclose(fixed.get_ydata(), front[front.policy == "fixed"].sort_values("cost")["tau"])
    best = [line for line in axes[0].get_lines() if line.get_label().startswith("best speedup")][0]
    x, y = best.get_data()
    assert np.allclose(y / x, front["speedup"].max())


def test_a_wrong_table_is_named(tables):
    with pytest.raises(ValueError, match="predicted_tau: table is missing"):
        whatif_plots.predicted_tau(tables["curve"].drop(columns="speedup"), tables["measured"])
    with pytest.raises(ValueError, match=r"predicted_tau \(measured\): table is missing"):
        whatif_plots.predicted_tau(tables["curve"], tables["measured"].drop(columns="steps"))
    with pytest.raises(ValueError, match="rules_replayed: table is empty"):
        whatif_plots.rules_replayed(tables["rules"].iloc[:0])
    with pytest.raises(ValueError, match="fronts"):
        whatif_plots.stop_frontier({})
    with pytest.raises(ValueError, match="stop_frontier: table is missing"):
        whatif_plots.stop_frontier({1.0: tables["fronts"][1.0].drop(columns="cost")})
    plt.close("all")
