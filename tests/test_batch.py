"""Batched decoding (spade_lib.decoding.batch) against single-sequence decoding: greedy rows equal per-row greedy
decoding (near ties classified by compare_greedy), sampled rows follow the exact target law (chi-square
against exact enumeration, p-value reported), a row's tokens do not depend on its batch-mates, and the
holey caches equal a fresh prefill after rejections."""

import math

import numpy as np
import pytest
import scipy.stats
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spade_lib.decoding.batch import BATCH_COLUMNS, BatchGenerationResult, BatchLM, batch_metrics, row_seeds
from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
from spade_lib.decoding.drafts.adaptive import AdaptiveGamma
from spade_lib.decoding.drafts.drafters import NGramDrafter
from spade_lib.decoding.drafts.policies import ConfidenceThreshold
from spade_lib.decoding.model.adapter import CausalLMAdapter
from spade_lib.decoding.records import RECORD_COLUMNS
from spade_lib.decoding.studies.divergence import compare_greedy
from spade_lib.exactness import counts_chi_square_pvalue, sequence_law
from spade_lib.sampling import SamplingConfig, adjust

GREEDY = SamplingConfig(temperature=0)
TEXTS = [  # eight prompts of different lengths (1 to ~30 tokens)
    "def fibonacci(n):\n    ",
    "a",
    "import os\nimport sys\n\n",
    "The return value is",
    "class Queue:\n    def __init__(self",
    "x = [1, 2, 3]\nfor i in",
    "Hello world, this is a longer prompt with more tokens in it than the others are",
    "#",
]
N_NEW = 24


from tests.test_decode import llama, perturbed  # noqa: E402  (the same model helpers)


@pytest.fixture(scope="module")
def tiny():
    from spade_lib.zoo.pairs import load_pair

    return load_pair("tiny")


@pytest.fixture(scope="module")
def prompts(tiny):
    ids = [tiny.tokenizer(t)["input_ids"] for t in TEXTS]
    assert len({len(i) for i in ids}) >= 6 and min(len(i) for i in ids) == 1
    return ids


@pytest.fixture(scope="module")
def close_draft(tiny):
    return perturbed(tiny.target, 0.05)  # long accepted blocks, and rejections too


def assert_rows_match(batch, singles, target, prompts, what):
    """Every row equals its single decode, or first differs at a near tie of the target."""
    ties = 0
    for r, s, ids in zip(batch, singles, prompts):
        if r.tokens != s:
            d = compare_greedy(r.tokens, s, target, ids)
            assert d.classification == "near_tie", (what, d)
            ties += 1
        else:
            assert r.stop_reason is not None
    assert ties <= 1, what  # rounding-level ties are rare
    return ties


# ---------------------------------------------------------------------------------------------
# greedy: each row equals single-sequence decoding


def test_greedy_rows_equal_single_decoding_for_batch_sizes_1_to_8(tiny, prompts, close_draft):
    dec = SpeculativeDecoder(tiny.target, close_draft, gamma=3, sampling=GREEDY, tokenizer=tiny.tokenizer)
    ar = AutoregressiveDecoder(tiny.target, sampling=GREEDY)
    singles = [dec.generate(p, N_NEW).tokens for p in prompts]
    assert singles == [ar.generate(p, N_NEW).tokens for p in prompts]
    accepted = 0
    for B in (1, 2, 5, 8):  # every size 1-8 runs on the random Llama below
        order = [(B + i) % len(prompts) for i in range(B)]  # a different mix of lengths for every size
        batch_prompts = [prompts[i] for i in order]
        refs = [singles[i] for i in order]
        out = dec.generate_batch(batch_prompts, N_NEW)
        assert len(out) == B and all(isinstance(r, BatchGenerationResult) for r in out)
        assert [r.row for r in out] == list(range(B)) and {r.batch_size for r in out} == {B}
        assert_rows_match(out, refs, tiny.target, batch_prompts, f"spec B={B}")
        if B in (1, 8):
            assert_rows_match(ar.generate_batch(batch_prompts, N_NEW), refs, tiny.target, batch_prompts, f"ar B={B}")
        assert out[0].text == tiny.tokenizer.decode(out[0].tokens)
        accepted += sum(s.n_accepted for r in out for s in r.steps)
    assert accepted > 0


def test_adaptive_policy_gives_ragged_draft_lengths(rand_pair, tiny, prompts):
    """An adaptive policy: rows draft different numbers of tokens in the same batched step and still
    equal single decoding; the tiny pair's own (mostly rejected) draft too."""
    target, draft, rprompts = rand_pair
    dec = SpeculativeDecoder(target, draft, policy=ConfidenceThreshold(0.5, max_gamma=5), sampling=GREEDY)
    out = dec.generate_batch(rprompts, N_NEW)
    assert_rows_match(out, [dec.generate(p, N_NEW).tokens for p in rprompts], target, rprompts, "policy")
    by_step: dict[int, set] = {}
    for r in out:
        for s in r.steps:
            by_step.setdefault(s.batch_step, set()).add(s.gamma)
    assert any(len(v) > 1 for v in by_step.values())
    assert any(s.draft_stop == "policy" for r in out for s in r.steps)
    dec2 = SpeculativeDecoder(tiny.target, tiny.draft, gamma=4, sampling=GREEDY)
    out2 = dec2.generate_batch(prompts[:4], 12)
    assert [r.tokens for r in out2] == [dec2.generate(p, 12).tokens for p in prompts[:4]]


def random_llama(vocab=128, seed=0, layers=2, hidden=32, init=0.3, max_pos=128):
    """A random Llama whose greedy continuations vary (the tiny pair's greedy text is one repeated token)."""
    return llama(vocab=vocab, seed=seed, layers=layers, hidden=hidden, init=init, max_pos=max_pos)


@pytest.fixture(scope="module")
def rand_pair():
    target = random_llama()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (9, 1, 4, 17, 2, 12, 30, 6)]
    return target, perturbed(target, 0.15), prompts


def test_greedy_rows_equal_single_decoding_on_a_random_llama(rand_pair):
    target, draft, prompts = rand_pair
    dec = SpeculativeDecoder(target, draft, gamma=4, sampling=GREEDY, eos_token_id=[])
    ar = AutoregressiveDecoder(target, sampling=GREEDY, eos_token_id=[])
    singles = [dec.generate(p, N_NEW).tokens for p in prompts]
    assert singles == [ar.generate(p, N_NEW).tokens for p in prompts]
    assert len({tuple(s) for s in singles}) == len(prompts)  # varied continuations
    ragged = 0
    for B in range(1, 9):
        order = [(3 * B + i) % len(prompts) for i in range(B)]
        sub, refs = [prompts[i] for i in order], [singles[i] for i in order]
        out = dec.generate_batch(sub, N_NEW)
        assert_rows_match(out, refs, target, sub, f"spec B={B}")
        if B in (1, 5, 8):
            assert_rows_match(ar.generate_batch(sub, N_NEW), refs, target, sub, f"ar B={B}")
        by_step: dict[int, set] = {}
        for r in out:
            for s in r.steps:
                by_step.setdefault(s.batch_step, set()).add(s.n_accepted)
        ragged += sum(len(v) > 1 for v in by_step.values())
    assert ragged > 0  # rows accepted different numbers of drafts in the same batched step


def test_adaptive_gamma_rows_keep_their_own_state_as_in_single_decoding(rand_pair):
    """AdaptiveGamma is stateful: every row gets its own state (policy.start()), whose gamma() caps that
    row's drafts from that row's past steps. Batched rows equal single decoding in tokens, per-step
    gammas, accept lengths and stop reasons (a loop that never starts the state drafts max_gamma
    every step: these gammas vary and mostly lie below it)."""
    target, _, prompts = rand_pair
    pol = AdaptiveGamma(c=0.05, verify_cost=1.0, max_gamma=6, decay=0.8)
    dec = SpeculativeDecoder(target, perturbed(target, 0.05), policy=pol, sampling=GREEDY, eos_token_id=[],
                             record="light")
    singles = [dec.generate(p, N_NEW) for p in prompts]
    assert all(len(set(s.gammas)) >= 3 for s in singles)          # the caps follow the acceptance
    assert sum(g < pol.max_gamma for s in singles for g in s.gammas[:-1]) > len(prompts)
    out = dec.generate_batch(prompts, N_NEW)
    assert_rows_match(out, [s.tokens for s in singles], target, prompts, "adaptive")
    same = [(r, s) for r, s in zip(out, singles) if r.tokens == s.tokens]
    assert len(same) >= len(prompts) - 1
    for r, s in same:
        assert r.gammas == s.gammas and r.accept_lengths == s.accept_lengths, r.row
        assert [x.draft_stop for x in r.steps] == [x.draft_stop for x in s.steps], r.row
    by_step: dict[int, set] = {}
    for r in out:
        for x in r.steps:
            by_step.setdefault(x.batch_step, set()).add(x.gamma)
    assert any(len(v) > 1 for v in by_step.values())  # rows' own caps differ within a batched step


def test_greedy_rows_equal_single_decoding_on_gpt2_absolute_positions(rand_pair):
    """GPT-2 adds learned absolute position embeddings: the explicit position ids must skip the holes."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    target = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=96,
                                        initializer_range=0.3, bos_token_id=None, eos_token_id=None)).eval()
    prompts = rand_pair[2][:5]
    dec = SpeculativeDecoder(target, perturbed(target, 0.1), gamma=3, sampling=GREEDY, eos_token_id=[])
    out = dec.generate_batch(prompts, N_NEW)
    assert_rows_match(out, [dec.generate(p, N_NEW).tokens for p in prompts], target, prompts, "gpt2")
    assert sum(s.n_accepted for r in out for s in r.steps) > 0


@pytest.mark.parametrize("backend", ["lean", "hf"])
def test_compaction_at_every_step_keeps_rows_exact(rand_pair, monkeypatch, backend):
    """Force the holes-dominate compaction after every step: rows still equal single decoding, on the lean
    weights (LeanBatch) and through HF's forward (BatchLM)."""
    from spade_lib.decoding import batch
    from spade_lib.decoding.model import lean_batch, slots

    calls = []
    cls = lean_batch.LeanBatch if backend == "lean" else batch.BatchLM
    original = cls._compact
    monkeypatch.setattr(slots, "COMPACT_SLACK", -10 ** 6)
    monkeypatch.setattr(cls, "_compact", lambda self, w: (calls.append(w), original(self, w)))
    target, draft, prompts = rand_pair
    if backend == "hf":
        target, draft = CausalLMAdapter(target, backend="hf"), CausalLMAdapter(draft, backend="hf")
    dec = SpeculativeDecoder(target, draft, gamma=4, sampling=GREEDY, eos_token_id=[])
    out = dec.generate_batch(prompts[:5], 16)
    assert_rows_match(out, [dec.generate(p, 16).tokens for p in prompts[:5]], target, prompts[:5], "compaction")
    assert len(calls) > 4


def test_rows_finish_independently_at_eos_and_context_limit(rand_pair):
    target, draft, prompts = rand_pair
    first = [SpeculativeDecoder(target, draft, gamma=3, sampling=GREEDY, eos_token_id=[]).generate(p, N_NEW).tokens
             for p in prompts]
    # row 0 stops at EOS early, the others where (if) they emit it; the long prompt (row 6) hits the
    # context limit before it emits EOS
    eos = room = None
    for t in first[0][2:]:
        j = first[6].index(t) if t in first[6] else N_NEW
        if j >= 2:
            eos, room = t, min(j, 7)
            break
    assert eos is not None
    limit = len(prompts[6]) + room
    for cls, kwargs in ((SpeculativeDecoder, {"draft": draft, "gamma": 3}), (AutoregressiveDecoder, {})):
        dec = cls(target, sampling=GREEDY, eos_token_id=eos, max_length=limit, **kwargs)
        out = dec.generate_batch(prompts, N_NEW)
        single = [dec.generate(p, N_NEW) for p in prompts]
        assert [r.tokens for r in out] == [s.tokens for s in single]
        assert [r.stop_reason for r in out] == [s.stop_reason for s in single]
        assert out[0].stop_reason == "eos" and len(out[0].tokens) < N_NEW
        assert len(out[6].tokens) == room and out[6].stop_reason == "context_limit"
    assert [r.tokens for r in dec.generate_batch(prompts[:3], 0)] == [[], [], []]


# ---------------------------------------------------------------------------------------------
# batch independence and per-row seeds


def test_a_row_does_not_depend_on_its_batch_mates(tiny, prompts):
    sampling = SamplingConfig(temperature=1.0)
    dec = SpeculativeDecoder(tiny.target, perturbed(tiny.target, 0.2), gamma=3, sampling=sampling)
    p = prompts[3]
    alone = dec.generate(p, N_NEW, seed=11).tokens
    a = dec.generate_batch([prompts[0], p, prompts[6]], N_NEW, seed=[5, 11, 6])[1].tokens
    b = dec.generate_batch([p, prompts[1]], N_NEW, seed=[11, 99])[0].tokens
    c = dec.generate_batch([prompts[4], prompts[5], prompts[2], p], N_NEW, seed=11)[3].tokens
    assert alone == a == b == c
    ar = AutoregressiveDecoder(tiny.target, sampling=sampling)
    alone = ar.generate(p, N_NEW, seed=3).tokens
    assert alone == ar.generate_batch([prompts[6], p], N_NEW, seed=[0, 3])[1].tokens
    # different seeds in one batch give different samples
    twins = dec.generate_batch([p, p], N_NEW, seed=[1, 2])
    assert twins[0].tokens != twins[1].tokens


def test_records_carry_row_and_batch_and_match_single_records(tiny, prompts):
    dec = SpeculativeDecoder(tiny.target, perturbed(tiny.target, 0.2), gamma=3, sampling=SamplingConfig(1.0),
                             record_topk=2)
    out = dec.generate_batch(prompts[:3], 16, seed=[4, 5, 6])
    single = dec.generate(prompts[1], 16, seed=5).records()
    rec = out[1].records()
    assert list(rec[0]) == [*RECORD_COLUMNS, "p_topk_ids", "p_topk_probs", "q_topk_ids", "q_topk_probs",
                            *BATCH_COLUMNS]
    assert len(rec) == len(single) and {r["row"] for r in rec} == {1} and {r["batch_size"] for r in rec} == {3}
    for x, y in zip(rec, single):
        for k, v in y.items():
            if k.startswith("t_"):
                continue
            if isinstance(v, float):
                assert (math.isnan(v) and math.isnan(x[k])) or abs(x[k] - v) <= 1e-5, k
            elif k.endswith("_probs"):
                np.testing.assert_allclose(x[k], v, atol=1e-5)
            else:
                assert x[k] == v, k
    m = batch_metrics(out)
    assert list(m["row"]) == [0, 1, 2] and (m["batch_new_tokens"] == sum(r.new_tokens for r in out)).all()
    assert (m["tokens_per_second"] > 0).all() and (m["batch_tokens_per_second"] > 0).all()
    assert all(r.timing["total"] <= r.batch_timing["total"] + 1e-9 for r in out)
    light = SpeculativeDecoder(tiny.target, tiny.draft, gamma=2, sampling=GREEDY, record="light")
    assert light.generate_batch(prompts[:2], 4)[0].steps[0].stats is None


def test_bad_input_is_refused(tiny, prompts):
    dec = SpeculativeDecoder(tiny.target, tiny.draft, gamma=2, sampling=GREEDY)
    with pytest.raises(ValueError, match="prompts"):
        dec.generate_batch([], 4)
    with pytest.raises(TypeError, match="prompts"):
        dec.generate_batch("abc", 4)
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        dec.generate_batch([prompts[0], []], 4)
    with pytest.raises(ValueError, match="seed"):
        dec.generate_batch(prompts[:2], 4, seed=[1, 2, 3])
    with pytest.raises(ValueError, match="seed"):
        row_seeds([1, -1], 2)
    with pytest.raises(TypeError, match="seed"):
        row_seeds(1.5, 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        dec.generate_batch(prompts[:2], -1)
    ngram = SpeculativeDecoder(tiny.target, NGramDrafter(), gamma=2, sampling=GREEDY)
    with pytest.raises(ValueError, match="draft"):
        ngram.generate_batch(prompts[:2], 4)


# ---------------------------------------------------------------------------------------------
# the cache with holes equals a fresh prefill


def test_holey_cache_equals_fresh_prefill_after_rollback_and_compaction(tiny):
    model = tiny.target
    lm = BatchLM(CausalLMAdapter(model), 3, "target")
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 500, (n,), generator=g) for n in (5, 1, 9)]
    kept = [r.tolist() for r in rows]
    ids = torch.zeros(3, 9, dtype=torch.long)
    valid = torch.zeros(3, 9, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, 9 - len(r):], valid[b, 9 - len(r):] = r, True
    lm.forward(ids, valid, keep=1)
    for step in range(6):  # feed 4 tokens per row (row 1: 2 tokens and 2 holes), keep a ragged prefix
        new = torch.randint(0, 500, (3, 4), generator=g)
        v = torch.ones(3, 4, dtype=torch.bool)
        v[1, 2:] = False
        before = lm.length.clone()
        logits = lm.forward(new, v, keep=0)
        for b in range(3):
            n = int(v[b].sum())
            ref = model(torch.tensor([kept[b] + new[b, :n].tolist()])).logits[0, -n:]
            torch.testing.assert_close(logits[b, :n], ref, rtol=1e-4, atol=1e-4)
        keep = torch.tensor([(step + b) % 3 + 1 for b in range(3)]).minimum(v.sum(1))
        lm.rollback(before + keep)
        for b in range(3):
            kept[b] += new[b, :int(keep[b])].tolist()
        lm.tidy()
    lm._compact(int(lm.length.max()))
    assert lm.slots == max(len(k) for k in kept)
    probe = torch.tensor([[7], [8], [9]])
    logits = lm.forward(probe, torch.ones(3, 1, dtype=torch.bool), keep=1)[:, -1]
    for b in range(3):
        ref = model(torch.tensor([kept[b] + [7 + b]])).logits[0, -1]
        torch.testing.assert_close(logits[b], ref, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# sampling: the rows' joint law of the first tokens is the target's (exact enumeration)

VOCAB, N_TOKENS, TEMP = 6, 3, 1.0


def small_llama(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      initializer_range=0.4, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def exact_joint(target, prompt, sampling):
    """P(first N_TOKENS tokens = t) under target-only sampling, by enumeration: [VOCAB ** N_TOKENS]."""
    return sequence_law(target, prompt, sampling, N_TOKENS)


@pytest.mark.slow
def test_sampled_rows_follow_the_exact_target_law(record_property):
    """Rows of two prompts of different lengths, interleaved in batches of 16 with per-row seeds:
    each prompt's 3-token continuations pass a chi-square test (p > 1e-3) against the target's exact
    law; the draft's own law is rejected by the same test (power check)."""
    target = small_llama()
    draft = perturbed(target, 0.5)
    sampling = SamplingConfig(temperature=TEMP)
    prompt_a, prompt_b = [2], [1, 4, 0, 3]
    laws = [exact_joint(target, p, sampling) for p in (prompt_a, prompt_b)]
    dec = SpeculativeDecoder(target, draft, gamma=2, sampling=sampling, record="light")
    B, n_calls = 16, 100
    counts = [np.zeros(VOCAB ** N_TOKENS, dtype=np.int64) for _ in range(2)]
    first = set()
    for call in range(n_calls):
        out = dec.generate_batch([prompt_a, prompt_b] * (B // 2), N_TOKENS, seed=list(range(call * B, call * B + B)))
        for r in out:
            t = r.tokens
            counts[r.row % 2][(t[0] * VOCAB + t[1]) * VOCAB + t[2]] += 1
            first.add(r.accept_lengths[0])
    p_values = [counts_chi_square_pvalue(c, law) for c, law in zip(counts, laws)]
    p_draft = counts_chi_square_pvalue(counts[1], exact_joint(draft, prompt_b, sampling))
    for name, v in zip(("p_value_prompt_a", "p_value_prompt_b", "p_value_draft_law"), (*p_values, p_draft)):
        record_property(name, v)
    print(f"batched sampling, {n_calls * B // 2} rows per prompt: chi-square p = {p_values[0]:.4f} (prompt of 1 "
          f"token), {p_values[1]:.4f} (4 tokens); against the draft's law p = {p_draft:.2g}")
    assert first == {1, 2, 3}  # rejections, partial and full acceptance all happened
    assert min(p_values) > 1e-3
    assert p_draft < 1e-3


# ---------------------------------------------------------------------------------------------
# the default pair (built by `make run`; skipped when it is not in the cache)


def _default_pair_built() -> bool:
    from spade_lib.zoo.build import zoo_dir

    return any(p.parent.name.startswith("default-") and "tokenizer" not in p.parent.name
               for p in zoo_dir().glob("default-*/manifest.json"))


@pytest.mark.slow
def test_greedy_rows_equal_single_decoding_on_the_default_pair():
    if not _default_pair_built():
        pytest.skip("the default pair is not built (python -m spade_lib.zoo default)")
    from spade_lib.zoo.pairs import load_pair

    pair = load_pair("default")
    prompts = [pair.tokenizer(t)["input_ids"] for t in TEXTS]
    dec = SpeculativeDecoder(pair.target, pair.draft, gamma=4, sampling=GREEDY)
    singles = [dec.generate(p, 32).tokens for p in prompts]
    ties = 0
    for B in (1, 3, 8):
        sub, refs = prompts[:B], singles[:B]
        out = dec.generate_batch(sub, 32)
        ties += assert_rows_match(out, refs, pair.target, sub, f"default B={B}")
        assert sum(s.n_accepted for r in out for s in r.steps) > 0
    assert ties <= 1


# ---------------------------------------------------------------------------------------------
# the study and its figure (mechanics only: no wall-clock thresholds)


def test_batch_study_rounds_prediction_intervals_and_figure(tiny, prompts, tmp_path, monkeypatch):
    """Three timed rounds per point, each on its own prompts; the prediction with the loop overhead is the
    cost model's; the interval is runs.metrics.bootstrap_speedup over the rounds (recomputed here)."""
    from spade_lib import theory
    from spade_lib.decoding.studies.batch_study import BatchStudyConfig, batch_study
    from spade_lib.plots import save_figure
    from spade_lib.plots.batch import plot_speedup_vs_batch
    from spade_lib.runs.batch_speedup import with_intervals

    from spade_lib.decoding.decode import SpeculativeDecoder

    cfg = BatchStudyConfig(batch_sizes=(1, 3), max_new_tokens=4, warmup=0, repeats=3, cost_repeats=1, gamma=2)
    batches = []  # every (timed: warmup 0) speculative batch, to recompute tau by hand
    real_generate_batch = SpeculativeDecoder.generate_batch

    def spy(self, *args, **kwargs):
        out = real_generate_batch(self, *args, **kwargs)
        batches.append(out)
        return out

    monkeypatch.setattr(SpeculativeDecoder, "generate_batch", spy)
    raw = batch_study(tiny.target, tiny.draft, prompts[:2], cfg, overhead=0.5)
    monkeypatch.undo()
    # tau, the reference: the plain mean of n_accepted + 1 over every step of a point's three rounds
    assert len(batches) == 4 * 3
    ref_tau = [float(np.mean([s.n_accepted + 1 for out in batches[i:i + 3] for r in out for s in r.steps]))
               for i in range(0, 12, 3)]
    np.testing.assert_allclose(raw["tau"], ref_tau, rtol=1e-12)
    df = with_intervals(raw, n_boot=500)
    assert list(df[["temperature", "batch_size"]].itertuples(index=False, name=None)) == [
        (0.0, 1), (0.0, 3), (1.0, 1), (1.0, 3)]
    assert (df["rounds"] == 3).all() and (df["prompts"] == 2).all()  # rounds 0, 1, 2 of B = 1: prompts 0, 1, 0
    assert (df["ar_tokens"] == 4 * df["batch_size"] * 3).all() and (df["spec_tokens"] == df["ar_tokens"]).all()
    assert df["ar_round_tokens"].map(len).eq(3).all() and df["spec_round_s"].map(len).eq(3).all()
    assert ((df["alpha"] >= 0) & (df["alpha"] <= 1)).all() and (df["r"] > 0).all() and (df["c"] > 0).all()
    np.testing.assert_allclose(df["speedup"], df["spec_tps"] / df["ar_tps"])
    assert (df["speedup_low"] <= df["speedup"] + 1e-12).all() and (df["speedup"] <= df["speedup_high"] + 1e-12).all()
    # the loop overhead: o itself at B = 1, rescaled to the B x 1 forward beyond; the prediction is the model's
    assert (df.loc[df.batch_size == 1, "overhead"] == 0.5).all() and (df["overhead"] > 0).all()
    # the baseline is SPADE's batched AR on the lean weights: the prediction is priced at its step (ar_level of the
    # speculative loop's B x 1 forward)
    assert ((df["ar_level"] > 0) & np.isfinite(df["ar_level"])).all()
    for _, r in df.iterrows():
        assert r["predicted"] == pytest.approx(r["ar_level"] * theory.speedup(r["alpha"], 2, r["c"], verify_cost=r["r"],
                                                                              overhead=r["overhead"]))
        assert r["predicted"] < r["predicted_forwards"]
    free = batch_study(tiny.target, tiny.draft, prompts[:1], BatchStudyConfig(
        batch_sizes=(2,), temperatures=(0.0,), max_new_tokens=2, warmup=0, repeats=1, cost_repeats=1, gamma=2))
    assert free["overhead"].iloc[0] == 0 and free["predicted"].iloc[0] == free["predicted_forwards"].iloc[0]
    assert np.isnan(with_intervals(free)["speedup_high"]).all()  # one round: no interval
    paths = save_figure(plot_speedup_vs_batch(df), "m2_speedup_vs_batch", directory=tmp_path, close=True)
    assert paths["png"].stat().st_size > 0
    with pytest.raises(ValueError, match="batch_sizes"):
        BatchStudyConfig(batch_sizes=(0,))
    with pytest.raises(ValueError, match="overhead"):
        batch_study(tiny.target, tiny.draft, prompts[:1], cfg, overhead=-1.0)
    with pytest.raises(ValueError, match="study"):
        plot_speedup_vs_batch(df.drop(columns="predicted"))


def test_round_rows_walk_through_the_prompts():
    from spade_lib.decoding.studies.batch_study import round_rows

    prompts = [[i] for i in range(5)]
    assert round_rows(prompts, 2, 0, 10) == ([[0], [1]], [10, 11], [0, 1])
    assert round_rows(prompts, 2, 1, 10) == ([[2], [3]], [12, 13], [2, 3])
    assert round_rows(prompts, 2, 2, 10) == ([[4], [0]], [14, 15], [4, 0])
    assert round_rows(prompts, 7, 0, 0)[2] == [0, 1, 2, 3, 4, 0, 1]  # B > n: prompts repeat within the batch


def test_with_intervals_is_the_speedup_bootstrap_over_rounds():
    """The reference: runs.metrics.bootstrap_speedup on one generation per round, the round the unit."""
    import pandas as pd

    from spade_lib.runs.batch_speedup import with_intervals
    from spade_lib.runs.metrics import bootstrap_speedup

    rounds = {"ar_round_tokens": [[40, 40, 40, 40]], "spec_round_tokens": [[40, 40, 40, 40]],
              "ar_round_s": [[1.0, 1.2, 0.9, 1.1]], "spec_round_s": [[0.5, 0.9, 0.6, 0.4]]}
    study = pd.DataFrame({"batch_size": [4], "speedup": [(160 / 2.4) / (160 / 4.2)], **rounds})
    got = with_intervals(study, n_boot=999, seed=3).iloc[0]
    ref = bootstrap_speedup(
        pd.DataFrame({"question_id": list("abcd"), "sample": 0, "new_tokens": 40, "wall_time": [0.5, 0.9, 0.6, 0.4]}),
        pd.DataFrame({"question_id": list("abcd"), "sample": 0, "new_tokens": 40, "wall_time": [1.0, 1.2, 0.9, 1.1]}),
        n_boot=999, seed=3, by=None, rounds=False)
    assert (got["speedup_low"], got["speedup_high"]) == (ref["ratio_of_totals_low"], ref["ratio_of_totals_high"])
    assert got["speedup_low"] < got["speedup"] < got["speedup_high"]
    assert list(with_intervals(study).columns[:4]) == ["batch_size", "speedup", "speedup_low", "speedup_high"]
    with pytest.raises(ValueError, match="ratio of totals"):
        with_intervals(study.assign(speedup=1.0))
    with pytest.raises(ValueError, match="per-round"):
        with_intervals(study.drop(columns="ar_round_s"))


def test_stops_paying_reads_the_interval_for_the_measurement():
    import pandas as pd

    from spade_lib.decoding.studies.batch_study import stops_paying

    fake = pd.DataFrame({"temperature": [0.0, 0.0, 1.0, 1.0], "batch_size": [1, 3, 1, 3],
                         "speedup": [1.5, 0.9, 1.2, 0.8], "speedup_low": [1.3, 0.8, 1.0, 0.6],
                         "speedup_high": [1.7, 0.95, 1.4, 1.05], "predicted": [1.1, 1.0, 0.5, 0.4]})
    # T = 1, B = 3: the point is below 1, its interval is not: no verdict
    assert stops_paying(fake) == {0.0: 3, 1.0: None}
    assert stops_paying(fake, "predicted") == {0.0: None, 1.0: 1}
    with pytest.raises(ValueError, match="with_intervals"):
        stops_paying(fake.drop(columns="speedup_high"))


def test_batched_greedy_check_is_the_notebooks_former_loop(tiny, prompts):
    """batch_study.batched_greedy_check against notebook 03's former inline check (the reference), on the tiny
    pair and on a draft that disagrees often (rollbacks in every row)."""
    from spade_lib.decoding.decode import SpeculativeDecoder
    from spade_lib.decoding.studies.batch_study import batched_greedy_check
    from spade_lib.decoding.studies.divergence import compare_greedy
    from spade_lib.sampling import SamplingConfig

    for draft in (tiny.draft, perturbed(tiny.target, 0.3)):
        got = batched_greedy_check(tiny.target, draft, prompts[:5], gamma=3, max_new_tokens=10)
        check_dec = SpeculativeDecoder(tiny.target, draft, gamma=3, sampling=SamplingConfig(temperature=0), record=False)
        batched = check_dec.generate_batch(prompts[:5], 10)
        kinds = {"identical": 0, "near_tie": 0, "bug": 0}
        for r, ids in zip(batched, prompts[:5]):
            kinds[compare_greedy(r.tokens, check_dec.generate(ids, 10).tokens, tiny.target, ids).classification] += 1
        assert got == kinds and sum(got.values()) == 5 and got["bug"] == 0
    with pytest.raises(ValueError, match=r"^prompts: at least one"):
        batched_greedy_check(tiny.target, tiny.draft, [], gamma=3, max_new_tokens=4)


def test_the_batch_studys_forwards_all_run_on_spades_lean_batch(tiny, prompts, monkeypatch):
    """Issue 56: the study's AR rounds and the AR step its prediction is priced at run on SPADE's batched lean
    forward (LeanBatch), the fastest batched AR the stack offers, not on the HF batched forward; so do its
    speculative rounds and their cost ratios (issue 53: the batch is a configuration of the one forward)."""
    from spade_lib.decoding import batch
    from spade_lib.decoding.model import lean_batch
    from spade_lib.decoding.studies.batch_study import BatchStudyConfig, batch_study

    made, hf = [], []
    real, real_hf = lean_batch.LeanBatch.__init__, batch.BatchLM.__init__
    monkeypatch.setattr(lean_batch.LeanBatch, "__init__", lambda self, lean, n: made.append(n) or real(self, lean, n))
    monkeypatch.setattr(batch.BatchLM, "__init__", lambda self, *a: hf.append(a[-1]) or real_hf(self, *a))
    df = batch_study(tiny.target, tiny.draft, prompts[:2], BatchStudyConfig(
        batch_sizes=(2,), temperatures=(0.0,), max_new_tokens=3, warmup=0, repeats=1, cost_repeats=1, gamma=2))
    # the AR round, the speculative round (target, draft), the cost ratios' target, verify, draft and AR forwards
    assert made == [2] * 7 and hf == []
    assert 0 < df["ar_level"].iloc[0] < 10
