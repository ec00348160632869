"""Old import path of :mod:`spade_lib.whatif.replay` (kept working: it is the same module object)."""

import sys

from spade_lib.whatif import replay as _module

sys.modules[__name__] = _module
