"""M2 runs: suite runs written as Parquet traces (runner, trace), the interleaved timing protocol
and timing helpers, the metrics computed from runs, and the run command line with sharded launches.

Modules: ``runner``, ``trace``, ``timing``, ``metrics``, ``costs``, ``protocol``, ``compare``, ``specbench``
(Spec-Bench answer files of runs), ``cli`` (``python -m spade_lib.runs.cli``), ``launch``; import each as
``spade_lib.runs.<module>``.
"""
