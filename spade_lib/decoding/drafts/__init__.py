"""Drafting: what proposes the block the target verifies, and how long it is.

``drafters`` (the :class:`~spade_lib.decoding.drafts.drafters.Drafter` protocol, each drafter's declared kind,
model / n-gram / prompt-lookup / suffix / null drafters, one ``check_draft``), ``crossvocab`` (drafts with another
tokenizer; they register themselves), ``eagle`` and ``medusa`` (the head kinds and their drafters), ``tree``,
``tree_drafting`` and ``tree_shapes`` (draft trees: the structure, how a model grows one, which shapes pay),
``policies`` and ``adaptive`` (when to stop drafting; "adaptive" registers itself here). Drafts run on
:mod:`spade_lib.decoding.model`; the loop above (:mod:`spade_lib.decoding.decode`) calls them.
"""

# the built-in policy "adaptive" registers itself on import (it builds on policies)
from spade_lib.decoding.drafts import adaptive as _adaptive  # noqa: E402,F401
