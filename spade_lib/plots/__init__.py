"""SPADE figures: the paper style, ``save_figure``, and one module of figure functions per milestone."""

from spade_lib.plots.style import DOUBLE_COLUMN, SINGLE_COLUMN, figure, save_figure, use_style

__all__ = ["DOUBLE_COLUMN", "SINGLE_COLUMN", "figure", "save_figure", "use_style"]
