"""HF ``datasets`` sources through the real loaders, on local fixtures made here (no network)."""

from __future__ import annotations

import json

import pytest

datasets = pytest.importorskip("datasets")

from spade_lib.bench import HF_SPECS, HFSource, SuiteSpec, build_suite, hf_spec, load_suite  # noqa: E402


@pytest.fixture(autouse=True)
def quiet_datasets():
    datasets.disable_progress_bars()
    yield
    datasets.enable_progress_bars()


def write_json_lines(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_save_to_disk_dataset(tmp_path):
    ds = datasets.Dataset.from_dict({"text": [f"prompt number {i}" for i in range(12)] + ["prompt number 0"],
                                     "idx": list(range(13))})
    ds.save_to_disk(str(tmp_path / "ds"))
    src = HFSource(path=str(tmp_path / "ds"), from_disk=True, name="local", category="toy", subtask="toy",
                   template="Continue: {text}", id_field="idx", license="CC0")
    suite = build_suite(SuiteSpec("toy", [src], n_per_category=5, seed=0))
    assert len(suite) == 5
    assert all(r["turns"][0].startswith("Continue: prompt number") for r in suite.rows)
    assert suite.manifest["counts"]["duplicates_removed"] == {"exact": 1, "normalised": 0}
    assert suite.manifest["licenses"] == {"local": "CC0"}
    path = suite.save(tmp_path / "toy.jsonl")
    assert load_suite(path).rows == suite.rows


def test_save_to_disk_datasetdict_split(tmp_path):
    dd = datasets.DatasetDict({"test": datasets.Dataset.from_dict({"text": ["a b c", "d e f"]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    src = HFSource(path=str(tmp_path / "dd"), from_disk=True, split="test", name="dd", category="c", subtask="c")
    assert [r["turns"] for r in src.load()] == [["a b c"], ["d e f"]]
    with pytest.raises(ValueError, match=r"no split 'train'; splits: \['test'\]"):
        HFSource(path=str(tmp_path / "dd"), from_disk=True, split="train", name="dd", category="c",
                 subtask="c").load()


def test_translation_spec_on_local_json(tmp_path):
    rows = [{"translation": {"de": f"Das ist Satz {i}.", "en": f"This is sentence {i}."}} for i in range(6)]
    src = hf_spec("translation", path="json", config=None, split="train", cache_dir=str(tmp_path / "cache"),
                  data_files=write_json_lines(tmp_path / "wmt.jsonl", rows))
    got = src.load()
    assert got[0]["turns"] == ["Translate German to English: Das ist Satz 0."]
    assert got[0]["reference"] == ["This is sentence 0."]
    assert got[0]["category"] == got[0]["subtask"] == "translation"


def test_mt_bench_spec_multi_turn_with_categories(tmp_path):
    rows = [{"prompt": [f"Write poem {i}.", "Now shorter."], "category": c, "prompt_id": 100 + i, "reference": []}
            for i, c in enumerate(["writing", "coding", "writing"])]
    src = hf_spec("mt_bench", path="json", split="train", cache_dir=str(tmp_path / "cache"),
                  data_files=write_json_lines(tmp_path / "mt.jsonl", rows))
    suite = build_suite(SuiteSpec("mt", [src]))
    assert [r["category"] for r in suite.rows] == ["writing", "writing", "coding"]
    assert suite.rows[0]["turns"] == ["Write poem 0.", "Now shorter."]
    assert {r["subtask"] for r in suite.rows} == {"mt_bench"}
    assert "reference" not in suite.rows[0]  # empty references are dropped
    assert suite.rows[0]["source_id"] == "100"


def test_rag_spec_joins_passages(tmp_path):
    rows = [{"question": "who wrote it", "answers": ["Ann"],
             "ctxs": [{"title": f"T{k}", "text": f"passage {k}"} for k in range(8)]}]
    with pytest.raises(ValueError, match="needs data_files"):
        hf_spec("rag").load()
    src = hf_spec("rag", data_files=write_json_lines(tmp_path / "nq.jsonl", rows), cache_dir=str(tmp_path / "c"))
    (row,) = src.load()
    assert row["turns"] == ["passage 0\npassage 1\npassage 2\npassage 3\npassage 4\nwho wrote it?"]
    assert row["reference"] == [["Ann"]]


def test_missing_field_names_field_and_columns(tmp_path):
    src = HFSource(path="json", data_files=write_json_lines(tmp_path / "x.jsonl", [{"body": "hi"}]), split="train",
                   name="x", category="c", subtask="c", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"row 0: field 'text' not found; the dataset's columns are \['body'\]"):
        src.load()


def test_unreachable_hub_id_gives_a_clear_error(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    src = hf_spec("qa", cache_dir=str(tmp_path / "empty_cache"))
    with pytest.raises(ValueError) as err:
        src.load()
    msg = str(err.value)
    assert "google-research-datasets/nq_open" in msg and "could not be loaded" in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__  # no chained deep trace


def test_every_spec_is_complete():
    assert set(HF_SPECS) >= {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "humaneval"}
    for name, spec in HF_SPECS.items():
        assert spec.license and spec.license != "see the dataset card", name
        assert spec.turns_field or all(f"{{{v}}}" in spec.template for v in spec.fields), name
    with pytest.raises(ValueError, match="known: "):
        hf_spec("imagenet")
    with pytest.raises(ValueError, match="bad override"):
        hf_spec("qa", nonsense=1)
