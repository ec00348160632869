"""M2 decoding, by role, top to bottom (each layer imports only the ones below it; ``pyproject.toml``'s
import-linter contract checks it):

- ``studies/``: measurements built on the loop: forward costs ``c`` and ``r(g)``, the batch-size study, greedy
  divergence.
- the loop itself, this package's own modules: ``decode`` (the speculative and autoregressive decoders),
  ``step`` (verify + commit for ``R`` rows), ``batch`` and ``batch_tree`` (batched chains and trees),
  ``baselines`` (HF generate and assisted generation), ``common`` (results, seeded streams, input checks),
  ``records`` (the trace's columns, defined once).
- ``drafts/``: drafters, draft heads' drafters, draft trees and draft-length policies.
- ``model/``: the forward (HF adapter, the lean forward and its kernels, masks, the draft-head interface).

Import each module by its path, e.g. ``spade_lib.decoding.model.lean``.
"""
