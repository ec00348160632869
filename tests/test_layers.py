"""The import layers of spade_lib (``[tool.importlinter]`` in pyproject.toml) hold: ``lint-imports`` passes.

A module imports only from its own layer or the layers below (function-level imports included), so
there are no import circles between layers and no module is reachable under a second path.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_lint_imports_keeps_the_layer_contract():
    exe = Path(sys.executable).parent / "lint-imports"
    assert exe.is_file(), f"{exe} not found: install requirements.txt (import-linter) into this environment"
    # run from the repository root: lint-imports reads its pyproject.toml and analyses its spade_lib
    out = subprocess.run([str(exe), "--no-cache", "--no-logo"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"lint-imports failed (exit {out.returncode}):\n{out.stdout}\n{out.stderr}"
