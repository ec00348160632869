"""One colour per draft (and per baseline method) in every SPADE figure, and legends kept off the data.

Colours come from the Okabe-Ito palette (distinguishable with the common colour-vision deficiencies).
A draft keeps its colour in every figure of every notebook, whatever order a table lists it in:
``color_for("distilled")`` is the same blue in ``m2_speedup_runs`` and ``m3_category_summary``.
Names not listed get a stable colour from the remaining ones (a hash of the name, not its position).
Temperatures, when a figure shows several, are told apart by marker fill and line style
(:func:`temperature_style`), never by colour, so colour always means the draft.
"""

from __future__ import annotations

import hashlib

OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#000000"]

FIXED = {
    "distilled": "#0072B2",     # blue: a pair's distilled draft (the embedded pair's and the real pair's)
    "draft": "#0072B2",         # the default draft of a target_id/draft_id pair
    "data_only": "#E69F00",     # orange
    "ngram": "#009E73",         # green: prompt lookup
    "hf_assisted": "#CC79A7",   # pink: HF assisted generation
    "early_exit": "#D55E00",    # vermillion: self-speculative
    "null": "#000000",          # black: the null-draft control (every draft rejected)
    "ar": "#555555",            # baselines in greys
    "hf": "#999999",
}
_SPARE = ["#56B4E9", "#F0E442", "#D55E00", "#CC79A7", "#000000"]


def color_for(name: str | None) -> str:
    """The colour of draft (or method) ``name`` in every figure."""
    if name is None:
        return FIXED["distilled"]
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    if name in FIXED:
        return FIXED[name]
    digest = hashlib.sha256(name.encode()).digest()
    return _SPARE[digest[0] % len(_SPARE)]


def temperature_style(temperature: float) -> dict:
    """Line and marker style of a temperature: greedy solid and filled, sampled dashed and open."""
    if temperature == 0:
        return {"linestyle": "-", "fillstyle": "full"}
    return {"linestyle": "--", "fillstyle": "none"}


def legend_outside(target, *, where: str = "right", ncol: int = 1, **kwargs):
    """A legend beside (``where="right"``) or below (``"below"``) an axes, never over its data.

    ``target`` is an Axes (its own handles) or a Figure (the handles of all its axes, deduplicated by
    label). ``savefig.bbox: tight`` in the SPADE style keeps the legend inside the saved file."""
    import matplotlib.figure

    kwargs.setdefault("fontsize", 6)
    if where not in ("right", "below"):
        raise ValueError(f"where must be 'right' or 'below', got {where!r}")
    if isinstance(target, matplotlib.figure.Figure):
        seen: dict = {}
        for ax in target.axes:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(lab, h)
        handles, labels = list(seen.values()), list(seen)
        if where == "right":
            return target.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), ncol=ncol, **kwargs)
        return target.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, **kwargs)
    if where == "right":
        return target.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, ncol=ncol, **kwargs)
    return target.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=ncol, **kwargs)
