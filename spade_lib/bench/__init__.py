"""M1 benchmark suites: Spec-Bench-compatible JSONL + hashed manifests, from three kinds of source.

Typical use::

    from spade_lib.bench import default_suite, from_specbench, load_suite
    suite = default_suite(tokenizer="tiny", n_per_category=8)   # embedded, offline
    suite.save(DATA_DIR / "embedded.jsonl"); suite = load_suite(DATA_DIR / "embedded.jsonl")

Spec-Bench answer files of runs, both ways, are :mod:`spade_lib.runs.specbench` (they read run folders).
"""

from spade_lib.bench.build import (SuiteSpec, build_suite, default_suite, from_specbench, humaneval_suite,
                                   named_source, prompt_token_ids, spec_from_manifest)
from spade_lib.bench.embedded import CATEGORIES as EMBEDDED_CATEGORIES, EmbeddedConfig
from spade_lib.bench.format import Suite, load_suite, manifest_path, read_jsonl
from spade_lib.bench.process import DEFAULT_TIER_EDGES, dedup, length_tier, normalise, render_prompt
from spade_lib.bench.sources import (MT_BENCH_CATEGORIES, SOURCE_KINDS, SPEC_BENCH_SUBTASKS, EmbeddedSource,
                                     HFSource, HumanEvalSource, SpecBenchSource, humaneval_path, register_source,
                                     source_from_dict)
from spade_lib.bench.specs import HF_SPECS, hf_spec

__all__ = [
    "DEFAULT_TIER_EDGES", "EMBEDDED_CATEGORIES", "EmbeddedConfig", "EmbeddedSource", "HFSource", "HF_SPECS",
    "HumanEvalSource", "humaneval_path", "humaneval_suite",
    "MT_BENCH_CATEGORIES", "SOURCE_KINDS", "SPEC_BENCH_SUBTASKS", "SpecBenchSource", "Suite",
    "SuiteSpec",
    "build_suite", "dedup", "default_suite", "from_specbench", "hf_spec", "length_tier", "load_suite",
    "manifest_path", "named_source", "normalise", "prompt_token_ids", "read_jsonl", "register_source",
    "render_prompt", "source_from_dict", "spec_from_manifest",
]
