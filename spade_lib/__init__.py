"""SPADE: Speculative decoding Acceptance Diagnostics and Evaluation.

Notation (Leviathan et al., 2023, used throughout): ``p`` is the target model's distribution, ``q``
the draft model's, ``gamma`` the number of drafted tokens per step, ``alpha`` the acceptance rate and
``c`` the cost of a draft forward relative to a target forward.

Modules (one idea each): ``paths``, ``io``, ``params``, ``plots`` (foundation); ``sampling``,
``verify``, ``measures``, ``theory`` (verification core); ``zoo`` (embedded draft/target pairs);
``bench`` (M1 suites); ``adapter``, ``drafters``, ``policies``, ``decode``, ``baselines``,
``divergence`` (M2 decoder); ``trace``, ``runner``, ``metrics``, ``timing`` (M2 runs);
``diagnose`` (M3); ``align``, ``replay`` (what-if analysis).

Heavy modules (torch, transformers) are imported lazily: ``import spade_lib`` is cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public names re-exported at the top level -> the module that defines them.
_EXPORTS = {
    "SamplingConfig": "spade_lib.sampling",
    "adjust": "spade_lib.sampling",
    "VerifyResult": "spade_lib.verify",
    "distribution_stats": "spade_lib.measures",
    "expected_tokens": "spade_lib.theory",
    "speedup": "spade_lib.theory",
    "optimal_gamma": "spade_lib.theory",
    "load_suite": "spade_lib.bench",
    "default_suite": "spade_lib.bench",
    "build_suite": "spade_lib.bench",
    "load_pair": "spade_lib.zoo",
    "load_tokenizer": "spade_lib.zoo",
    "Pair": "spade_lib.zoo",
    "pair_names": "spade_lib.zoo",
    "SpeculativeDecoder": "spade_lib.decoding.decode",
    "AutoregressiveDecoder": "spade_lib.decoding.decode",
    "GenerationResult": "spade_lib.decoding.decode",
    "CausalLMAdapter": "spade_lib.decoding.adapter",
    "ModelDrafter": "spade_lib.decoding.drafters",
    "NGramDrafter": "spade_lib.decoding.drafters",
    "FixedGamma": "spade_lib.decoding.policies",
    "ConfidenceThreshold": "spade_lib.decoding.policies",
    "EntropyThreshold": "spade_lib.decoding.policies",
    "hf_generate": "spade_lib.decoding.baselines",
    "compare_greedy": "spade_lib.decoding.divergence",
    "score_sequences": "spade_lib.whatif.align",
    "predict": "spade_lib.whatif.align",
    "counterfactual": "spade_lib.whatif.replay",
    "replay_stop_rule": "spade_lib.whatif.replay",
    "StopRule": "spade_lib.whatif.replay",
    "RunConfig": "spade_lib.runs.runner",
    "run_suite": "spade_lib.runs.runner",
    "read_trace": "spade_lib.runs.trace",
    "setup_notebook": "spade_lib.params",
    "save_figure": "spade_lib.plots",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'spade_lib' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))
