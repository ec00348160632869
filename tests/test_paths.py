"""spade_lib.paths is anchored on the repository root, whatever the working directory."""

import json
import os
import subprocess
import sys
from pathlib import Path

from spade_lib import paths


def test_root_holds_the_package():
    assert (paths.REPO_ROOT / "spade_lib" / "__init__.py").is_file()
    assert (paths.REPO_ROOT / "pyproject.toml").is_file()


def _paths_from(cwd: Path) -> dict:
    code = (
        "import json; from spade_lib import paths; "
        "print(json.dumps({k: str(getattr(paths, k)) for k in "
        "['REPO_ROOT', 'DATA_DIR', 'FIGURES_DIR', 'RUNS_DIR', 'CACHE_DIR', 'NOTEBOOKS_DIR']}))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPADE_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_paths_do_not_depend_on_cwd(tmp_path):
    here = _paths_from(paths.REPO_ROOT)
    elsewhere = _paths_from(tmp_path)
    inside_notebooks = _paths_from(paths.REPO_ROOT / "notebooks")
    assert here == elsewhere == inside_notebooks
    assert Path(here["FIGURES_DIR"]) == paths.REPO_ROOT / "figures"


def test_environment_overrides(tmp_path):
    code = "from spade_lib import paths; print(paths.FIGURES_DIR)"
    env = dict(os.environ, SPADE_FIGURES_DIR=str(tmp_path / "f"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()) == (tmp_path / "f").resolve()
