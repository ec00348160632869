"""vLLM's speculators format both ways, against the ``speculators`` package itself.

(a) a head saved by SPADE loads back identical (no package needed); (b) a folder written by
``Eagle3DraftModel.save_pretrained`` loads into SPADE's head with the same training-time-test logits;
(c) a folder written by SPADE loads into ``Eagle3DraftModel.from_pretrained`` with the same logits.
(b) and (c) run speculators in a child process (tests/speculators_pkg.py obtains the package outside
the venv) and skip, with the reason, when it cannot be had.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from spade_lib.decoding.drafts.eagle import EagleHead
from spade_lib.zoo.speculators_format import is_speculators_folder, load_speculators, save_speculators

from speculators_pkg import REPO, run_with_speculators, speculators_dir

V, VD, H = 96, 40, 32
REF = REPO / "tests" / "speculators_ref.py"


def tiny_target(layers=8, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def random_head(target, vocab=VD, seed=1):
    torch.manual_seed(seed)
    head = EagleHead.from_target(target, draft_token_ids=torch.randperm(V)[:vocab] if vocab < V else None)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if not name.startswith("embed_tokens"):
                p.add_(0.1 * torch.randn_like(p))
    return head


@pytest.fixture(scope="module")
def speculators():
    folder, reason = speculators_dir()
    if folder is None:
        pytest.skip(reason)
    return folder


def test_spade_head_round_trips_identical(tmp_path):
    target = tiny_target()
    for vocab in (VD, V):  # a pruned vocabulary (d2t, t2d saved) and the whole one (no maps)
        head = random_head(target, vocab)
        folder = save_speculators(head, tmp_path / f"h{vocab}", verifier_name_or_path="org/target")
        assert is_speculators_folder(folder)
        back = load_speculators(folder, target=target)
        assert back.embed_tokens.weight is target.get_input_embeddings().weight
        sd, sd_back = head.state_dict(), back.state_dict()
        assert sd.keys() == sd_back.keys()
        assert all(torch.equal(sd[k], sd_back[k]) for k in sd)
        assert torch.equal(head.draft_ids, back.draft_ids)
        assert back.config.feature_layers == head.config.feature_layers and back.config.layer == head.config.layer
        feats, toks = torch.randn(1, 7, 3 * H), torch.randint(0, V, (1, 9))
        with torch.no_grad():
            for a, b in zip(head.unrolled(feats, toks, 3)[0], back.unrolled(feats, toks, 3)[0]):
                assert torch.equal(a, b)


def test_written_folder_has_the_speculators_names(tmp_path):
    head = random_head(tiny_target())
    folder = save_speculators(head, tmp_path / "h", include_embeddings=True, speculative_tokens=4)
    config = json.loads((folder / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3DraftModel"]
    assert config["draft_vocab_size"] == VD and config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["norm_before_residual"] is False  # vLLM reads a missing key as True
    tl = config["transformer_layer_config"]
    assert tl["model_type"] == "llama" and tl["num_hidden_layers"] == 1 and tl["vocab_size"] == V
    proposal = config["speculators_config"]["proposal_methods"][0]
    assert proposal["proposal_type"] == "greedy" and proposal["speculative_tokens"] == 4
    shapes = {k: tuple(v.shape) for k, v in load_file(str(folder / "model.safetensors")).items()}
    assert shapes == {
        "embed_tokens.weight": (V, H), "fc.weight": (H, 3 * H), "norm.weight": (H,), "lm_head.weight": (VD, H),
        "d2t": (VD,), "t2d": (V,),
        "layers.0.self_attn.q_proj.weight": (H, 2 * H), "layers.0.self_attn.k_proj.weight": (16, 2 * H),
        "layers.0.self_attn.v_proj.weight": (16, 2 * H), "layers.0.self_attn.o_proj.weight": (H, H),
        "layers.0.mlp.gate_proj.weight": (64, H), "layers.0.mlp.up_proj.weight": (64, H),
        "layers.0.mlp.down_proj.weight": (H, 64), "layers.0.input_layernorm.weight": (H,),
        "layers.0.post_attention_layernorm.weight": (H,), "layers.0.hidden_norm.weight": (H,)}


def test_unsupported_folders_and_heads_are_refused(tmp_path):
    target = tiny_target()
    folder = save_speculators(random_head(target), tmp_path / "h")
    config = json.loads((folder / "config.json").read_text())
    for key, value, match in (("norm_before_fc", True, "norm_before_fc"), ("speculators_model_type", "mtp", "folder"),
                              ("transformer_layer_config", {**config["transformer_layer_config"], "model_type": "qwen3"},
                               "model_type")):
        (folder / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises((ValueError, NotImplementedError), match=match):
            load_speculators(folder, target=target)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="target"):
        load_speculators(folder)  # no embedding saved and no target to take it from
    with pytest.raises(ValueError, match="target"):
        load_speculators(folder, target=_with_vocab(V + 4))  # another vocabulary
    eagle1 = EagleHead.from_target(target, variant="eagle1")
    with pytest.raises(ValueError, match="eagle3"):
        save_speculators(eagle1, tmp_path / "e1")


def test_a_broken_folder_is_refused_at_load_naming_the_file_and_the_field(tmp_path):
    """Issue 57: head folders are validated when they load. Before, an all-NaN ``fc.weight`` or ``embed_tokens``
    loaded and died later in a torch IndexError, a config without ``draft_vocab_size`` gave a bare KeyError,
    ``'abc'`` an ``int()`` error, a shape mismatch torch's load_state_dict dump, a float ``d2t`` was truncated to
    integers and an int64 ``lm_head.weight`` cast silently; a missing config.json said little."""
    target = tiny_target()
    good = save_speculators(random_head(target), tmp_path / "good", include_embeddings=True)
    config = json.loads((good / "config.json").read_text())
    state = load_file(str(good / "model.safetensors"))
    assert load_speculators(good, target=target) is not None

    def broken(name, *, config_changes=None, drop=(), tensors=None):
        folder = tmp_path / name
        folder.mkdir()
        c = {k: v for k, v in {**config, **(config_changes or {})}.items() if k not in drop}
        (folder / "config.json").write_text(json.dumps(c))
        save_file({**state, **(tensors or {})}, str(folder / "model.safetensors"))
        return folder

    cases = [
        (broken("nan_fc", tensors={"fc.weight": torch.full_like(state["fc.weight"], float("nan"))}),
         ValueError, r"^fc.weight: .*nan_fc/model.safetensors holds NaN"),
        (broken("nan_embed", tensors={"embed_tokens.weight": torch.full_like(state["embed_tokens.weight"], float("nan"))}),
         ValueError, r"^embed_tokens.weight: .*nan_embed/model.safetensors holds NaN"),
        (broken("no_vd", drop=("draft_vocab_size",)), ValueError, r"^draft_vocab_size: .*no_vd/config.json lacks it"),
        (broken("abc_vd", config_changes={"draft_vocab_size": "abc"}), TypeError,
         r"^draft_vocab_size: must be an integer .*'abc'.*abc_vd/config.json"),
        (broken("shape", tensors={"lm_head.weight": torch.zeros(VD + 1, H)}), ValueError,
         rf"^lm_head.weight: .*shape/model.safetensors has shape \[{VD + 1}, {H}\], the head's config gives \[{VD}, {H}\]"),
        (broken("float_d2t", tensors={"d2t": state["d2t"].float() + 0.4}), TypeError,
         r"^d2t: .*float_d2t/model.safetensors holds torch.float32, a map must hold integers"),
        (broken("int_lm_head", tensors={"lm_head.weight": state["lm_head.weight"].long()}), TypeError,
         r"^lm_head.weight: .*int_lm_head/model.safetensors holds torch.int64, a weight must be floating-point"),
        (broken("bad_layers", config_changes={"eagle_aux_hidden_state_layer_ids": [1, "x", 3]}), TypeError,
         r"^eagle_aux_hidden_state_layer_ids\[1\]: must be an integer"),
    ]
    for folder, error, match in cases:
        with pytest.raises(error, match=match):
            load_speculators(folder, target=target)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"folder: .*empty has no config.json \(a head folder holds"):
        load_speculators(tmp_path / "empty", target=target)
    assert not is_speculators_folder(tmp_path / "empty")
    with pytest.raises(TypeError, match="dtype: must be a floating-point torch.dtype"):
        load_speculators(good, target=target, dtype=torch.int64)
    with pytest.raises(TypeError, match="d2t: must hold integer offsets, got torch.float32"):
        random_head(target).set_vocab_maps(state["d2t"].float(), None)


def _with_vocab(v):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=v, hidden_size=H, intermediate_size=64, num_hidden_layers=8, num_attention_heads=4,
                      num_key_value_heads=2)
    return LlamaForCausalLM(cfg).eval()


def test_a_folder_written_by_speculators_loads_with_the_same_logits(speculators, tmp_path):
    out = run_with_speculators(speculators, REF, "write", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    ref = load_file(str(tmp_path / "reference.safetensors"))
    head = load_speculators(tmp_path / "model")  # the folder carries its embedding
    assert head.config.feature_layers == (1, 3, 5) and head.config.draft_vocab_size == VD
    toks = torch.cat([ref["input_ids"], torch.zeros(1, 2, dtype=torch.long)], dim=1)  # speculators pads with 0
    with torch.no_grad():
        logits, _ = head.unrolled(ref["hidden_states"], toks, steps=3)
    for i in range(3):
        torch.testing.assert_close(logits[i], ref[f"logits_{i}"], rtol=1e-5, atol=1e-5)


def test_a_folder_written_by_spade_loads_in_speculators_with_the_same_logits(speculators, tmp_path):
    target = tiny_target()
    target.save_pretrained(tmp_path / "verifier")  # speculators loads the verifier's config and weights
    head = random_head(target)
    folder = save_speculators(head, tmp_path / "head", include_embeddings=True,
                              verifier_name_or_path=str(tmp_path / "verifier"))
    hidden_states, input_ids = torch.randn(1, 10, 3 * H), torch.randint(0, V, (1, 10))
    save_file({"hidden_states": hidden_states, "input_ids": input_ids}, str(tmp_path / "io.safetensors"))
    out = run_with_speculators(speculators, REF, "forward", str(folder), str(tmp_path / "io.safetensors"),
                               str(tmp_path / "out.safetensors"))
    assert out.returncode == 0, out.stderr[-3000:]
    ref = load_file(str(tmp_path / "out.safetensors"))
    with torch.no_grad():
        logits, _ = head.unrolled(hidden_states, torch.cat([input_ids, torch.zeros(1, 2, dtype=torch.long)], 1), 3)
    for i in range(3):
        torch.testing.assert_close(logits[i], ref[f"logits_{i}"], rtol=1e-5, atol=1e-5)


def test_load_pair_takes_a_speculators_folder_as_a_head(tmp_path):
    from spade_lib.decoding.drafts.drafters import make_drafter
    from spade_lib.decoding.drafts.eagle import EagleDrafter
    from spade_lib.zoo.configs import TokenizerConfig
    from spade_lib.zoo.pairs import load_pair
    from spade_lib.zoo.tokenizer import train_tokenizer

    tok = train_tokenizer(["def f(x):\n    return x + 1\n" * 20], TokenizerConfig(vocab_size=300, min_frequency=1))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=H, intermediate_size=64, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    target = LlamaForCausalLM(cfg).eval()
    target.save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    save_speculators(EagleHead.from_target(target), tmp_path / "eagle3", verifier_name_or_path=str(tmp_path / "target"))
    pair = load_pair(target=str(tmp_path / "target"), draft=str(tmp_path / "eagle3"))
    assert pair.drafts == {} and set(pair.heads) == {"draft"} and pair.draft is pair.heads["draft"]
    assert pair.heads["draft"].embed_tokens.weight is pair.target.get_input_embeddings().weight
    assert pair.manifest["heads"] == {"draft": str(tmp_path / "eagle3")}
    assert isinstance(make_drafter("draft", pair), EagleDrafter) and isinstance(make_drafter("eagle", pair), EagleDrafter)


# --------------------------------------------------------------------------------- a Gemma-3 verifier (issue 40)

def gemma_head(target, vocab=VD, seed=1):
    """An EAGLE-3 head over the tiny Gemma-3 of test_zoo_gemma3 (4 layers: features (1, 2, 3)), a pruned vocabulary."""
    from test_zoo_gemma3 import VOCAB

    torch.manual_seed(seed)
    head = EagleHead.from_target(target, draft_token_ids=torch.randperm(VOCAB)[:vocab], feature_layers=(1, 2, 3))
    with torch.no_grad():
        for name, p in head.named_parameters():
            if not name.startswith("embed_tokens"):
                p.add_(0.1 * torch.randn_like(p))
    return head


def test_a_gemma_verifier_head_round_trips_identical(tmp_path):
    """Gemma3ForCausalLM as the verifier, d2t / t2d of the reduced vocabulary, the embedding scale kept."""
    from test_zoo_gemma3 import VOCAB, tiny_gemma3

    target = tiny_gemma3()
    head = gemma_head(target)
    folder = save_speculators(head, tmp_path / "g", verifier_name_or_path="google/gemma-3-270m")
    config = json.loads((folder / "config.json").read_text())
    assert config["speculators_config"]["verifier"] == {"name_or_path": "google/gemma-3-270m",
                                                        "architectures": ["Gemma3ForCausalLM"]}
    assert config["embed_scale"] == 8.0 and config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    tl = config["transformer_layer_config"]
    assert tl["model_type"] == "llama" and tl["vocab_size"] == VOCAB and tl["hidden_act"] == "silu"
    tensors = load_file(str(folder / "model.safetensors"))
    assert tensors["t2d"].dtype == torch.bool and int(tensors["t2d"].sum()) == VD
    ids = torch.arange(VD) + tensors["d2t"]
    assert torch.equal(ids, head.draft_ids) and bool(tensors["t2d"][ids].all())
    back = load_speculators(folder, target=target)
    assert back.config.embed_scale == 8.0 and back.config.meta["verifier_architectures"] == ["Gemma3ForCausalLM"]
    assert back.embed_tokens.weight is target.get_input_embeddings().weight
    sd, sd_back = head.state_dict(), back.state_dict()
    assert sd.keys() == sd_back.keys() and all(torch.equal(sd[k], sd_back[k]) for k in sd)
    x = torch.randint(0, VOCAB, (9,))
    with torch.no_grad():
        assert torch.equal(back.embed(x), target.get_input_embeddings()(x))
        feats, toks = torch.randn(1, 7, 3 * 64), torch.randint(0, VOCAB, (1, 9))
        for a, b in zip(head.unrolled(feats, toks, 3)[0], back.unrolled(feats, toks, 3)[0]):
            assert torch.equal(a, b)
    config.pop("embed_scale")  # a folder speculators wrote for a Gemma verifier: its plain embedding (s = 1)
    (folder / "config.json").write_text(json.dumps(config))
    assert load_speculators(folder, target=target).config.embed_scale == 1.0


def test_a_gemma_verifier_folder_written_by_spade_loads_in_speculators(speculators, tmp_path):
    """speculators loads the folder with its Gemma-3 verifier (weights from the verifier's own folder) and
    computes SPADE's function with a plain embedding: equal to SPADE's head with s = 1, and to the scaled
    head up to the input norm's eps (module docstring of speculators_format)."""
    import dataclasses

    from test_zoo_gemma3 import VOCAB, tiny_gemma3

    target = tiny_gemma3()
    target.save_pretrained(tmp_path / "verifier")
    head = gemma_head(target)
    folder = save_speculators(head, tmp_path / "head", include_embeddings=True,
                              verifier_name_or_path=str(tmp_path / "verifier"))
    hidden_states, input_ids = torch.randn(1, 10, 3 * 64), torch.randint(0, VOCAB, (1, 10))
    save_file({"hidden_states": hidden_states, "input_ids": input_ids}, str(tmp_path / "io.safetensors"))
    out = run_with_speculators(speculators, REF, "forward", str(folder), str(tmp_path / "io.safetensors"),
                               str(tmp_path / "out.safetensors"))
    assert out.returncode == 0, out.stderr[-3000:]
    ref = load_file(str(tmp_path / "out.safetensors"))
    plain = EagleHead(dataclasses.replace(head.config, embed_scale=1.0))
    plain.load_state_dict(head.state_dict())
    plain.tie_to_target(target)
    toks = torch.cat([input_ids, torch.zeros(1, 2, dtype=torch.long)], 1)
    with torch.no_grad():
        unscaled, _ = plain.eval().unrolled(hidden_states, toks, 3)
        scaled, _ = head.unrolled(hidden_states, toks, 3)
    for i in range(3):
        torch.testing.assert_close(unscaled[i], ref[f"logits_{i}"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(scaled[i], ref[f"logits_{i}"], rtol=1e-4, atol=1e-4)
