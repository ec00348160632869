"""Old import path of :mod:`spade_lib.whatif.stoprules` (kept working: it is the same module object)."""

import sys

from spade_lib.whatif import stoprules as _module

sys.modules[__name__] = _module
