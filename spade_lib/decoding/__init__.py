"""M2 decoding: model adapter with KV-cache rollback, drafters, draft-length policies, the
speculative and autoregressive decoders (single and batched), HF baselines, greedy-divergence
classification.

Modules: ``adapter``, ``lean``, ``drafters``, ``policies``, ``adaptive``, ``decode``, ``batch``, ``baselines``, ``divergence``. Each is also importable at its old
path ``spade_lib.<module>``.
"""
