"""Measurements made with the decoding loop: ``costs`` (the one cost measurement: the draft's ``c`` and the
target's ``r(g)`` from paired, in-turn timings), ``batch_study`` (batched speculative against batched
autoregressive decoding by batch size) and ``divergence`` (is a greedy mismatch a numeric near-tie or a bug).
"""
