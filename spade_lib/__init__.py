"""SPADE: Speculative decoding Acceptance Diagnostics and Evaluation.

Notation (Leviathan et al., 2023, used throughout): ``p`` is the target model's distribution, ``q``
the draft model's, ``gamma`` the number of drafted tokens per step, ``alpha`` the acceptance rate and
``c`` the cost of a draft forward relative to a target forward.

Every module has one import path; import names from the module that defines them. Top to bottom
(a layer imports only from the layers below it; ``lint-imports`` checks this, see ``pyproject.toml``):

- ``spade_lib.runbook``: runs the notebooks; ``spade_lib.report`` (the run report) and
  ``spade_lib.experiment`` (the notebooks' pair, suite and runs);
- ``spade_lib.whatif`` (``align``, ``replay``, ``stoprules``) and ``spade_lib.diagnose`` (M3);
- ``spade_lib.runs``: suite runs, traces, timing protocol, metrics, the run command line
  (``python -m spade_lib.runs.cli``);
- ``spade_lib.bench`` (M1 suites), then ``spade_lib.zoo`` (embedded and real draft/target pairs);
- ``spade_lib.decoding`` (``adapter``, ``lean``, ``kernels``, ``drafters``, ``policies``, ``adaptive``,
  ``records``, ``common``, ``costs``, ``batch``, ``decode``, ``batch_study``, ``baselines``,
  ``divergence``: the M2 decoder);
- ``spade_lib.exactness``; ``spade_lib.verify``, ``spade_lib.theory``: the verification core;
- ``spade_lib.sampling``, ``spade_lib.measures``, ``spade_lib.rules``, ``spade_lib.devices``;
- ``spade_lib.params``, ``spade_lib.plots``, then ``spade_lib.validate``, ``spade_lib.io``,
  ``spade_lib.paths`` (foundation).

Heavy modules (torch, transformers) are imported by the modules that need them: ``import spade_lib``
is cheap.
"""

__version__ = "0.1.0"
