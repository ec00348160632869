"""Drafters: the model drafter's proposals and cache bookkeeping, the prompt-lookup drafter's lookups, the
drafters' declared kinds and the one check of a draft name (check_draft)."""

import functools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spade_lib.decoding.drafts.drafters import ModelDrafter, NGramDrafter, _match_vocab
from spade_lib.decoding.drafts.policies import ConfidenceThreshold, EntropyThreshold, FixedGamma
from spade_lib.sampling import SamplingConfig, adjust

GREEDY = SamplingConfig(temperature=0)


def tiny_llama(vocab=64, seed=0, init=0.5):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      initializer_range=init, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def draft():
    return tiny_llama()


def fresh_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def test_model_drafter_greedy_matches_the_drafts_own_greedy_decode(draft):
    prompt = [3, 17, 9, 40]
    d = ModelDrafter(draft)
    d.reset(torch.tensor(prompt), 64)
    out = d.propose(5, FixedGamma(5), GREEDY, None)
    ref = draft.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False,
                         attention_mask=torch.ones(1, 4, dtype=torch.long))[0, 4:].tolist()
    assert out.tokens.tolist() == ref
    assert out.gamma == 5 and out.stop == "max_gamma"
    assert out.q.shape == (5, 64) and torch.equal(out.q.argmax(-1), out.tokens)
    assert torch.allclose(out.q.sum(-1), torch.ones(5))


@pytest.mark.parametrize("n_accepted", [0, 1, 3, 4])
def test_model_drafter_cache_after_accept_equals_fresh_prefill(draft, n_accepted):
    """After any accept/reject the next draft distribution equals a cache-free forward on the committed text."""
    prompt = [5, 6, 7]
    sampling = SamplingConfig(temperature=0.8)
    d = ModelDrafter(draft)
    d.reset(prompt, 64)
    gen = torch.Generator().manual_seed(0)
    committed = list(prompt)
    for next_token in (11, 12):
        out = d.propose(4, FixedGamma(4), sampling, gen)
        d.accept(n_accepted, next_token)
        committed += out.tokens[:n_accepted].tolist() + [next_token]
        nxt = d.propose(1, FixedGamma(1), sampling, gen)
        expect = adjust(fresh_logits(draft, committed), sampling)
        torch.testing.assert_close(nxt.q[0], expect, rtol=1e-5, atol=1e-6)
        d.accept(0, 20)
        committed.append(20)
    assert d.adapter.length == len(committed) - 1  # the newest token is fed on the next propose


def test_model_drafter_accept_without_proposal(draft):
    d = ModelDrafter(draft)
    d.reset([1, 2], 64)
    d.accept(0, 9)  # a plain target step happened: nothing was drafted
    out = d.propose(1, FixedGamma(1), GREEDY, None)
    assert out.q[0].argmax().item() == fresh_logits(draft, [1, 2, 9]).argmax().item()


def test_model_drafter_sampling_replays_with_the_same_generator(draft):
    d = ModelDrafter(draft)
    runs = []
    for _ in range(2):
        d.reset([4, 4, 4], 64)
        runs.append(d.propose(6, FixedGamma(6), SamplingConfig(1.0), torch.Generator().manual_seed(7)).tokens)
    assert torch.equal(runs[0], runs[1])


def test_model_drafter_policies_stop_drafting(draft):
    d = ModelDrafter(draft)
    d.reset([1, 2, 3], 64)
    out = d.propose(5, ConfidenceThreshold(threshold=1.0, max_gamma=5), GREEDY, None)
    assert out.gamma == 1 and out.stop == "policy"  # the low-confidence token is kept, drafting stops after it
    d.reset([1, 2, 3], 64)
    assert d.propose(5, ConfidenceThreshold(threshold=0.0, max_gamma=5), GREEDY, None).gamma == 5
    d.reset([1, 2, 3], 64)
    out = d.propose(5, EntropyThreshold(threshold=0.0, max_gamma=5), GREEDY, None)
    assert out.gamma == 1 and out.stop == "policy"


def test_vocabulary_is_matched_to_the_target():
    z = torch.tensor([[0.0, 1.0, 2.0]])
    assert _match_vocab(z, 3) is z
    assert _match_vocab(z, 2).tolist() == [[0.0, 1.0]]
    padded = _match_vocab(z, 5)
    assert padded.shape == (1, 5) and torch.isneginf(padded[0, 3:]).all()
    small = tiny_llama(vocab=48)
    d = ModelDrafter(small)
    d.reset([1, 2], 64)
    out = d.propose(2, FixedGamma(2), SamplingConfig(1.0), torch.Generator().manual_seed(0))
    assert out.q.shape == (2, 64) and out.q[:, 48:].sum() == 0


def test_model_drafter_rejects_empty_prompt(draft):
    with pytest.raises(ValueError, match="prompt_ids"):
        ModelDrafter(draft).reset([], 64)


# ---------------------------------------------------------------------------------------------
# prompt lookup


def propose(d, gamma):
    return d.propose(gamma, FixedGamma(gamma), GREEDY, None)


def test_ngram_proposes_what_followed_the_trailing_ngram():
    d = NGramDrafter(max_ngram=3)
    d.reset([1, 2, 3, 4, 1, 2], 10)
    out = propose(d, 3)
    assert out.tokens.tolist() == [3, 4, 1] and out.stop == "max_gamma"
    assert torch.equal(out.q, torch.nn.functional.one_hot(out.tokens, 10).float())
    assert out.logits is None and d.deterministic


def test_ngram_prefers_longest_then_latest_match():
    d = NGramDrafter(max_ngram=2)
    d.reset([5, 6, 7, 5, 6, 8, 5, 6], 10)
    assert propose(d, 1).tokens.tolist() == [8]  # latest earlier (5, 6) was followed by 8
    d = NGramDrafter(max_ngram=2)
    d.reset([9, 6, 1, 5, 6, 2, 3, 5, 6], 10)
    assert propose(d, 2).tokens.tolist() == [2, 3]  # bigram (5, 6) beats the later unigram (6)


def test_ngram_short_or_no_proposal():
    d = NGramDrafter()
    d.reset([1, 2, 3], 10)
    out = propose(d, 4)
    assert out.gamma == 0 and out.stop == "no_match" and out.q.shape == (0, 10)
    d.reset([7, 8, 7], 10)
    out = propose(d, 4)
    assert out.tokens.tolist() == [8, 7] and out.stop == "no_match"  # fewer than asked


def test_ngram_accept_extends_the_context_and_index():
    d = NGramDrafter(max_ngram=2)
    d.reset([1, 2, 3, 1, 2], 10)
    assert propose(d, 2).tokens.tolist() == [3, 1]
    d.accept(1, 9)  # context: 1 2 3 1 2 3 9
    assert d._ctx == [1, 2, 3, 1, 2, 3, 9]
    assert propose(d, 2).gamma == 0
    d.accept(0, 3)  # ... 9 3 -> (9, 3) unseen, (3) last followed by 9
    assert propose(d, 2).tokens.tolist() == [9, 3]


def test_ngram_bad_arguments():
    with pytest.raises(ValueError, match="min_ngram"):
        NGramDrafter(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError, match="prompt_ids"):
        NGramDrafter().reset([], 10)


def test_ngram_consults_the_policy_with_one_hot_signals():
    from dataclasses import dataclass

    from spade_lib.decoding.drafts.policies import Policy

    @dataclass(frozen=True)
    class Seen(Policy):
        max_gamma: int = 3
        needs_signals = True
        calls: list = None  # type: ignore[assignment]

        def keep_drafting(self, q_top_prob, h_q):
            self.calls.append((q_top_prob, h_q))
            return False

    d = NGramDrafter(max_ngram=3)
    d.reset([1, 2, 3, 4, 1, 2], 10)
    pol = Seen(calls=[])
    out = d.propose(3, pol, GREEDY, None)
    assert out.tokens.tolist() == [3] and out.stop == "policy" and pol.calls == [(1.0, 0.0)]
    d.accept(1, 4)
    assert d._ctx[-2:] == [3, 4]
    for keep_all in (ConfidenceThreshold(threshold=1.0, max_gamma=3), EntropyThreshold(threshold=0.0, max_gamma=3)):
        d.reset([1, 2, 3, 4, 1, 2], 10)
        assert d.propose(3, keep_all, GREEDY, None).gamma == 3  # one-hot q: confidence 1, entropy 0


def test_make_drafter_by_name():
    from types import SimpleNamespace

    from spade_lib.decoding.drafts.drafters import drafter_names, drafter_options, make_drafter

    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
    pair = SimpleNamespace(name="toy", target=model, drafts={"small": model})
    ngram = make_drafter("ngram", pair, max_ngram=2)
    assert isinstance(ngram, NGramDrafter) and ngram.max_ngram == 2
    assert isinstance(make_drafter("small", pair), ModelDrafter)
    assert "ngram" in drafter_names() and "small" in drafter_names(pair)
    assert drafter_options("ngram") == ("max_ngram", "min_ngram") and drafter_options("small") == ()
    with pytest.raises(ValueError, match="draft: pair 'toy' has drafts"):
        make_drafter("huge", pair)


def test_every_drafter_declares_its_kind_and_its_instances_are_what_it_declares(draft):
    """Each drafter class of the library declares its own ``DrafterKind`` (none inherits the interface's
    default), a registered name carries its drafter's kind, and an instance agrees with the declaration:
    ``deterministic`` is ``not kind.q``, a model is run (``drafting_model()``) exactly when ``kind.model``,
    features are read (``hidden_layers``) exactly when ``kind.head``."""
    from types import SimpleNamespace

    from spade_lib.decoding.drafts import crossvocab, eagle, medusa  # noqa: F401 (every drafter class of the library)
    from spade_lib.decoding.drafts.drafters import (HEAD_DRAFTER, Drafter, NGramTreeDrafter, NullDrafter, SuffixDrafter,
                                             drafter_kind, drafter_names, make_drafter)

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    library = [c for c in subclasses(Drafter) if c.__module__.startswith("spade_lib.")]
    assert {"ModelDrafter", "NGramDrafter", "NullDrafter", "SuffixDrafter", "TextDrafter", "EagleDrafter"} <= \
        {c.__name__ for c in library}
    undeclared = [c.__name__ for c in library if c.kind is Drafter.kind and not c.__name__.endswith("SyncDrafter")]
    assert undeclared == []
    assert eagle.EagleDrafter.kind is medusa.MedusaDrafter.kind is HEAD_DRAFTER
    assert drafter_kind("eagle") is drafter_kind("medusa") is HEAD_DRAFTER
    assert (drafter_kind("ngram"), drafter_kind("ngram_tree"), drafter_kind("null")) == \
        (NGramDrafter.kind, NGramTreeDrafter.kind, NullDrafter.kind)
    assert drafter_kind("suffix") is SuffixDrafter.kind and SuffixDrafter.kind.shapes == ("trie",)
    pair = SimpleNamespace(name="toy", target=draft, drafts={"small": draft}, heads={"e3": object()})
    assert drafter_kind("small", pair) is ModelDrafter.kind and drafter_kind("e3", pair) is HEAD_DRAFTER
    assert drafter_kind("small") is None and drafter_kind("huge", pair) is None
    built = [make_drafter(n, pair) for n in drafter_names() if not drafter_kind(n).head] + [make_drafter("small", pair)]
    assert {type(d) for d in built} == {NGramDrafter, NGramTreeDrafter, SuffixDrafter, NullDrafter, ModelDrafter}
    for d in built:
        kind = type(d).kind
        assert d.deterministic is (not kind.q) and (d.drafting_model() is not None) is kind.model
        assert bool(d.hidden_layers) is kind.head is False and kind.vocabulary == "same"


def test_check_draft_refuses_what_make_drafter_would_before_anything_is_built(draft, monkeypatch):
    """One check of a draft name against a pair (the runner, notebooks 04 and 05): an unknown name, a head
    drafter of a pair without heads, a tree of a shape the kind does not propose, an option the drafter does not
    take, a kind without what the caller ``needs`` (naming the pair's drafts that have it); make_drafter refuses
    the same through it, before a factory runs."""
    from types import SimpleNamespace

    from spade_lib.decoding.drafts import drafters
    from spade_lib.decoding.drafts.drafters import HEAD_DRAFTER, check_draft, make_drafter

    pair = SimpleNamespace(name="toy", target=draft, drafts={"small": draft}, heads={})
    assert check_draft(pair, "small", tree="eagle2:nodes=8,depth=3,topk=2") is ModelDrafter.kind
    assert check_draft(pair, "ngram_tree", tree="trie:nodes=8", max_ngram=2) is drafters.NGramTreeDrafter.kind
    assert check_draft(pair, "ngram", tree="chain") is NGramDrafter.kind  # the chain is every chain drafter's
    cases = [(dict(draft="huge"), r"^draft: pair 'toy' has drafts \['small'\], heads \[\] \(or \[.*'ngram'.*\]\), "
                                  r"not 'huge'"),
             (dict(draft="eagle"), r"^draft: 'eagle' drafts with one of the pair's feature heads, and pair 'toy' has "
                                   r"none attached"),
             (dict(draft="ngram", tree="eagle2"), r"^tree: drafter 'ngram' drafts chains only, not a 'eagle2' tree"),
             (dict(draft="small", tree="trie:nodes=8"), r"^tree: the draft model 'small' drafts \('chain', 'eagle2', "
                                                        r"'static', 'sampled'\), not a 'trie' tree"),
             (dict(draft="suffix", tree="chain"), r"^tree: drafter 'suffix' drafts \('trie',\), not a 'chain' tree"),
             (dict(draft="ngram", max_ngram=2, bogus=1), r"^options: drafter 'ngram' takes \['max_ngram', "
                                                         r"'min_ngram'\], not \['bogus'\]"),
             (dict(draft="small", rule="tli"), r"^options: the draft model 'small' takes \['max_length'\], not "
                                               r"\['rule'\]")]
    def never_built(factory):
        @functools.wraps(factory)  # the same options (drafter_options reads the signature)
        def factory_(*args, **kwargs):
            pytest.fail("a refused drafter was built")
        return factory_

    monkeypatch.setattr(drafters, "_REGISTRY", {n: drafters._Registered(never_built(r.factory), r.kind)
                                                  for n, r in drafters._REGISTRY.items()})
    for kw, match in cases:
        draft_name = kw.pop("draft")
        with pytest.raises(ValueError, match=match):
            check_draft(pair, draft_name, **kw)
        with pytest.raises(ValueError, match=match):
            make_drafter(draft_name, pair, **kw)
    with pytest.raises(ValueError, match=r"^draft: 'ngram' is not a drafter of pair 'toy' with q=True: to replay q "
                                         r"\(those: \['small'\]\)"):
        check_draft(pair, "ngram", needs={"q": True}, why=": to replay q")
    headed = SimpleNamespace(**{**vars(pair), "heads": {"e3": object()}})
    assert check_draft(headed, "eagle", needs={"head": True}) is check_draft(headed, "e3") is HEAD_DRAFTER
    with pytest.raises(ValueError, match=r"^needs: fields of DrafterKind .*not \['cost'\]"):
        check_draft(pair, "small", needs={"cost": 1})


def test_a_drafter_kind_is_declared_and_checked():
    from spade_lib.decoding.drafts.drafters import DrafterKind, register_drafter

    with pytest.raises(ValueError, match=r"^vocabulary: must be one of \('same', 'other'\)"):
        DrafterKind(q=True, vocabulary="mine", head=False, model=True, shapes=("chain",))
    with pytest.raises(ValueError, match=r"^shapes: a non-empty tuple of"):
        DrafterKind(q=True, vocabulary="same", head=False, model=True, shapes=("chain", "forest"))
    with pytest.raises(ValueError, match=r"^kind: must be a DrafterKind"):
        register_drafter("undeclared", lambda pair, *, device: NGramDrafter(), None)


def test_sample_categorical_draws_q_exactly():
    """Inverse-CDF draws follow q (chi-square p-value), never a zero-weight token, unnormalised rows too."""
    from scipy.stats import chisquare

    from spade_lib.decoding.drafts.drafters import sample_categorical

    q = torch.zeros(300)
    q[[0, 7, 255, 256, 299]] = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    gen = torch.Generator().manual_seed(0)
    draws = sample_categorical((3.0 * q).expand(20_000, -1), gen)
    counts = torch.bincount(draws, minlength=300)
    assert counts.sum() == 20_000 and set(torch.nonzero(counts)[:, 0].tolist()) <= {0, 7, 255, 256, 299}
    support = q > 0
    p = chisquare(counts[support].numpy(), 20_000 * q[support].numpy()).pvalue
    assert p > 1e-3, p
    edge = torch.zeros(1, 5)
    edge[0, 2] = 1.0  # a single token, last weights zero: always that token
    assert sample_categorical(edge.expand(100, -1), gen).unique().tolist() == [2]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_null_drafter_is_always_rejected_and_equals_autoregressive(temperature):
    """The null-draft control: every step verifies gamma + 1 tokens and keeps one token ~ p, drawn with
    the same residual stream as the autoregressive loop, so the outputs are identical."""
    from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
    from spade_lib.decoding.drafts.drafters import NullDrafter, make_drafter

    target = tiny_llama(seed=3)
    sampling = SamplingConfig(temperature=temperature)
    spec = SpeculativeDecoder(target, NullDrafter(), gamma=4, sampling=sampling)
    assert spec.mode == "reject"
    out = spec.generate([1, 2, 3], 20, seed=5)
    ref = AutoregressiveDecoder(target, sampling=sampling).generate([1, 2, 3], 20, seed=5)
    assert out.tokens == ref.tokens
    assert [s.n_accepted for s in out.steps] == [0] * 20 and all(s.gamma == 4 for s in out.steps[:-4])
    assert all(r["accept_prob"] == 0.0 and not r["accepted"] for r in out.records())
    assert isinstance(make_drafter("null", type("P", (), {"target": target})()), NullDrafter)
