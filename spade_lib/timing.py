"""Old import path of :mod:`spade_lib.runs.timing` (kept working: it is the same module object)."""

import sys

from spade_lib.runs import timing as _module

sys.modules[__name__] = _module
