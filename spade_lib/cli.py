"""Old import path of :mod:`spade_lib.runs.cli` (kept working: it is the same module object)."""

import sys

if __name__ == "__main__":  # python -m spade_lib.cli
    import runpy

    runpy.run_module("spade_lib.runs.cli", run_name="__main__", alter_sys=True)
else:
    from spade_lib.runs import cli as _module

    sys.modules[__name__] = _module
