"""Old import path of :mod:`spade_lib.runs.protocol` (kept working: it is the same module object)."""

import sys

from spade_lib.runs import protocol as _module

sys.modules[__name__] = _module
