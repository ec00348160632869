"""Old import path of :mod:`spade_lib.runs.runner` (kept working: it is the same module object)."""

import sys

if __name__ == "__main__":  # python -m spade_lib.runner
    import runpy

    runpy.run_module("spade_lib.runs.runner", run_name="__main__", alter_sys=True)
else:
    from spade_lib.runs import runner as _module

    sys.modules[__name__] = _module
