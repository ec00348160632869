"""The embedded pair: load_pair("tiny") from an empty cache, save/load round trips, bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from spade_lib import paths
from spade_lib.zoo import PAIRS
from spade_lib.zoo.build import pair_entry
from spade_lib.zoo.cache import read_manifest, verify_entry
from spade_lib.zoo.configs import TINY, ModelConfig, TokenizerConfig, TrainConfig
from spade_lib.zoo.corpus import Document
from spade_lib.zoo.data import encode_documents, eval_windows
from spade_lib.zoo.evaluate import teacher_forced_stats
from spade_lib.zoo.pairs import load_pair, load_tokenizer, pair_built, pair_names
from spade_lib.zoo.tokenizer import train_tokenizer
from spade_lib.zoo.train import new_model, train_model


@pytest.fixture(scope="module")
def zoo_cache(tmp_path_factory):
    """An empty project cache for this module (``spade_lib.paths.CACHE_DIR`` is read at call time)."""
    cache = tmp_path_factory.mktemp("spade_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paths, "CACHE_DIR", cache)
        yield cache


@pytest.fixture(scope="module")
def tiny(zoo_cache):
    assert not (zoo_cache / "zoo").exists()
    return load_pair("tiny")


def test_pair_built_says_what_would_load_without_a_build(tiny, zoo_cache):
    """Only the tiny pair is in this module's cache: the others are not built, and asking builds nothing."""
    assert pair_built("tiny")
    assert not any(pair_built(n) for n in ("default", "smollm2", "gemma3"))
    assert sorted(p.name for p in (zoo_cache / "zoo").iterdir() if p.is_dir()) == sorted(
        p.name for p in (zoo_cache / "zoo").iterdir() if p.is_dir() and p.name.startswith("tiny-"))
    with pytest.raises(ValueError, match="^name: unknown pair 'nope'"):
        pair_built("nope")


def test_tiny_pair_from_empty_cache(tiny, zoo_cache):
    assert tiny.name == "tiny" and tiny.path.parent == zoo_cache / "zoo"
    assert set(tiny.drafts) == {"distilled", "data_only"} and tiny.draft is tiny.drafts["distilled"]
    assert verify_entry(tiny.path) is None
    assert repr(tiny).startswith("Pair(name='tiny', target=LlamaForCausalLM(") and len(repr(tiny)) < 400
    for model in (tiny.target, *tiny.drafts.values()):
        assert not model.training and model.dtype == torch.float32
        assert model.config.vocab_size == len(tiny.tokenizer)
        assert model.config.bos_token_id == model.config.eos_token_id == model.config.pad_token_id == 0
    tok = tiny.tokenizer
    assert tok.convert_ids_to_tokens(0) == "<|endoftext|>"
    assert tok.bos_token_id == tok.eos_token_id == tok.pad_token_id == 0
    text = "def f(x):\n    return x ** 2  # é\n"
    assert tok.decode(tok(text)["input_ids"]) == text
    m = tiny.manifest
    assert m["corpus"]["sha256"] and m["environment"]["python_version"]
    assert set(m["models"]) == {"target", "distilled", "data_only"}
    assert all(v["train_curve"] for v in m["models"].values())
    assert 0 < m["models"]["distilled"]["alpha"] <= 1 and m["costs"]["verify_cost_ratio"] > 0


def test_second_load_reuses_the_entry(tiny):
    again = load_pair("tiny", draft="data_only")
    assert again.path == tiny.path and again.manifest["build_id"] == tiny.manifest["build_id"]
    assert again.draft is again.drafts["data_only"]
    for a, b in zip(again.target.state_dict().values(), tiny.target.state_dict().values()):
        assert torch.equal(a, b)


def test_loaded_models_reproduce_the_build_figures(tiny):
    """The manifest's figures were computed on the in-memory models before saving."""
    held = encode_documents(tiny.tokenizer, _heldout())
    windows = eval_windows(held, TINY.eval.n_windows, TINY.eval.seq_len)
    stats = teacher_forced_stats(tiny.target, tiny.drafts, windows, temperatures=TINY.eval.temperatures)
    for name in ("target", "distilled", "data_only"):
        assert stats[name]["val_loss"] == pytest.approx(tiny.manifest["models"][name]["val_loss"], rel=1e-6)
    for name in tiny.drafts:
        assert stats[name]["alpha"] == pytest.approx(tiny.manifest["models"][name]["alpha"], rel=1e-6)


def _heldout() -> list[Document]:
    from spade_lib.zoo.build import cached_corpus

    return cached_corpus(TINY.corpus).heldout


def test_save_pretrained_round_trip_gives_equal_logits(tiny, tmp_path):
    """A freshly trained model saved like the zoo saves it and loaded back through the Auto classes."""
    vocab = len(tiny.tokenizer)
    model = new_model(ModelConfig(n_layers=1, hidden=32, n_heads=2, intermediate=64, max_positions=128), vocab, 3)
    stream = torch.randint(1, vocab, (2000,), generator=torch.Generator().manual_seed(0))
    train_model(model, stream, TrainConfig(steps=3, batch_size=2, seq_len=16, warmup=1))
    model.save_pretrained(tmp_path / "m")
    tiny.tokenizer.save_pretrained(tmp_path / "m")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32, use_safetensors=True).eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    x = torch.tensor([tok("import os\nclass A:\n    pass")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, loaded(input_ids=x).logits)
    assert tok.get_vocab() == tiny.tokenizer.get_vocab()


def test_real_pair_from_local_folders_matches_embedded(tiny):
    pair = load_pair(target=str(tiny.path / "target"), draft=str(tiny.path / "drafts" / "data_only"))
    assert pair.default_draft == "draft" and pair.manifest["kind"] == "hf"
    x = torch.tensor([tiny.tokenizer("for i in range(10):")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(pair.target(input_ids=x).logits, tiny.target(input_ids=x).logits)
        assert torch.equal(pair.draft(input_ids=x).logits, tiny.drafts["data_only"](input_ids=x).logits)


def test_load_tokenizer_matches_the_pair(tiny):
    tok = load_tokenizer("tiny")
    assert tok.get_vocab() == tiny.tokenizer.get_vocab() and tok.eos_token_id == 0


def test_unknown_name_lists_known_pairs():
    with pytest.raises(ValueError, match="default.*tiny"):
        load_pair("huge")
    with pytest.raises(ValueError, match="known pairs"):
        load_tokenizer("huge")
    assert pair_names() == sorted(PAIRS)


def test_bad_draft_arguments(tiny):
    with pytest.raises(ValueError, match="draft"):
        load_pair("tiny", draft="nope")
    with pytest.raises(ValueError, match="drafts"):
        load_pair("tiny", drafts={"a": "b"})
    with pytest.raises(ValueError, match="draft"):
        load_pair(target=str(tiny.path / "target"))


def test_missing_local_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="target.*does not exist"):
        load_pair(target=str(tmp_path / "nope"), draft=str(tmp_path / "nope2"))


def test_unsupported_dtype_is_refused_before_loading(tmp_path):
    for dtype in ("int8", torch.int8):  # by name here, not by transformers naming the target
        with pytest.raises(ValueError, match=r"^dtype: must be one of \['float32', 'bfloat16', 'float16'\], got 'int8'"):
            load_pair(target=str(tmp_path / "nope"), draft=str(tmp_path / "nope2"), dtype=dtype)


def test_unreachable_hub_id_is_a_clear_error(tiny, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="draft.*HF_HUB_OFFLINE"):
        load_pair(target=str(tiny.path / "target"), draft="spade-test/no-such-model")


def test_a_draft_with_its_own_tokenizer_is_a_cross_vocabulary_draft(tiny, tmp_path):
    """A draft whose tokenizer differs is loaded with its own tokenizer (not refused), ``make_drafter``
    drafts with it through the text, and greedy decoding still equals the target's greedy output."""
    from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
    from spade_lib.decoding.drafts.crossvocab import TextDrafter
    from spade_lib.decoding.drafts.drafters import make_drafter
    from spade_lib.sampling import SamplingConfig

    other = tmp_path / "other_draft"
    tok = train_tokenizer(["def f(x):\n    return x\n" * 50, "print('hello world')\n" * 50],
                          TokenizerConfig(vocab_size=300))
    model = new_model(ModelConfig(n_layers=1, hidden=32, n_heads=2, intermediate=64, max_positions=256),
                      len(tok), seed=3).eval()
    model.save_pretrained(other, safe_serialization=True)
    tok.save_pretrained(other)
    pair = load_pair(target=str(tiny.path / "target"), drafts={"own": str(other), "same": str(tiny.path / "drafts" /
                                                                                          "data_only")})
    assert sorted(pair.draft_tokenizers) == ["own"]  # the draft with the target's tokenizer shares it
    assert len(pair.draft_tokenizers["own"]) == len(tok) != len(pair.tokenizer)
    assert "own vocab" in repr(pair)
    drafter = make_drafter("own", pair)
    assert isinstance(drafter, TextDrafter) and drafter.draft_tokenizer is pair.draft_tokenizers["own"]
    assert not isinstance(make_drafter("same", pair), TextDrafter)
    greedy = SamplingConfig(temperature=0)
    ids = pair.tokenizer.encode("def f(x):\n    return", add_special_tokens=False)
    ref = AutoregressiveDecoder(pair.target, sampling=greedy).generate(ids, 24)
    out = SpeculativeDecoder(pair.target, make_drafter("own", pair), gamma=3, sampling=greedy).generate(ids, 24)
    assert out.tokens == ref.tokens
    with pytest.raises(ValueError, match=r"^tree: the cross-vocabulary draft 'own' drafts chains only"):
        make_drafter("own", pair, tree="eagle2:nodes=16,depth=4,topk=4")
    with pytest.raises(ValueError, match=r"^options: the cross-vocabulary draft 'own' with rule 'text' takes rule"):
        make_drafter("own", pair, max_ngram=3)
    with pytest.raises(ValueError, match=r"^rule: the cross-vocabulary draft 'own' drafts by one of \('text', 'tli', "
                                         r"'slrs'\), not 'slem'"):
        make_drafter("own", pair, rule="slem")
    # token-level intersection and string-level rejection sampling: the same greedy output
    from spade_lib.decoding.drafts.crossvocab import SLRSDrafter, TLIDrafter

    # (this pair's target tokens reach 20 characters: SLRS's 18,022 draft-token paths are refused by default)
    with pytest.raises(ValueError, match=r"^max_nodes: SLRS enumerates 18022 draft-token paths .* more than "
                                         r"max_nodes=4096"):
        make_drafter("own", pair, rule="slrs")
    for rule, cls, options in (("tli", TLIDrafter, {}), ("slrs", SLRSDrafter, {"max_nodes": 20000})):
        drafter = make_drafter("own", pair, rule=rule, **options)
        assert isinstance(drafter, cls)
        out = SpeculativeDecoder(pair.target, drafter, gamma=3, sampling=greedy).generate(ids, 24)
        assert out.tokens == ref.tokens


def test_same_seed_gives_identical_weights():
    cfg = ModelConfig(n_layers=1, hidden=32, n_heads=2, intermediate=64, max_positions=64)
    stream = torch.randint(1, 300, (3000,), generator=torch.Generator().manual_seed(1))
    runs = []
    for _ in range(2):
        model = new_model(cfg, 300, seed=5)
        runs.append((train_model(model, stream, TrainConfig(steps=4, batch_size=2, seq_len=16, warmup=1)),
                     model.state_dict()))
    assert [c["loss"] for c in runs[0][0]] == [c["loss"] for c in runs[1][0]]
    for a, b in zip(runs[0][1].values(), runs[1][1].values()):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_corrupted_entry_is_rebuilt_with_a_warning(tiny, tmp_path, monkeypatch):
    """Corrupt a copy of the cache: loading warns, rebuilds, and gives the same weights (deterministic)."""
    shutil.copytree(paths.CACHE_DIR, tmp_path / "cache")
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path / "cache")
    entry = pair_entry(TINY)
    assert entry.parent == tmp_path / "cache" / "zoo"
    weights = entry / "target" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert "sha256 mismatch" in verify_entry(entry)
    with pytest.warns(UserWarning, match="corrupted.*rebuilding"):
        pair = load_pair("tiny")
    assert verify_entry(entry) is None and pair.manifest["build_id"] != tiny.manifest["build_id"]
    assert read_manifest(entry)["files"] == tiny.manifest["files"]  # same seed, same threads: same bytes


def test_alpha_is_one_minus_total_variation(tiny):
    """Teacher-forced alpha against a direct 1 - TV reference; a draft equal to the target has alpha 1."""
    x = torch.tensor([tiny.tokenizer("import sys\nprint(sys.argv)\n" * 3)["input_ids"]])
    stats = teacher_forced_stats(tiny.target, {"same": tiny.target, "d": tiny.draft}, x, temperatures=(1.0, 0.5))
    assert stats["same"]["alpha"] == pytest.approx(1.0, abs=1e-6) and stats["same"]["top1_agreement"] == 1.0
    with torch.no_grad():
        p = torch.softmax(tiny.target(input_ids=x[:, :-1]).logits / 0.5, -1)
        q = torch.softmax(tiny.draft(input_ids=x[:, :-1]).logits / 0.5, -1)
    reference = 1 - 0.5 * (p - q).abs().sum(-1).mean().item()
    assert stats["d"]["alpha_by_temperature"]["0.5"] == pytest.approx(reference, abs=1e-5)


def test_cost_ratios_put_each_drafts_byte_ratio_beside_its_c(tiny):
    """``cost_ratios``' ``c_bytes``: the draft's bytes a step over the target's, from the lean forwards'
    ``weight_bytes`` (a matrix count of its own here: every projection and the head, never the embedding table)."""
    from spade_lib.zoo.evaluate import cost_ratios

    def step_bytes(m):
        return sum(p.numel() * p.element_size() for n, p in m.named_parameters()
                   if "_proj." in n or n.startswith("lm_head.")
                   or (n.endswith("embed_tokens.weight") and m.config.tie_word_embeddings))

    got = cost_ratios(tiny.target, tiny.drafts, gamma=2, context=8, reps=2)
    for name, draft in tiny.drafts.items():
        assert got["drafts"][name]["c_bytes"] == pytest.approx(step_bytes(draft) / step_bytes(tiny.target), rel=1e-12)
        assert 0 < got["drafts"][name]["c_bytes"] < 1
