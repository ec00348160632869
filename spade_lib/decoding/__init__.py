"""M2 decoding: model adapter with KV-cache rollback, drafters, draft-length policies, the
speculative and autoregressive decoders (single and batched), HF baselines, greedy-divergence
classification.

Modules: ``adapter``, ``lean``, ``drafters``, ``heads`` (the interface of a draft head on the target's
hidden states), ``eagle`` and ``medusa`` (its kinds and their drafters), ``policies``, ``adaptive``, ``records`` (the trace's column
names), ``common`` (results and helpers the decoders share), ``step`` (the verify + commit step of single and
batched decoding), ``batch``, ``decode``, ``batch_study``,
``baselines``, ``divergence``, ``tree_shapes`` (the shapes of draft trees: static, EAGLE-2, sampled,
prompt lookup, suffix index; their acceptance statistics); import each as ``spade_lib.decoding.<module>``.
"""

# the built-in policy "adaptive" registers itself on import (spade_lib.decoding.adaptive builds on policies)
from spade_lib.decoding import adaptive as _adaptive  # noqa: E402,F401
