"""Old import path of :mod:`spade_lib.whatif.align` (kept working: it is the same module object)."""

import sys

from spade_lib.whatif import align as _module

sys.modules[__name__] = _module
