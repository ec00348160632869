"""M1 suites: format, hashing, processing, the embedded and Spec-Bench sources (offline)."""

from __future__ import annotations

import json

import pytest

from spade_lib import paths
from spade_lib.bench import (EMBEDDED_CATEGORIES, MT_BENCH_CATEGORIES, SPEC_BENCH_SUBTASKS, Suite, SuiteSpec,
                             build_suite, dedup, default_suite, from_specbench, length_tier, load_suite,
                             manifest_path, named_source, normalise, prompt_token_ids, read_jsonl,
                             render_prompt, source_from_dict, spec_from_manifest)
from spade_lib.bench.embedded import embedded_candidates, split_prose
from spade_lib.bench.process import stratified_sample
from spade_lib.bench.sources import source_to_dict


@pytest.fixture(scope="module")
def tok():
    """A tiny byte-level BPE trained here (no hub, no zoo build)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator(["def f(x):\n    return x + 1\n", "The quick brown fox jumps over the lazy dog."] * 20,
                          trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def embedded_suite(tok):
    return default_suite(tokenizer=tok, n_per_category=10, seed=0)


def specbench_file(tmp_path, rows=None):
    rows = rows or ([{"question_id": 81 + i, "category": c, "turns": [f"{c} question {i}", "and a follow-up"]}
                     for i, c in enumerate(MT_BENCH_CATEGORIES)]
                    + [{"question_id": 200 + i, "category": "translation", "turns": [f"Translate German: Satz {i}"],
                        "reference": [f"sentence {i}"]} for i in range(3)])
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- format ---------------------------------------------------------------------------------------

def test_save_load_roundtrip_and_manifest(embedded_suite, tmp_path):
    path = embedded_suite.save(tmp_path / "s.jsonl")
    m = json.loads(manifest_path(path).read_text())
    import hashlib
    assert m["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    for key in ("name", "version", "spec", "seed", "licenses", "counts", "length_stats", "tokenizer", "software"):
        assert key in m, key
    back = load_suite(path)
    assert back.rows == embedded_suite.rows and back.name == embedded_suite.name
    assert back.to_jsonl() == path.read_bytes()


def test_rows_have_specbench_shape_and_spade_fields(embedded_suite):
    for r in embedded_suite.rows:
        assert isinstance(r["question_id"], int) and isinstance(r["category"], str)
        assert isinstance(r["turns"], list) and r["turns"] and all(isinstance(t, str) for t in r["turns"])
        assert r["source"] == "embedded" and r["source_id"] and r["subtask"] == r["category"]
        assert r["n_tokens"] > 0 and r["length_tier"] in ("short", "medium", "long")
    assert [r["question_id"] for r in embedded_suite.rows] == list(range(1, len(embedded_suite) + 1))


def test_tampered_file_is_refused(embedded_suite, tmp_path):
    path = embedded_suite.save(tmp_path / "s.jsonl")
    data = path.read_bytes()
    path.write_bytes(data.replace(b"def ", b"def  ", 1))
    with pytest.raises(ValueError, match="modified"):
        load_suite(path)
    load_suite(path, verify=False)  # an explicit opt-out still reads it


def test_corrupt_line_names_file_and_line(embedded_suite, tmp_path):
    path = embedded_suite.save(tmp_path / "s.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2][:-5] + "\n"
    path.write_text("".join(lines))
    with pytest.raises(ValueError, match=r"s\.jsonl:3: not valid JSON"):
        read_jsonl(path)


@pytest.mark.parametrize("row, message", [
    ({"question_id": 1, "turns": ["x"]}, r"missing field\(s\) \['category'\]"),
    ({"question_id": "1", "category": "a", "turns": ["x"]}, "question_id must be an int"),
    ({"question_id": 1, "category": "a", "turns": "x"}, "turns must be a non-empty list"),
    ({"question_id": 1, "category": "a", "turns": [" "]}, "first turn is empty"),
])
def test_bad_rows(tmp_path, row, message):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=message):
        read_jsonl(path, spade=False)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest"):
        load_suite(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "nope.jsonl")


def test_to_frame(embedded_suite):
    df = embedded_suite.to_frame()
    assert len(df) == len(embedded_suite)
    assert {"question_id", "category", "subtask", "turns", "n_tokens", "length_tier", "prompt"} <= set(df.columns)
    assert df.groupby("category").size().to_dict() == {c: 10 for c in EMBEDDED_CATEGORIES}


def test_filter_subset(embedded_suite):
    sub = embedded_suite.filter(categories=["structured"], n_per_category=3)
    assert [r["category"] for r in sub.rows] == ["structured"] * 3
    assert sub.manifest["subset_of"]["name"] == embedded_suite.name
    with pytest.raises(ValueError, match="this suite has"):
        embedded_suite.filter(categories=["nope"])


# --- processing -----------------------------------------------------------------------------------

def test_dedup_exact_and_normalised():
    rows = [{"category": "a", "turns": t} for t in (["Hello  World"], ["Hello  World"], ["hello world\n"], ["other"])]
    kept, counts = dedup(rows)
    assert [r["turns"] for r in kept] == [["Hello  World"], ["other"]]
    assert counts == {"exact": 1, "normalised": 1}
    assert normalise("ＡＢ\t c ") == "ab c"  # NFKC folds full-width letters


def test_length_tiers():
    assert [length_tier(n, (4, 8)) for n in (0, 3, 4, 7, 8, 100)] == ["short"] * 2 + ["medium"] * 2 + ["long"] * 2
    assert length_tier(None) is None


def test_stratified_sample_is_seeded_nested_and_independent():
    rows = [{"category": c, "turns": [f"{c}{i}"]} for c in "ab" for i in range(30)]
    s1, _ = stratified_sample(rows, 5, seed=3)
    s2, _ = stratified_sample(rows, 5, seed=3)
    s3, _ = stratified_sample(rows, 5, seed=4)
    big, _ = stratified_sample(rows, 12, seed=3)
    only_a, _ = stratified_sample([r for r in rows if r["category"] == "a"], 5, seed=3)
    assert s1 == s2 and s1 != s3
    assert all(r in big for r in s1)  # same seed: the small sample is inside the big one
    assert [r for r in s1 if r["category"] == "a"] == only_a  # a category's draw ignores the others
    with pytest.raises(ValueError, match="has only 30 prompts"):
        stratified_sample(rows, 31, seed=0)
    out, stats = stratified_sample(rows, 31, seed=0, allow_fewer=True)
    assert len(out) == 60 and stats["a"] == {"available": 30, "selected": 30}
    with pytest.raises(ValueError, match=r"known categories: \['a', 'b'\]"):
        stratified_sample(rows, 2, seed=0, categories=["a", "zz"])
    with pytest.raises(ValueError, match="n_per_category"):
        stratified_sample(rows, 0, seed=0)


def test_chat_template_applied_when_present(tok):
    import copy

    chat = copy.deepcopy(tok)
    chat.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
    assert render_prompt("hi", tok) == "hi"
    assert render_prompt("hi", chat) == "<|user|>hi<|assistant|>"
    assert render_prompt("hi", chat, chat_template=False) == "hi"
    with pytest.raises(ValueError, match="no chat template"):
        render_prompt("hi", tok, chat_template=True)
    src = [named_source("embedded")]
    plain = build_suite(SuiteSpec("p", src, n_per_category=2, tokenizer=tok))
    templ = build_suite(SuiteSpec("p", src, n_per_category=2, tokenizer=chat))
    assert [r["turns"] for r in plain.rows] == [r["turns"] for r in templ.rows]  # turns stay raw
    assert all(b["n_tokens"] > a["n_tokens"] for a, b in zip(plain.rows, templ.rows))
    ids = prompt_token_ids(templ, chat)
    assert chat.decode(ids[1]).startswith("<|user|>")


# --- embedded source ------------------------------------------------------------------------------

def test_embedded_categories_have_enough_candidates():
    kept, _ = dedup(embedded_candidates())
    counts = {c: sum(r["category"] == c for r in kept) for c in EMBEDDED_CATEGORIES}
    assert all(n >= 40 for n in counts.values()), counts


def test_embedded_prompts_come_from_heldout_documents_only():
    from spade_lib.bench.embedded import heldout_corpus

    corpus = heldout_corpus()
    heldout = {d.name for d in corpus.heldout}
    train_text = {d.name: d.text for d in corpus.train}
    for r in embedded_candidates():
        doc = r["source_id"].rsplit(":", 1)[0]
        assert doc in heldout and doc not in train_text


def test_split_prose_cuts_at_a_sentence():
    text = "One two three four five six seven eight. Nine ten eleven twelve thirteen fourteen fifteen sixteen."
    head, tail = split_prose(text, 0.5)
    assert head.endswith("eight.") and tail.startswith("Nine")
    assert split_prose("too short", 0.5) is None


def test_same_seed_gives_identical_bytes(tok, tmp_path):
    a = default_suite(tokenizer=tok, n_per_category=6, seed=1)
    b = default_suite(tokenizer=tok, n_per_category=6, seed=1)
    c = default_suite(tokenizer=tok, n_per_category=6, seed=2)
    pa, pb = a.save(tmp_path / "a.jsonl"), b.save(tmp_path / "b" / "a.jsonl")
    assert pa.read_bytes() == pb.read_bytes()
    assert manifest_path(pa).read_bytes() == manifest_path(pb).read_bytes()
    assert a.to_jsonl() != c.to_jsonl()


def test_rebuild_from_manifest_reproduces_bytes(tok, tmp_path):
    suite = build_suite(SuiteSpec("r", ["embedded"], n_per_category=3, seed=5, tokenizer=tok, tier_edges=(20, 90)))
    path = suite.save(tmp_path / "r.jsonl")
    spec = spec_from_manifest(load_suite(path).manifest, tokenizer=tok)
    assert spec.seed == 5 and spec.tier_edges == (20, 90)
    assert build_suite(spec).to_jsonl() == path.read_bytes()


def test_empty_category_and_allow_fewer(tok):
    # every structured prompt is longer than 5 tokens: the category is empty after the length filter
    with pytest.raises(ValueError, match=r"no prompts for \['structured'\] \(after filtering\)"):
        build_suite(SuiteSpec("e", ["embedded"], categories=["structured"], tokenizer=tok, max_tokens=5))
    s = build_suite(SuiteSpec("f", ["embedded"], categories=["reference_prose", "docstring"], n_per_category=500,
                              tokenizer=tok, allow_fewer=True))
    counts = s.manifest["counts"]
    assert counts["short_categories"] == ["docstring", "reference_prose"]
    assert counts["per_category"] == counts["available_per_category"]
    assert s.categories == ["reference_prose", "docstring"]  # the requested order


def test_source_without_prompts_is_refused(tmp_path):
    class Empty:
        kind, name, license = "empty", "empty", "none"

        def load(self):
            return []

    with pytest.raises(ValueError, match="source 'empty' produced no prompts"):
        build_suite(SuiteSpec("x", [Empty()]))


def test_unknown_names_list_the_known_ones(tok):
    with pytest.raises(ValueError, match="known: .*embedded.*spec_bench"):
        named_source("wikipedia")
    with pytest.raises(ValueError, match="the sources have"):
        build_suite(SuiteSpec("x", ["embedded"], categories=["poetry"], tokenizer=tok))
    with pytest.raises(ValueError, match="known embedded categories"):
        embedded_candidates(("poetry",))
    with pytest.raises(ValueError, match="unknown source kind 'web'; known kinds"):
        source_from_dict({"kind": "web"})
    with pytest.raises(ValueError, match="has only"):
        default_suite(tokenizer=tok, n_per_category=10_000)


def test_length_filter_and_tiers_in_manifest(tok):
    s = build_suite(SuiteSpec("f", ["embedded"], tokenizer=tok, min_tokens=40, max_tokens=200,
                              tier_edges=(60, 120)))
    assert all(40 <= r["n_tokens"] <= 200 for r in s.rows)
    assert sum(s.manifest["counts"]["length_filtered"].values()) > 0
    assert {r["length_tier"] for r in s.rows} == {"short", "medium", "long"}
    with pytest.raises(ValueError, match="need a tokenizer"):
        build_suite(SuiteSpec("f", ["embedded"], min_tokens=4))
    with pytest.raises(ValueError, match="tier_edges"):
        build_suite(SuiteSpec("f", ["embedded"], tier_edges=(10, 5)))


def test_source_dict_roundtrip():
    for name in ("embedded", "spec_bench", "translation", "mt_bench"):
        src = named_source(name)
        assert source_from_dict(json.loads(json.dumps(source_to_dict(src)))) == src


# --- Spec-Bench files -----------------------------------------------------------------------------

def test_specbench_format_file(tmp_path, tok):
    suite = from_specbench(specbench_file(tmp_path), tokenizer=tok)
    assert [r["question_id"] for r in suite.rows][:2] == [81, 82]  # Spec-Bench ids are kept
    subtasks = suite.manifest["counts"]["per_subtask"]
    assert subtasks == {"mt_bench": 8, "translation": 3}
    assert suite.rows[0]["turns"] == ["writing question 0", "and a follow-up"]  # multi-turn kept
    assert suite.rows[-1]["reference"] == ["sentence 2"]
    path = suite.save(tmp_path / "out" / "spec.jsonl")
    assert load_suite(path).rows == suite.rows


def test_specbench_sampling_renumbers(tmp_path):
    suite = build_suite(SuiteSpec("sb", [source_from_dict({"kind": "specbench", "path": str(specbench_file(tmp_path))})],
                                  n_per_category=1, seed=0))
    assert [r["question_id"] for r in suite.rows] == list(range(1, 10))
    assert all(r["n_tokens"] is None and r["length_tier"] is None for r in suite.rows)


def test_specbench_bad_line(tmp_path):
    path = specbench_file(tmp_path)
    path.write_text(path.read_text() + '{"question_id": 999, "category": "qa"}\n')
    with pytest.raises(ValueError, match=r"question\.jsonl:12: missing field"):
        from_specbench(path)


def test_real_specbench_file_480_prompts_6_subtasks(spec_bench_questions):
    suite = from_specbench(spec_bench_questions)
    assert len(suite) == 480
    assert suite.manifest["counts"]["per_subtask"] == {s: 80 for s in SPEC_BENCH_SUBTASKS}
    assert len(suite.categories) == 13
    assert sum(len(r["turns"]) == 2 for r in suite.rows) == 80  # MT-bench is two-turn


# --- the committed suite --------------------------------------------------------------------------

COMMITTED = paths.DATA_DIR / "embedded.jsonl"


@pytest.mark.skipif(not COMMITTED.is_file(), reason="no committed embedded suite under data/")
def test_committed_suite_verifies():
    suite = load_suite(COMMITTED)
    assert suite.manifest["counts"]["per_category"] == {c: 40 for c in EMBEDDED_CATEGORIES}


@pytest.mark.slow
@pytest.mark.skipif(not COMMITTED.is_file(), reason="no committed embedded suite under data/")
def test_committed_suite_is_reproduced_byte_for_byte(tmp_path):
    """On every Python: the corpus is cut from the pinned transformers wheel, not the stdlib."""
    manifest = load_suite(COMMITTED).manifest
    assert manifest["provenance"]["embedded"]["source_package"] == "transformers==5.24.0"
    rebuilt = build_suite(spec_from_manifest(manifest))  # loads the "default" tokenizer from the zoo
    assert rebuilt.to_jsonl() == COMMITTED.read_bytes()
    path = rebuilt.save(tmp_path / COMMITTED.name)
    assert manifest_path(path).read_bytes() == manifest_path(COMMITTED).read_bytes()
