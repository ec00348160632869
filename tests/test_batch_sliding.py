"""Batched decoding of a model with sliding-window layers (the tiny Gemma-3 of test_zoo_gemma3: windows of 8
tokens beside a global layer), against Hugging Face: ragged prompts (left holes) decoded well past the window
give each row HF ``generate``'s greedy tokens, the batched logits are HF's own forward's on each row's
sequence, and a speculative batch with a Gemma draft (holes in the middle, rollbacks, compaction) gives
every row the autoregressive tokens; tree blocks past the window, batched on HF and on the lean weights, give
each row the single-sequence tree forward's logits."""

import pytest
import torch

from spade_lib.decoding.model import slots
from spade_lib.decoding.batch import BatchLM, left_pad
from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
from spade_lib.decoding.model.adapter import CausalLMAdapter
from spade_lib.sampling import SamplingConfig

from test_zoo_gemma3 import VOCAB, WINDOW, lively_gemma3, periodic_prompt

GREEDY = SamplingConfig(temperature=0)
LENGTHS = (1, 5, 2 * WINDOW + 3, WINDOW, 3 * WINDOW + 1)  # 0 .. 24 left holes


@pytest.fixture(scope="module")
def target():
    return lively_gemma3()


@pytest.fixture(scope="module")
def prompts():
    return [periodic_prompt(n, seed=i)[: n] for i, n in enumerate(LENGTHS)]


def hf_greedy(model, ids, n):
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=VOCAB - 1)
    return out[0, len(ids):].tolist()


def test_the_sliding_model_gets_a_cache_that_keeps_every_slot(target):
    lm = BatchLM(CausalLMAdapter(target), 2, "target")
    assert lm.window == WINDOW and not any(getattr(layer, "is_sliding", False) for layer in lm.cache.layers)


def test_batched_logits_are_hfs_on_every_row_past_the_window(target, prompts):
    """Prefill the ragged batch, then extend every row by a block with holes of its own: each row's logits at
    its valid slots equal one HF forward of that row's sequence alone."""
    lm = BatchLM(CausalLMAdapter(target), len(prompts), "target")
    ids, valid = left_pad([torch.tensor(p) for p in prompts], "cpu")
    with torch.no_grad():
        first = lm.forward(ids, valid, keep=0)
        g = torch.Generator().manual_seed(3)
        block = torch.randint(0, VOCAB - 3, (len(prompts), 2 * WINDOW), generator=g)
        bvalid = torch.rand(len(prompts), 2 * WINDOW, generator=g) > 0.3  # holes among the new tokens
        second = lm.forward(block, bvalid, keep=0)
        for r, p in enumerate(prompts):
            seq = p + block[r][bvalid[r]].tolist()
            ref = target(torch.tensor([seq]), use_cache=False).logits[0]
            got = torch.cat([first[r][valid[r]], second[r][bvalid[r]]])
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_batched_greedy_equals_hf_generate_row_by_row(target, prompts):
    res = AutoregressiveDecoder(target, sampling=GREEDY, eos_token_id=[]).generate_batch(prompts, 3 * WINDOW)
    for r, p in zip(res, prompts):
        assert r.tokens == hf_greedy(target, p, 3 * WINDOW)
    assert len({t for r in res for t in r.tokens}) > 10  # not one repeated token per row


def test_a_speculative_batch_with_a_gemma_draft_equals_autoregressive(target, prompts, monkeypatch):
    """Ragged acceptance leaves holes mid-cache, rollbacks mask them, and (slack 0) the caches compact:
    every row still equals the single autoregressive decode."""
    monkeypatch.setattr(slots, "COMPACT_SLACK", 0)
    draft = lively_gemma3(seed=0)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ar = AutoregressiveDecoder(target, sampling=GREEDY, eos_token_id=[])
    dec = SpeculativeDecoder(target, draft, gamma=4, sampling=GREEDY, eos_token_id=[])
    res = dec.generate_batch(prompts, 3 * WINDOW)
    for r, p in zip(res, prompts):
        assert r.tokens == ar.generate(p, 3 * WINDOW).tokens
    steps = [s for r in res for s in r.steps]
    assert sum(s.n_accepted for s in steps) > 0
    assert sum(s.n_accepted < s.gamma for s in steps) > 0  # rejections: holes rolled back


@pytest.mark.parametrize("cache", ["hf", "lean"])
def test_batched_tree_blocks_past_the_window_equal_the_single_lean_tree_forward(target, prompts, cache):
    """A tree block per row (holes past each row's nodes) after ragged prompts longer than the window: each
    row's tree logits equal the single-sequence lean forward of that row with ``parents`` (which honours the
    window by position and is checked against HF in test_zoo_gemma3), on HF's batch and on ``LeanBatch``;
    ``keep`` of each row's root and path then gives the next token's logits of the committed text."""
    from spade_lib.decoding import batch
    from spade_lib.decoding.model.lean_batch import LeanBatch
    from spade_lib.decoding.model.masks import ancestor_mask

    rows = [prompts[2], prompts[4], prompts[1]]
    trees = [([-1, 0, 0, 1, 3], [0, 1, 3]), ([-1, -1, 1], [1, 2]), ([-1, 0], [])]  # (parents, an accepted path)
    T = BatchLM(CausalLMAdapter(target), len(rows), "target") if cache == "hf" else \
        batch.batch_lm(CausalLMAdapter(target, max_length=128), len(rows), "target")
    assert isinstance(T, BatchLM if cache == "hf" else LeanBatch)
    g = torch.Generator().manual_seed(5)
    K = 1 + max(len(ps) for ps, _ in trees)
    bids = torch.randint(0, VOCAB - 3, (len(rows), K), generator=g)
    bvalid = torch.zeros(len(rows), K, dtype=torch.bool)
    anc = torch.zeros(len(rows), K, K, dtype=torch.bool)
    for r, (ps, _) in enumerate(trees):
        n = len(ps) + 1
        bvalid[r, :n] = True
        anc[r, :n, :n] = ancestor_mask(torch.tensor([-1] + [j + 1 for j in ps]))
    with torch.no_grad():
        ids, valid = left_pad([torch.tensor(p[:-1]) for p in rows], "cpu")
        T.forward(ids, valid, keep=1)
        bids[:, 0] = torch.tensor([p[-1] for p in rows])
        start = T.slots
        logits = T.forward_tree(bids, bvalid, anc)
        T.keep([[0] + [j + 1 for j in acc] for _, acc in trees], start=start)
        nxt = torch.tensor([[7], [9], [11]])
        after = T.forward(nxt, torch.ones(len(rows), 1, dtype=torch.bool), keep=1)[:, -1]
        for r, (p, (ps, acc)) in enumerate(zip(rows, trees)):
            single = CausalLMAdapter(target, max_length=128)
            assert single.lean is not None
            single.extend(torch.tensor(p[:-1]))
            ref = single.extend(bids[r, :len(ps) + 1], parents=[-1] + [j + 1 for j in ps])
            torch.testing.assert_close(logits[r, :len(ps) + 1], ref, rtol=1e-4, atol=1e-4)
            text = torch.tensor(p[:-1] + [int(bids[r, 0])] + [int(bids[r, j + 1]) for j in acc] + [int(nxt[r])])
            fresh = target(text[None], use_cache=False).logits[0, -1]
            torch.testing.assert_close(after[r], fresh, rtol=1e-4, atol=1e-4)
