"""Draft heads on a Gemma-3 target (issue 40), on the tiny random Gemma-3 of ``test_zoo_gemma3`` (sliding-window
layers of 8 tokens beside a global one, QK-norm, tied embeddings, the ``sqrt(H)`` embedding scale), in its
``lively_gemma3`` form, whose greedy text varies with the context.

References: the head embeds a token exactly as the target's own embedding module does; greedy speculative
decoding with every Gemma head (EAGLE-3, Medusa; untrained and trained for a few steps; chains on both
backends, an EAGLE tree on the lean one) emits the target's own greedy tokens (HF ``generate`` /
the autoregressive decoder) past the window; the chunked soft labels of ``extract`` are the full
forward's; the generations-only draft vocabulary is a plain-Python ranking's; and the zoo builds, caches,
loads and attaches Gemma heads through ``pairs.head_entry`` / ``load_pair`` / ``head_cli``.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
import torch

from spade_lib import paths
from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
from spade_lib.decoding.drafts.eagle import EagleConfig, EagleDrafter, EagleHead, NativeRunner, _HFRunner
from spade_lib.decoding.drafts.medusa import MedusaDrafter, MedusaHead
from spade_lib.decoding.model.adapter import CausalLMAdapter
from spade_lib.sampling import SamplingConfig
from spade_lib.zoo import heads
from spade_lib.zoo.head_data import HeadDataConfig, Sequences, extract
from spade_lib.zoo.head_train import HeadTrainConfig

from test_zoo_gemma3 import VOCAB, WINDOW, lively_gemma3, periodic_prompt, tiny_tokenizer

GREEDY = SamplingConfig(temperature=0)
VD = 48
LAYERS = (1, 2, 3)  # the tiny target has 4 layers: speculators' [2, L // 2, L - 3] is not three distinct ones
SMOKE_DATA = HeadDataConfig(n_prompts=6, gen_tokens=12, gen_batch=3, n_windows=6, window=40, max_prompt_tokens=400,
                            heldout_every=3, bos=True)
SMOKE_TRAIN = HeadTrainConfig(steps=6, batch_size=2, seq_len=24, rows=64, warmup=2)
SMOKE = {kind: heads.HeadConfig(kind, draft_vocab_size=VD, vocab_source="generations", data=SMOKE_DATA,
                                train=SMOKE_TRAIN, budget_s=300, threads=1, eval_depth=2,
                                feature_layers=LAYERS if kind == "eagle3" else None, medusa_heads=3)
         for kind in ("eagle3", "medusa")}


@pytest.fixture(scope="module")
def target():
    return lively_gemma3()


def _words(ids) -> str:
    return " ".join(f"t{i}" for i in ids)


def untrained(target, kind: str, seed: int = 0):
    torch.manual_seed(seed)
    vocab = torch.randperm(VOCAB)[:VD]
    if kind == "eagle3":
        head = EagleHead.from_target(target, draft_token_ids=vocab, feature_layers=LAYERS)
    else:
        head = MedusaHead.from_target(target, draft_token_ids=vocab, num_heads=3)
    with torch.no_grad():  # a head of its own, not the target's copy
        for name, p in head.named_parameters():
            if name not in head.tied:
                p.add_(0.05 * torch.randn_like(p))
    return head


def trained(target, kind: str):
    """A head built and trained for a few steps by the zoo's own build (random sequences, held out every 3rd)."""
    g = torch.Generator().manual_seed(5)
    seqs = [torch.tensor(periodic_prompt(40, seed=s)) for s in range(9)]
    gens = Sequences([torch.cat([s, torch.randint(0, VOCAB - 3, (12,), generator=g)]) for s in seqs],
                     [41] * 9, ["generation"] * 9)
    head, facts = heads.build_head(target, tiny_tokenizer(), SMOKE[kind], sequences=gens, cost_reps=1)
    assert facts["steps_done"] == SMOKE_TRAIN.steps and facts["vocab_source"] == "generations"
    return head


# ------------------------------------------------------------------------------------------- the head's shape

def test_the_config_of_a_gemma_target_is_a_llama_layer_with_its_embedding_scale(target):
    c = EagleConfig.for_target(target.config, feature_layers=LAYERS, draft_vocab_size=VD)
    assert c.embed_scale == pytest.approx(64 ** 0.5) and c.layer["hidden_act"] == "silu"
    assert c.layer["rope_parameters"] == target.config.rope_parameters["full_attention"]
    assert c.layer["num_key_value_heads"] == 1 and c.layer["head_dim"] == 16 and c.target_layers == 4
    assert EagleConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert EagleConfig.from_dict({k: v for k, v in c.to_dict().items() if k != "embed_scale"}).embed_scale == 1.0
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="target_config"):
        EagleConfig.for_target(GPT2Config(n_layer=8))
    with pytest.raises(ValueError, match="embed_scale"):
        dataclasses.replace(c, embed_scale=0.0)


def test_the_head_embeds_a_token_as_the_target_does_on_both_engines(target):
    head = untrained(target, "eagle3")
    ids = torch.tensor(periodic_prompt(12))
    with torch.no_grad():
        assert torch.equal(head.embed(ids), target.get_input_embeddings()(ids))  # s E x, s = sqrt(H), bit for bit
        assert not torch.equal(head.embed(ids), head.embed_tokens(ids))
    g = torch.Generator().manual_seed(4)
    feats, toks = torch.randn(7, head.in_features, generator=g), torch.randint(0, VOCAB, (7,), generator=g)
    runners = [_HFRunner(head)] + ([NativeRunner(head)] if NativeRunner.usable(head) else [])
    outs = []
    with torch.inference_mode():
        for run in runners:
            o = run.feed(run.fuse(feats), toks, torch.arange(1, 8))
            outs.append(run.draft_logits(run.feed(run.feedback(o[-1:]), toks[:1], torch.tensor([8]))))
        ref, _ = head.unrolled(feats[None], torch.cat([toks, toks[:1]])[None], steps=2)
    for got in outs:  # the training forward and each drafting engine: one function
        torch.testing.assert_close(got[0], ref[1][0, -1], rtol=1e-4, atol=1e-4)


def test_init_from_a_gemma_layer_takes_its_gains_plus_one(target):
    head = EagleHead.from_target(target, feature_layers=LAYERS)
    src, dst = target.model.layers[-1], head.layers[0]
    assert torch.equal(dst.input_layernorm.weight, 1 + src.input_layernorm.weight)
    assert torch.equal(dst.post_attention_layernorm.weight, 1 + src.pre_feedforward_layernorm.weight)
    assert torch.equal(head.norm.weight, 1 + target.model.norm.weight)
    assert torch.equal(dst.mlp.down_proj.weight, src.mlp.down_proj.weight)
    assert head.embed_tokens.weight is target.get_input_embeddings().weight


# --------------------------------------------------------------------------- greedy SPADE = greedy AR (item 5)

@pytest.mark.parametrize("training", ["untrained", "trained"])
@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
@pytest.mark.parametrize("backend", ["hf", "lean"])
def test_greedy_speculative_decoding_with_every_gemma_head_is_the_targets_greedy_output(target, kind, training,
                                                                                       backend):
    """Past the window (a 30-token prompt, 8-token windows, 40 new tokens): the decoder with the head emits
    the autoregressive decoder's greedy tokens, which are HF ``generate``'s; some drafts were accepted."""
    head = untrained(target, kind) if training == "untrained" else trained(target, kind)
    prompt = periodic_prompt(3 * WINDOW + 6)
    ar = AutoregressiveDecoder(CausalLMAdapter(target, backend=backend), sampling=GREEDY,
                               eos_token_id=[]).generate(prompt, 40)
    x = torch.tensor([prompt])
    ref = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=40, min_new_tokens=40,
                          do_sample=False, eos_token_id=None, pad_token_id=VOCAB - 1)[0, len(prompt):].tolist()
    assert ar.tokens == ref and len(set(ref)) > 5  # the target's own text: not one repeated token
    adapter = CausalLMAdapter(target, backend=backend)
    assert adapter.backend == backend
    res = SpeculativeDecoder(adapter, head.drafter(), gamma=3, sampling=GREEDY, eos_token_id=[]).generate(prompt, 40)
    assert res.tokens == ar.tokens
    assert sum(res.accept_lengths) > 0


def test_an_eagle_tree_on_the_lean_forward_is_the_targets_greedy_output(target):
    head = trained(target, "eagle3")
    prompt = periodic_prompt(3 * WINDOW + 6)
    ar = AutoregressiveDecoder(CausalLMAdapter(target), sampling=GREEDY, eos_token_id=[]).generate(prompt, 32)
    dec = SpeculativeDecoder(CausalLMAdapter(target), EagleDrafter(head, tree="eagle2:nodes=8,depth=3,topk=3"),
                             gamma=3, sampling=GREEDY, eos_token_id=[])
    res = dec.generate(prompt, 32)
    assert res.tokens == ar.tokens and sum(res.accept_lengths) > 0


# ------------------------------------------------------------------------------- data and the draft vocabulary

@pytest.mark.parametrize("family,softcap", [("gemma3", None), ("gemma3", 5.0), ("llama", None)])
def test_chunked_soft_labels_are_the_full_forwards(family, softcap):
    """``extract`` never holds a batch's logits: its top-k and log-normaliser, from ``h^L`` a few rows at a
    time, equal those of the model's own full forward (with Gemma-2-style final soft-capping too)."""
    if family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                             num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3,
                                             bos_token_id=None, eos_token_id=None, pad_token_id=None)).eval()
    else:
        model = lively_gemma3()
        model.config.final_logit_softcapping = softcap
    g = torch.Generator().manual_seed(1)
    seqs = Sequences([torch.randint(0, VOCAB, (n,), generator=g) for n in (17, 11, 6)], [0, 0, 0], ["window"] * 3)
    data = extract(model, seqs, (0, 2, 4), top_k=5, batch=2, feature_dtype=torch.float32, logit_rows=7)
    for s, v, i, lse, f in zip(seqs.seqs, data.topv, data.topi, data.lse, data.feats):
        with torch.no_grad():
            out = model(s[None], output_hidden_states=True)
        ref_v, ref_i = out.logits[0].topk(5, dim=-1)
        torch.testing.assert_close(v.float(), ref_v, rtol=1e-3, atol=1e-3)  # stored as fp16
        assert torch.equal(i.long(), ref_i)
        torch.testing.assert_close(lse, out.logits[0].logsumexp(-1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(f, torch.cat([out.hidden_states[k][0] for k in (0, 2, 4)], -1), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="logit_rows"):
        extract(model, seqs, (0,), logit_rows=0)


def test_the_generations_only_vocabulary_ranks_the_targets_own_tokens_first():
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 50, (n,), generator=g) for n in (30, 25, 40)]
    starts = [10, 5, 40]  # the third is a window: none of its tokens are the target's own
    own = Counter(t for s, a in zip(seqs, starts) for t in s[a:].tolist())
    every = Counter(t for s in seqs for t in s.tolist())
    ranked = sorted(range(60), key=lambda t: (-own[t], -every[t], t))  # plain Python: own, then all, then id
    got = heads.draft_vocabulary(seqs, 60, 20, [59], generations_only=True, starts=starts)
    assert got.tolist() == sorted(set(ranked[:19]) | {59})
    plain = heads.draft_vocabulary(seqs, 60, 20, [59])
    assert plain.tolist() == sorted(set(sorted(range(60), key=lambda t: (-every[t], t))[:19]) | {59})
    with pytest.raises(ValueError, match="starts"):
        heads.draft_vocabulary(seqs, 60, 20, [], generations_only=True)
    with pytest.raises(ValueError, match="vocab_source"):
        heads.HeadConfig(vocab_source="windows")


def test_new_recipe_fields_at_their_old_values_keep_the_old_cache_keys():
    cfg = heads.head_config("eagle3", "make")  # SmolLM2's, built before vocab_source and bos existed
    recipe = cfg.recipe()
    assert "vocab_source" not in recipe and "bos" not in recipe["data"]
    changed = dataclasses.replace(cfg, vocab_source="generations", data=dataclasses.replace(cfg.data, bos=True))
    assert changed.recipe()["vocab_source"] == "generations" and changed.recipe()["data"]["bos"] is True


def test_the_gemma3_recipes_read_the_targets_generations():
    for profile in ("make", "long"):
        for kind in ("eagle3", "medusa"):
            cfg = heads.head_config(kind, profile, pair="gemma3")
            assert cfg.vocab_source == "generations" and cfg.data.bos
            assert cfg.draft_vocab_size == heads.GEMMA3_DRAFT_VOCAB
    assert heads.head_config("eagle3", "make", pair="gemma3").budget_s <= 1200


# ------------------------------------------------------------------------------------------ the zoo's routing

@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """The tiny Gemma-3 as the pair's target (a cache entry with a manifest), the smoke recipes as its ``make``
    ones, no cross-vocabulary draft, in a temporary cache."""
    from spade_lib.zoo import gemma3, head_eval
    from spade_lib.zoo.gemma3 import save_clean

    entry = tmp_path_factory.mktemp("gemma3-target")
    save_clean(lively_gemma3(), tiny_tokenizer(), entry / "target")
    (entry / "manifest.json").write_text(json.dumps({"kind": "gemma3-target", "name": "gemma3"}))
    mp = pytest.MonkeyPatch()
    mp.setattr(paths, "CACHE_DIR", tmp_path_factory.mktemp("cache"))
    mp.setattr(gemma3, "target_entry", lambda rebuild=False, create=True: entry)
    mp.setattr(gemma3, "CROSS_DRAFTS", ())
    mp.setitem(heads.PAIR_PROFILES, "gemma3", {"make": SMOKE})
    mp.setitem(head_eval.HELDOUT_BY_PAIR, "gemma3", dataclasses.replace(SMOKE_DATA, n_prompts=4, n_windows=2))
    yield entry
    mp.undo()


def test_pairs_head_entry_load_pair_and_the_cli_build_gemma_heads(zoo, capsys):
    from spade_lib.decoding.drafts.drafters import make_drafter
    from spade_lib.zoo import head_cli
    from spade_lib.zoo.cache import read_manifest
    from spade_lib.zoo.pairs import head_entry, load_pair

    entry = head_entry("gemma3", "eagle3")
    m = read_manifest(entry)
    assert m["head_kind"] == "eagle3" and m["vocab_source"] == "generations" and m["draft_vocab_size"] == VD
    assert 0 < m["draft_vocab_heldout_generated_mass"] <= 1
    folder = json.loads((entry / "head" / "config.json").read_text())
    assert folder["speculators_config"]["verifier"]["architectures"] == ["Gemma3ForCausalLM"]
    pair = load_pair("gemma3", heads=("eagle3", "medusa"))
    assert sorted(pair.heads) == ["eagle3", "medusa"] and pair.heads["eagle3"].config.embed_scale == 8.0
    assert pair.heads["eagle3"].embed_tokens.weight is pair.target.get_input_embeddings().weight
    assert isinstance(make_drafter("eagle", pair), EagleDrafter) and isinstance(make_drafter("medusa", pair),
                                                                                 MedusaDrafter)
    prompt = periodic_prompt(3 * WINDOW)
    ar = AutoregressiveDecoder(pair.target, sampling=GREEDY, eos_token_id=[]).generate(prompt, 24)
    for draft in ("eagle", "medusa"):
        res = SpeculativeDecoder(pair.target, make_drafter(draft, pair), gamma=3, sampling=GREEDY,
                                 eos_token_id=[]).generate(prompt, 24)
        assert res.tokens == ar.tokens, draft
    out = head_cli.main(["eval", "--pair", "gemma3", "--kind", "medusa", "--depth", "3", "--threads", "1"])
    assert out["depth"] == 3 and out["build"]["steps_done"] == SMOKE_TRAIN.steps and "alpha" in capsys.readouterr().out
