"""Medusa heads: shapes and initialisation against the target, the drafter against the heads' own argmax,
and a greedy speculative loop that must emit exactly the target's greedy ``generate``."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spade_lib.decoding.drafts.drafters import TargetView, make_drafter
from spade_lib.decoding.drafts.medusa import MedusaConfig, MedusaDrafter, MedusaHead
from spade_lib.decoding.drafts.policies import ConfidenceThreshold, FixedGamma
from spade_lib.sampling import SamplingConfig

V, VD = 64, 40
GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def make_head(target, vocab=VD, seed=1):
    torch.manual_seed(seed)
    ids = torch.randperm(V)[:vocab] if vocab < V else None
    head = MedusaHead.from_target(target, draft_token_ids=ids, num_heads=3)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return head


def last_hidden(target, ids):
    with torch.no_grad():
        return target(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]


def test_initialised_heads_predict_what_the_target_predicts(target):
    """ResBlocks start as identities and lm_head_i as the target's rows: q_i = the target's next-token
    distribution restricted (and renormalised) to the draft vocabulary."""
    head = MedusaHead.from_target(target, draft_token_ids=torch.arange(VD), num_heads=2)
    assert head.config.feature_layer == 2 and head.heads[0][-1].weight.shape == (VD, 32)
    h = last_hidden(target, [1, 2, 3])[-1]
    with torch.no_grad():
        logits = head(h)
        p_logits = target(input_ids=torch.tensor([[1, 2, 3]])).logits[0, -1]
    assert logits.shape == (2, VD)
    torch.testing.assert_close(logits[0], p_logits[:VD], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[1], p_logits[:VD], rtol=1e-5, atol=1e-5)


def test_config_refuses_bad_arguments(target):
    with pytest.raises(ValueError, match="num_heads"):
        MedusaConfig.for_target(target.config, num_heads=0)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        MedusaConfig.for_target(target.config, draft_vocab_size=V + 1)


def drive(drafter, target, prompt, max_new, gamma):
    seq = list(prompt)
    drafter.reset(torch.tensor(prompt), V)
    layer = drafter.hidden_layers[0]

    def view(cached):
        with torch.no_grad():
            hs = target(input_ids=torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states
        return TargetView(torch.tensor(seq[cached:-1]), cached, {layer: hs[layer][0, cached:]}, seq[-1])

    drafter.observe(view(0))
    cached, emitted = len(seq) - 1, []
    while len(emitted) < max_new:
        draft = drafter.propose(gamma, FixedGamma(gamma), GREEDY, None)
        proposed = draft.tokens.tolist()
        h = last_hidden(target, seq[:-1])[-1]
        with torch.no_grad():
            expect = drafter.head.target_logits(drafter.head(h), V).argmax(-1)[:len(proposed)].tolist()
            p = target(input_ids=torch.tensor([seq + proposed])).logits[0, len(seq) - 1:].argmax(-1).tolist()
        assert proposed == expect  # head i's argmax at the newest committed position
        n = 0
        while n < len(proposed) and proposed[n] == p[n]:
            n += 1
        drafter.accept(n, p[n])
        seq += proposed[:n] + [p[n]]
        emitted += proposed[:n] + [p[n]]
        drafter.observe(view(cached))
        cached = len(seq) - 1
    return emitted[:max_new]


def test_greedy_loop_with_medusa_equals_target_generate(target):
    prompt = [5, 9, 33, 2]
    ref = target.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                          attention_mask=torch.ones(1, 4, dtype=torch.long))[0, 4:].tolist()
    assert drive(MedusaDrafter(make_head(target)), target, prompt, 16, 5) == ref


def test_drafts_at_most_one_token_per_head_with_q_in_the_draft_vocabulary(target):
    head = make_head(target)
    d = MedusaDrafter(head)
    d.reset(torch.tensor([1, 2, 3]), V)
    h = last_hidden(target, [1, 2])
    d.observe(TargetView(torch.tensor([1, 2]), 0, {2: h}, 3))
    draft = d.propose(8, FixedGamma(8), SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    assert draft.gamma == 3 and draft.stop == "heads"
    torch.testing.assert_close(draft.q.sum(-1), torch.ones(3))
    off = torch.ones(V, dtype=torch.bool)
    off[head.draft_ids] = False
    assert float(draft.q[:, off].sum()) == 0.0
    # no fresh state, no draft
    assert d.propose(2, FixedGamma(2), GREEDY, None).stop == "no_match"
    d.observe(TargetView(torch.tensor([1, 2]), 0, {2: h}, 3))
    stopped = d.propose(3, ConfidenceThreshold(threshold=1.0, max_gamma=3), SamplingConfig(temperature=1.0),
                        torch.Generator().manual_seed(0))
    assert stopped.gamma == 1 and stopped.stop == "policy"


def test_make_drafter_finds_the_pairs_medusa_head(target):
    class P:
        name, drafts = "toy", {}

    pair = P()
    pair.target, pair.heads = target, {"m": make_head(target)}
    assert isinstance(make_drafter("medusa", pair), MedusaDrafter)
    assert isinstance(make_drafter("m", pair), MedusaDrafter)


def test_speculative_decoder_with_the_heads_equals_autoregressive(target):
    """Through the real decoder: greedy output with Medusa heads equals AR decoding token for token."""
    from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
    from spade_lib.decoding.model.adapter import CausalLMAdapter
    from spade_lib.sampling import SamplingConfig

    prompt = [5, 9, 33, 2, 17]
    greedy = SamplingConfig(temperature=0.0)
    ar = AutoregressiveDecoder(CausalLMAdapter(target), sampling=greedy, eos_token_id=[]).generate(prompt, 24)
    res = SpeculativeDecoder(CausalLMAdapter(target), MedusaDrafter(make_head(target)), gamma=3,
                             sampling=greedy, eos_token_id=[]).generate(prompt, 24)
    assert res.tokens == ar.tokens


def test_the_native_forward_is_the_module_forward():
    """Without gradients on the CPU the heads run on SPADE's native kernels; with gradients (training) on the
    modules: the same logits, fp32 summation order apart, for one row and for a batch of rows."""
    from spade_lib.decoding.model import native

    if not native.available():
        pytest.skip("SPADE's native kernels do not build here")
    torch.manual_seed(0)
    head = MedusaHead(MedusaConfig(hidden_size=24, vocab_size=50, feature_layer=2, num_heads=3, num_layers=2))
    with torch.no_grad():
        for prm in head.parameters():
            prm.add_(0.1 * torch.randn_like(prm))
    h = torch.randn(2, 5, 24)
    ref = head(h)  # gradients on: the modules
    with torch.no_grad():
        got = head(h)
        one = head(h[0, :1], n_heads=2)
    assert ref.requires_grad and not got.requires_grad and got.shape == (2, 5, 3, 50) and one.shape == (1, 2, 50)
    torch.testing.assert_close(got, ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(one, ref.detach()[0, :1, :2], rtol=1e-5, atol=1e-5)
