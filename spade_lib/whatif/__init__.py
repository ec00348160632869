"""What-if analysis: teacher-forced scoring and tau predictions (align), counterfactual acceptance
and stop-rule replay of stored traces (replay), the stop-rule study (stoprules).

Modules: ``align``, ``replay``, ``stoprules``, ``tree_replay`` (smaller draft trees replayed from a wide
greedy one), ``sessions`` (notebook 05's runs under the timing protocol, its parameters' cross checks, the
chosen stop rules run for real); import each as ``spade_lib.whatif.<module>``.
"""
