"""SPADE: Speculative decoding Acceptance Diagnostics and Evaluation.

Notation (Leviathan et al., 2023, used throughout): ``p`` is the target model's distribution, ``q`` the draft model's,
``gamma`` the number of drafted tokens per step, ``alpha`` the acceptance rate and ``c`` the cost of a draft forward
relative to a target forward.

Every module has one import path; import names from the module that defines them. Top to bottom
(a layer imports only from the layers below it; ``lint-imports`` checks this, see ``pyproject.toml``):

- ``spade_lib.runbook``: runs the notebooks; ``spade_lib.report`` (the run report) and ``spade_lib.experiment`` (the
  notebooks' pair, suite and runs);
- ``spade_lib.whatif`` (``align``, ``replay``, ``stoprules``) and ``spade_lib.diagnose`` (M3);
- ``spade_lib.runs``: suite runs, traces, timing protocol, metrics, the run CLI (``python -m spade_lib.runs.cli``);
- ``spade_lib.bench`` (M1 suites), then ``spade_lib.zoo`` (embedded and real draft/target pairs);
- ``spade_lib.decoding`` (``adapter``, ``lean``, ``kernels``, ``drafters``, ``policies``, ``adaptive``, ``records``,
  ``common``, ``costs``, ``batch``, ``decode``, ``batch_study``, ``baselines``, ``divergence``: the M2 decoder);
- ``spade_lib.exactness``; ``spade_lib.verify``, ``spade_lib.theory``: the verification core;
- ``spade_lib.sampling``, ``spade_lib.measures``, ``spade_lib.rules``, ``spade_lib.devices``;
- ``spade_lib.params``, ``spade_lib.plots``; foundation: ``spade_lib.validate``, ``spade_lib.io``, ``spade_lib.paths``.

**The front door**, lazily (PEP 562, as ``transformers`` does): ``from spade_lib import load_pair, SpeculativeDecoder,
SamplingConfig``. :data:`_FRONT_DOOR` maps each name to the ``"module:attribute"`` that *defines* it (the same object,
``spade_lib.load_pair is spade_lib.zoo.pairs.load_pair``), as strings so that ``import spade_lib`` (run before every
submodule import) stays cheap: no torch, no submodule. ``tests/test_front_door.py`` checks that no module imports a
front-door name from the package top (an upward import the ``[tool.importlinter]`` contract cannot see).
"""

import importlib

__version__ = "0.1.0"

_FRONT_DOOR: dict[str, str] = {
    # pairs and suites (M1)
    "load_pair": "spade_lib.zoo.pairs:load_pair",                # embedded ("tiny", "default"), "smollm2", or target=/draft=
    "default_suite": "spade_lib.bench.build:default_suite",      # the embedded prompt suite, built offline
    "load_suite": "spade_lib.bench.format:load_suite",           # a suite JSONL + manifest, hash-checked
    # decoding (M2)
    "SamplingConfig": "spade_lib.sampling:SamplingConfig",       # temperature, top_k, top_p (p and q alike)
    "SpeculativeDecoder": "spade_lib.decoding.decode:SpeculativeDecoder",
    "AutoregressiveDecoder": "spade_lib.decoding.decode:AutoregressiveDecoder",  # the speedup baseline
    "GenerationResult": "spade_lib.decoding.common:GenerationResult",            # tokens, steps, records()
    "make_drafter": "spade_lib.decoding.drafts.drafters:make_drafter",  # "ngram", "null", a pair's draft or head
    "get_policy": "spade_lib.decoding.drafts.policies:get_policy",      # when to stop drafting ("fixed", "entropy", ...)
    # runs and traces
    "RunConfig": "spade_lib.runs.config:RunConfig",              # everything that determines a run
    "run_suite": "spade_lib.runs.runner:run_suite",              # one config over a suite -> a run folder
    "read_trace": "spade_lib.runs.trace:read_trace",             # a run folder's token-level trace
    # diagnostics (M3): trace (DataFrame or run folder) in, tidy table out
    "position_acceptance": "spade_lib.diagnose.position:position_acceptance",
    "expected_vs_realised": "spade_lib.diagnose.expected:expected_vs_realised",
    "calibration_table": "spade_lib.diagnose.calibration:calibration_table",
    "category_summary": "spade_lib.diagnose.summary:category_summary",
    "all_tables": "spade_lib.diagnose.summary:all_tables",
}

__all__ = ["__version__", *_FRONT_DOOR]


def __getattr__(name: str):
    """``spade_lib.<name>`` for a front-door name: its defining module's attribute (imported on first use)."""
    target = _FRONT_DOOR.get(name)
    if target is None:
        raise AttributeError(f"module 'spade_lib' has no attribute {name!r} (front-door names: "
                             f"{', '.join(sorted(_FRONT_DOOR))})")
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FRONT_DOOR))
