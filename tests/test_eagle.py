"""EAGLE heads: the training-time test against the drafting chain, and the drafter against references.

References: the unrolled training forward (:meth:`EagleHead.unrolled`) must equal the chain a drafter
runs on its KV cache position by position (step 0: the target's features; step ``i``: the head's own
output, with the true next tokens); the drafter's greedy proposals must equal the head's chain
recomputed from scratch on the committed text; and a greedy speculative loop driven by the drafter
must emit exactly the target's own greedy ``generate``.
"""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from spade_lib.decoding.drafts.drafters import TargetView, drafter_names, drafter_options, make_drafter
from spade_lib.decoding.drafts.eagle import (EagleConfig, EagleDrafter, EagleHead, default_feature_layers,
                                      step_weights)
from spade_lib.decoding.drafts.policies import ConfidenceThreshold, FixedGamma
from spade_lib.decoding.model.masks import causal_additive
from spade_lib.sampling import SamplingConfig

V, VD = 64, 40
GREEDY = SamplingConfig(temperature=0)


def tiny_target(seed=0, layers=8):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def make_head(target, variant="eagle3", seed=1):
    torch.manual_seed(seed)
    vocab = torch.randperm(V)[:VD]
    head = EagleHead.from_target(target, draft_token_ids=vocab, variant=variant)
    with torch.no_grad():  # move off the target's weights, so the head is a model of its own
        for p in head.parameters():
            if p is not head.embed_tokens.weight:
                p.add_(0.05 * torch.randn_like(p))
    return head


@pytest.fixture(scope="module", params=["eagle3", "eagle1"])
def head(request, target):
    return make_head(target, request.param)


def hidden_at(target, ids, layers):
    with torch.no_grad():
        hs = target(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    return {layer: hs[layer][0] for layer in layers}


def view_of(target, seq, cached, layers):
    """What the decoder tells the drafter when the target's cache grows from ``cached`` tokens to all of
    ``seq`` but the last (``seq[-1]`` is the emitted, not yet fed, next token)."""
    hidden = hidden_at(target, seq[:-1], layers) if len(seq) > 1 else {}
    return TargetView(torch.tensor(seq[cached:-1], dtype=torch.long), cached,
                      {k: v[cached:] for k, v in hidden.items()}, int(seq[-1]))


def reference_chain(head, target, seq, gamma):
    """The head's greedy chain after ``seq`` from scratch: every committed pair on an empty cache, then
    ``gamma - 1`` feedback steps."""
    feats = head.features(hidden_at(target, seq[:-1], head.config.feature_layers))[None]
    toks = torch.tensor([seq[1:]])
    cache = DynamicCache()
    with torch.no_grad():
        g = head.fuse(feats)
        m = g.shape[1]
        o = head.layer(g, toks, torch.arange(1, m + 1)[None], causal_additive(m, 0, g.dtype, g.device), cache)[:, -1:]
        out = []
        for i in range(gamma):
            x = head.target_logits(head.draft_logits(o)[0, 0], V).argmax()
            out.append(int(x))
            o = head.layer(head.feedback(o), x.reshape(1, 1), torch.tensor([[m + 1 + i]]), cache=cache)
    return out


def test_default_feature_layers_are_speculators_low_mid_high():
    assert default_feature_layers(30) == (2, 15, 27)   # SmolLM2-135M
    assert default_feature_layers(8) == (2, 4, 5)
    assert default_feature_layers(30, "eagle1") == (30,)
    with pytest.raises(ValueError, match="feature_layers"):
        default_feature_layers(6)  # [2, 3, 3]


def test_step_weights_decay_by_0_8():
    assert step_weights(3) == pytest.approx([1.0, 0.8, 0.64])


def test_config_refuses_bad_arguments(target):
    with pytest.raises(ValueError, match="variant"):
        EagleConfig.for_target(target.config, variant="eagle2")
    with pytest.raises(ValueError, match="feature_layers"):
        EagleConfig.for_target(target.config, feature_layers=(2, 2, 5))
    with pytest.raises(ValueError, match="feature_layers"):
        EagleConfig.for_target(target.config, feature_layers=(2, 4, 9))  # past L = 8
    with pytest.raises(ValueError, match="draft_vocab_size"):
        EagleConfig.for_target(target.config, draft_vocab_size=V + 1)
    with pytest.raises(ValueError, match="token_ids"):
        EagleHead.from_target(target, draft_token_ids=torch.zeros(VD, dtype=torch.long))


def test_head_shapes_and_vocabulary_maps(target):
    head = make_head(target)
    assert head.fc.weight.shape == (32, 3 * 32)
    assert head.layers[0].self_attn.q_proj.weight.shape == (32, 64)
    assert head.layers[0].self_attn.k_proj.weight.shape == (16, 64)
    assert head.lm_head.weight.shape == (VD, 32)
    assert head.embed_tokens.weight is target.get_input_embeddings().weight  # tied, not copied
    ids = torch.arange(VD) + head.d2t
    assert int(head.t2d.sum()) == VD and bool(head.t2d[ids].all())
    logits = head.target_logits(torch.randn(2, VD), V)
    assert torch.isinf(logits[:, ~head.t2d]).all() and torch.isfinite(logits[:, head.t2d]).all()


def test_unrolled_training_time_test_equals_the_drafting_chain(target, head):
    """Step ``i`` of the unrolled forward at ``t`` = the chain after position ``t``: pairs ``0..t`` on the
    cache, then ``i`` feedback steps fed the true tokens ``x_{t+2} .. x_{t+1+i}``."""
    torch.manual_seed(3)
    seq = torch.randint(0, V, (14,)).tolist()
    T, steps = 10, 3
    feats = head.features(hidden_at(target, seq, head.config.feature_layers))[None]
    toks = torch.tensor([seq[1:T + steps]])  # toks[t] = x_{t+1}
    with torch.no_grad():
        logits, outputs = head.unrolled(feats[:, :T], toks, steps=steps)
        assert [tuple(x.shape) for x in logits] == [(1, T, VD)] * steps
        for t in (0, 4, 9):
            cache = DynamicCache()
            g = head.fuse(feats[:, :t + 1])
            o = head.layer(g, toks[:, :t + 1], torch.arange(1, t + 2)[None],
                           causal_additive(t + 1, 0, g.dtype, g.device), cache)[:, -1:]
            torch.testing.assert_close(head.draft_logits(o)[0, 0], logits[0][0, t], rtol=1e-5, atol=1e-5)
            for i in range(1, steps):
                o = head.layer(head.feedback(o), toks[:, t + i:t + i + 1], torch.tensor([[t + 1 + i]]), cache=cache)
                torch.testing.assert_close(head.draft_logits(o)[0, 0], logits[i][0, t], rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(o[0, 0], outputs[i][0, t], rtol=1e-4, atol=1e-4)


def test_unrolled_with_own_tokens_is_the_drafters_greedy_chain_at_every_position(target, head):
    """``own_tokens=True``: step ``i`` at ``t`` = the drafter's ``i``-th greedy proposal after observing
    ``x_0 .. x_t`` (next token ``x_{t+1}``), fed its own previous proposals (what the held-out eval uses)."""
    torch.manual_seed(5)
    seq = torch.randint(0, V, (12,)).tolist()
    T, steps = 10, 4
    feats = head.features(hidden_at(target, seq[:T], head.config.feature_layers))[None]
    with torch.no_grad():
        logits, _ = head.unrolled(feats, torch.tensor([seq[1:T + 1]]), steps=steps, own_tokens=True)
    for t in (0, 3, 9):
        drafter = EagleDrafter(head)
        drafter.reset(torch.tensor(seq[:t + 1]), V)
        drafter.observe(view_of(target, seq[:t + 2], 0, head.config.feature_layers))
        chain = drafter.propose(steps, FixedGamma(gamma=steps), GREEDY, None).tokens.tolist()
        assert chain == [int(head.draft_ids[logits[i][0, t].argmax()]) for i in range(steps)]


def test_unrolled_is_the_same_for_a_row_of_a_right_padded_batch(target):
    head = make_head(target)
    torch.manual_seed(4)
    a, b = torch.randint(0, V, (13,)).tolist(), torch.randint(0, V, (8,)).tolist()
    layers = head.config.feature_layers
    fa, fb = head.features(hidden_at(target, a, layers)), head.features(hidden_at(target, b, layers))
    feats = torch.stack([fa[:10], torch.cat([fb[:6], torch.zeros(4, fb.shape[1])])])
    toks = torch.stack([torch.tensor(a[1:13]), torch.tensor(b[1:8] + [0] * 5)])
    with torch.no_grad():
        batched, _ = head.unrolled(feats, toks, steps=3)
        alone, _ = head.unrolled(fb[None, :6], torch.tensor([b[1:8] + [0]]), steps=3)
    for i in range(3):  # the short row's valid positions do not see its padding
        torch.testing.assert_close(batched[i][1, :6 - i], alone[i][0, :6 - i], rtol=1e-5, atol=1e-5)


def drive(drafter, target, prompt, max_new, gamma, check_chain=None):
    """A plain greedy speculative loop around ``drafter`` (the decoder's protocol: reset, observe the
    prefill, then propose / verify / accept / observe); returns the emitted tokens and accepted counts."""
    seq = list(prompt)
    drafter.reset(torch.tensor(prompt), V)
    drafter.observe(view_of(target, seq, 0, drafter.hidden_layers))
    cached, emitted, accepted = len(seq) - 1, [], []
    while len(emitted) < max_new:
        draft = drafter.propose(gamma, FixedGamma(gamma), GREEDY, None)
        proposed = draft.tokens.tolist()
        if check_chain is not None and proposed:
            assert proposed == check_chain(seq, len(proposed))
        with torch.no_grad():
            p = target(input_ids=torch.tensor([seq + proposed])).logits[0, len(seq) - 1:].argmax(-1).tolist()
        n = 0
        while n < len(proposed) and proposed[n] == p[n]:
            n += 1
        block = proposed[:n] + [p[n]]
        drafter.accept(n, p[n])
        seq += block
        emitted += block
        accepted.append(n)
        drafter.observe(view_of(target, seq, cached, drafter.hidden_layers))
        cached = len(seq) - 1
    return emitted[:max_new], accepted


def test_greedy_loop_with_the_drafter_equals_target_generate(target, head):
    prompt = [5, 9, 33, 2, 17]
    ref = target.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                          attention_mask=torch.ones(1, len(prompt), dtype=torch.long))[0, len(prompt):].tolist()
    chain = lambda seq, g: reference_chain(head, target, seq, g)  # noqa: E731
    out, _ = drive(EagleDrafter(head), target, prompt, 20, 4, check_chain=chain)
    assert out == ref


def test_first_proposal_after_the_prefill_is_the_reference_chain(target):
    """Greedy: the proposal after the prefill is the head's chain from scratch, with one-hot q."""
    head = make_head(target)
    d = EagleDrafter(head)
    prompt = [3, 4, 5, 6]
    d.reset(torch.tensor(prompt), V)
    d.observe(view_of(target, prompt, 0, d.hidden_layers))
    draft = d.propose(3, FixedGamma(3), GREEDY, None)
    assert draft.tokens.tolist() == reference_chain(head, target, prompt, 3)
    assert torch.equal(draft.q.argmax(-1), draft.tokens) and torch.allclose(draft.q.sum(-1), torch.ones(3))


def test_sampled_proposals_lie_in_the_draft_vocabulary_and_replay(target):
    head = make_head(target)
    sampling = SamplingConfig(temperature=1.0, top_k=10)
    runs = []
    for _ in range(2):
        d = EagleDrafter(head)
        d.reset(torch.tensor([1, 2, 3]), V)
        d.observe(view_of(target, [1, 2, 3], 0, d.hidden_layers))
        draft = d.propose(5, FixedGamma(5), sampling, torch.Generator().manual_seed(7))
        runs.append(draft)
        assert draft.q.shape == (5, V)
        torch.testing.assert_close(draft.q.sum(-1), torch.ones(5))
        assert float(draft.q[:, ~head.t2d].abs().sum()) == 0.0  # q = 0 off the draft vocabulary
        assert bool(head.t2d[draft.tokens].all())
        assert ((draft.q > 0).sum(-1) <= 10).all()  # top-k applied like the target's
    assert torch.equal(runs[0].tokens, runs[1].tokens)


def test_the_policy_stops_drafting(target):
    head = make_head(target)
    d = EagleDrafter(head)
    d.reset(torch.tensor([1, 2, 3]), V)
    d.observe(view_of(target, [1, 2, 3], 0, d.hidden_layers))
    draft = d.propose(6, ConfidenceThreshold(threshold=1.0, max_gamma=6), SamplingConfig(temperature=1.0),
                      torch.Generator().manual_seed(0))
    assert draft.gamma == 1 and draft.stop == "policy"


def test_no_features_no_draft_and_out_of_order_views_are_refused(target):
    head = make_head(target)
    d = EagleDrafter(head)
    d.reset(torch.tensor([7]), V)  # a one-token prompt: the prefill holds no position
    d.observe(view_of(target, [7], 0, d.hidden_layers))
    draft = d.propose(4, FixedGamma(4), GREEDY, None)
    assert draft.gamma == 0 and draft.stop == "no_match"
    d.accept(0, 9)
    with pytest.raises(ValueError, match="view"):
        d.observe(view_of(target, [7, 9, 4], 1, d.hidden_layers))  # position 0 was never observed


def test_tree_root_children_are_the_chain_top_k_and_q_matches(target):
    head = make_head(target)
    prompt = [3, 4, 5, 6]

    def fresh():
        d = EagleDrafter(head)
        d.reset(torch.tensor(prompt), V)
        d.observe(view_of(target, prompt, 0, d.hidden_layers))
        return d

    tree = fresh().propose_tree(depth=2, top_k=3, sampling=SamplingConfig(temperature=1.0))
    assert tree["tokens"].shape == (12,) and tree["q"].shape == (12, V)
    assert tree["parents"][:3].tolist() == [-1, -1, -1] and tree["depth"].tolist() == [0] * 3 + [1] * 9
    chain = fresh().propose(2, FixedGamma(2), SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    assert tree["tokens"][0] == fresh().propose(1, FixedGamma(1), GREEDY, None).tokens[0]
    torch.testing.assert_close(tree["q"][0], chain.q[0])
    # the children of the root's first child: top-3 after feeding it (the greedy chain's second token)
    second = reference_chain(head, target, prompt, 2)[1]
    kids = tree["tokens"][tree["parents"] == 0].tolist()
    assert kids[0] == second


def test_make_drafter_finds_the_pairs_eagle_head(target):
    class P:
        name = "toy"
        drafts = {}

    pair = P()
    pair.target = target
    pair.heads = {"e3": make_head(target)}
    assert "eagle" in drafter_names() and "e3" in drafter_names(pair)
    assert drafter_options("eagle") == ("head", "tree")
    assert isinstance(make_drafter("eagle", pair), EagleDrafter)
    assert isinstance(make_drafter("e3", pair), EagleDrafter)
    pair.heads = {}
    with pytest.raises(ValueError, match="head"):
        make_drafter("eagle", pair)


@pytest.mark.parametrize("backend", ["hf", "lean"])
def test_speculative_decoder_with_the_head_equals_autoregressive(target, head, backend):
    """Through the real decoder (observe after the prefill and every step, hidden states from the
    backend's tree-free extend): greedy output equals AR decoding token for token, and drafts do get
    accepted (the head was initialised from the target, so agreement is far from 0)."""
    from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
    from spade_lib.decoding.model.adapter import CausalLMAdapter
    from spade_lib.sampling import SamplingConfig

    prompt = [5, 9, 33, 2, 17]
    greedy = SamplingConfig(temperature=0.0)
    ar = AutoregressiveDecoder(CausalLMAdapter(target, backend=backend), sampling=greedy,
                               eos_token_id=[]).generate(prompt, 24)
    dec = SpeculativeDecoder(CausalLMAdapter(target, backend=backend), EagleDrafter(head), gamma=4,
                             sampling=greedy, eos_token_id=[], record=True)
    res = dec.generate(prompt, 24)
    assert res.tokens == ar.tokens
    assert sum(res.accept_lengths) > 0


@pytest.mark.parametrize("variant,options", [("eagle3", {}), ("eagle1", {}),
                                             ("eagle3", {"norm_before_residual": True, "norm_output": True})])
def test_the_native_runner_is_the_hf_layer_for_chains_steps_and_trees(target, variant, options):
    """The drafter's engine on SPADE's native kernels computes what the Hugging Face modules compute (fp32
    summation order apart): a block of committed positions, single drafted steps, a tree level under its
    ancestor mask, and the same again after a crop back to the committed positions."""
    from spade_lib.decoding.drafts.eagle import NativeRunner, _HFRunner
    from spade_lib.decoding.model import native

    if not native.available():
        pytest.skip("SPADE's native kernels do not build here")
    torch.manual_seed(3)
    head = EagleHead.from_target(target, variant=variant, **options)
    with torch.no_grad():  # a trained head's layer is not the target's: perturb every weight
        for prm in head.parameters():
            if prm.requires_grad:
                prm.add_(0.05 * torch.randn_like(prm))
    assert isinstance(head.runner(), NativeRunner)
    g = torch.Generator().manual_seed(4)
    feats = torch.randn(7, head.fc.in_features, generator=g)
    toks = torch.randint(0, V, (7,), generator=g)
    parents = torch.tensor([-1, -1, 0, 0, 1])
    anc = torch.zeros(5, 5, dtype=torch.bool)
    for i, p in enumerate(parents.tolist()):
        anc[i, i] = True
        while p >= 0:
            anc[i, p], p = True, int(parents[p])
    outs = {}
    with torch.inference_mode():
        for name, run in (("hf", _HFRunner(head)), ("native", NativeRunner(head, capacity=4))):  # 4: it must grow
            o = run.feed(run.fuse(feats), toks, torch.arange(1, 8))
            step = run.feed(run.feedback(o[-1:]), toks[:1], torch.tensor([8]))
            logits = run.draft_logits(step)
            run.crop(7)
            level1 = run.feed(run.feedback(o[-1:]).expand(2, -1), toks[:2], torch.tensor([8, 8]), tree_from=7,
                              ancestors=anc[:2, :2].contiguous())
            level2 = run.feed(run.feedback(level1[[0, 0, 1]]), toks[2:5], torch.tensor([9, 9, 9]), tree_from=7,
                              ancestors=anc[2:5].contiguous())
            assert run.length == 12
            outs[name] = (o, step, logits, level1, level2, run.draft_logits(level2))
    for got, ref in zip(outs["native"], outs["hf"]):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
