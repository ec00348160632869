"""Checks the figure tests share."""

from __future__ import annotations

from spade_lib.plots import save_figure


def saves_twice_identically(fig, name: str, tmp_path) -> None:
    """``save_figure`` writes the same PDF and PNG bytes for ``fig`` twice (the figures are byte-stable)."""
    first = save_figure(fig, name, directory=tmp_path / "a")
    second = save_figure(fig, name, directory=tmp_path / "b")
    assert set(first) == {"pdf", "png"}, first
    for ext in ("pdf", "png"):
        assert first[ext].read_bytes() == second[ext].read_bytes(), (name, ext)
