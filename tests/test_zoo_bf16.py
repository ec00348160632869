"""``zoo/bf16.py``: a draft held in bf16 is the fp32 model with its matrices rounded (its HF forward equal to that
model's), shares everything else and leaves the fp32 model alone; the lean forward reads its bf16 weights in place
on the native kernel, agrees with its HF forward on one row, blocks, a prefill and a tree, and refuses what it cannot
run; speculative decoding with it stays exact (greedy: the target's tokens)."""

from __future__ import annotations

import copy

import pytest
import torch

from spade_lib.decoding.model import native
from spade_lib.decoding.model.lean import LeanForward, _unsupported, lean_forward
from spade_lib.zoo.bf16 import WidenedLinear, bf16_twin
from tests.test_zoo_qwen_coder import prompt, tiny_qwen2

needs_native = pytest.mark.skipif(not native.available(),
                                  reason="SPADE's native kernels do not build here (no AVX2/FMA, compiler or ninja)")


@pytest.fixture(scope="module")
def models():
    model = tiny_qwen2(2, layers=2, hidden=80)  # head_dim 20 (rotation over 10-float halves); K-tails: test_native
    return model, bf16_twin(model)


def rounded(model):
    """The reference: a deep copy of ``model`` with every linear weight rounded to bf16 and back (fp32)."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for m in ref.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.copy_(m.weight.to(torch.bfloat16).float())
    return ref


def test_the_twin_rounds_the_matrices_and_shares_the_rest(models):
    model, twin = models
    before = {n: p.clone() for n, p in model.named_parameters()}
    linears = [m for m in twin.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(isinstance(m, WidenedLinear) and m.weight.dtype == torch.bfloat16 for m in linears)
    assert all(type(m) is torch.nn.Linear and m.weight.dtype == torch.float32
               for m in model.modules() if isinstance(m, torch.nn.Linear))  # the fp32 model untouched
    assert twin.model.embed_tokens.weight is model.model.embed_tokens.weight
    assert twin.model.norm.weight is model.model.norm.weight
    a, b = twin.model.layers[0].self_attn.q_proj, model.model.layers[0].self_attn.q_proj
    assert a.bias is b.bias and torch.equal(a.weight, b.weight.to(torch.bfloat16))
    assert twin.config is not model.config and twin.model.layers is not model.model.layers
    ids = torch.tensor([prompt(12)])
    with torch.inference_mode():
        torch.testing.assert_close(twin(ids).logits, rounded(model)(ids).logits, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_bad_models_are_refused():
    with pytest.raises(ValueError, match="no nn.Linear"):
        bf16_twin(torch.nn.Sequential(torch.nn.ReLU()))
    with pytest.raises(ValueError, match="rounds fp32 weights"):
        bf16_twin(torch.nn.Sequential(torch.nn.Linear(4, 4).double()))


@needs_native
def test_the_lean_forward_reads_the_bf16_weights_in_place_and_agrees_with_hf(models):
    from spade_lib.decoding.model.masks import ancestor_mask

    _, twin = models
    lean = LeanForward(twin, 128)
    assert lean.weight_dtype == torch.bfloat16 and lean.dtype == torch.float32 and lean.in_place
    assert lean.kernel_names == {"one": "native_rows", "many": "native_rows"} and lean.plan_source == "fixed"
    storages = {p.untyped_storage().data_ptr() for p in twin.parameters()}
    assert all(k.w.dtype == torch.bfloat16 and k.w.untyped_storage().data_ptr() in storages
               for layer in lean.layers for name, ks in layer.items() if name in ("qkv", "o", "gate_up", "down")
               for k in ks)
    ids = torch.tensor(prompt(44, seed=3))
    with torch.inference_mode():
        ref = twin(ids[None], use_cache=False).logits[0]
        lean.reset()
        got = torch.cat([lean.forward(ids[:10]), *[lean.forward(ids[i:i + 1]) for i in range(10, 20)]])
        torch.testing.assert_close(got, ref[:20], atol=1e-4, rtol=1e-4)
        lean.reset()  # a prefill's block: SGEMM on the widened weights
        assert lean._row_class(36) == 2
        torch.testing.assert_close(lean.forward(ids[:36]), ref[:36], atol=1e-4, rtol=1e-4)
        for k in (2, 5, 9):
            lean.rollback(20)
            torch.testing.assert_close(lean.forward(ids[20:20 + k]), ref[20:20 + k], atol=1e-4, rtol=1e-4)
        lean.rollback(20)
        parents = torch.tensor([-1, 0, 0, 1, 2, 2])
        tree = torch.tensor(prompt(6, seed=4))
        scored = lean.forward(tree, ancestors=ancestor_mask(parents))
        seq = torch.cat([ids[:20], tree[torch.tensor([0, 2, 5])]])  # node 5's path: 0 -> 2 -> 5
        torch.testing.assert_close(scored[5], twin(seq[None], use_cache=False).logits[0, -1], atol=1e-4, rtol=1e-4)
    assert lean_forward(twin, 64) is not None  # and the checked constructor takes it (agreement recorded)


@needs_native
def test_the_lean_forward_refuses_what_bf16_weights_cannot_run(models, monkeypatch):
    _, twin = models
    for kwargs in ({"kernels": "mkl"}, {"in_place": False}, {"kernels": "native"}):
        with pytest.raises(ValueError, match="bfloat16 weights run in place on 'native_rows' only"):
            LeanForward(twin, 64, **kwargs)
    monkeypatch.setenv("SPADE_NATIVE", "0")
    assert "bf16 weights run on SPADE's native kernels only" in _unsupported(twin)
    assert lean_forward(twin, 64) is None  # the HF forward (WidenedLinear) runs it instead


@needs_native
def test_greedy_spade_with_the_bf16_draft_gives_the_targets_tokens():
    from spade_lib.decoding.decode import SpeculativeDecoder
    from spade_lib.decoding.drafts.drafters import ModelDrafter
    from spade_lib.sampling import SamplingConfig

    target, draft = tiny_qwen2(0, layers=3), bf16_twin(tiny_qwen2(1, layers=1, hidden=32))
    for seed in (1, 2):
        ids = prompt(24, seed)
        x = torch.tensor([ids])
        want = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=30, min_new_tokens=30,
                               do_sample=False, eos_token_id=None, pad_token_id=95)[0, len(ids):].tolist()
        dec = SpeculativeDecoder(target, ModelDrafter(draft), gamma=4, sampling=SamplingConfig(temperature=0.0),
                                 eos_token_id=[])
        assert dec.generate(ids, 30).tokens == want, seed
