"""M2 runs: suite runs written as Parquet traces (config, methods, store, runner, trace), the
interleaved timing protocol and timing helpers, the metrics computed from runs, and the run command
line with sharded launches.

Modules: ``config`` (``RunConfig``, seeds, prompt ids), ``methods`` (how each method generates, timed),
``store`` (run folders: identity, shards, summary), ``runner`` (the suite loop, ``run_suite``), ``trace``,
``timing``, ``metrics``, ``costs``, ``protocol``, ``compare``, ``specbench`` (Spec-Bench answer files of
runs), ``cli`` (``python -m spade_lib.runs.cli``), ``launch``; import each as ``spade_lib.runs.<module>``.
"""
