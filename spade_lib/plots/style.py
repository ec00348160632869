"""The SPADE figure style and the one way figures are saved.

``use_style()`` applies seaborn's *paper* context and ``spade.mplstyle`` (TrueType fonts, column
sizes). ``save_figure(fig, name)`` writes ``figures/<name>.pdf`` and ``figures/<name>.png`` with
metadata stripped of dates and versions, so two saves of the same figure are byte-identical, and
each file is written atomically.

Under a Jupyter kernel (papermill, nbval, JupyterLab) ``use_style()`` first selects the inline
backend (IPython's ``%matplotlib inline``, from ``matplotlib_inline``), even where ``MPLBACKEND=Agg``
is exported (``make run`` does): every figure a cell leaves open is then the cell's ``image/png``
output, so executed notebooks and their HTML pages show their figures. The saved files do not depend
on the backend: ``savefig`` renders PDF and PNG with its own canvases.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

# Headless by default, but never over a backend already chosen through MPLBACKEND: a Jupyter kernel
# sets it to its inline backend, and replacing that with Agg leaves notebooks opened in JupyterLab
# without figures (tests/test_browser.py).
if not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

from spade_lib import paths  # noqa: E402
from spade_lib.io import atomic_path  # noqa: E402

STYLE_FILE = Path(__file__).with_name("spade.mplstyle")
SINGLE_COLUMN = 3.4  # inches
DOUBLE_COLUMN = 7.0  # inches

# Metadata keys that would otherwise embed dates or software versions.
_PDF_METADATA = {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}
_PNG_METADATA = {"Software": None}


def use_inline_backend() -> bool:
    """Select the inline backend when running under a Jupyter kernel; return whether it did.

    Outside a kernel (plain Python, pytest, an IPython terminal) nothing changes.
    """
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency of the notebooks
        return False
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    if "inline" not in matplotlib.get_backend():
        shell.run_line_magic("matplotlib", "inline")
    return True


def _inline() -> bool:
    return "inline" in matplotlib.get_backend()


def use_style() -> None:
    """Select the inline backend under a kernel, then apply seaborn's paper context and the SPADE
    style file (idempotent)."""
    use_inline_backend()
    sns.set_theme(context="paper", style="ticks")
    plt.style.use(STYLE_FILE)


def figure(width: float = SINGLE_COLUMN, aspect: float = 0.7, **subplots_kwargs):
    """``plt.subplots`` sized for a paper column: ``width`` inches wide, ``width*aspect`` tall."""
    return plt.subplots(figsize=(width, width * aspect), **subplots_kwargs)


def save_figure(fig, name: str, *, directory: str | Path | None = None, close: bool = False) -> dict[str, Path]:
    """Write ``<directory>/<name>.pdf`` and ``.png`` deterministically; return both paths.

    ``directory`` defaults to :data:`spade_lib.paths.FIGURES_DIR`. ``name`` must be a plain file stem.
    With ``close`` under the inline backend the figure is displayed before it is closed (so a closed
    figure still appears in the notebook).
    """
    if not name or Path(name).name != name or name.endswith((".pdf", ".png")):
        raise ValueError(f"figure name must be a plain stem like 'm3_acceptance_by_position', got {name!r}")
    directory = Path(directory) if directory is not None else paths.FIGURES_DIR
    out = {}
    for ext, metadata in (("pdf", _PDF_METADATA), ("png", _PNG_METADATA)):
        path = directory / f"{name}.{ext}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, metadata=metadata)
        out[ext] = path
    if close:
        if _inline():
            from IPython.display import display

            display(fig)
        plt.close(fig)
    return out
