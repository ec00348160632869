"""Batched tree decoding (spade_lib.decoding.batch_tree) against single-row tree decoding: each row of a
batch equals SpeculativeDecoder.generate of its prompt and seed token for token (greedy and sampled,
several tree shapes), greedy rows equal autoregressive decoding, and the tree-masked holey cache
equals the single adapter's tree extend and, after keeping a path, a fresh prefill."""

import math

import numpy as np
import pytest
import torch

from spade_lib.decoding import batch
from spade_lib.decoding.batch import BATCH_COLUMNS, BatchLM
from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
from spade_lib.decoding.drafts.drafters import ModelDrafter
from spade_lib.decoding.model.adapter import CausalLMAdapter
from spade_lib.decoding.model import slots
from spade_lib.decoding.model.lean_batch import LeanBatch
from spade_lib.decoding.model.masks import ancestor_mask
from spade_lib.sampling import SamplingConfig
from tests.test_decode import llama, perturbed

GREEDY = SamplingConfig(temperature=0)
SAMPLED = SamplingConfig(temperature=1.0)
TREES = ["eagle2:nodes=16,depth=4,topk=4", "static", "sampled:widths=3-2-1,draws=iid",
         "sampled:widths=3-2-1,draws=without_replacement"]
N_NEW = 20
SEEDS = [3, 4, 5]


@pytest.fixture(scope="module")
def pair():
    target = llama(vocab=128, seed=0, layers=2, hidden=32, init=0.3, max_pos=128)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (9, 1, 17)]
    return target, perturbed(target, 0.15), prompts


def decoder(pair, tree, sampling, **kw):
    target, draft, _ = pair
    return SpeculativeDecoder(target, ModelDrafter(draft, tree=tree), gamma=4, sampling=sampling, eos_token_id=[],
                              **kw)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("tree", TREES)
def test_rows_equal_single_tree_decoding(pair, tree, sampling):
    """B = 3 rows of different prompt lengths and seeds: tokens, accept lengths, tree sizes and stop
    reasons of every row equal single decoding with the same seed."""
    dec = decoder(pair, tree, sampling)
    prompts = pair[2]
    out = dec.generate_batch(prompts, N_NEW, seed=SEEDS)
    singles = [dec.generate(p, N_NEW, seed=s) for p, s in zip(prompts, SEEDS)]
    for r, s in zip(out, singles):
        assert r.tokens == s.tokens, (tree, r.row)
        assert r.accept_lengths == s.accept_lengths and r.gammas == s.gammas, (tree, r.row)
        assert [x.draft_stop for x in r.steps] == [x.draft_stop for x in s.steps]
        assert r.stop_reason == s.stop_reason
        assert [x.tree for x in r.steps] == [x.tree for x in s.steps]
    assert sum(x.n_accepted for r in out for x in r.steps) > 0
    assert any(x.tree is not None for r in out for x in r.steps)  # tree steps (not plain ones) ran


def test_greedy_tree_rows_equal_autoregressive_decoding(pair):
    target, _, prompts = pair
    ar = AutoregressiveDecoder(target, sampling=GREEDY, eos_token_id=[])
    out = decoder(pair, TREES[0], GREEDY).generate_batch(prompts, N_NEW)
    assert [r.tokens for r in out] == [ar.generate(p, N_NEW).tokens for p in prompts]


def test_records_match_single_records(pair):
    dec = decoder(pair, TREES[0], SAMPLED, record_topk=2)
    out = dec.generate_batch(pair[2], 12, seed=SEEDS)
    for r, p, s in zip(out, pair[2], SEEDS):
        single = dec.generate(p, 12, seed=s).records()
        rec = r.records()
        assert len(rec) == len(single) > 0
        for a, b in zip(rec, single):  # statistics up to the rounding of the batched forward
            for k, v in b.items():
                if k.startswith("t_"):
                    continue
                if isinstance(v, float):
                    assert a[k] == v or (math.isnan(v) and math.isnan(a[k])) or abs(a[k] - v) <= 1e-5, k
                elif k.endswith("_probs"):
                    np.testing.assert_allclose(a[k], v, atol=1e-5)
                else:
                    assert a[k] == v, k
            assert a["row"] == r.row and set(BATCH_COLUMNS) <= set(a)


def test_rows_finish_at_eos_and_context_limit_with_compaction(pair, monkeypatch):
    """EOS, the context limit (a tree cut to fit) and a compaction after every step, as single decoding."""
    target, draft, prompts = pair
    monkeypatch.setattr(slots, "COMPACT_SLACK", -10 ** 6)
    first = decoder(pair, TREES[0], GREEDY).generate(prompts[0], N_NEW).tokens
    limit = len(prompts[2]) + 7
    dec = SpeculativeDecoder(target, ModelDrafter(draft, tree=TREES[0]), gamma=4, sampling=GREEDY,
                             eos_token_id=first[5], max_length=limit)
    out = dec.generate_batch(prompts, N_NEW)
    single = [dec.generate(p, N_NEW) for p in prompts]
    assert [r.tokens for r in out] == [s.tokens for s in single]
    assert [r.stop_reason for r in out] == [s.stop_reason for s in single]
    assert out[0].stop_reason == "eos" and out[2].stop_reason == "context_limit"
    assert [r.tokens for r in dec.generate_batch(prompts, 0)] == [[], [], []]


@pytest.mark.parametrize("cache", ["hf", "lean", "lean_in_place"])
def test_tree_forward_equals_the_single_adapter_and_keep_equals_fresh_prefill(pair, cache, monkeypatch):
    """Two rows with different cache lengths (holes from left padding): the batched tree forward's logits
    equal CausalLMAdapter.extend with parents per row; after keep(root + path) the next token's logits
    equal a fresh prefill of the committed text. On HF's forward (BatchLM) and on the lean weights (LeanBatch,
    packed copies and in place: the cache ``batch_lm`` gives a model with lean weights)."""
    target, _, _ = pair
    monkeypatch.setenv("SPADE_WEIGHTS_ONCE", "1" if cache == "lean_in_place" else "0")
    g = torch.Generator().manual_seed(1)
    heads = [torch.randint(0, 128, (n,), generator=g) for n in (5, 2)]
    trees = [(torch.randint(0, 128, (5,), generator=g), [-1, 0, 0, 1, -1]),
             (torch.randint(0, 128, (3,), generator=g), [-1, -1, 1])]
    paths = [[1, 2, 4], [2, 3]]  # block slots (root 0 and the accepted path's nodes + 1)
    T = BatchLM(CausalLMAdapter(target, backend="hf"), 2, "target") if cache == "hf" else \
        batch.batch_lm(CausalLMAdapter(target, max_length=64), 2, "target")
    assert isinstance(T, BatchLM if cache == "hf" else LeanBatch)
    assert cache == "hf" or T.lean.in_place == (cache == "lean_in_place")
    ids, valid = batch.left_pad(heads, "cpu")
    T.forward(ids, valid, keep=1)
    K = 1 + max(len(t) for t, _ in trees)
    bids = torch.zeros(2, K, dtype=torch.long)
    bvalid = torch.zeros(2, K, dtype=torch.bool)
    anc = torch.zeros(2, K, K, dtype=torch.bool)
    for r, (tok, ps) in enumerate(trees):
        n = len(ps)
        bids[r, 1:n + 1], bvalid[r, :n + 1] = tok, True
        anc[r, :n + 1, :n + 1] = ancestor_mask(torch.tensor([-1] + [j + 1 for j in ps]))
    start = T.slots
    logits = T.forward_tree(bids, bvalid, anc)
    nxt = torch.tensor([[7], [9]])
    T.keep([[0] + p for p in paths], start=start)
    after = T.forward(nxt, torch.ones(2, 1, dtype=torch.bool), keep=1)[:, -1]
    for r, ((tok, ps), head) in enumerate(zip(trees, heads)):
        a = CausalLMAdapter(target, backend="hf")
        a.extend(head)
        full = torch.cat([bids[r, :1], tok])
        ref = a.extend(full, parents=[-1] + [j + 1 for j in ps])
        torch.testing.assert_close(logits[r, :len(ps) + 1], ref, rtol=1e-5, atol=1e-5)
        text = torch.cat([head, full[[0] + paths[r]], nxt[r]])
        fresh = CausalLMAdapter(target, backend="hf").extend(text, last_only=True)[0]
        torch.testing.assert_close(after[r], fresh, rtol=1e-5, atol=1e-5)


def test_eight_rows_and_gpt2_absolute_positions(pair):
    """B = 8 prompts of 1 to 30 tokens on the Llama pair, and GPT-2 (learned absolute positions: the
    tree's position ids must skip the holes): every row equals single tree decoding."""
    from transformers import GPT2Config, GPT2LMHeadModel

    target, draft, _ = pair
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (9, 1, 4, 17, 2, 12, 30, 6)]
    dec = decoder(pair, TREES[0], SAMPLED)
    out = dec.generate_batch(prompts, 12, seed=list(range(8)))
    assert [r.tokens for r in out] == [dec.generate(p, 12, seed=s).tokens for s, p in enumerate(prompts)]
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=96,
                                      initializer_range=0.3, bos_token_id=None, eos_token_id=None)).eval()
    dec = SpeculativeDecoder(gpt2, ModelDrafter(perturbed(gpt2, 0.1), tree="static"), gamma=3, sampling=GREEDY,
                             eos_token_id=[])
    out = dec.generate_batch(prompts[:4], 16)
    assert [r.tokens for r in out] == [dec.generate(p, 16).tokens for p in prompts[:4]]
    assert sum(s.n_accepted for r in out for s in r.steps) > 0
