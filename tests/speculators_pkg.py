"""vLLM's ``speculators`` package for the format tests, kept beside the repository, never in the venv.

``speculators==0.9.0`` pins ``transformers<=5.19`` and pulls torchvision/torchaudio, so it is installed
with ``pip install --no-deps --target <folder>`` together with the few pure-Python packages its import
needs, and only ever imported in a child process with ``PYTHONPATH=<folder>``: nothing it brings can
shadow a package of the test process. Where the folder is:

1. ``$SPADE_SPECULATORS_DIR`` when set (an existing ``--target`` folder holding ``speculators/``);
2. else ``<repo>/.cache/speculators-0.9.0``, installed there on first use (under a file lock, into a
   temporary sibling renamed into place) unless ``SPADE_FETCH_SPECULATORS=0``.

``python tests/speculators_pkg.py`` installs it ahead of the tests (what ``make test`` can run first);
:func:`speculators_dir` returns the folder or the reason it is unavailable (the tests skip with it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VERSION = "0.9.0"
REQUIREMENTS = (f"speculators=={VERSION}", "openai==3.57.0", "sniffio==1.3.1", "hs_connectors==0.9.0", "loguru==0.7.3",
                "pydantic-settings==2.16.3")  # pinned: the versions the format tests were written against
REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO / ".cache" / f"speculators-{VERSION}"


def _usable(folder: Path) -> bool:
    return (folder / "speculators" / "__init__.py").is_file()


def install(folder: Path = DEFAULT_DIR, *, timeout: float = 300) -> Path:
    """``pip install --no-deps --target folder`` (atomically: a killed install leaves nothing behind)."""
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if _usable(folder):
            return folder
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        os.chmod(tmp, 0o755)
        try:
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "--no-deps", "--timeout", "20", "--retries", "1", "--target", str(tmp), *REQUIREMENTS],
                           check=True, timeout=timeout, capture_output=True, text=True)
            if folder.exists():
                shutil.rmtree(folder)
            os.rename(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return folder


def speculators_dir() -> tuple[Path | None, str]:
    """``(folder, "")`` with ``speculators`` importable from ``folder``, or ``(None, reason)``."""
    env = os.environ.get("SPADE_SPECULATORS_DIR")
    if env:
        folder = Path(env).expanduser()
        return (folder, "") if _usable(folder) else (None, f"SPADE_SPECULATORS_DIR={env} holds no speculators/")
    if _usable(DEFAULT_DIR):
        return DEFAULT_DIR, ""
    if os.environ.get("SPADE_FETCH_SPECULATORS", "1") == "0":
        return None, (f"speculators=={VERSION} is not installed in {DEFAULT_DIR} and SPADE_FETCH_SPECULATORS=0 "
                      f"(run: python tests/speculators_pkg.py)")
    try:
        return install(), ""
    except (subprocess.SubprocessError, OSError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        return None, (f"could not install speculators=={VERSION} into {DEFAULT_DIR} (no network?): "
                      f"{detail.strip().splitlines()[-1] if detail.strip() else type(e).__name__}")


def run_with_speculators(folder: Path, script: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``script`` in a child Python with ``folder`` and the repository on ``PYTHONPATH``, offline."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(REPO)]), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


if __name__ == "__main__":
    folder, reason = speculators_dir()
    if folder is None:
        sys.exit(reason)
    print(folder)
