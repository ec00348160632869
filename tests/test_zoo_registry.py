"""The registry of real pairs (``zoo/registry.py``): a pair is one record, and every tool takes every record.

A fake pair (a tiny random Qwen2 target and draft saved in a temporary folder) is registered and used through
``load_pair``, ``pair_built``, ``target_dir`` and the runner, with no branch naming it anywhere.
"""

from __future__ import annotations

import pytest

from spade_lib.zoo import registry
from spade_lib.zoo.loading import load_models
from spade_lib.zoo.registry import RealPair


def test_the_shipped_pairs_are_registered_in_order():
    assert registry.real_pairs()[:3] == ("smollm2", "gemma3", "qwen2.5-coder")
    assert [p for p in registry.real_pairs() if registry.real_pair(p).headline] == ["qwen2.5-coder"]
    assert registry.real_pair("gemma3").bos and not registry.real_pair("qwen2.5-coder").bos


def test_unknown_pairs_and_bad_records_are_refused():
    with pytest.raises(ValueError, match="name: no real pair 'nope'; registered: .*qwen2.5-coder"):
        registry.real_pair("nope")
    with pytest.raises(ValueError, match="name"):
        RealPair(name="a/b", load=print, entries=list, target_dir=print, label="x", source="y")
    with pytest.raises(TypeError, match="entries"):
        RealPair(name="ab", load=print, entries=None, target_dir=print, label="x", source="y")
    with pytest.raises(ValueError, match="registered already"):
        registry.register_pair(RealPair(name="smollm2", load=print, entries=list, target_dir=print, label="x",
                                        source="y"))


@pytest.fixture
def fake(tmp_path):
    from tests.test_zoo_qwen_coder import save_tiny, tiny_qwen2

    for name, seed in (("target", 0), ("draft", 1)):
        save_tiny(tiny_qwen2(seed), tmp_path / name)
    (tmp_path / "manifest.json").write_text("{}")

    def load(*, draft=None, placement=None, dtype=None, rebuild=False, heads=(), head_profile="make"):
        pair = load_models(str(tmp_path / "target"), {"small": str(tmp_path / "draft")}, draft or "small",
                           placement=placement, dtype=dtype, trust_remote_code=False, local_only=True)
        pair.name, pair.manifest = "fake-tiny", {"kind": "fake-tiny"}
        return pair

    record = registry.register_pair(RealPair(name="fake-tiny", load=load, entries=lambda: [tmp_path],
                                             target_dir=lambda rebuild=False: tmp_path / "target",
                                             label="a fake pair", source="random weights"))
    yield record
    registry.unregister_pair("fake-tiny")


def test_a_registered_pair_goes_through_every_tool(fake, tmp_path):
    from spade_lib.bench import Suite
    from spade_lib.runs.config import RunConfig
    from spade_lib.runs.runner import run_suite
    from spade_lib.runs.store import read_summary
    from spade_lib.zoo.pairs import all_pair_names, load_pair, pair_built, target_dir

    assert "fake-tiny" in all_pair_names() and pair_built("fake-tiny")
    assert target_dir("fake-tiny") == tmp_path / "target"
    pair = load_pair("fake-tiny")
    assert pair.name == "fake-tiny" and list(pair.drafts) == ["small"]
    suite = Suite("mini", [{"question_id": i, "category": "code", "turns": [f"def f{i}(x):\n    return x + {i}\n"]}
                           for i in range(2)], {})
    run = run_suite(pair, suite, RunConfig(draft="small", gamma=3, max_new_tokens=8, temperature=0.0),
                    tmp_path / "run", progress=False)
    assert len(read_summary(run)) == 2


def test_a_record_names_the_drafts_load_pair_prepares(tmp_path, monkeypatch):
    """``RealPair.prepare``: ``load_pair(name)`` prepares the target and those drafts (plus a model named by
    ``draft=``); ``prepare=[...]`` names them, ``False`` prepares nothing, anything else is refused."""
    from spade_lib import paths
    from spade_lib.experiment import load_experiment
    from tests.test_zoo_qwen_coder import save_tiny, tiny_qwen2
    from spade_lib.zoo.pairs import load_for_timing, load_pair

    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path / "cache")  # plans recorded in a fresh cache
    save_tiny(tiny_qwen2(0), tmp_path / "target")
    save_tiny(tiny_qwen2(1, layers=1, hidden=32), tmp_path / "draft")

    def load(*, draft=None, placement=None, dtype=None, rebuild=False, heads=(), head_profile="make"):
        refs = {"small": str(tmp_path / "draft"), "other": str(tmp_path / "draft")}
        pair = load_models(str(tmp_path / "target"), refs, draft or "small", placement=placement, dtype=dtype,
                           trust_remote_code=False, local_only=True)
        pair.name, pair.manifest = "fake-two", {"kind": "fake-two"}
        return pair

    with pytest.raises(ValueError, match="^prepare: None or a tuple of draft names"):
        RealPair(name="fake-two", load=load, entries=list, target_dir=print, label="x", source="y", prepare="small")
    registry.register_pair(RealPair(name="fake-two", load=load, entries=lambda: [tmp_path], label="two drafts",
                                    target_dir=lambda rebuild=False: tmp_path / "target", source="random weights",
                                    prepare=("small",)))
    try:
        def roles(pair):
            return [r["role"] for r in pair.prepared]

        assert roles(load_pair("fake-two")) == ["target", "small"]
        assert roles(load_pair("fake-two", draft="other")) == ["target", "small", "other"]
        assert roles(load_pair("fake-two", prepare=["other"])) == ["target", "other"]
        bare = load_pair("fake-two", prepare=False)
        assert roles(bare) == []
        assert bare.draft_model() == "small" and bare.draft_model("other") == "other"
        with pytest.raises(ValueError, match="^draft: 'ngram' is not a draft model of pair 'fake-two'.*'small', 'other'"):
            bare.draft_model("ngram")  # a model-free drafter: nothing a benchmark can time as c
        timed, name = load_for_timing("fake-two", "other")  # what bench_decode / align / batch load
        assert name == "other" and roles(timed) == ["target", "other"]
        with pytest.raises(ValueError, match="^draft: 'ngram'"):
            load_for_timing("fake-two", "ngram")
        with pytest.raises(ValueError, match="^prepare: True, False or a list of draft names"):
            load_pair("fake-two", prepare="other")
        # a notebook prepares the draft models its parameters name (a drafter such as ngram is no model)
        e = load_experiment("fake-two", suite="embedded", n_per_category=1, prepare_drafts=["ngram", "other"])
        assert roles(e.pair) == ["target", "other"]
        with pytest.raises(ValueError, match="^prepare_drafts: "):
            load_experiment("fake-two", prepare_drafts="other")
    finally:
        registry.unregister_pair("fake-two")
