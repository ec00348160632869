"""Old import path of :mod:`spade_lib.runs.launch` (kept working: it is the same module object)."""

import sys

from spade_lib.runs import launch as _module

sys.modules[__name__] = _module
