"""TLI is lossless, a naive re-encoding rule is not: exact enumeration in fp64 on synthetic vocabularies."""
import pytest
import torch

from spade_lib.decoding.drafts.crossvocab import emitted_law, intersection_map, naive_emitted_law, tli_distribution

# the same strings tokenised differently: "ab" merges in the target, splits in the draft; "cd" the reverse
TARGET = {"a": 0, "b": 1, "ab": 2, "c": 3, "e": 4}
DRAFT = {"a": 0, "b": 1, "c": 2, "cd": 3, "d": 4, "e": 5}


def test_tli_emitted_law_is_target():
    g = torch.Generator().manual_seed(0)
    d_ids, t_ids = intersection_map(DRAFT, TARGET)
    assert sorted(t_ids.tolist()) == [0, 1, 3, 4]
    for _ in range(50):
        p = torch.rand(len(TARGET), generator=g, dtype=torch.float64).softmax(-1)
        q = (3 * torch.rand(len(DRAFT), generator=g, dtype=torch.float64)).softmax(-1)
        law = emitted_law(p, tli_distribution(q, d_ids, t_ids, len(TARGET)))
        assert torch.allclose(law, p, atol=1e-12, rtol=0)


def test_naive_rule_is_lossy():
    g = torch.Generator().manual_seed(1)
    to_target = torch.tensor([TARGET["a"], TARGET["b"], TARGET["c"], TARGET["c"], TARGET["e"], TARGET["e"]])
    worst = 0.0
    for _ in range(50):
        p = torch.rand(len(TARGET), generator=g, dtype=torch.float64).softmax(-1)
        q = (3 * torch.rand(len(DRAFT), generator=g, dtype=torch.float64)).softmax(-1)
        worst = max(worst, float((naive_emitted_law(p, q, to_target) - p).abs().sum()) / 2)
    assert worst > 0.01


def test_no_intersection_refused():
    with pytest.raises(ValueError, match="draft_vocab"):
        intersection_map({"x": 0}, {"y": 0})


# ------------------------------------------------------------------------------------------------
# string-level drafting (TextDrafter): alignment, then exactness by enumeration through the real verify

import itertools
import zlib

from spade_lib.decoding.drafts.crossvocab import appended_text, continuation, retokenize, text_proposal
from spade_lib.exactness import proposal_law_error


class GreedyTokenizer:
    """Longest match first over a string vocabulary (``encode``/``decode`` as a HF tokenizer's)."""

    def __init__(self, strings):
        self.strings = list(strings)
        self.ids = {s: i for i, s in enumerate(self.strings)}
        self.longest = max(map(len, self.strings))

    def encode(self, text, add_special_tokens=False):
        out, i = [], 0
        while i < len(text):
            for n in range(min(self.longest, len(text) - i), 0, -1):
                if text[i:i + n] in self.ids:
                    out.append(self.ids[text[i:i + n]])
                    i += n
                    break
            else:
                raise ValueError(f"text: {text[i]!r} is not in the vocabulary")
        return out

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.strings[i] for i in ids)

    def get_vocab(self):
        return dict(self.ids)


# "ab" and "da" are one target token but two draft tokens (merges); the draft's "cd" and "bc" split
# into two target tokens, "bc" across a target boundary ("abc" = [ab, c] vs [a, bc])
TARGET_TOK = GreedyTokenizer(["a", "b", "c", "d", "ab", "da"])
DRAFT_TOK = GreedyTokenizer(["a", "b", "c", "d", "cd", "bc"])


def t_ids(*strings):
    return [TARGET_TOK.ids[s] for s in strings]


def test_continuation_handles_splits_merges_and_a_differently_segmented_boundary():
    # plain: the re-encoding extends the committed tokens
    assert continuation(t_ids("ab"), "cd", TARGET_TOK) == t_ids("c", "d")     # a draft "cd" splits
    assert continuation(t_ids("c"), "ab", TARGET_TOK) == t_ids("ab")          # draft a, b merge
    assert continuation(t_ids("c"), "da", TARGET_TOK) == t_ids("da")
    # committed [a, b] re-encodes as [ab]: the boundary after "ab" still exists, propose what follows it
    assert continuation(t_ids("a", "b"), "cd", TARGET_TOK) == t_ids("c", "d")
    # committed [a], the draft wrote "b": re-encoded [ab] straddles the boundary; encode the new text alone
    assert continuation(t_ids("a"), "bc", TARGET_TOK) == t_ids("b", "c")
    # committed [d], new "a" -> "da" straddles the boundary
    assert continuation(t_ids("d"), "ab", TARGET_TOK) == t_ids("ab")
    assert continuation(t_ids("ab"), "", TARGET_TOK) == []
    # the proposal holds back the last token (it may still merge), or ends with EOS
    assert text_proposal(t_ids("c"), "dab", TARGET_TOK, 3) == t_ids("da")
    assert text_proposal(t_ids("c"), "dab", TARGET_TOK, 3, hold_last=False) == t_ids("da", "b")
    assert text_proposal(t_ids("c"), "dab", TARGET_TOK, 3, ended=True, eos=5) == t_ids("da", "b") + [5]
    assert text_proposal(t_ids("c"), "dabcd", TARGET_TOK, 2, hold_last=False) == t_ids("da", "b")
    # the draft side: the boundary re-tokenised as the draft's tokenizer would ("c" + "d" -> "cd")
    d = [DRAFT_TOK.ids[s] for s in ("a", "b", "c")]
    assert retokenize(d, "da", DRAFT_TOK, window=2) == [DRAFT_TOK.ids[s] for s in ("a", "bc", "d", "a")]
    assert retokenize(d, "d", DRAFT_TOK, window=1) == [DRAFT_TOK.ids[s] for s in ("a", "b", "cd")]
    assert appended_text(t_ids("a"), t_ids("b", "da"), TARGET_TOK) == "bda"
    with pytest.raises(ValueError, match="window"):
        retokenize(d, "a", DRAFT_TOK, window=0)


def _table(vocab, seed, tag, scale=2.0):
    """A random autoregressive model as a table: prefix -> fp64 distribution over ``vocab`` ids."""
    cache = {}

    def law(prefix):
        key = tuple(prefix)
        if key not in cache:
            g = torch.Generator().manual_seed(zlib.crc32(repr((tag, seed, key)).encode()))
            cache[key] = (scale * torch.randn(vocab, generator=g, dtype=torch.float64)).softmax(-1)
        return cache[key]

    return law


COMMITTED = [("ab",), ("a",), ("a", "b"), ("d",), ("c", "da")]  # target-token contexts (three align badly)


def _draft_proposals(committed, k=3, gamma=3, seed=0):
    """Every draft continuation of ``k`` draft tokens, its probability under a random draft table, and
    the target block the string-level drafter proposes for it (``text_proposal``, as ``TextDrafter``)."""
    c = t_ids(*committed)
    text = TARGET_TOK.decode(c)
    d_ctx = DRAFT_TOK.encode(text)
    q_draft = _table(len(DRAFT_TOK.strings), seed, "draft")
    out = []
    for seq in itertools.product(range(len(DRAFT_TOK.strings)), repeat=k):
        w = 1.0
        for i in range(k):
            w *= float(q_draft(d_ctx + list(seq[:i]))[seq[i]])
        new_text = appended_text(d_ctx, list(seq), DRAFT_TOK)
        x = text_proposal(c, new_text, TARGET_TOK, gamma)
        # the block continues the committed text with the draft's text (a prefix of it)
        assert new_text.startswith(TARGET_TOK.decode(x))
        out.append((tuple(x), w))
    return c, out


@pytest.mark.parametrize("committed", COMMITTED)
def test_string_level_proposals_are_lossless_under_one_hot_q(committed):
    c, rows = _draft_proposals(committed)
    proposals, weights = [x for x, _ in rows], [w for _, w in rows]
    assert abs(sum(weights) - 1) < 1e-12
    assert max(map(len, proposals)) == 3 and min(map(len, proposals)) < 3  # full and short blocks
    p = _table(len(TARGET_TOK.strings), 0, "target")
    p_of = lambda prefix: p(c + list(prefix))  # noqa: E731
    assert proposal_law_error(proposals, weights, p_of, mode="one_hot_q") < 1e-12
    # temperature 0: p one-hot at the argmax, the greedy rule emits the argmax chain whatever is proposed
    def argmax(prefix):
        return torch.nn.functional.one_hot(p_of(prefix).argmax(), len(TARGET_TOK.strings)).double()

    assert proposal_law_error(proposals, weights, argmax, mode="greedy") == 0.0


def _conditional_q(proposals, weights, V, marginal=False):
    """q_i(. | x_<i) of the proposals' law (``marginal``: ignoring x_<i, the naive mapping), per proposal."""
    mass = {}
    for x, w in zip(proposals, weights):
        for i in range(len(x)):
            key = (i, None if marginal else x[:i])
            mass.setdefault(key, torch.zeros(V, dtype=torch.float64))[x[i]] += w
    rows = lambda x: [mass[(i, None if marginal else x[:i])] for i in range(len(x))]  # noqa: E731
    return lambda k: torch.stack([m / m.sum() for m in rows(proposals[k])])


@pytest.mark.parametrize("committed", COMMITTED[:3])
def test_exact_rule_needs_the_proposal_law_itself(committed):
    """The exact rule is lossless with q = the true law of the proposed target tokens (here known by
    enumeration) and lossy with the draft's q mapped naively (ignoring what the block's prefix was)."""
    c, rows = _draft_proposals(committed)
    proposals, weights = [x for x, _ in rows], [w for _, w in rows]
    p = _table(len(TARGET_TOK.strings), 0, "target")
    p_of = lambda prefix: p(c + list(prefix))  # noqa: E731
    keep = [k for k, x in enumerate(proposals) if x]  # an empty block is a plain step under any rule
    props, ws = [proposals[k] for k in keep], [weights[k] for k in keep]
    V = len(TARGET_TOK.strings)
    exact = proposal_law_error(props, ws, p_of, mode="exact", q_of=_conditional_q(props, ws, V))
    naive = proposal_law_error(props, ws, p_of, mode="exact", q_of=_conditional_q(props, ws, V, marginal=True))
    assert exact < 1e-12
    assert naive > 1e-3  # rounding is 1e-16; the gap is the rule's


# ------------------------------------------------------------------------------------------------
# end to end: two byte-level BPE tokenizers trained on different text, tiny models, SpeculativeDecoder

import numpy as np

from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
from spade_lib.decoding.drafts.crossvocab import TextDraftConfig, TextDrafter
from spade_lib.exactness import counts_chi_square_pvalue, sequence_law
from spade_lib.sampling import SamplingConfig
from tests.test_decode import CheckedAdapter, ToyLM

# logit bonuses by string: the target favours "dd" (one target token, two draft tokens "d" "d"), the draft
# "d"; the draft's "ca" splits into target "c" "a"; the target's "an" is two draft tokens
TARGET_BONUS = {"dd": 6, "d": 4, "a": 4, "n": 4, "an": 4.5, "c": 3}
DRAFT_BONUS = {"d": 6, "a": 4, "n": 4, "ca": 4, "c": 3}


@pytest.fixture(scope="module")
def tokenizers():
    from spade_lib.zoo.configs import TokenizerConfig
    from spade_lib.zoo.corpus import source_files
    from spade_lib.zoo.tokenizer import train_tokenizer

    files = dict(source_files()[0])
    target_text = files["transformers/models/llama/modeling_llama.py"].decode()[:8000]
    draft_text = files["transformers/models/gpt2/modeling_gpt2.py"].decode()[:8000]
    ttok = train_tokenizer([target_text], TokenizerConfig(vocab_size=320, min_frequency=2))
    dtok = train_tokenizer([draft_text], TokenizerConfig(vocab_size=300, min_frequency=2))
    tv, dv = ttok.get_vocab(), dtok.get_vocab()
    assert {"dd", "an"} <= set(tv) - set(dv) and "ca" in set(dv) - set(tv)  # the merges the bonuses rely on
    return ttok, dtok


class BiasedToyLM(ToyLM):
    """:class:`ToyLM` plus a fixed logit bonus per token (what makes a random draft agree sometimes)."""

    def __init__(self, tokenizer, bonus, seed, scale):
        super().__init__(len(tokenizer), seed, scale=scale, max_pos=96)
        bias = torch.tensor([float(bonus.get(tokenizer.decode([i]), 0.0)) for i in range(len(tokenizer))])
        self.register_buffer("logit_bias", bias)

    def forward(self, input_ids, cache=None, use_cache=False, position_ids=None, logits_to_keep=0):
        out = super().forward(input_ids, cache=cache, use_cache=use_cache, position_ids=position_ids,
                              logits_to_keep=logits_to_keep)
        out.logits = out.logits + self.logit_bias
        return out


def _pair(tokenizers, scale):
    ttok, dtok = tokenizers
    return BiasedToyLM(ttok, TARGET_BONUS, 0, scale), BiasedToyLM(dtok, DRAFT_BONUS, 1, scale)


PROMPTS = ["def f(x", "import os\n", "The return value is"]


def _greedy_equals_target(target, tokenizers, make_drafter) -> tuple[int, int, int]:
    """Greedy SPADE with ``make_drafter()`` (its draft behind a ``CheckedAdapter``: every extend equals a
    fresh forward) on every prompt equals the target's greedy output, and the drafter's own tokens spell
    the committed text; returns (drafts accepted, blocks rejected, draft-cache rollbacks)."""
    ttok, dtok = tokenizers
    greedy = SamplingConfig(temperature=0)
    accepted = rejected = crops = 0
    for prompt in PROMPTS:
        ids = ttok.encode(prompt, add_special_tokens=False)
        drafter = make_drafter()
        ref = AutoregressiveDecoder(target, sampling=greedy).generate(ids, 40)
        out = SpeculativeDecoder(target, drafter, gamma=3, sampling=greedy).generate(ids, 40)
        assert out.tokens == ref.tokens
        accepted += sum(s.n_accepted for s in out.steps)
        rejected += sum(s.n_accepted < s.gamma for s in out.steps)
        assert dtok.decode(drafter._draft_ids) == ttok.decode(ids + out.tokens)
        crops += drafter.adapter.crops
    return accepted, rejected, crops


@pytest.mark.parametrize("scale", [0.3, 1.0])  # long accepted blocks; mostly rejections
def test_greedy_text_drafting_equals_target_greedy(tokenizers, scale):
    ttok, dtok = tokenizers
    target, draft = _pair(tokenizers, scale)
    accepted, rejected, crops = _greedy_equals_target(target, tokenizers,
                                                      lambda: TextDrafter(CheckedAdapter(draft), dtok, ttok))
    print(f"scale {scale}: {accepted} drafts accepted, {rejected} blocks rejected, {crops} draft-cache rollbacks")
    assert accepted > 0 and rejected > 0 and crops > 0


@pytest.mark.slow
def test_sampled_text_drafting_has_the_target_law(tokenizers, record_property):
    """Chi-square of the first two emitted target tokens (1,000 seeded generations) against their exact law
    under plain target sampling (``sequence_law``): the draft samples its own text at temperature 1 from
    the decoder's draft stream, the verifier's uniforms come from the other two."""
    ttok, dtok = tokenizers
    target, draft = _pair(tokenizers, 0.3)
    sampling = SamplingConfig(temperature=1.0)
    ids = ttok.encode(PROMPTS[0], add_special_tokens=False)
    dec = SpeculativeDecoder(target, TextDrafter(draft, dtok, ttok, TextDraftConfig(temperature=1.0)), gamma=3,
                             sampling=sampling, record="light")
    V = len(ttok)
    counts = np.zeros(V * V, dtype=np.int64)
    first = []
    for seed in range(1000):
        out = dec.generate(ids, 4, seed=seed)
        counts[out.tokens[0] * V + out.tokens[1]] += 1
        first.append(out.steps[0].n_accepted)
    p_value = counts_chi_square_pvalue(counts, sequence_law(target, ids, sampling, 2))
    record_property("p_value_text_drafter", p_value)
    print(f"chi-square of the first two tokens vs the target's law: p = {p_value:.4f}; first-step accepted "
          f"counts {np.bincount(first).tolist()}")
    assert {0, 1, 2} <= set(first)  # rejections at the first token, and blocks accepted past it
    assert p_value > 1e-3


def test_greedy_text_drafting_on_random_llamas(tokenizers):
    """The same on two random Llamas (the lean forward, its own cache rollback): equal to target greedy."""
    from tests.tiny_models import llama

    ttok, dtok = tokenizers
    target, draft = llama(vocab=len(ttok), seed=0), llama(vocab=len(dtok), seed=1)
    greedy = SamplingConfig(temperature=0)
    ids = ttok.encode(PROMPTS[1], add_special_tokens=False)
    drafter = TextDrafter(draft, dtok, ttok, TextDraftConfig(window=4))
    out = SpeculativeDecoder(target, drafter, gamma=2, sampling=greedy).generate(ids, 30)
    assert out.tokens == AutoregressiveDecoder(target, sampling=greedy).generate(ids, 30).tokens
    assert sum(s.gamma for s in out.steps) > 0
    assert drafter.drafting_model() is drafter.adapter  # priced by its draft model's forward, not at c = 0
    # (random Llamas emit bytes that are not UTF-8: the draft sees them as U+FFFD, so its text differs there)


def test_text_drafter_bad_arguments(tokenizers):
    ttok, dtok = tokenizers
    _, draft = _pair(tokenizers, 0.3)
    with pytest.raises(ValueError, match="target_tokenizer"):
        TextDrafter(draft, dtok, object())
    with pytest.raises(ValueError, match="temperature"):
        TextDraftConfig(temperature=-1.0)
    with pytest.raises(ValueError, match="max_draft_tokens"):
        TextDraftConfig(max_draft_tokens=0)
    with pytest.raises(ValueError, match="prompt_ids"):
        TextDrafter(draft, dtok, ttok).reset([], len(ttok))


# ------------------------------------------------------------------------------------------------
# token-level intersection (TLI) as a drafter: the map by decoded strings, fp64 enumeration, the real decoder

from spade_lib.decoding.drafts.crossvocab import TLIConfig, TLIDrafter, tli_q, token_strings, vocab_intersection
from spade_lib.decoding.drafts.drafters import sample_categorical
from spade_lib.decoding.drafts.policies import FixedGamma
from spade_lib.sampling import adjust


class OddTokenizer:
    """Ids 0..6: a special token, a byte that is not text, "x" twice (encode picks id 4), "y" twice
    (encode picks neither: an id 6 merge the vocabulary lists under another spelling)."""

    all_special_ids = [0]
    strings = ["<s>", "\ufffd", "a", "x", "x", "y", "y"]

    def get_vocab(self):
        return {f"tok{i}": i for i in range(len(self.strings))}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.strings[i] for i in ids if not (skip_special_tokens and i in self.all_special_ids))

    def encode(self, text, add_special_tokens=False):
        return {"a": [2], "x": [4], "y": [2, 2]}.get(text, [])


def test_token_strings_is_one_to_one_by_decoded_text():
    assert token_strings(OddTokenizer()) == {"a": 2, "x": 4}  # special, U+FFFD, the unresolved "y" dropped
    assert token_strings(TARGET_TOK) == TARGET_TOK.ids
    d, t = vocab_intersection(DRAFT_TOK, TARGET_TOK)
    assert [DRAFT_TOK.strings[i] for i in d] == [TARGET_TOK.strings[i] for i in t] == ["a", "b", "c", "d"]


def _tli_blocks(committed, sampling, gamma=3, seed=0, scale=2.0):
    """Every block TLI proposes after the target tokens ``committed`` (fp64): its probability, and the
    ``q_I`` at each of its positions (``tli_q`` of a random draft table, the draft consuming its own id of
    each proposed string, as ``TLIDrafter``); also the full draft ``q`` at the first position."""
    c = t_ids(*committed)
    d_ctx = DRAFT_TOK.encode(TARGET_TOK.decode(c))
    d_ids, t_ids_ = vocab_intersection(DRAFT_TOK, TARGET_TOK)
    to_draft = dict(zip(t_ids_.tolist(), d_ids.tolist()))
    q_draft = _table(len(DRAFT_TOK.strings), seed, "draft", scale)
    V = len(TARGET_TOK.strings)
    blocks = []

    def grow(x, w, qs, ctx):
        q = tli_q(q_draft(ctx).log(), sampling, d_ids, t_ids_, V) if len(x) < gamma else None
        if q is None:  # max_gamma, or no mass on the intersection: the block ends
            blocks.append((tuple(x), w, torch.stack(qs) if qs else None))
            return
        assert q.dtype == torch.float64 and abs(float(q.sum()) - 1) < 1e-12
        for t in q.nonzero()[:, 0].tolist():
            grow(x + [t], w * float(q[t]), qs + [q], ctx + [to_draft[t]])

    grow([], 1.0, [], d_ctx)
    return c, blocks, q_draft(d_ctx)


@pytest.mark.parametrize("committed", COMMITTED)
def test_tli_step_through_verify_is_lossless_and_naive_is_not(committed):
    """One TLI step, every proposal enumerated with its probability and verified by the real
    ``verify`` (``exact`` rule, q = q_I): the emitted law is the target's to rounding (fp64). With top-k
    the draft sometimes keeps no string of the intersection (shorter or empty blocks): still exact.
    Against it: the naive rule (full draft q, first target token of the re-encoding) and a drafter that
    proposes from the full q but tells the verifier q_I are lossy."""
    p = _table(len(TARGET_TOK.strings), 0, "target")
    V = len(TARGET_TOK.strings)
    for sampling in (SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=2)):
        c, blocks, q0 = _tli_blocks(committed, sampling)
        p_of = lambda prefix: p(c + list(prefix))  # noqa: E731
        proposals, weights = [x for x, _, _ in blocks], [w for _, w, _ in blocks]
        assert abs(sum(weights) - 1) < 1e-12
        short = sum(len(x) < 3 for x in proposals)
        err = proposal_law_error(proposals, weights, p_of, mode="exact", q_of=lambda k: blocks[k][2])
        print(f"{committed} {sampling}: {len(blocks)} blocks ({short} ended early), TLI error {err:.2e}")
        assert err < 1e-12
        if sampling.top_k == 0:
            assert short == 0 and len(blocks) == 4 ** 3  # every string of I at every position
        else:  # top-2 of the draft's six strings keeps none of I somewhere (not in the last context)
            assert short > 0 or committed == COMMITTED[-1]
    # the naive rule: draft d ~ q (all six strings), propose the first target token of its re-encoding
    to_target = torch.tensor([TARGET_TOK.encode(s)[0] for s in DRAFT_TOK.strings])
    naive = float((naive_emitted_law(p_of(()), q0, to_target) - p_of(())).abs().sum()) / 2
    # a careless drafter: x = to_target[d], d ~ full q, the verifier told q_I (one position)
    q_I = tli_q(q0.log(), SamplingConfig(), *vocab_intersection(DRAFT_TOK, TARGET_TOK), V)
    careless = proposal_law_error([(int(to_target[d]),) for d in range(len(q0))], q0.tolist(), p_of,
                                  mode="exact", q_of=lambda k: q_I[None])
    print(f"naive rule: total variation {naive:.3f}; careless drafter: error {careless:.3f}")
    assert naive > 1e-4 and careless > 1e-4  # rounding is 1e-16; the gap is the rule's


def test_tli_greedy_q_is_the_argmax_on_the_intersection():
    d_ids, t_ids_ = vocab_intersection(DRAFT_TOK, TARGET_TOK)
    logits = torch.tensor([0.0, 1.0, 0.5, 2.0, 9.0, 8.0])  # the draft's best, "cd" and "bc", are outside I
    q = tli_q(logits, SamplingConfig(temperature=0), d_ids, t_ids_, len(TARGET_TOK.strings))
    assert q.tolist() == torch.nn.functional.one_hot(torch.tensor(TARGET_TOK.ids["d"]), 6).float().tolist()
    assert tli_q(logits, SamplingConfig(top_k=2), d_ids, t_ids_, 6) is None  # top-2 keeps no string of I


# TLI's pair: both favour "d" (in I); the target's "an" is two draft tokens, and the draft's favourite "ca" is
# no target token (outside I: TLI drops its mass, a careless drafter proposes its first target token "c")
TLI_TARGET_BONUS = {"d": 6, "a": 4, "n": 4, "an": 4.5, "c": 4}
TLI_DRAFT_BONUS = {"d": 5, "ca": 6, "c": 3}


def _tli_pair(tokenizers, scale):
    ttok, dtok = tokenizers
    strings_t, strings_d = token_strings(ttok), token_strings(dtok)
    assert "ca" in set(strings_d) - set(strings_t) and {"d", "c"} <= set(strings_d) & set(strings_t)
    return BiasedToyLM(ttok, TLI_TARGET_BONUS, 0, scale), BiasedToyLM(dtok, TLI_DRAFT_BONUS, 1, scale)


@pytest.mark.parametrize("scale", [0.3, 1.0])  # both agree on "ddd...": all accepted; mostly rejections
def test_greedy_tli_equals_target_greedy(tokenizers, scale):
    ttok, dtok = tokenizers
    target, draft = _tli_pair(tokenizers, scale)
    accepted, rejected, crops = _greedy_equals_target(target, tokenizers,
                                                      lambda: TLIDrafter(CheckedAdapter(draft), dtok, ttok, TLIConfig()))
    print(f"scale {scale}: {accepted} drafts accepted, {rejected} blocks rejected, {crops} draft-cache rollbacks")
    assert accepted > 0 and (rejected > 0 and crops > 0 if scale == 1.0 else rejected == 0)


def test_greedy_tli_on_random_llamas(tokenizers):
    from tests.tiny_models import llama

    ttok, dtok = tokenizers
    target, draft = llama(vocab=len(ttok), seed=0), llama(vocab=len(dtok), seed=1)
    greedy = SamplingConfig(temperature=0)
    ids = ttok.encode(PROMPTS[1], add_special_tokens=False)
    out = SpeculativeDecoder(target, TLIDrafter(draft, dtok, ttok, TLIConfig(window=4)), gamma=2,
                             sampling=greedy).generate(ids, 30)
    assert out.tokens == AutoregressiveDecoder(target, sampling=greedy).generate(ids, 30).tokens
    assert sum(s.gamma for s in out.steps) > 0


class CarelessTLIDrafter(TLIDrafter):
    """The broken variant: the draft's id ``d ~ q`` over its *full* vocabulary, proposed as the first target
    token of its string's re-encoding, the verifier told ``q_I`` (not the law the token was drawn from)."""

    def _draw(self, logits, sampling, generator):
        q_I = tli_q(logits, sampling, self.draft_ids, self.target_ids, self.vocab_size)
        d = int(sample_categorical(adjust(logits[None], sampling), generator)[0])
        x = self.target_tokenizer.encode(self.draft_tokenizer.decode([d]), add_special_tokens=False)
        if q_I is None or not x or float(q_I[x[0]]) == 0:  # nothing the verifier could be told: end the block
            return None
        return x[0], d, q_I


def _chi_square(tokenizers, drafter_class, n=1000):
    """Chi-square of the first two emitted target tokens of ``n`` seeded T = 1 generations against their
    exact law under plain target sampling (``sequence_law``)."""
    ttok, dtok = tokenizers
    target, draft = _tli_pair(tokenizers, 0.3)
    sampling = SamplingConfig(temperature=1.0)
    ids = ttok.encode(PROMPTS[0], add_special_tokens=False)
    dec = SpeculativeDecoder(target, drafter_class(draft, dtok, ttok, TLIConfig()), gamma=3, sampling=sampling,
                             record="light")
    assert dec.mode == "exact"
    V = len(ttok)
    counts = np.zeros(V * V, dtype=np.int64)
    first = []
    for seed in range(n):
        out = dec.generate(ids, 4, seed=seed)
        counts[out.tokens[0] * V + out.tokens[1]] += 1
        first.append(out.steps[0].n_accepted)
    return counts_chi_square_pvalue(counts, sequence_law(target, ids, sampling, 2)), np.bincount(first).tolist()


@pytest.mark.slow
def test_sampled_tli_has_the_target_law_and_a_careless_one_does_not(tokenizers, record_property):
    p_tli, first = _chi_square(tokenizers, TLIDrafter)
    p_careless, first_careless = _chi_square(tokenizers, CarelessTLIDrafter)
    record_property("p_value_tli", p_tli)
    record_property("p_value_careless_tli", p_careless)
    print(f"chi-square of the first two tokens vs the target's law, 1,000 seeded runs: TLI p = {p_tli:.4f} "
          f"(first-step accepted counts {first}); careless variant p = {p_careless:.2e} ({first_careless})")
    assert len(first) >= 3  # rejections at the first token, and blocks accepted past it
    assert p_tli > 1e-3
    assert p_careless < 1e-3


def test_tli_policy_stop_and_empty_block(tokenizers):
    """The policy is consulted after each drafted token; an empty proposal is a plain target step."""
    ttok, dtok = tokenizers
    target, draft = _tli_pair(tokenizers, 0.3)
    drafter = TLIDrafter(draft, dtok, ttok, TLIConfig())
    drafter.reset(ttok.encode(PROMPTS[0], add_special_tokens=False), len(ttok))
    stop_at_one = type("Once", (), {"needs_signals": True, "keep_drafting": lambda self, top, h: False})()
    tree = drafter.propose(3, stop_at_one, SamplingConfig(), torch.Generator().manual_seed(0))
    assert tree.gamma == 1 and tree.stop == "policy" and abs(float(tree.q.sum()) - 1) < 1e-5
    drafter.accept(0, int(tree.tokens[0]))
    tree = drafter.propose(3, FixedGamma(3), SamplingConfig(top_k=1), torch.Generator().manual_seed(0))
    assert tree.stop in ("max_gamma", "no_match")  # top-1 keeps one draft string: in I or not
    assert tree.q.shape == (tree.gamma, len(ttok))


def test_tli_bad_arguments(tokenizers):
    ttok, dtok = tokenizers
    _, draft = _pair(tokenizers, 0.3)
    with pytest.raises(ValueError, match="config"):
        TLIDrafter(draft, dtok, ttok, TextDraftConfig())
    with pytest.raises(ValueError, match="target_tokenizer"):
        TLIDrafter(draft, dtok, object(), TLIConfig())
    with pytest.raises(ValueError, match="draft_tokenizer"):
        TLIDrafter(draft, GreedyTokenizer(["\u00e9\u00e9\u00e9", "\u03a9\u03a9"]), ttok, TLIConfig())
    with pytest.raises(ValueError, match="window"):
        TLIConfig(window=0)
    with pytest.raises(ValueError, match="tokenizer"):
        token_strings(object())
    d = TLIDrafter(draft, dtok, ttok, TLIConfig())
    with pytest.raises(ValueError, match="propose"):
        d.propose(3, FixedGamma(3), SamplingConfig(), None)
    with pytest.raises(ValueError, match="prompt_ids"):
        d.reset([], len(ttok))
    with pytest.raises(ValueError, match="vocab_size"):
        d.reset([1, 2], 3)


# ------------------------------------------------------------------------------------------------
# what a step costs (DraftStepCosts), the committed tails decoded once a step, and TLI at the draft's EOS

from spade_lib.decoding.drafts.crossvocab import tail_of


def test_a_given_tail_reencodes_as_the_computed_one():
    committed = t_ids("c", "da", "b")
    for text in ("ab", "cd", "dab", ""):
        tail = tail_of(committed, TARGET_TOK, 2)
        assert continuation(committed, text, TARGET_TOK, window=2, tail=tail) == continuation(committed, text, TARGET_TOK,
                                                                                            window=2)
        assert appended_text(committed, t_ids("ab"), TARGET_TOK, window=2, tail=tail) == "ab"


@pytest.mark.parametrize("rule", ["text", "tli"])
def test_drafters_account_for_every_step(tokenizers, rule):
    """Every step carries the drafter's own account: one forward per token drawn, the text work timed
    apart, and (text drafting) about two tokenizer calls per draft token drawn plus a few per step --
    decoding the committed tails once per step, not once per drawn token (which made ~6 per token), and
    never re-encoding a special token (a tail holding one took the slow alignment, ever more calls)."""
    ttok, dtok = tokenizers
    target, draft = (_pair if rule == "text" else _tli_pair)(tokenizers, 0.3)
    greedy = SamplingConfig(temperature=0)
    drafter = TextDrafter(draft, dtok, ttok) if rule == "text" else TLIDrafter(draft, dtok, ttok, TLIConfig())
    # a special token near the end, as a chat template leaves one: decoded to nothing, it is never re-encoded
    ids = ttok.encode(PROMPTS[2], add_special_tokens=False) + [ttok.eos_token_id] + ttok.encode(" x", add_special_tokens=False)
    drafter.reset(ids, len(ttok))
    assert drafter.step_costs() is None  # no step closed yet
    out = SpeculativeDecoder(target, drafter, gamma=3, sampling=greedy).generate(ids, 40)
    assert out.tokens == AutoregressiveDecoder(target, sampling=greedy).generate(ids, 40).tokens
    costs = [s.draft_costs for s in out.steps]
    assert all(c is not None for c in costs)
    draws = np.array([c["draft_tokens"] for c in costs])
    calls = np.array([c["encode_calls"] + c["decode_calls"] for c in costs])
    for s, c in zip(out.steps, costs):
        assert c["fed"] >= c["forwards"] >= c["draft_tokens"] >= (s.gamma if rule == "tli" else 0)
        assert c["t_forward"] >= 0 and c["t_text"] >= 0 and c["encode_calls"] >= 1  # the commit re-encodes
    if rule == "text":
        assert (np.array([c["forwards"] for c in costs]) == draws).all() and draws.sum() >= sum(out.gammas)
        assert (calls <= 2 * draws + 12).all(), list(zip(calls, draws))  # the special token's steps included
    else:
        assert calls.max() <= 8  # TLI's text work is the commit's re-sync alone


class EndingToyLM(BiasedToyLM):
    """:class:`BiasedToyLM` that wants to end: its EOS logit gains 30 from position ``end_at`` on."""

    def __init__(self, tokenizer, bonus, seed, scale, end_at):
        super().__init__(tokenizer, bonus, seed, scale)
        self.end_at, self.eos = end_at, tokenizer.eos_token_id

    def forward(self, input_ids, cache=None, use_cache=False, position_ids=None, logits_to_keep=0):
        past = 0 if cache is None else cache.get_seq_length()
        out = super().forward(input_ids, cache=cache, use_cache=use_cache, position_ids=position_ids,
                              logits_to_keep=logits_to_keep)
        pos = position_ids[0] if position_ids is not None else torch.arange(past, past + input_ids.shape[1])
        out.logits[..., self.eos] += 30.0 * (pos[-out.logits.shape[1]:] >= self.end_at)
        return out


def test_tli_ends_its_block_where_the_draft_would_end_and_the_target_still_writes_eos(tokenizers):
    """A draft that wants to end (EOS its argmax) proposes nothing under ``stop_at_eos`` (plain target
    steps; without it, the intersection's best string after its end); ``q_I`` puts no mass on the target's
    EOS, which the target writes itself, as the residual or bonus token: greedy output equals AR's,
    EOS included, whichever drafter."""
    ttok, dtok = tokenizers
    eos_t, eos_d = ttok.eos_token_id, dtok.eos_token_id
    ids = ttok.encode(PROMPTS[0], add_special_tokens=False)
    target = EndingToyLM(ttok, TLI_TARGET_BONUS, 0, 0.3, end_at=len(ids) + 12)
    ending = BiasedToyLM(dtok, {**TLI_DRAFT_BONUS, dtok.decode([eos_d]): 20.0}, 1, 0.3)
    _, plain = _tli_pair(tokenizers, 0.3)
    greedy = SamplingConfig(temperature=0)
    ref = AutoregressiveDecoder(target, sampling=greedy, eos_token_id=eos_t).generate(ids, 40)
    assert ref.stop_reason == "eos" and len(ref.tokens) == 14 and ref.tokens[-1] == eos_t  # the token after end_at
    for draft, config, drafts in ((ending, TLIConfig(), False), (ending, TLIConfig(stop_at_eos=False), True),
                                  (plain, TLIConfig(), True)):
        drafter = TLIDrafter(draft, dtok, ttok, config)
        out = SpeculativeDecoder(target, drafter, gamma=3, sampling=greedy, eos_token_id=eos_t).generate(ids, 40)
        assert out.tokens == ref.tokens and out.stop_reason == "eos"
        assert (sum(out.gammas) > 0) == drafts
        if not drafts:
            assert {s.draft_stop for s in out.steps[:-1]} == {"no_match"}
    drafter = TLIDrafter(plain, dtok, ttok, TLIConfig())
    drafter.reset(ids, len(ttok))
    tree = drafter.propose(3, FixedGamma(3), SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    assert tree.gamma > 0 and float(tree.q[:, eos_t].sum()) == 0.0  # EOS is outside I


@pytest.mark.slow
def test_sampled_tli_stopping_at_the_drafts_eos_keeps_the_target_law(tokenizers):
    """Chi-square of the first two tokens (1,000 seeded T = 1 generations) with a draft whose EOS becomes
    its argmax after some of its sampled strings, so about half the first blocks end early (``stop_at_eos``,
    first-step gamma 1 or 2, else 3): the law is still the target's."""
    ttok, dtok = tokenizers
    target, _ = _tli_pair(tokenizers, 0.3)
    draft = BiasedToyLM(dtok, {**TLI_DRAFT_BONUS, dtok.decode([dtok.eos_token_id]): 5.3}, 1, 0.3)
    sampling = SamplingConfig(temperature=1.0)
    ids = ttok.encode(PROMPTS[0], add_special_tokens=False)
    dec = SpeculativeDecoder(target, TLIDrafter(draft, dtok, ttok, TLIConfig()), gamma=3, sampling=sampling,
                             record="light", eos_token_id=[])
    V = len(ttok)
    counts = np.zeros(V * V, dtype=np.int64)
    stops = []
    for seed in range(1000):
        out = dec.generate(ids, 4, seed=seed)
        counts[out.tokens[0] * V + out.tokens[1]] += 1
        stops.append(out.steps[0].gamma)
    p_value = counts_chi_square_pvalue(counts, sequence_law(target, ids, sampling, 2))
    print(f"first-step gamma counts {np.bincount(stops).tolist()}; chi-square p = {p_value:.4f}")
    assert 0.2 < np.mean(np.array(stops) < 3) < 0.8  # about half the first blocks end at the draft's EOS
    assert p_value > 1e-3


# ------------------------------------------------------------------------------------------------
# string-level rejection sampling (SLRS): the law of the longest target token the draft's string starts with,
# summed over every draft-token path, against a reference that enumerates the draft's text; fp64 enumeration
# of whole blocks through the real verify; the real decoder (greedy equality, chi-square)

import math

from spade_lib.decoding.drafts.crossvocab import (STOP, DraftPaths, SLRSConfig, SLRSDrafter, draft_strings, sample_string,
                                           slrs_law)
from spade_lib.exactness import draft_text_law

# a second pair with deeper paths: the target's "abc" has the draft spellings [a, b, c], [ab, c], [a, bc] (its
# prefix "ab" two: [a, b], [ab]), the draft's "cd" and "bc" split, its last id (7) is not text (its text ends)
SLRS_TARGET = GreedyTokenizer(["a", "b", "c", "d", "ab", "abc", "da"])
SLRS_DRAFT = GreedyTokenizer(["a", "b", "c", "d", "ab", "bc", "cd"])
SLRS_PAIRS = {"merges": (TARGET_TOK, DRAFT_TOK), "deep": (SLRS_TARGET, SLRS_DRAFT)}


def _longest_target_prefix(text, target):
    """lambda, written out: the id of the longest target string ``text`` starts with (None: none)."""
    best = None
    for s, i in target.ids.items():
        if text.startswith(s) and (best is None or len(s) > len(target.strings[best])):
            best = i
    return best


def _reference_laws(target, ds, next_law):
    """From the draft's exact text law (:func:`draft_text_law`, every id sequence as long as the longest target
    token, so every proposal is decided): the law of ``lambda(S)`` over target ids + STOP, and
    ``psi(t) = P(S starts with t)`` (the draft's string probability of each target token, over its tokenizations)."""
    V = len(target.strings)
    texts = draft_text_law(ds, next_law, max(map(len, target.strings)))
    lam, psi = [0.0] * (V + 1), [0.0] * V
    for text, w in texts.items():
        t = _longest_target_prefix(text, target)
        lam[V if t is None else t] += w
        for s, i in target.ids.items():
            if text.startswith(s):
                psi[i] += w
    return torch.tensor(lam, dtype=torch.float64), torch.tensor(psi, dtype=torch.float64)


def _draft_rows(table, ctx, sampling):
    """The draft's adjusted rows after ``ctx + path`` (fp64), as ``SLRSDrafter`` computes them from logits."""
    return lambda path: adjust(table(ctx + list(path)).log(), sampling, torch.float64)  # noqa: E731


@pytest.mark.parametrize("pair", sorted(SLRS_PAIRS))
@pytest.mark.parametrize("committed", ["cab", "ab", "d", "a"])
def test_slrs_law_is_the_draft_string_law_summed_over_its_paths(pair, committed):
    """``slrs_law`` (the path enumeration) equals the law of ``lambda(S)`` read off the draft's exact text law,
    to rounding; ``q(t) = psi(t) - sum psi(t')`` over the shortest target tokens ``t'`` extending ``t``, and
    ``sum psi > sum q`` (a target token is a prefix of another, "a" of "ab"): ``psi`` counts a string once per
    target token it starts with, so it is no law over target tokens."""
    target, draft = SLRS_PAIRS[pair]
    V, Vd = len(target.strings), len(draft.strings) + 1  # the draft's last id is not text
    ds = draft_strings(draft, Vd)
    assert ds[-1] is None and ds[:-1] == tuple(draft.strings)
    paths = DraftPaths(ds, token_strings(target))
    assert (paths.n_nodes, paths.depth) == {"merges": (3, 1), "deep": (5, 2)}[pair]
    table = _table(Vd, 0, "draft", scale=1.0)
    ctx = draft.encode(committed)
    for sampling in (SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=3)):
        rows = _draft_rows(table, ctx, sampling)
        q, laws = slrs_law(paths, rows, V)
        lam, psi = _reference_laws(target, ds, rows)
        assert float((q - lam).abs().max()) < 1e-14 and abs(float(q.sum()) - 1) < 1e-14
        if sampling.top_k == 0:  # every inner node has mass; the end id stops some strings; psi overcounts
            assert len(laws) == paths.n_nodes and q[V] > 0 and float(psi.sum() - q[:V].sum()) > 1e-3
        for s, t in target.ids.items():
            longer = [u for u in target.strings if u.startswith(s) and u != s]
            shortest = [u for u in longer if not any(u.startswith(v) and u != v for v in longer)]
            assert abs(float(q[t]) - (float(psi[t]) - sum(float(psi[target.ids[u]]) for u in shortest))) < 1e-14


def test_sample_string_walks_the_rows_of_slrs_law():
    """Walking the rows with forced draws: each path's ids in turn, ending where its text decides."""
    paths = DraftPaths(draft_strings(SLRS_DRAFT, 8), token_strings(SLRS_TARGET))
    one_hot = lambda d: torch.nn.functional.one_hot(torch.tensor(d), 8).double()  # noqa: E731
    ids = SLRS_DRAFT.ids
    for walk, decided in ([("a", "b", "c"), "abc"], [("ab", "cd"), "abc"], [("a", "bc"), "abc"], [("ab", "d"), "ab"],
                          [("cd",), "c"], [("d", "a"), "da"], [("d", "b"), "d"], [("a", None), "a"]):
        rows = {tuple(ids[s] for s in walk[:i]): one_hot(7 if walk[i] is None else ids[walk[i]])
                for i in range(len(walk))}
        q, laws = slrs_law(paths, lambda path: rows[path], len(SLRS_TARGET.strings))
        assert sample_string(paths, laws, None, greedy=True) == (SLRS_TARGET.ids[decided], len(walk))
        assert q.tolist() == torch.nn.functional.one_hot(torch.tensor(SLRS_TARGET.ids[decided]), 8).double().tolist()
    q, laws = slrs_law(paths, lambda path: one_hot(7), 7)  # the text ends at once: nothing to propose
    assert sample_string(paths, laws, torch.Generator().manual_seed(0)) == (STOP, 1) and q[7] == 1


def _slrs_blocks(pair, committed, sampling, q_rule, gamma=3, seed=0):
    """Every block SLRS proposes after the text ``committed``, with its probability from the *reference* law
    of ``lambda(S)`` at each position (the draft's context: the committed text and the proposed tokens' text,
    re-encoded as ``SLRSDrafter`` does), and the ``q`` the verifier is told there by ``q_rule(paths, rows, ctx)``."""
    target, draft = SLRS_PAIRS[pair]
    V, Vd = len(target.strings), len(draft.strings) + 1
    ds = draft_strings(draft, Vd)
    paths = DraftPaths(ds, token_strings(target))
    table = _table(Vd, seed, "draft", scale=1.0)
    d_ctx = draft.encode(committed)
    tail = tail_of(d_ctx, draft, 16)
    blocks = []

    def grow(x, w, qs, text):
        if len(x) == gamma:
            blocks.append((tuple(x), w, torch.stack(qs)))
            return
        ctx = d_ctx[:tail.start] + draft.encode(tail.text + text)
        rows = _draft_rows(table, ctx, sampling)
        lam, _ = _reference_laws(target, ds, rows)
        if lam[V] > 0:  # the draft's text ended first: the block ends here
            blocks.append((tuple(x), w * float(lam[V]), torch.stack(qs) if qs else None))
        q = q_rule(paths, rows, ctx)
        for t in lam[:V].nonzero()[:, 0].tolist():
            grow(x + [t], w * float(lam[t]), qs + [q], text + target.strings[t])

    grow([], 1.0, [], "")
    return target, blocks


def _slrs_q(paths, rows, ctx):
    q, _ = slrs_law(paths, rows, len(paths.target_strings))
    V = len(paths.target_strings)
    return q[:V] / q[:V].sum()


def _single_path_q(paths, rows, ctx):
    """The broken variant: each target token's probability along the draft's one tokenization of its text (its
    longest-match encoding), normalised -- the other spellings and the draft tokens that overshoot it are missed."""
    spell = GreedyTokenizer([s for s in paths.draft_strings if s is not None])  # the text ids come first
    q = torch.zeros(len(paths.target_strings), dtype=torch.float64)
    for s, t in paths.target_strings.items():
        ids = spell.encode(s)
        q[t] = math.prod(float(rows(tuple(ids[:j]))[d]) for j, d in enumerate(ids))
    return q / q.sum()


def _psi_q(paths, rows, ctx):
    """Another broken variant: ``psi(t)`` (the draft's probability of a string starting with ``t``), normalised."""
    inv = {i: s for s, i in paths.target_strings.items()}
    target = GreedyTokenizer([inv[i] for i in range(len(inv))])
    _, psi = _reference_laws(target, paths.draft_strings, rows)
    return psi / psi.sum()


@pytest.mark.parametrize("pair", sorted(SLRS_PAIRS))
@pytest.mark.parametrize("committed", ["cab", "d", "a"])
def test_slrs_block_through_verify_is_lossless_and_single_path_is_not(pair, committed):
    """A whole SLRS step (gamma = 2: the second position's law depends on the first token), every block
    enumerated with its probability under the reference law and verified by the real ``verify`` (``exact``
    rule) told SLRS's ``q``: the emitted law is the target's to rounding (fp64), blocks ended early by the
    draft's end id included. Told the single-path ``q`` or the normalised ``psi`` instead: lossy."""
    p = _table(len(SLRS_PAIRS[pair][0].strings), 0, "target")
    cases = [("slrs", SamplingConfig(temperature=1.0)), ("slrs", SamplingConfig(temperature=0.7, top_k=3)),
             ("single_path", SamplingConfig(temperature=1.0)), ("psi", SamplingConfig(temperature=1.0))]
    rules = {"slrs": _slrs_q, "single_path": _single_path_q, "psi": _psi_q}
    errors = {}
    for name, sampling in cases:
        target, blocks = _slrs_blocks(pair, committed, sampling, rules[name], gamma=2)
        c = target.encode(committed)
        p_of = lambda prefix: p(c + list(prefix))  # noqa: E731
        proposals, weights = [x for x, _, _ in blocks], [w for _, w, _ in blocks]
        assert abs(sum(weights) - 1) < 1e-12 and min(map(len, proposals)) < 2 == max(map(len, proposals))
        errors[name, sampling.top_k] = proposal_law_error(proposals, weights, p_of, mode="exact",
                                                          q_of=lambda k: blocks[k][2])
    print(f"{pair} {committed!r}: {len(blocks)} blocks; errors {errors}")
    assert errors["slrs", 0] < 1e-12 and errors["slrs", 3] < 1e-12
    assert errors["single_path", 0] > 1e-3 and errors["psi", 0] > 1e-3  # rounding is 1e-16; the gap is the rule's


@pytest.mark.parametrize("scale", [0.3, 1.0])  # long accepted blocks; mostly rejections
def test_greedy_slrs_equals_target_greedy(tokenizers, scale):
    """Greedy SLRS (each position walks the draft's argmax path to the longest target token it spells) on the
    byte-level BPE pair, its draft behind a ``CheckedAdapter``: the target's greedy output, with accepted
    drafts, rejections and draft-cache rollbacks."""
    ttok, dtok = tokenizers
    target, draft = _pair(tokenizers, scale)
    accepted, rejected, crops = _greedy_equals_target(
        target, tokenizers, lambda: SLRSDrafter(CheckedAdapter(draft), dtok, ttok, SLRSConfig()))
    print(f"scale {scale}: {accepted} drafts accepted, {rejected} blocks rejected, {crops} draft-cache rollbacks")
    assert accepted > 0 and rejected > 0 and crops > 0


class VectorBiasLM(BiasedToyLM):
    """:class:`ToyLM` plus a fixed logit bonus per id (``bias``, one per id: the synthetic tokenizers'
    vocabularies, the draft's end id included)."""

    def __init__(self, bias, seed, scale):
        ToyLM.__init__(self, len(bias), seed, scale=scale, max_pos=32)
        self.register_buffer("logit_bias", torch.tensor(bias, dtype=torch.float32))


def _slrs_toy_pair():
    """Toy LMs on the ``deep`` pair: the target favours "abc" and "da"; the draft writes them through tokens that
    overshoot ("bc", "cd") or spell them in pieces ("a" "b"), and sometimes ends (id 7)."""
    #                          a    b    c    d    ab   abc  da
    target = VectorBiasLM([1.0, 0.5, 0.5, 1.0, 1.0, 2.0, 1.5], 0, 0.5)
    #                         a    b    c    d    ab   bc   cd   end
    draft = VectorBiasLM([1.5, 0.5, 0.5, 1.0, 1.0, 1.5, 1.0, 0.0], 1, 0.5)
    return target, draft


@pytest.mark.slow
def test_sampled_slrs_has_the_target_law(record_property):
    """Chi-square of the first two emitted target tokens (2,000 seeded T = 1 generations through
    ``SpeculativeDecoder``) against their exact law under plain target sampling (``sequence_law``): the draft
    writes its strings from the decoder's draft stream, the verifier is told SLRS's ``q``."""
    target, draft = _slrs_toy_pair()
    sampling = SamplingConfig(temperature=1.0)
    ids = SLRS_TARGET.encode("cab")
    drafter = SLRSDrafter(draft, SLRS_DRAFT, SLRS_TARGET, SLRSConfig())
    dec = SpeculativeDecoder(target, drafter, gamma=3, sampling=sampling, record="light")
    assert dec.mode == "exact"
    V = len(SLRS_TARGET.strings)
    counts = np.zeros(V * V, dtype=np.int64)
    first = []
    for seed in range(2000):
        out = dec.generate(ids, 4, seed=seed)
        counts[out.tokens[0] * V + out.tokens[1]] += 1
        first.append(out.steps[0].n_accepted)
    p_value = counts_chi_square_pvalue(counts, sequence_law(target, ids, sampling, 2))
    record_property("p_value_slrs", p_value)
    print(f"chi-square of the first two tokens vs the target's law, 2,000 seeded runs: SLRS p = {p_value:.4f}; "
          f"first-step accepted counts {np.bincount(first).tolist()}")
    assert {0, 1, 2} <= set(first)  # rejections at the first token, and blocks accepted past it
    assert p_value > 1e-3


def test_slrs_policy_stop_and_a_draft_that_ends_at_once():
    """The policy is consulted after each drafted token with ``q``'s signals; a draft whose text always ends at
    once proposes nothing (``STOP``: plain target steps), and greedy output is still the target's."""
    target, draft = _slrs_toy_pair()
    ids = SLRS_TARGET.encode("cab")
    never_ends = VectorBiasLM([1.5, 0.5, 0.5, 1.0, 1.0, 1.5, 1.0, -30.0], 1, 0.5)
    drafter = SLRSDrafter(never_ends, SLRS_DRAFT, SLRS_TARGET, SLRSConfig())
    drafter.reset(ids, len(SLRS_TARGET.strings))
    stop_at_one = type("Once", (), {"needs_signals": True, "keep_drafting": lambda self, top, h: False})()
    tree = drafter.propose(3, stop_at_one, SamplingConfig(), torch.Generator().manual_seed(0))
    assert tree.gamma == 1 and tree.stop == "policy" and abs(float(tree.q.sum()) - 1) < 1e-6
    ending = VectorBiasLM([0.0] * 7 + [30.0], 1, 0.5)
    greedy = SamplingConfig(temperature=0)
    ref = AutoregressiveDecoder(target, sampling=greedy).generate(ids, 12)
    for d in (draft, ending):
        out = SpeculativeDecoder(target, SLRSDrafter(d, SLRS_DRAFT, SLRS_TARGET), gamma=3,
                                 sampling=greedy).generate(ids, 12)
        assert out.tokens == ref.tokens
        assert (sum(out.gammas) == 0) == (d is ending)
        if d is ending:
            assert {s.draft_stop for s in out.steps[:-1]} == {"no_match"}


def test_slrs_bad_arguments(tokenizers):
    ttok, dtok = tokenizers
    _, draft = _pair(tokenizers, 0.3)
    with pytest.raises(ValueError, match="^window"):
        SLRSConfig(window=0)
    with pytest.raises(ValueError, match="^max_nodes"):
        SLRSConfig(max_nodes=0)
    with pytest.raises(ValueError, match="^config"):
        SLRSDrafter(draft, dtok, ttok, TLIConfig())
    with pytest.raises(ValueError, match=r"^max_nodes: SLRS enumerates 138 draft-token paths .* up to 7 draft tokens "
                                         r"deep.* more than max_nodes=100"):
        SLRSDrafter(draft, dtok, ttok, SLRSConfig(max_nodes=100))
    with pytest.raises(ValueError, match="^tokenizer"):
        draft_strings(object(), 5)
    with pytest.raises(ValueError, match="^vocab_size"):
        draft_strings(DRAFT_TOK, 0)
    with pytest.raises(ValueError, match="^draft_strings"):
        DraftPaths([None], {"a": 0})
    with pytest.raises(ValueError, match="^target_strings"):
        DraftPaths(["a"], {})
    with pytest.raises(ValueError, match="^vocab_size"):
        slrs_law(DraftPaths(["a", "b"], {"a": 0, "b": 5}), lambda path: torch.tensor([0.5, 0.5]), 3)
    d = SLRSDrafter(draft, dtok, ttok)
    with pytest.raises(ValueError, match="^propose"):
        d.propose(3, FixedGamma(3), SamplingConfig(), None)
    with pytest.raises(ValueError, match="^prompt_ids"):
        d.reset([], len(ttok))
    with pytest.raises(ValueError, match="^vocab_size"):
        d.reset([1, 2], 3)


def test_slrs_accounts_for_its_paths(tokenizers):
    """What an SLRS step costs, from its own account: greedy walks one path a position (at most ``depth + 1``
    forwards, the root's included), sampling enumerates at most ``n_nodes`` a position; one forward per
    fed token except the re-sync of the committed text; tokenizer calls a few per position, never per path."""
    ttok, dtok = tokenizers
    target, draft = _pair(tokenizers, 0.3)
    ids = ttok.encode(PROMPTS[0], add_special_tokens=False)
    for sampling, per_position in ((SamplingConfig(temperature=0), "depth"), (SamplingConfig(temperature=1.0), "nodes")):
        drafter = SLRSDrafter(draft, dtok, ttok)
        paths = drafter.paths
        assert (paths.n_nodes, paths.depth) == (138, 7)
        out = SpeculativeDecoder(target, drafter, gamma=3, sampling=sampling).generate(ids, 16, seed=0)
        limit = paths.depth + 1 if per_position == "depth" else paths.n_nodes
        for s in out.steps:
            c = s.draft_costs
            assert c["forwards"] <= 3 * limit and c["fed"] >= c["forwards"] >= c["draft_tokens"] >= s.gamma
            assert c["encode_calls"] + c["decode_calls"] <= 16
        forwards = [s.draft_costs["forwards"] for s in out.steps]
        print(f"{sampling}: forwards per step {forwards}")
        if per_position == "nodes":
            assert max(forwards) > 3 * (paths.depth + 1)  # the sum over paths, not one walk


def test_the_cross_vocabulary_drafters_register_from_their_own_module_with_their_declared_kinds(tokenizers):
    """``drafters`` never imports this module (no import circle): its drafters register here under their rules,
    and ``make_drafter`` / ``check_draft`` build and resolve a pair's cross-vocabulary draft by ``rule`` through
    that registry; each instance is what its class declares (another vocabulary, a model: ``drafting_model``, no
    features: ``hidden_layers``; a one-hot ``q`` for the text rule only: ``deterministic``)."""
    import ast
    import types

    from spade_lib.decoding.drafts import drafters

    tree = ast.parse(open(drafters.__file__).read())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "spade_lib.decoding" not in imported and not any("crossvocab" in m for m in imported if m)
    assert drafters._CROSS_VOCAB == {"text": (TextDraftConfig, TextDrafter), "tli": (TLIConfig, TLIDrafter),
                                     "slrs": (SLRSConfig, SLRSDrafter)}
    ttok, dtok = tokenizers
    _, draft = _pair(tokenizers, 0.3)
    pair = types.SimpleNamespace(name="x", drafts={"cross": draft}, draft_tokenizers={"cross": dtok}, tokenizer=ttok,
                                 heads={})
    for rule, cls, q in (("text", TextDrafter, False), ("tli", TLIDrafter, True), ("slrs", SLRSDrafter, True)):
        d = drafters.make_drafter("cross", pair, rule=rule)
        kind = drafters.check_draft(pair, "cross", rule=rule)
        assert type(d) is cls and kind is cls.kind == drafters.drafter_kind("cross", pair, rule=rule)
        assert (kind.vocabulary, kind.q, kind.model, kind.head, kind.chain_only) == ("other", q, True, False, True)
        assert d.deterministic is (not q) and d.drafting_model() is not None and d.hidden_layers == ()
    with pytest.raises(ValueError, match=r"^tree: the cross-vocabulary draft 'cross' drafts chains only, not a "
                                         r"'eagle2' tree"):
        drafters.check_draft(pair, "cross", tree="eagle2")
    with pytest.raises(ValueError, match=r"^drafter_class: a Drafter whose kind drafts in another vocabulary"):
        drafters.register_cross_vocab_rule("text", TextDraftConfig, drafters.NGramDrafter, replace=True)
    with pytest.raises(ValueError, match=r"^rule: 'text' is already registered"):
        drafters.register_cross_vocab_rule("text", TextDraftConfig, TextDrafter)
