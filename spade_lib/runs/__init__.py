"""M2 runs: suite runs written as Parquet traces (runner, trace), the interleaved timing protocol
and timing helpers, the metrics computed from runs, and the run command line with sharded launches.

Modules: ``runner``, ``trace``, ``timing``, ``metrics``, ``protocol``, ``cli``, ``launch``. Each is also importable at its old
path ``spade_lib.<module>``.
"""
