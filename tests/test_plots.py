"""Figures: saved as PDF + PNG, byte-identical across saves, with TrueType fonts."""

import matplotlib.pyplot as plt
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
