"""FR-Spec trimming of any causal LM (``zoo.frspec.trim_head``), against the untrimmed model itself: on the kept
token ids the logits are the full model's, elsewhere ``-inf``, through the Hugging Face forward and the lean
one; a trimmed draft keeps speculative decoding lossless (greedy output = the target's)."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
from spade_lib.decoding.model.adapter import CausalLMAdapter
from spade_lib.sampling import SamplingConfig
from spade_lib.zoo.frspec import SubsetLMHead, trim_head

from test_zoo_gemma3 import VOCAB, lively_gemma3, periodic_prompt, tiny_gemma3


def tiny_llama(seed=0, tied=False):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.3, tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None,
                      pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


MODELS = {"llama": tiny_llama, "llama_tied": lambda: tiny_llama(tied=True), "gemma3": lively_gemma3}


@pytest.mark.parametrize("family", sorted(MODELS))
def test_trimmed_logits_are_the_full_models_on_the_subset_and_minus_inf_off_it(family):
    model = MODELS[family]()
    full = copy.deepcopy(model)
    keep = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))[:40]
    embedding = model.get_input_embeddings().weight
    before = embedding.detach().clone()
    assert trim_head(model, keep) is model
    on = torch.zeros(VOCAB, dtype=torch.bool)
    on[keep] = True
    ids = torch.tensor([periodic_prompt(20)])
    with torch.no_grad():
        ref, got = full(ids).logits[0], model(ids).logits[0]
    assert isinstance(model.get_output_embeddings(), SubsetLMHead) and got.shape == ref.shape
    assert torch.isneginf(got[:, ~on]).all()
    torch.testing.assert_close(got[:, on], ref[:, on], rtol=1e-5, atol=1e-5)
    assert model.get_input_embeddings().weight is embedding and torch.equal(embedding, before)  # untied, untouched
    assert torch.equal(model.head_token_ids, keep.sort().values) and not model.config.tie_word_embeddings
    # the lean forward honours head_token_ids: the same logits (and it passed its own check against HF's)
    adapter = CausalLMAdapter(model)
    assert adapter.backend == "lean"
    lean = adapter.extend(ids[0])
    assert torch.isneginf(lean[:, ~on]).all()
    torch.testing.assert_close(lean[:, on], ref[:, on], rtol=1e-4, atol=1e-4)
    # trimmed again from what it kept
    trim_head(model, keep[:10])
    with torch.no_grad():
        again = model(ids).logits[0]
    assert torch.isfinite(again).sum(-1).eq(10).all()
    torch.testing.assert_close(again[:, keep[:10]], ref[:, keep[:10]], rtol=1e-5, atol=1e-5)


def test_a_trimmed_draft_keeps_greedy_decoding_the_targets():
    target, draft = lively_gemma3(seed=0), lively_gemma3(seed=0)
    torch.manual_seed(2)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.05 * torch.randn_like(p))
    greedy = SamplingConfig(temperature=0)
    prompt = periodic_prompt(30)
    ar = AutoregressiveDecoder(target, sampling=greedy, eos_token_id=[]).generate(prompt, 24)
    said = sorted(set(ar.tokens))
    keep = sorted(set(range(0, VOCAB, 2)) | set(said[: len(said) // 2]))  # some of what it says is off the subset
    trim_head(draft, keep)
    res = SpeculativeDecoder(target, draft, gamma=3, sampling=greedy, eos_token_id=[]).generate(prompt, 24)
    assert res.tokens == ar.tokens and sum(s.n_accepted for s in res.steps) > 0
    drafted = [r["draft_token"] for r in res.records()]
    assert drafted and set(drafted) <= set(keep)  # q = 0 off the subset: never drafted
    assert set(ar.tokens) - set(keep)  # and the target did say tokens the draft cannot


def test_bad_subsets_and_models_are_refused():
    model = tiny_llama()
    for ids in ([1, 1, 2], [VOCAB], [-1], []):
        with pytest.raises(ValueError, match="token_ids"):
            trim_head(model, ids)
    trim_head(model, [1, 2, 3])
    with pytest.raises(ValueError, match="token_ids"):
        trim_head(model, [1, 4])  # 4 is no longer there
    capped = tiny_gemma3()
    capped.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="model"):
        trim_head(capped, [1, 2])
    with pytest.raises(ValueError, match="model"):
        trim_head(torch.nn.Linear(3, 3), [1])


def test_a_trimmed_twin_shares_the_body_and_leaves_the_model_whole():
    """``trimmed_twin``: the twin's logits are the model's on the kept ids and ``-inf`` off them; every parameter but
    the head's is the model's own tensor (held once); the model keeps its full head, configuration and logits."""
    from spade_lib.zoo.frspec import trimmed_twin

    model = tiny_llama(seed=5)
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
    keep = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(4))[:30]
    twin = trimmed_twin(model, keep)
    assert twin is not model and isinstance(twin.lm_head, SubsetLMHead)
    assert type(model.lm_head) is torch.nn.Linear and getattr(model, "head_token_ids", None) is None
    assert twin.model is model.model and twin.config is not model.config
    shared = dict(model.named_parameters())
    for name, p in twin.named_parameters():
        if not name.startswith("lm_head"):
            assert p is shared[name], name
    with torch.no_grad():
        got, again = twin(ids).logits, model(ids).logits
    torch.testing.assert_close(again, want, rtol=0, atol=0)
    on = torch.zeros(VOCAB, dtype=torch.bool)
    on[keep] = True
    torch.testing.assert_close(got[..., on], want[..., on])
    assert torch.isneginf(got[..., ~on]).all()


def test_the_recorded_lean_verdict_is_keyed_by_the_weights_not_only_the_configuration():
    """A trimmed head, or another checkpoint of the same configuration, gets its own lean-vs-HF verdict (the key
    holds every product's shape and a sample of the weights), while the same model keys the same verdict."""
    from spade_lib.decoding.model.lean import LeanForward, _agreement_key
    from spade_lib.zoo.frspec import trimmed_twin

    model, other = tiny_llama(seed=5), tiny_llama(seed=6)
    twin = trimmed_twin(model, torch.arange(30))

    def key(m):
        return _agreement_key(m, LeanForward(m, 32, kernels="mkl"))

    assert key(model) == key(model)
    assert len({key(model), key(twin), key(other)}) == 3
