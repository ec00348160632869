"""Old import path of :mod:`spade_lib.decoding.adapter` (kept working: it is the same module object)."""

import sys

from spade_lib.decoding import adapter as _module

sys.modules[__name__] = _module
