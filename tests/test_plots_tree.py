"""Draft-tree figures: each draws its table, rejects a wrong one, and saves byte-identical files twice."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.figure import Figure

from spade_lib import diagnose as dg
from spade_lib.plots import use_style
from spade_lib.plots import tree as tree_plots
from spade_lib.whatif import tree_replay
from tests.tree_traces import random_steps, tree_trace
from tests.plot_checks import saves_twice_identically


@pytest.fixture(scope="module")
def figures():
    use_style()
    a = tree_trace(random_steps(40, 8, seed=1))
    b = tree_trace(random_steps(40, 4, seed=2))
    both = dg.combine_runs({"tree 8": a, "tree 4": b})
    real = dg.tree_summary(both, by="run").assign(label=lambda t: t.run.astype(str))
    return {
        "depth": tree_plots.depth_acceptance(dg.depth_acceptance(both, by="run"), by="run"),
        "sibling": tree_plots.sibling_acceptance(dg.sibling_acceptance(both, by="run"), by="run"),
        "budget": tree_plots.tau_vs_budget(tree_replay.budget_curve(a, [1, 2, 4, 8]), real),
        "budget_alone": tree_plots.tau_vs_budget(tree_replay.budget_curve(a, [2, 8], rank="drafting")),
    }


def test_every_figure_draws_and_saves_deterministically(figures, tmp_path):
    for name, fig in figures.items():
        assert isinstance(fig, Figure) and fig.axes, name
        saves_twice_identically(fig, f"m3_tree_{name}", tmp_path / name)


def test_a_wrong_table_is_named():
    with pytest.raises(ValueError, match="depth_acceptance: table is missing"):
        tree_plots.depth_acceptance(pd.DataFrame({"depth": [0]}))
    with pytest.raises(ValueError, match="tau_vs_budget: table is empty"):
        tree_plots.tau_vs_budget(pd.DataFrame(columns=["rank", "budget", "nodes", "tau", "tau_se"]))


def test_every_run_of_a_tree_figure_has_its_own_colour():
    """Run labels are not drafts of the fixed palette: they get colours by position, distinct in the figure
    (a hash of six labels into the five spare colours made two runs share one)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from spade_lib.plots.palette import FIXED, colors_for

    use_style()
    labels = ["chain g4 T=0", "tree 8 T=0", "tree 4 T=0", "tree 2 T=0", "chain g4 T=1", "tree 8 T=1"]
    runs = dg.combine_runs({lab: tree_trace(random_steps(12, 4, seed=i)) for i, lab in enumerate(labels)})
    fig = tree_plots.depth_acceptance(dg.depth_acceptance(runs, by="run"), by="run")
    colors = [to_hex(c.lines[0].get_color()) for c in fig.axes[0].containers]
    assert len(colors) == len(labels) == len(set(colors))
    plt.close(fig)
    fig = tree_plots.sibling_acceptance(dg.sibling_acceptance(runs, by="run"), by="run")
    assert len({to_hex(c.lines[0].get_color()) for c in fig.axes[0].containers}) == len(labels)
    plt.close(fig)
    # a fixed draft keeps its colour beside run labels; a second name of the same fixed colour gets another
    got = colors_for(["tree 8", "distilled", "draft", None])
    assert got[1] == FIXED["distilled"] and len(set(got)) == 4
    assert len(set(colors_for([f"run {i}" for i in range(40)]))) == 40
    with pytest.raises(TypeError, match="names"):
        colors_for([3])


def test_tree_figures_label_each_point_with_its_count():
    import matplotlib.pyplot as plt

    from spade_lib.plots.counts import count_text

    use_style()
    both = dg.combine_runs({"tree 8": tree_trace(random_steps(40, 8, seed=1)),
                            "tree 4": tree_trace(random_steps(40, 4, seed=2))})
    depth = dg.depth_acceptance(both, by="run")
    fig = tree_plots.depth_acceptance(depth, by="run")
    shown = depth[depth["steps_reached"] > 0]
    assert sorted(t.get_text() for t in fig.axes[0].texts) == sorted(count_text(v) for v in shown["steps_reached"])
    sib = dg.sibling_acceptance(both, by="run")
    fig = tree_plots.sibling_acceptance(sib, by="run")
    drawn = sib[sib["rate"].notna()]
    assert sorted(t.get_text() for ax in fig.axes for t in ax.texts) == sorted(count_text(v) for v in drawn["reached"])
    plt.close("all")
