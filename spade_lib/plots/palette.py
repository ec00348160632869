"""One colour per draft (and per baseline method) in every SPADE figure, and legends kept off the data.

Colours come from the Okabe-Ito palette (distinguishable with the common colour-vision deficiencies).
A draft listed in ``FIXED`` keeps its colour in every figure of every notebook, whatever order a table
lists it in: ``color_for("distilled")`` is the same blue in ``m2_speedup_runs`` and
``m3_category_summary``. The other series of a figure (run labels such as ``"tree 8 T=0"``, drafts
without a fixed colour) get colours by their position in the figure (:func:`colors_for`): the
palette's colours the figure's fixed names leave free, in order, so every series of one figure has its
own colour (a hash of the name, as ``color_for`` alone gives, let two of them share one).
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
# after Okabe-Ito, for figures of more series: matplotlib's tab10, then evenly spaced hues
_MORE = ["#1F77B4", "#FF7F0E", "#2CA02C", "#D62728", "#9467BD", "#8C564B", "#E377C2", "#7F7F7F", "#BCBD22",
         "#17BECF"]


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


def colors_for(names) -> list[str]:
    """One colour per series of one figure, all distinct: a name of ``FIXED`` keeps its colour (unless an
    earlier name of the figure already took that colour), every other name takes the next colour of
    Okabe-Ito (then tab10, then evenly spaced hues) that no series of the figure uses, by position."""
    import matplotlib.colors

    names = list(names)
    for n in names:
        if n is not None and not isinstance(n, str):
            raise TypeError(f"names must be strings (or None), got {type(n).__name__}")
    out: list[str | None] = [None] * len(names)
    used: set[str] = set()
    for i, n in enumerate(names):
        c = FIXED["distilled"] if n is None else FIXED.get(n)
        if c is not None and c not in used:
            out[i] = c
            used.add(c)
    free = [c for c in dict.fromkeys(OKABE_ITO + _MORE) if c not in used]
    need = sum(c is None for c in out)
    if need > len(free):
        free += [matplotlib.colors.to_hex(matplotlib.colors.hsv_to_rgb((h, 0.65, 0.8)))
                 for h in (i / (need - len(free)) for i in range(need - len(free)))]
    it = iter(free)
    return [c if c is not None else next(it) for c in out]


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
