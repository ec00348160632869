"""The speculative decoder against references: HF greedy decoding token for token, the exact
target distribution of the first tokens (chi-square, p-value reported), fresh-prefill logits after
every rollback; plus EOS / max_new_tokens / context edge cases, replay and the record schema."""

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.stats
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig

from spade_lib.decoding.common import seed_streams
from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
from spade_lib.decoding.drafts.drafters import Drafter, ModelDrafter, NGramDrafter
from spade_lib.decoding.drafts.policies import ConfidenceThreshold, EntropyThreshold
from spade_lib.decoding.drafts.tree import DraftTree
from spade_lib.decoding.model.adapter import CausalLMAdapter
from spade_lib.decoding.records import RECORD_COLUMNS
from spade_lib.exactness import counts_chi_square_pvalue, sequence_law
from spade_lib.runs import trace
from spade_lib.sampling import SamplingConfig, adjust
from tests.tiny_models import llama, perturbed

GREEDY = SamplingConfig(temperature=0)
SMOKE_PROMPTS = [  # one per kind of text the embedded suite holds
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n",
    "The return value is",
    "class Queue:\n    def __init__(self",
    "x = [1, 2, 3]\nfor i in",
]


@pytest.fixture(scope="module")
def tiny():
    from spade_lib.zoo.pairs import load_pair

    return load_pair("tiny")


def hf_greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


# ---------------------------------------------------------------------------------------------
# greedy equality with HF generate


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [1, 2, 4, 6])
def test_greedy_equals_hf_generate_on_the_tiny_pair(tiny, gamma):
    dec = SpeculativeDecoder(tiny.target, tiny.draft, gamma=gamma, sampling=GREEDY, tokenizer=tiny.tokenizer)
    same = perturbed(tiny.target, 0.05)  # a close draft: long accepted blocks, rejections too
    dec_close = SpeculativeDecoder(tiny.target, same, gamma=gamma, sampling=GREEDY)
    for text in SMOKE_PROMPTS:
        ids = tiny.tokenizer(text)["input_ids"]
        ref = hf_greedy(tiny.target, ids, 40)
        for d in (dec, dec_close):
            out = d.generate(ids, 40)
            assert out.tokens == ref, (text, gamma)
            assert sum(out.emitted_lengths) == len(ref)
        assert out.text is None and dec.generate(ids, 3).text == tiny.tokenizer.decode(ref[:3])
    assert max(out.accept_lengths) > 1  # the close draft exercised accepted blocks


def test_greedy_equals_hf_generate_for_prompt_lookup_and_policies(tiny):
    t = tiny.target
    close = perturbed(t, 0.05)
    decoders = [SpeculativeDecoder(t, NGramDrafter(max_ngram=3), gamma=4, sampling=GREEDY),
                SpeculativeDecoder(t, close, policy=ConfidenceThreshold(0.4, max_gamma=8), sampling=GREEDY),
                SpeculativeDecoder(t, close, policy=EntropyThreshold(2.0, max_gamma=8), sampling=GREEDY)]
    lookups = 0
    for text in SMOKE_PROMPTS:
        ids = tiny.tokenizer(text)["input_ids"]
        ref = hf_greedy(t, ids, 40)
        for dec in decoders:
            out = dec.generate(ids, 40)
            assert out.tokens == ref
        lookups += sum(g > 0 for g in decoders[0].generate(ids, 40).gammas)
    assert lookups > 0  # prompt lookup did propose (the tiny target repeats itself)


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_equals_hf_generate_on_gpt2(gamma):
    torch.manual_seed(0)
    target = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=96,
                                        initializer_range=0.3, bos_token_id=None, eos_token_id=None)).eval()
    draft = perturbed(target, 0.1)
    dec = SpeculativeDecoder(target, draft, gamma=gamma, sampling=GREEDY)
    rng = torch.Generator().manual_seed(gamma)
    accepted = 0
    for L in (1, 5, 12):
        ids = torch.randint(0, 128, (L,), generator=rng).tolist()
        out = dec.generate(ids, 30)
        assert out.tokens == hf_greedy(target, ids, 30)
        accepted += sum(s.n_accepted for s in out.steps)
    assert accepted > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_greedy_agrees_up_to_near_ties(tiny, dtype):
    """In bf16/fp16 batched verification rounds differently from 1-token steps: outputs may diverge, but
    only where the target's top two logits are within the dtype's tie threshold."""
    from spade_lib.decoding.studies.divergence import compare_greedy

    target, draft = copy.deepcopy(tiny.target).to(dtype), copy.deepcopy(tiny.draft).to(dtype)
    dec = SpeculativeDecoder(target, draft, gamma=3, sampling=GREEDY)
    for text in SMOKE_PROMPTS[:3]:
        ids = tiny.tokenizer(text)["input_ids"]
        ours, ref = dec.generate(ids, 24).tokens, hf_greedy(target, ids, 24)
        assert compare_greedy(ours, ref, target, ids).classification in ("identical", "near_tie")


# ---------------------------------------------------------------------------------------------
# sampling: the output distribution is the target's


N_TOKENS, VOCAB, TEMP = 3, 6, 0.5


class ToyLM(torch.nn.Module):
    """A one-layer, one-head causal-attention LM in plain torch with the HF forward interface
    (``cache=`` a ``DynamicCache``, ``position_ids``, ``logits_to_keep``). The Monte-Carlo tests need
    thousands of generations, and an HF model's fixed per-forward overhead would dominate them."""

    def __init__(self, vocab, seed, dim=8, scale=0.3, max_pos=16):
        super().__init__()
        self.config = LlamaConfig(vocab_size=vocab, hidden_size=dim, num_hidden_layers=1, num_attention_heads=1,
                                  num_key_value_heads=1, max_position_embeddings=max_pos, bos_token_id=None,
                                  eos_token_id=None, pad_token_id=None)
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.nn.Parameter(torch.randn(vocab, dim, generator=g))
        self.pos = torch.nn.Parameter(torch.randn(max_pos, dim, generator=g))
        self.w = torch.nn.Parameter(torch.randn(3, dim, dim, generator=g) / dim ** 0.5)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(vocab, dim, generator=g) * scale / dim ** 0.5)

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids, cache=None, use_cache=False, position_ids=None, logits_to_keep=0):
        n = input_ids.shape[1]
        past = 0 if cache is None else cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + n)[None]
        h = self.emb[input_ids] + self.pos[position_ids]
        q, k, v = h @ self.w[0], h @ self.w[1], h @ self.w[2]
        if cache is not None:
            k, v = (t[:, 0] for t in cache.update(k[:, None], v[:, None], 0))
        att = (q @ k.transpose(-1, -2)) / h.shape[-1] ** 0.5
        mask = torch.ones(n, past + n, dtype=torch.bool).tril(past)
        out = h + att.masked_fill(~mask, -math.inf).softmax(-1) @ v
        if logits_to_keep:
            out = out[:, -logits_to_keep:]
        return SimpleNamespace(logits=self.head(out))


def exact_joint(target, prompt, sampling):
    """P(first N_TOKENS tokens = t) under target-only sampling, by enumeration: [VOCAB ** N_TOKENS]."""
    return sequence_law(target, prompt, sampling, N_TOKENS)


def sample_counts(decoder, prompt, n_runs):
    counts = np.zeros(VOCAB ** N_TOKENS, dtype=np.int64)
    steps = []
    for seed in range(n_runs):
        out = decoder.generate(prompt, N_TOKENS, seed=seed)
        t = out.tokens
        counts[(t[0] * VOCAB + t[1]) * VOCAB + t[2]] += 1
        steps.append(out.accept_lengths[0])
    return counts, steps


@pytest.fixture(scope="module")
def mc_pair():
    target = ToyLM(VOCAB, seed=0)
    return target, perturbed(target, 0.5)  # alpha ~ 0.5-0.8 per position at TEMP


def test_toy_lm_cache_matches_its_full_forward(mc_pair):
    target, _ = mc_pair
    a = CausalLMAdapter(target)
    a.extend(torch.tensor([1, 2, 3]))
    a.extend(torch.tensor([4, 5]))
    a.rollback(4)
    torch.testing.assert_close(a.extend(torch.tensor([0, 2])), target(torch.tensor([[1, 2, 3, 4, 0, 2]])).logits[0, -2:])


@pytest.mark.slow
def test_sampling_distribution_equals_target_only_sampling(mc_pair, record_property):
    target, draft = mc_pair
    sampling = SamplingConfig(temperature=TEMP)
    prompt = [2]
    expected = exact_joint(target, prompt, sampling)
    dec = SpeculativeDecoder(target, draft, gamma=2, sampling=sampling, record="light")
    counts, first_lengths = sample_counts(dec, prompt, 2000)
    p_spade = counts_chi_square_pvalue(counts, expected)
    ar_counts, _ = sample_counts(AutoregressiveDecoder(target, sampling=sampling), prompt, 1000)
    p_ar = counts_chi_square_pvalue(ar_counts, expected)
    record_property("p_value_speculative", p_spade)
    record_property("p_value_autoregressive", p_ar)
    print(f"chi-square vs exact target joint of {N_TOKENS} tokens: speculative p = {p_spade:.4f}, "
          f"autoregressive p = {p_ar:.4f}; first-step accept lengths {np.bincount(first_lengths).tolist()}")
    assert set(first_lengths) == {1, 2, 3}  # rejections, partial and full acceptance all happened
    assert p_spade > 1e-3 and p_ar > 1e-3


def test_sampling_test_detects_an_unwarped_q(mc_pair, monkeypatch, record_property):
    """Injected bug: the draft samples from the warped q but reports the unwarped softmax to verify."""
    target, draft = mc_pair
    sampling = SamplingConfig(temperature=TEMP)
    original = ModelDrafter.propose

    def buggy(self, *args, **kwargs):
        d = original(self, *args, **kwargs)
        d.q = d.logits.float().softmax(-1)
        return d

    monkeypatch.setattr(ModelDrafter, "propose", buggy)
    dec = SpeculativeDecoder(target, draft, gamma=2, sampling=sampling, record="light")
    counts, _ = sample_counts(dec, [2], 600)
    p_bug = counts_chi_square_pvalue(counts, exact_joint(target, [2], sampling))
    record_property("p_value_injected_bug", p_bug)
    print(f"chi-square with the unwarped-q bug: p = {p_bug:.3g}")
    assert p_bug < 1e-3


# ---------------------------------------------------------------------------------------------
# rollback: the caches always equal a fresh prefill


class CheckedAdapter(CausalLMAdapter):
    """Compares every extend's logits with a cache-free forward on the whole token history."""

    def reset(self):
        super().reset()
        self.history: list[int] = []
        self.checks = self.crops = 0

    def extend(self, ids, *, last_only=False):
        logits = super().extend(ids, last_only=last_only)
        self.history += ids.tolist()
        with torch.no_grad():
            ref = self.model(torch.tensor([self.history])).logits[0, -logits.shape[0]:]
        torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-5)
        self.checks += 1
        return logits

    def rollback(self, length):
        self.crops += length < self.length
        super().rollback(length)
        del self.history[length:]


def test_rollback_equals_fresh_prefill_after_accepts_and_rejects(tiny):
    target = CheckedAdapter(tiny.target)
    draft = CheckedAdapter(perturbed(tiny.target, 1.0))
    dec = SpeculativeDecoder(target, ModelDrafter(draft), gamma=4, sampling=SamplingConfig(1.0), eos_token_id=[])
    ids = tiny.tokenizer(SMOKE_PROMPTS[0])["input_ids"]
    out = dec.generate(ids, 40, seed=3)
    assert target.crops > 0 and draft.crops > 0 and target.checks == 1 + out.n_steps  # prefill + steps
    ns = {s.n_accepted for s in out.steps}
    assert 0 in ns and len(ns) > 1
    # the final state too: the committed text minus the newest token is cached
    assert target.history == ids + out.tokens[:-1]


# ---------------------------------------------------------------------------------------------
# edge cases


@pytest.fixture(scope="module")
def same_pair():
    """Draft = target: every draft is accepted, so blocks are gamma + 1 long."""
    t = llama(vocab=64, seed=3, max_pos=64)
    return t, copy.deepcopy(t)


def test_eos_inside_an_accepted_block_stops_there(same_pair):
    target, draft = same_pair
    prompt = [1, 2, 3]
    ref = hf_greedy(target, prompt, 30)
    j = next(j for j in range(7, 30) if ref[j] not in ref[:j] and j % 5 not in (0, 4))  # mid-block
    out = SpeculativeDecoder(target, draft, gamma=4, sampling=GREEDY, eos_token_id=ref[j]).generate(prompt, 30)
    assert out.tokens == ref[:j + 1] and out.stop_reason == "eos"
    assert out.accept_lengths[-1] == 5 and out.emitted_lengths[-1] < 5  # verified whole, emitted truncated
    sampled = SpeculativeDecoder(target, draft, gamma=4, sampling=SamplingConfig(1.0), eos_token_id=[])
    free = sampled.generate(prompt, 30, seed=0).tokens
    e = free[8]
    stopped = SpeculativeDecoder(target, draft, gamma=4, sampling=SamplingConfig(1.0),
                                 eos_token_id=[e]).generate(prompt, 30, seed=0)
    assert stopped.tokens == free[:free.index(e) + 1] and stopped.tokens[-1] == e


@pytest.mark.parametrize("m", [0, 1, 2, 4, 5, 6, 9, 11])
def test_max_new_tokens_is_exact(same_pair, m):
    target, draft = same_pair
    ref = hf_greedy(target, [4, 5], 12)
    out = SpeculativeDecoder(target, draft, gamma=4, sampling=GREEDY).generate([4, 5], m)
    assert out.tokens == ref[:m] and out.stop_reason == "max_new_tokens"
    assert sum(out.emitted_lengths) == m and all(g <= 4 for g in out.gammas)


def test_one_token_prompt_and_gamma_one(tiny):
    for tok in (0, 77, 300):
        ref = hf_greedy(tiny.target, [tok], 20)
        for gamma in (1, 3):
            assert SpeculativeDecoder(tiny.target, tiny.draft, gamma=gamma, sampling=GREEDY,
                                      eos_token_id=[]).generate([tok], 20).tokens == ref


def test_context_limit(same_pair):
    target, draft = same_pair  # 64 positions
    dec = SpeculativeDecoder(target, perturbed(target, 0.2), gamma=4, sampling=GREEDY)
    ar = AutoregressiveDecoder(target, sampling=GREEDY)
    prompt = list(range(1, 61))
    out = dec.generate(prompt, 10)
    assert out.tokens == hf_greedy(target, prompt, 4) == ar.generate(prompt, 10).tokens
    assert out.stop_reason == "context_limit" and len(prompt) + len(out.tokens) == 64
    at_limit = dec.generate(list(range(64)), 5)
    assert at_limit.tokens == [] and at_limit.stop_reason == "context_limit"
    assert dec.generate(list(range(63)), 5).tokens == hf_greedy(target, list(range(63)), 1)
    with pytest.raises(ValueError, match="prompt_ids: 65 tokens exceed the context limit of 64"):
        dec.generate(list(range(65)), 5)


def test_bad_arguments(same_pair):
    target, draft = same_pair
    dec = SpeculativeDecoder(target, draft, gamma=2)
    with pytest.raises(ValueError, match="prompt_ids: empty prompt"):
        dec.generate([], 5)
    with pytest.raises(ValueError, match="prompt_ids: empty prompt"):
        AutoregressiveDecoder(target).generate(torch.zeros(1, 0, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        dec.generate([1], -1)
    with pytest.raises(ValueError, match="seed"):
        dec.generate([1], 2, seed=-3)
    with pytest.raises(ValueError, match="gamma/policy"):
        SpeculativeDecoder(target, draft)
    with pytest.raises(ValueError, match="mode"):
        SpeculativeDecoder(target, draft, gamma=2, mode="fast")
    with pytest.raises(ValueError, match="record"):
        SpeculativeDecoder(target, draft, gamma=2, record="all")
    with pytest.raises(ValueError, match="draft"):
        SpeculativeDecoder(target, "gpt2", gamma=2)
    with pytest.raises(ValueError, match="sampling"):
        SpeculativeDecoder(target, draft, gamma=2, sampling={"temperature": 0})


def test_a_draft_of_another_vocabulary_is_refused_at_construction():
    """Issue 57: a draft model whose embedding cannot read the target's token ids, given straight to the decoder
    (not through make_drafter), died in F.embedding with an IndexError at the first step; it is refused when
    the decoder is built, pointing at make_drafter. A larger (padded) draft vocabulary reads every target id."""
    target = llama(vocab=64, max_pos=64)
    small = llama(vocab=32, max_pos=64, seed=2)
    for draft in (small, CausalLMAdapter(small)):
        with pytest.raises(ValueError, match=r"draft: LlamaForCausalLM embeds 32 token ids, the target emits 64.*"
                                             r"make_drafter"):
            SpeculativeDecoder(target, draft, gamma=2)
    padded = SpeculativeDecoder(target, llama(vocab=80, max_pos=64, seed=2), gamma=2,
                                sampling=SamplingConfig(temperature=0))
    assert len(padded.generate([1, 2, 63], 6).tokens) == 6


# ---------------------------------------------------------------------------------------------
# replay, records, modes


def test_same_seed_replays_bit_exactly_and_seeds_differ(tiny):
    dec = SpeculativeDecoder(tiny.target, tiny.draft, gamma=3, sampling=SamplingConfig(1.0, top_k=50), record_topk=4)
    ids = tiny.tokenizer(SMOKE_PROMPTS[2])["input_ids"]
    a, b, c = dec.generate(ids, 30, seed=5), dec.generate(ids, 30, seed=5), dec.generate(ids, 30, seed=6)
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith("t_")} for r in rs]  # noqa: E731
    assert a.tokens == b.tokens and strip(a.records()) == strip(b.records())
    assert a.tokens != c.tokens
    gens = seed_streams(5, "cpu")
    assert len({torch.rand(1, generator=g).item() for g in gens.values()}) == 3


def test_records_follow_the_trace_schema_and_verify_math(tiny):
    dec = SpeculativeDecoder(tiny.target, perturbed(tiny.target, 0.3), gamma=4, sampling=SamplingConfig(0.8),
                             record_topk=3)
    ids = tiny.tokenizer(SMOKE_PROMPTS[1])["input_ids"]
    out = dec.generate(ids, 40, seed=1)
    rows = out.records()
    assert len(rows) == sum(out.gammas)
    assert all(list(r)[:len(RECORD_COLUMNS)] == list(RECORD_COLUMNS) for r in rows)
    for step, s in enumerate(out.steps):
        block = [r for r in rows if r["step"] == step]
        assert [r["pos"] for r in block] == list(range(s.gamma))
        assert sum(r["accepted"] for r in block) == s.n_accepted
        for r in block:
            assert r["abs_pos"] == s.abs_pos + r["pos"] and r["gamma"] == s.gamma
            assert r["reached"] == (r["pos"] <= s.n_accepted)
            assert r["accepted"] == (r["reached"] and r["uniform"] < r["accept_prob"])
            assert r["accept_prob"] == pytest.approx(min(1.0, r["p_x"] / r["q_x"]), rel=1e-5)
            assert 0 <= r["tv"] <= 1 and r["kl"] >= -1e-6 and r["q_top_prob"] >= r["q_x_raw"]
            assert r["p_margin"] >= 0 and len(r["p_topk_ids"]) == 3
    emitted = []
    for step, s in enumerate(out.steps):
        drafts = [r["draft_token"] for r in rows if r["step"] == step]
        emitted += (drafts[:s.n_accepted] + [s.next_token])[:s.emitted]
    assert emitted == out.tokens
    table = trace.records_to_table([{**r, "prompt_id": "p0", "category": "code", "sample": 0} for r in rows])
    assert table.num_rows == len(rows)
    assert set(out.timing) == {"prefill", "draft", "verify", "overhead", "records", "total"}
    assert out.timing["total"] >= out.timing["draft"] + out.timing["verify"]


def test_greedy_records_carry_unwarped_statistics(tiny):
    dec = SpeculativeDecoder(tiny.target, tiny.draft, gamma=2, sampling=GREEDY)
    rows = dec.generate(tiny.tokenizer(SMOKE_PROMPTS[0])["input_ids"], 10).records()
    r = rows[0]
    assert r["p_x"] in (0.0, 1.0) and r["q_x"] == 1.0 and math.isnan(r["uniform"])
    assert 0 < r["q_x_raw"] < 1 and r["h_p_raw"] > 0 and r["h_q_raw"] > 0 and 0 < r["tv_raw"] < 1


def test_light_and_unrecorded_runs_give_the_same_tokens(tiny):
    ids = tiny.tokenizer(SMOKE_PROMPTS[3])["input_ids"]
    outs = [SpeculativeDecoder(tiny.target, tiny.draft, gamma=3, sampling=SamplingConfig(1.0), record=r)
            .generate(ids, 25, seed=2) for r in (True, "light", False)]
    assert outs[0].tokens == outs[1].tokens == outs[2].tokens
    assert outs[0].accept_lengths == outs[1].accept_lengths
    with pytest.raises(ValueError, match="record"):
        outs[1].records()
    assert math.isnan(outs[2].timing["draft"]) and outs[2].timing["total"] > 0


def test_record_statistics_are_timed_apart(tiny, monkeypatch):
    """record=True times the statistics on their own (timing["records"]) and takes them out of each
    step's t_verify: a statistics pass made 30 ms slower per step moves them, not the step's time."""
    import time

    from spade_lib.decoding import records

    real = records.position_stats
    monkeypatch.setattr(records, "position_stats", lambda inputs: time.sleep(0.03) or real(inputs))
    ids = tiny.tokenizer(SMOKE_PROMPTS[3])["input_ids"]
    out = SpeculativeDecoder(tiny.target, tiny.draft, gamma=3, sampling=SamplingConfig(1.0), record=True
                             ).generate(ids, 12, seed=2)
    drafted = [s for s in out.steps if s.gamma > 0]
    assert out.timing["records"] >= 0.03 * len(drafted) > 0
    assert all(s.t_verify < 0.03 for s in drafted)  # a tiny pair's verify forward is far below 30 ms
    assert out.timing["total"] >= out.timing["records"] + out.timing["verify"]
    light = SpeculativeDecoder(tiny.target, tiny.draft, gamma=3, sampling=SamplingConfig(1.0), record="light"
                               ).generate(ids, 12, seed=2)
    assert light.timing["records"] == 0.0 and light.tokens == out.tokens


def test_prompt_lookup_with_sampling_uses_one_hot_q(tiny):
    dec = SpeculativeDecoder(tiny.target, NGramDrafter(), gamma=3, sampling=SamplingConfig(1.0))
    assert dec.mode == "one_hot_q"
    out = dec.generate(list(range(5, 15)) * 3, 20, seed=0)
    rows = out.records()
    assert rows and all(r["q_x"] == 1.0 and r["h_q"] == 0.0 for r in rows)
    assert len(out.tokens) == 20


def test_sampling_cannot_change_after_the_rule_was_chosen_for_it(tiny):
    """A decoder built greedy verifies with the greedy rule: sampling it afterwards would silently change the
    target distribution, so the configuration is read-only (both decoders) and a new decoder is the way."""
    dec = SpeculativeDecoder(tiny.target, NGramDrafter(), gamma=3, sampling=SamplingConfig(0.0))
    assert dec.mode == "greedy" and dec.sampling.greedy
    with pytest.raises(AttributeError, match="sampling: fixed at construction"):
        dec.sampling = SamplingConfig(1.0)
    assert dec.sampling.greedy
    with pytest.raises(AttributeError, match="sampling: fixed at construction"):
        AutoregressiveDecoder(tiny.target).sampling = SamplingConfig(1.0)


def test_autoregressive_baseline_matches_hf_greedy_and_replays(tiny):
    ids = tiny.tokenizer(SMOKE_PROMPTS[4])["input_ids"]
    ar = AutoregressiveDecoder(tiny.target, sampling=GREEDY, tokenizer=tiny.tokenizer)
    out = ar.generate(ids, 25)
    assert out.tokens == hf_greedy(tiny.target, ids, 25)[:len(out.tokens)]
    assert out.n_steps == len(out.tokens) and out.accept_lengths == [1] * len(out.tokens)
    s = AutoregressiveDecoder(tiny.target, sampling=SamplingConfig(0.9, top_p=0.9))
    assert s.generate(ids, 20, seed=4).tokens == s.generate(ids, 20, seed=4).tokens


# ---------------------------------------------------------------------------------------------
# drafters that read the target's hidden states, and draft trees


TREE_TARGET_BACKENDS = ["hf", "lean"]


class FeatureDrafter(Drafter):
    """A toy feature-reading drafter (the shape of EAGLE / Medusa): it reads the target's last hidden
    state (after the final norm) at the newest committed position, maps it linearly and scores it with
    the target's own LM head; it proposes that argmax ``gamma`` times (a chain). Every view is kept."""

    hidden_layers = (-1,)

    def __init__(self, target, gamma=2, noise=0.3):
        self.head = target.lm_head.weight.detach()
        h = self.head.shape[1]
        g = torch.Generator().manual_seed(0)
        self.map = torch.eye(h) + noise * torch.randn(h, h, generator=g) / h ** 0.5
        self.gamma, self.views, self.last = gamma, [], None

    def reset(self, prompt_ids, vocab_size):
        self.views, self.last = [], None

    def observe(self, view):
        self.views.append(view)
        if view.tokens.numel():
            self.last = view.hidden[-1][-1]

    def propose(self, max_gamma, policy, sampling, generator):
        if self.last is None:
            return DraftTree(torch.zeros(0, dtype=torch.long), torch.zeros(0, self.head.shape[0]))
        logits = (self.head @ (self.map @ self.last))[None].expand(min(self.gamma, max_gamma), -1)
        return DraftTree(logits.argmax(dim=-1), adjust(logits, sampling), logits, "max_gamma")

    def accept(self, n_accepted, next_token):
        pass


class TwoBranchDrafter(Drafter):
    """A toy tree drafter: the draft model's top-2 tokens as the root's children, then a greedy chain of
    the draft below each (depth up to ``max_gamma``); deterministic, verified greedily."""

    deterministic = True

    def __init__(self, draft_model):
        self.adapter = CausalLMAdapter(draft_model, backend="hf")
        self.paths = []

    def reset(self, prompt_ids, vocab_size):
        prompt = torch.as_tensor(prompt_ids)
        self.adapter.reset()
        if prompt.numel() > 1:
            self.adapter.extend(prompt[:-1])
        self.unfed, self.paths = prompt[-1:].tolist(), []

    def propose(self, max_gamma, policy, sampling, generator):
        a = self.adapter
        root = a.extend(torch.tensor(self.unfed), last_only=True)[0]
        self.base = a.length
        tokens, parents = [], []
        for child in root.topk(2).indices.tolist():
            a.rollback(self.base)
            tokens.append(child)
            parents.append(-1)
            for _ in range(max_gamma - 1):
                nxt = int(a.extend(torch.tensor([tokens[-1]]), last_only=True)[0].argmax())
                parents.append(len(tokens) - 1)
                tokens.append(nxt)
        self.tokens = tokens
        return DraftTree(torch.tensor(tokens), None, None, "max_gamma", torch.tensor(parents), "deterministic")

    def accept(self, n_accepted, next_token):  # a step without a draft (the budget's last token)
        assert n_accepted == 0
        self.unfed.append(next_token)

    def accept_path(self, path, next_token):
        self.paths.append(path)
        self.adapter.rollback(self.base)
        self.unfed = [self.tokens[i] for i in path] + [next_token]


@pytest.mark.parametrize("backend", TREE_TARGET_BACKENDS)
def test_a_drafter_reading_target_hidden_states_decodes_exactly(tiny, backend):
    """Greedy output equals HF generate token for token, and every view the drafter was told is the
    committed text in order with the target's own hidden states there (HF output_hidden_states)."""
    target = CausalLMAdapter(tiny.target, backend=backend)
    drafter = FeatureDrafter(tiny.target)
    dec = SpeculativeDecoder(target, drafter, gamma=2, sampling=GREEDY, eos_token_id=[])
    accepted = 0
    for text in SMOKE_PROMPTS[:3]:
        ids = tiny.tokenizer(text)["input_ids"]
        out = dec.generate(ids, 30)
        assert out.tokens == hf_greedy(tiny.target, ids, 30)
        accepted += sum(s.n_accepted for s in out.steps)
        text_ids = ids + out.tokens
        views = drafter.views
        assert len(views) == 1 + out.n_steps  # the prefill, then every step
        assert torch.cat([v.tokens for v in views]).tolist() == text_ids[:-1]
        assert [v.start for v in views] == np.cumsum([0] + [v.tokens.numel() for v in views[:-1]]).tolist()
        assert [v.next_token for v in views] == [text_ids[v.start + v.tokens.numel()] for v in views]
        with torch.no_grad():
            ref = tiny.target(torch.tensor([text_ids[:-1]]), output_hidden_states=True).hidden_states[-1][0]
        torch.testing.assert_close(torch.cat([v.hidden[-1] for v in views]), ref, rtol=1e-4, atol=1e-4)
    assert accepted > 0  # some drafts were accepted (the tiny target repeats itself)


@pytest.mark.parametrize("backend", TREE_TARGET_BACKENDS)
@pytest.mark.parametrize("gamma", [1, 3])
def test_a_two_branch_tree_drafter_decodes_exactly(tiny, backend, gamma):
    """Greedy tree decoding equals HF generate and the autoregressive decoder token for token; the second
    branch is accepted sometimes (a non-contiguous keep of the target's cache)."""
    target = CausalLMAdapter(tiny.target, backend=backend)
    drafter = TwoBranchDrafter(perturbed(tiny.target, 0.7))  # errs often enough for its second branch to win
    dec = SpeculativeDecoder(target, drafter, gamma=gamma, sampling=GREEDY, eos_token_id=[])
    ar = AutoregressiveDecoder(tiny.target, sampling=GREEDY, eos_token_id=[])
    second_branch = long = 0
    for text in SMOKE_PROMPTS:
        ids = tiny.tokenizer(text)["input_ids"]
        out = dec.generate(ids, 30)
        assert out.tokens == hf_greedy(tiny.target, ids, 30) == ar.generate(ids, 30).tokens
        drafted = [s for s in out.steps if s.gamma > 0]
        assert [len(p) for p in drafter.paths] == [s.n_accepted for s in drafted]
        assert all(s.gamma % 2 == 0 and s.gamma <= 2 * gamma for s in drafted)  # two branches of gamma (or the budget)
        second_branch += sum(bool(p) and p[0] == s.gamma // 2 for p, s in zip(drafter.paths, drafted))
        long += sum(len(p) > 1 and p[0] == s.gamma // 2 for p, s in zip(drafter.paths, drafted))
    assert second_branch > 0 and (gamma == 1 or long > 0)


def test_tree_steps_record_each_node_and_its_place(tiny):
    """A tree step's records are its nodes: node, parent, depth, sibling rank (kept when the trace schema
    lists them), reached = judged by the walk, accepted = on the path; p at the parent's row."""
    from spade_lib.decoding.records import TREE_COLUMNS

    gamma = 3
    drafter = TwoBranchDrafter(perturbed(tiny.target, 0.7))
    dec = SpeculativeDecoder(CausalLMAdapter(tiny.target, backend="hf"), drafter, gamma=gamma, sampling=GREEDY,
                             record_topk=2)
    ids = tiny.tokenizer(SMOKE_PROMPTS[1])["input_ids"]
    out = dec.generate(ids, 24)
    plain = out.records()
    assert list(plain[0]) == list(RECORD_COLUMNS) + ["p_topk_ids", "p_topk_probs", "q_topk_ids", "q_topk_probs"]
    trace.records_to_table([{**r, "prompt_id": "p0", "category": "code", "sample": 0} for r in plain])
    assert set(TREE_COLUMNS) <= set(RECORD_COLUMNS)  # trace schema v2: every record carries its place
    rows = plain
    for s, path in zip([s for s in out.steps if s.gamma > 0], drafter.paths):
        block = [r for r in rows if r["step"] == out.steps.index(s)]
        d = s.gamma // 2  # two branches of depth d: [-1, 0, .., d-2, -1, d, .., 2d-2]
        parents = [-1] + list(range(d - 1)) + [-1] + list(range(d, 2 * d - 1))
        assert [r["node"] for r in block] == list(range(2 * d)) and [r["parent"] for r in block] == parents
        assert [r["depth"] for r in block] == list(range(d)) * 2
        assert [r["sibling_rank"] for r in block] == [int(i == d) for i in range(2 * d)]
        assert [r["accepted"] for r in block] == [i in path for i in range(2 * d)]
        # judged: the parent is on the path (or the root) and every earlier sibling was rejected
        judged = [(p == -1 or p in path) and not any(parents[j] == p and j in path for j in range(i))
                  for i, p in enumerate(parents)]
        assert [r["reached"] for r in block] == judged
        for r in block:
            assert r["abs_pos"] == s.abs_pos + r["depth"] and r["q_x"] == 1.0
            assert r["accepted"] == (r["reached"] and r["draft_token"] == r["p_top1"])
            if r["reached"]:
                assert r["accept_prob"] == float(r["draft_token"] == r["p_top1"])
            else:
                assert math.isnan(r["accept_prob"])
    dec_chain = SpeculativeDecoder(tiny.target, tiny.draft, gamma=gamma, sampling=GREEDY)
    chain_rows = dec_chain.generate(ids, 12).records()
    assert all((r["node"], r["parent"], r["depth"], r["sibling_rank"]) == (r["pos"], r["pos"] - 1, r["pos"], 0)
               for r in chain_rows)


def test_a_drafter_that_reads_nothing_costs_nothing(tiny, monkeypatch):
    """Without hidden_layers and without an observe override, the target is never asked for hidden states
    and observe is never called."""
    calls = []
    original = CausalLMAdapter.extend

    def spy(self, ids, **kwargs):
        calls.append(kwargs)
        return original(self, ids, **kwargs)

    monkeypatch.setattr(CausalLMAdapter, "extend", spy)
    monkeypatch.setattr(Drafter, "observe", lambda self, view: pytest.fail("observe called"))
    dec = SpeculativeDecoder(tiny.target, tiny.draft, gamma=3, sampling=GREEDY)
    dec.generate(tiny.tokenizer(SMOKE_PROMPTS[0])["input_ids"], 12)
    assert calls and all(set(kw) <= {"last_only"} for kw in calls)


class SampledTreeDrafter(Drafter):
    """A toy sampling tree drafter: two children of the root drawn i.i.d. from the draft's ``q`` at the
    root, and below each one child drawn from ``q`` after it (``draws="iid"``)."""

    def __init__(self, draft_model):
        self.adapter = CausalLMAdapter(draft_model)

    def reset(self, prompt_ids, vocab_size):
        prompt = torch.as_tensor(prompt_ids)
        self.adapter.reset()
        if prompt.numel() > 1:
            self.adapter.extend(prompt[:-1])
        self.unfed = prompt[-1:].tolist()

    def propose(self, max_gamma, policy, sampling, generator):
        from spade_lib.decoding.drafts.drafters import sample_categorical

        a = self.adapter
        q_root = adjust(a.extend(torch.tensor(self.unfed), last_only=True), sampling)
        self.base = a.length
        tokens, parents, qs = [], [], []
        for _ in range(2):
            x = sample_categorical(q_root, generator)
            tokens.append(int(x))
            parents.append(-1)
            qs.append(q_root[0])
            if max_gamma > 1:
                a.rollback(self.base)
                q = adjust(a.extend(x, last_only=True), sampling)
                tokens.append(int(sample_categorical(q, generator)))
                parents.append(len(tokens) - 2)
                qs.append(q[0])
        self.tokens = tokens
        return DraftTree(torch.tensor(tokens), torch.stack(qs), None, "max_gamma", torch.tensor(parents), "iid")

    def accept(self, n_accepted, next_token):
        assert n_accepted == 0
        self.unfed.append(next_token)

    def accept_path(self, path, next_token):
        self.adapter.rollback(self.base)
        self.unfed = [self.tokens[i] for i in path] + [next_token]


@pytest.mark.slow
def test_sampled_tree_decoding_follows_the_target_distribution(record_property):
    """Exact tree verification (recursive rejection sampling over i.i.d. siblings) through the decoder:
    the first N_TOKENS tokens follow the target-only joint (chi-square against enumeration)."""
    target = llama(vocab=VOCAB, seed=0)
    draft = perturbed(target, 0.1)
    sampling = SamplingConfig(temperature=TEMP)
    prompt = [2, 4]
    dec = SpeculativeDecoder(target, SampledTreeDrafter(draft), gamma=2, sampling=sampling, record="light")
    assert dec.mode == "exact" and dec.tree_mode == "exact"
    counts, first_lengths = sample_counts(dec, prompt, 1500)
    p_tree = counts_chi_square_pvalue(counts, exact_joint(target, prompt, sampling))
    record_property("p_value_tree", p_tree)
    print(f"chi-square vs exact target joint, tree decoding: p = {p_tree:.4f}; first-step accept lengths "
          f"{np.bincount(first_lengths).tolist()}")
    assert set(first_lengths) == {1, 2, 3}  # rejections, one and two accepted nodes
    assert p_tree > 1e-3


@pytest.mark.parametrize("backend", TREE_TARGET_BACKENDS)
def test_trees_are_cut_to_the_context_and_empty_trees_are_plain_steps(tiny, backend):
    """Near the context limit a tree keeps the first nodes that fit (a tree again); an empty tree is a
    plain target step. Output still equals HF greedy, up to the context limit."""
    ids = tiny.tokenizer(SMOKE_PROMPTS[2])["input_ids"]
    limit = len(ids) + 10
    dec = SpeculativeDecoder(CausalLMAdapter(tiny.target, backend=backend, max_length=limit),
                             TwoBranchDrafter(perturbed(tiny.target, 0.7)), gamma=4, sampling=GREEDY, eos_token_id=[])
    out = dec.generate(ids, 30)
    assert out.tokens == hf_greedy(tiny.target, ids, 10) and out.stop_reason == "context_limit"
    assert any(s.gamma % 2 == 1 and s.draft_stop == "budget" for s in out.steps)  # a cut tree

    class EmptyTrees(TwoBranchDrafter):
        def propose(self, *args):
            super().propose(*args)
            self.adapter.rollback(self.base)
            return DraftTree(torch.zeros(0, dtype=torch.long), None, None, "no_match", torch.zeros(0, dtype=torch.long),
                             "deterministic")

        def accept(self, n_accepted, next_token):
            assert n_accepted == 0
            self.unfed = [next_token]

    empty = SpeculativeDecoder(tiny.target, EmptyTrees(tiny.draft), gamma=3, sampling=GREEDY, eos_token_id=[])
    got = empty.generate(ids, 10)
    assert got.tokens == hf_greedy(tiny.target, ids, 10) and got.gammas == [0] * 10
