"""Hugging Face's two cross-tokenizer generators through ``baselines.hf_generate``: UAG (greedy) equals the
target's greedy output; USD (sampling) does not keep the target's law unless the assistant tokenizer's
``get_vocab()`` happens to iterate in id order (chi-square against the exact law, fp64); the caller's draft
is never pruned; HF's own preconditions, recorded."""

import copy

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast
from transformers.generation import candidate_generator as cg

from spade_lib.decoding import baselines
from spade_lib.decoding.baselines import hf_generate
from spade_lib.exactness import counts_chi_square_pvalue, sequence_law
from spade_lib.sampling import SamplingConfig
from tests.tiny_models import llama

GREEDY = SamplingConfig(temperature=0)
T1 = SamplingConfig(temperature=1.0)


class IdOrdered(PreTrainedTokenizerFast):
    """The same tokenizer, ``get_vocab()`` iterating in id order (a dict's order carries no meaning)."""

    def get_vocab(self):
        return dict(sorted(super().get_vocab().items(), key=lambda kv: kv[1]))


class ReverseOrdered(PreTrainedTokenizerFast):
    """The same tokenizer, ``get_vocab()`` iterating in reverse id order: one fixed instance of the random
    order a Rust hash map gives a plain fast tokenizer (deterministic, so the test is)."""

    def get_vocab(self):
        return dict(sorted(super().get_vocab().items(), key=lambda kv: -kv[1]))


def bpe(chars, merges, cls=PreTrainedTokenizerFast):
    """A BPE fast tokenizer over ``chars`` with ``merges`` (ids: ``<eos>`` 0, the characters, the merges)."""
    vocab = {"<eos>": 0}
    for c in chars:
        vocab[c] = len(vocab)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.decoder = decoders.Fuse()  # decode concatenates (no spaces between tokens)
    return cls(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


# the same strings tokenised differently: "ab", "da" merge in the target only; "cd", "bc", "dd" in the draft only
TARGET_MERGES = [("a", "b"), ("d", "a")]
DRAFT_MERGES = [("c", "d"), ("b", "c"), ("d", "d")]
PROMPT = "abcab"


def tokenizers(cls=PreTrainedTokenizerFast):
    return bpe("abcd", TARGET_MERGES, cls), bpe("abcd", DRAFT_MERGES, cls)


@pytest.fixture(scope="module")
def models_():
    ttok, dtok = tokenizers()
    assert len(ttok) == 7 and len(dtok) == 8  # HF needs different vocab sizes (test_hf_refuses_equal_vocab_sizes)
    return llama(vocab=len(ttok), seed=0), llama(vocab=len(dtok), seed=1)


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny forwards: threads only add synchronisation
    yield
    torch.set_num_threads(n)


def test_uag_greedy_equals_target_greedy(models_, monkeypatch):
    target, draft = models_
    ttok, dtok = tokenizers()
    matches = []
    real = cg.AssistedCandidateGeneratorDifferentTokenizers.update_candidate_strategy

    def record(self, input_ids, scores, num_matches):
        matches.append(int(num_matches))
        return real(self, input_ids, scores, num_matches)

    monkeypatch.setattr(cg.AssistedCandidateGeneratorDifferentTokenizers, "update_candidate_strategy", record)
    for prompt in (PROMPT, "d", "cdcab"):
        ids = ttok(prompt, add_special_tokens=False)["input_ids"]
        plain = hf_generate(target, ids, 24, sampling=GREEDY, eos_token_id=[])
        uag = hf_generate(target, ids, 24, sampling=GREEDY, assistant=draft, gamma=3, eos_token_id=[],
                          target_tokenizer=ttok, assistant_tokenizer=dtok)
        assert uag.tokens == plain.tokens and len(uag.tokens) == 24
    print(f"UAG rounds {len(matches)}, accepted candidates per round {np.bincount(matches).tolist()}")
    assert sum(matches) > 0 and 0 in matches  # candidates accepted and rejected: the check had work to do
    assert type(draft.lm_head) is torch.nn.Linear  # UAG does not touch the assistant


def test_hf_refuses_equal_vocab_sizes():
    """HF takes equal ``vocab_size`` to mean one tokenizer and refuses ``assistant_tokenizer`` then, though
    these two tokenizers (7 tokens each) split "ab" and "cd" differently."""
    ttok, dtok = bpe("abcd", TARGET_MERGES), bpe("abcd", [("c", "d"), ("b", "c")])
    assert len(ttok) == len(dtok) and ttok.get_vocab() != dtok.get_vocab()
    target, draft = llama(vocab=7, seed=0), llama(vocab=7, seed=1)
    with pytest.raises(ValueError, match="`assistant_tokenizer` is not required"):
        hf_generate(target, [1, 2], 4, sampling=GREEDY, assistant=draft, eos_token_id=[], target_tokenizer=ttok,
                    assistant_tokenizer=dtok)


def test_usd_column_order_follows_get_vocab_order():
    """The mechanism, read from ``AssistantToTargetTranslator`` and checked on its real methods: pruned
    column ``j`` is proposed as target token ``get_target_ids(j)`` but its logit lands on ``get_target_logits``'s
    position for the ``j``-th intersection token in id order. They agree only when ``get_vocab()`` iterates
    in id order; a fast tokenizer's does not (a Rust hash map, random per process)."""
    def mismatches(cls):
        ttok, dtok = tokenizers(cls)
        draft = llama(vocab=len(dtok), seed=1)
        tr = cg.AssistantToTargetTranslator(ttok, dtok, len(ttok), assistant_model=draft, assistant_prune_lm_head=True)
        n = len(tr.assistant_overlap_token_ids)
        proposed = tr.get_target_ids(torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, dtype=torch.long),
                                     torch.arange(n)[None])[0]
        placed = tr.get_target_logits(torch.eye(n)).argmax(-1)  # where column j's logit goes
        return int((proposed != placed).sum()), n

    assert mismatches(IdOrdered) == (0, 5)
    assert mismatches(ReverseOrdered) == (4, 5)  # all but the middle one of the five shared tokens
    big = bpe("abcdefghijklmnopqrstuvwxyz", [])  # 27 tokens: id order by chance has probability 1 / 27!
    assert list(big.get_vocab().values()) != sorted(big.get_vocab().values())


def _first_two_counts(target, draft, ttok, dtok, n, V, prune=True):
    ids = ttok(PROMPT, add_special_tokens=False)["input_ids"]
    counts = np.zeros(V * V, dtype=np.int64)
    for seed in range(n):
        out = hf_generate(target, ids, 4, sampling=T1, assistant=draft, gamma=3, seed=seed, eos_token_id=[],
                          target_tokenizer=ttok, assistant_tokenizer=dtok, prune_lm_head=prune)
        counts[out.tokens[0] * V + out.tokens[1]] += 1
    return counts, sequence_law(target, ids, T1, 2)


@pytest.mark.slow
def test_usd_sampling_law(models_, record_property):
    """Chi-square of the first two target tokens of HF's USD (T = 1, gamma 3, 4 new tokens) against their
    exact law under plain target sampling (fp64 enumeration, rare cells pooled): the same models, prompt
    and tokenizers, only ``get_vocab()``'s iteration order differs; and HF's unpruned translator
    (``prune_lm_head=False``) on the reverse-ordered vocabulary."""
    target, draft = models_
    V = len(tokenizers()[0])
    baselines.clear_usd_copies()
    counts, law = _first_two_counts(target, draft, *tokenizers(IdOrdered), 1000, V)
    p_sorted = counts_chi_square_pvalue(counts, law)
    counts, law = _first_two_counts(target, draft, *tokenizers(ReverseOrdered), 300, V)
    p_reversed = counts_chi_square_pvalue(counts, law)
    counts, law = _first_two_counts(target, draft, *tokenizers(ReverseOrdered), 1000, V, prune=False)
    p_unpruned = counts_chi_square_pvalue(counts, law)
    record_property("p_usd_unpruned_reverse_order", p_unpruned)
    record_property("p_usd_id_order", p_sorted)
    record_property("p_usd_reverse_order", p_reversed)
    print(f"USD first two tokens vs the target's law: id-ordered vocab p = {p_sorted:.4f} (N = 1000), "
          f"reverse-ordered vocab p = {p_reversed:.3g} (N = 300), unpruned on the reverse-ordered vocab "
          f"p = {p_unpruned:.4f} (N = 1000)")
    assert p_sorted > 1e-3   # TLI as implemented is exact when the orders agree
    assert p_reversed < 1e-6  # and lossy when they do not: q is attached to the wrong target tokens
    assert p_unpruned > 1e-3  # HF's unpruned translator maps both sides in id order: exact


def test_usd_leaves_the_callers_draft_alone(models_):
    """HF's USD prunes the assistant in place (shown on a copy called directly); through hf_generate the
    caller's draft keeps its head, embeddings and weights, repeated calls replay with the seed, and a second
    draft with the same tokenizers gets its own translator."""
    target, draft = models_
    ttok, dtok = tokenizers()
    ids = ttok(PROMPT, add_special_tokens=False)["input_ids"]
    direct = copy.deepcopy(draft)
    target.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=True, assistant_model=direct, tokenizer=ttok,
                    assistant_tokenizer=dtok, pad_token_id=0, eos_token_id=[])
    assert type(direct.lm_head).__name__ == "_PruneReindexingLMHead"  # HF mutated the model it was given
    assert type(direct.get_input_embeddings()).__name__ == "_MapInputEmbedding"

    before = {k: v.clone() for k, v in draft.state_dict().items()}
    before_config = draft.generation_config.repetition_penalty
    # the same tokenizers: HF's translator cache (keyed by them) now holds the translator built for `direct`
    a = hf_generate(target, ids, 8, sampling=T1, assistant=draft, gamma=3, seed=5, eos_token_id=[],
                    target_tokenizer=ttok, assistant_tokenizer=dtok)
    b = hf_generate(target, ids, 8, sampling=T1, assistant=draft, gamma=3, seed=5, eos_token_id=[],
                    target_tokenizer=ttok, assistant_tokenizer=dtok)
    assert a.tokens == b.tokens and len(a.tokens) == 8 and a.timing["total"] > 0
    assert type(draft.lm_head) is torch.nn.Linear and type(draft.get_input_embeddings()) is torch.nn.Embedding
    assert all(torch.equal(v, before[k]) for k, v in draft.state_dict().items())
    other = llama(vocab=len(dtok), seed=2)  # same tokenizers, another draft: must not reuse draft's translator
    c = hf_generate(target, ids, 8, sampling=T1, assistant=other, gamma=3, seed=5, eos_token_id=[],
                    target_tokenizer=ttok, assistant_tokenizer=dtok)
    assert len(c.tokens) == 8 and type(other.lm_head) is torch.nn.Linear
    assert hf_generate(target, ids, 8, sampling=T1, assistant=draft, gamma=3, seed=5, eos_token_id=[],
                       target_tokenizer=ttok, assistant_tokenizer=dtok).tokens == a.tokens
    d = hf_generate(target, ids, 8, sampling=T1, assistant=draft, gamma=3, seed=5, eos_token_id=[],
                    target_tokenizer=ttok, assistant_tokenizer=dtok, prune_lm_head=False)  # the draft itself
    assert len(d.tokens) == 8 and type(draft.lm_head) is torch.nn.Linear
    assert all(torch.equal(v, before[k]) for k, v in draft.state_dict().items())
    assert draft.generation_config.repetition_penalty == before_config  # HF sets it to None: restored


def test_cross_tokenizer_bad_arguments(models_):
    target, draft = models_
    ttok, dtok = tokenizers()
    with pytest.raises(ValueError, match="^assistant_tokenizer: .*only target_tokenizer"):
        hf_generate(target, [1], 2, assistant=draft, target_tokenizer=ttok)
    with pytest.raises(ValueError, match="^target_tokenizer: .*only assistant_tokenizer"):
        hf_generate(target, [1], 2, assistant=draft, assistant_tokenizer=dtok)
    with pytest.raises(ValueError, match="^assistant: "):
        hf_generate(target, [1], 2, target_tokenizer=ttok, assistant_tokenizer=dtok)
    with pytest.raises(ValueError, match="^prune_lm_head: "):
        hf_generate(target, [1], 2, assistant=draft, target_tokenizer=ttok, assistant_tokenizer=dtok,
                    prune_lm_head="no")
    with pytest.raises(ValueError, match="different tokenizers"):  # HF's own: different vocab sizes, no tokenizers
        hf_generate(target, [1], 2, sampling=GREEDY, assistant=draft, eos_token_id=[])
