"""``zoo/narrow.py``: a draft held in bf16 or int8 is the fp32 model with its matrices rounded (its HF forward equal
to that model's), shares everything else and leaves the fp32 model alone; int8 rounds within half a step of each
row's scale; the lean forward reads the narrow weights in place on the native kernel, agrees with its HF forward on
one row, blocks, a prefill and a tree, and refuses what it cannot run; speculative decoding with it stays exact
(greedy: the target's tokens)."""

from __future__ import annotations

import copy

import pytest
import torch

from spade_lib.decoding.model import native
from spade_lib.decoding.model.lean import LeanForward, _unsupported, lean_forward
from spade_lib.decoding.model.kernels import SCALE
from spade_lib.zoo.narrow import FORMATS, WidenedLinear, narrow_twin, quantize_int8
from tests.test_zoo_qwen_coder import prompt, tiny_qwen2

needs_native = pytest.mark.skipif(not native.available(),
                                  reason="SPADE's native kernels do not build here (no AVX2/FMA, compiler or ninja)")


@pytest.fixture(scope="module", params=list(FORMATS))
def models(request):
    model = tiny_qwen2(2, layers=2, hidden=80)  # head_dim 20 (rotation over 10-float halves); K-tails: test_native
    return model, narrow_twin(model, request.param), request.param


def rounded(model, fmt):
    """The reference: a deep copy of ``model`` with every linear weight rounded to ``fmt`` and back (fp32)."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for m in ref.modules():
            if isinstance(m, torch.nn.Linear):
                if fmt == "bf16":
                    m.weight.copy_(m.weight.to(torch.bfloat16).float())
                else:
                    w8, scale = quantize_int8(m.weight)
                    m.weight.copy_(w8.float() * scale[:, None])
    return ref


def test_every_format_is_a_dtype_the_lean_forward_reads():
    from spade_lib.decoding.model.lean import NARROW_DTYPES

    assert set(FORMATS.values()) == set(NARROW_DTYPES)


def test_int8_rounds_each_row_within_half_its_scale():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(7, 33, generator=gen) * torch.logspace(-3, 1, 7)[:, None]
    w[3] = 0.0  # an all-zero row: scale 1, zeros
    w8, scale = quantize_int8(w)
    assert w8.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (7,)
    assert int(w8.abs().max()) == 127 and bool((w8.abs().amax(dim=1)[[0, 1, 2, 4, 5, 6]] == 127).all())
    assert float(scale[3]) == 1.0 and not w8[3].any()
    assert bool(((w - w8.float() * scale[:, None]).abs() <= scale[:, None] / 2 * (1 + 1e-6)).all())


def test_the_twin_rounds_the_matrices_and_shares_the_rest(models):
    model, twin, fmt = models
    before = {n: p.clone() for n, p in model.named_parameters()}
    linears = [m for m in twin.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(isinstance(m, WidenedLinear) and m.weight.dtype == FORMATS[fmt] for m in linears)
    assert all((getattr(m, SCALE, None) is not None) == (fmt == "int8") for m in linears)
    assert all(type(m) is torch.nn.Linear and m.weight.dtype == torch.float32
               for m in model.modules() if isinstance(m, torch.nn.Linear))  # the fp32 model untouched
    assert twin.model.embed_tokens.weight is model.model.embed_tokens.weight
    assert twin.model.norm.weight is model.model.norm.weight
    a, b = twin.model.layers[0].self_attn.q_proj, model.model.layers[0].self_attn.q_proj
    assert a.bias is b.bias and torch.equal(a.weight, b.weight.to(torch.bfloat16) if fmt == "bf16"
                                            else quantize_int8(b.weight)[0])
    assert twin.config is not model.config and twin.model.layers is not model.model.layers
    ids = torch.tensor([prompt(12)])
    with torch.inference_mode():
        torch.testing.assert_close(twin(ids).logits, rounded(model, fmt)(ids).logits, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_bad_models_and_formats_are_refused():
    with pytest.raises(ValueError, match="no nn.Linear"):
        narrow_twin(torch.nn.Sequential(torch.nn.ReLU()), "bf16")
    with pytest.raises(ValueError, match="rounds fp32 weights"):
        narrow_twin(torch.nn.Sequential(torch.nn.Linear(4, 4).double()), "int8")
    with pytest.raises(ValueError, match="fmt: must be one of \\['bf16', 'int8'\\], got 'fp8'"):
        narrow_twin(torch.nn.Sequential(torch.nn.Linear(4, 4)), "fp8")


@needs_native
def test_the_lean_forward_reads_the_narrow_weights_in_place_and_agrees_with_hf(models):
    from spade_lib.decoding.model.masks import ancestor_mask

    _, twin, fmt = models
    lean = LeanForward(twin, 128)
    assert lean.weight_dtype == FORMATS[fmt] and lean.dtype == torch.float32 and lean.in_place
    assert lean.kernel_names == {"one": "native_rows", "many": "native_rows"} and lean.plan_source == "fixed"
    storages = {p.untyped_storage().data_ptr() for p in twin.parameters()}
    kernels = [k for layer in lean.layers for name, ks in layer.items() if name in ("qkv", "o", "gate_up", "down")
               for k in ks] + list(lean.head)
    assert all(k.w.dtype == FORMATS[fmt] and k.w.untyped_storage().data_ptr() in storages for k in kernels)
    buffers = {b.untyped_storage().data_ptr() for b in twin.buffers()}  # int8: the modules' scales, joined in place
    assert all((k.s is not None and k.s.untyped_storage().data_ptr() in buffers) if fmt == "int8" else k.s is None
               for k in kernels)
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
def test_the_lean_forward_refuses_what_narrow_weights_cannot_run(models, monkeypatch):
    _, twin, fmt = models
    for kwargs in ({"kernels": "mkl"}, {"in_place": False}, {"kernels": "native"}):
        with pytest.raises(ValueError, match=f"{FORMATS[fmt]} weights run in place on 'native_rows' only"):
            LeanForward(twin, 64, **kwargs)
    monkeypatch.setenv("SPADE_NATIVE", "0")
    assert "bf16 and int8 weights run on SPADE's native kernels only" in _unsupported(twin)
    assert lean_forward(twin, 64) is None  # the HF forward (WidenedLinear) runs it instead


@needs_native
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_greedy_spade_with_a_narrow_draft_gives_the_targets_tokens(fmt):
    from spade_lib.decoding.decode import SpeculativeDecoder
    from spade_lib.decoding.drafts.drafters import ModelDrafter
    from spade_lib.sampling import SamplingConfig

    target, draft = tiny_qwen2(0, layers=3), narrow_twin(tiny_qwen2(1, layers=1, hidden=32), fmt)
    for seed in (1, 2):
        ids = prompt(24, seed)
        x = torch.tensor([ids])
        want = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=30, min_new_tokens=30,
                               do_sample=False, eos_token_id=None, pad_token_id=95)[0, len(ids):].tolist()
        dec = SpeculativeDecoder(target, ModelDrafter(draft), gamma=4, sampling=SamplingConfig(temperature=0.0),
                                 eos_token_id=[])
        assert dec.generate(ids, 30).tokens == want, seed
