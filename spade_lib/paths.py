"""Repository-anchored paths.

Notebooks are executed by JupyterLab, papermill and nbval, each starting its kernel in a different
working directory; every path SPADE reads or writes is therefore anchored on the repository root
(the folder that holds ``pyproject.toml`` and ``spade_lib/``), never on the current directory.

Environment overrides (useful for tests and shared machines):

- ``SPADE_CACHE_DIR``   where built models and other reusable artefacts go (default ``<root>/.cache/spade``)
- ``SPADE_RUNS_DIR``    where executed notebooks and run traces go (default ``<root>/runs``)
- ``SPADE_FIGURES_DIR`` where figures go (default ``<root>/figures``)
- ``SPADE_DATA_DIR``    where benchmark suites go (default ``<root>/data``)
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT: Path = Path(__file__).resolve().parent.parent


def _env_path(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser().resolve() if value else default


DATA_DIR: Path = _env_path("SPADE_DATA_DIR", REPO_ROOT / "data")
FIGURES_DIR: Path = _env_path("SPADE_FIGURES_DIR", REPO_ROOT / "figures")
RUNS_DIR: Path = _env_path("SPADE_RUNS_DIR", REPO_ROOT / "runs")
CACHE_DIR: Path = _env_path("SPADE_CACHE_DIR", REPO_ROOT / ".cache" / "spade")
PARAMS_DIR: Path = REPO_ROOT / "params"
NOTEBOOKS_DIR: Path = REPO_ROOT / "notebooks"


def ensure_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if missing and return it."""
    path.mkdir(parents=True, exist_ok=True)
    return path
