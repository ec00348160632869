"""spade_lib.decoding.native: the one-token kernels equal their torch formulation (products with and
without the RMSNorm prologue, gate, bias and residual; attention with rotation and cache write, grouped
and not), refuse bad input by name, and step aside where they cannot be built."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from spade_lib import paths
from spade_lib.decoding import native
from spade_lib.decoding.lean import LeanForward

needs_native = pytest.mark.skipif(not native.available(),
                                  reason="SPADE's native kernels do not build here (no AVX2/FMA, compiler or ninja)")


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,k", [(1, 8), (70, 150), (576, 576), (1000, 37)])  # K % 32, K % 8 tails; N over grains
def test_linear_one_equals_its_torch_formulation(n, k, threads):
    g = torch.Generator().manual_seed(n + k)
    w, b, r = torch.randn(n, k, generator=g), torch.randn(n, generator=g), torch.randn(1, n, generator=g)
    x, xx = torch.randn(1, k, generator=g), torch.randn(1, 2 * k, generator=g)
    u = F.silu(xx[:, :k]) * xx[:, k:]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        close = lambda got, ref: torch.testing.assert_close(got, ref, rtol=2e-5, atol=2e-5)  # noqa: E731
        close(native.linear_one(x, w), F.linear(x, w))
        close(native.linear_one(x[0], w, b, r), r + F.linear(x, w, b))
        close(native.linear_one(x, w, eps=1e-5), F.linear(F.rms_norm(x, (k,), None, 1e-5), w))
        close(native.linear_one(xx, w, b, r, eps=1e-6, gated=True),
              r + F.linear(F.rms_norm(u, (k,), None, 1e-6), w, b))
    finally:
        torch.set_num_threads(before)


@needs_native
@pytest.mark.parametrize("heads,kv_heads,start", [(9, 3, 200), (4, 4, 0), (8, 2, 37)])
def test_attend_one_rotates_writes_the_cache_and_attends(heads, kv_heads, start):
    g = torch.Generator().manual_seed(heads * 100 + start)
    hd, cap = 16, 256
    qkv = torch.randn((heads + 2 * kv_heads) * hd, generator=g)
    kv = torch.randn(2, kv_heads, cap, hd, generator=g)
    ang = torch.rand(hd // 2, generator=g) * 6
    cos, sin = torch.cat([ang.cos(), ang.cos()]), torch.cat([ang.sin(), ang.sin()])
    ref_kv = kv.clone()
    out = native.attend_one(qkv, kv, start, cos, sin, heads)
    x = qkv.view(heads + 2 * kv_heads, hd)
    ref_kv[0, :, start] = rope(x[heads:heads + kv_heads], cos, sin)
    ref_kv[1, :, start] = x[heads + kv_heads:]
    grp = heads // kv_heads
    q = rope(x[:heads], cos, sin)
    ref = torch.cat([torch.softmax(q[h] @ ref_kv[0, h // grp, :start + 1].T, -1) @ ref_kv[1, h // grp, :start + 1]
                     for h in range(heads)])[None]
    torch.testing.assert_close(kv, ref_kv, rtol=0, atol=1e-6)  # only position `start` changed
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@needs_native
def test_bad_input_is_refused_by_name():
    w = torch.randn(8, 16)
    with pytest.raises(RuntimeError, match="x: must hold one row of 16"):
        native.linear_one(torch.randn(1, 15), w)
    with pytest.raises(RuntimeError, match="x: must hold one row of 32"):
        native.linear_one(torch.randn(1, 16), w, gated=True)
    with pytest.raises(RuntimeError, match="w: must be a contiguous float32"):
        native.linear_one(torch.randn(1, 8), w.t())
    with pytest.raises(RuntimeError, match="residual: must hold 8"):
        native.linear_one(torch.randn(1, 16), w, residual=torch.randn(1, 9))
    with pytest.raises(RuntimeError, match="x: must be a contiguous float32"):
        native.linear_one(torch.randn(1, 16, dtype=torch.float64), w)
    kv = torch.zeros(2, 2, 8, 4)
    with pytest.raises(RuntimeError, match="start: must be in"):
        native.attend_one(torch.zeros(6 * 4), kv, 8, torch.ones(4), torch.zeros(4), 2)
    with pytest.raises(RuntimeError, match="qkv: must hold"):
        native.attend_one(torch.zeros(5 * 4), kv, 0, torch.ones(4), torch.zeros(4), 2)


@needs_native
def test_the_lean_one_token_path_is_the_same_with_and_withoutnative_attention():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         initializer_range=0.2)).eval()
    ids = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = model(ids[None], use_cache=False).logits[0]
        lean = LeanForward(model, 64, kernels="avx2")
        assert lean.native_attention and lean.kernel_names["one"] == "avx2"
        outs = {}
        for native_attention in (True, False):
            lean.native_attention = native_attention
            lean.reset()
            outs[native_attention] = torch.cat([lean.forward(ids[:5])] + [lean.forward(ids[i:i + 1]) for i in range(5, 12)])
        for got in outs.values():
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(outs[True], outs[False], rtol=1e-5, atol=1e-5)
        assert not LeanForward(model, 64, kernels="legacy").native_attention  # the before/after reference


def test_native_kernels_step_aside_where_they_cannot_be_built(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setenv("SPADE_NATIVE", "0")
    assert not native.available()
    monkeypatch.delenv("SPADE_NATIVE")
    monkeypatch.setattr(native, "_MODULE", [None])  # tried before and not built: the kernels refuse, by name
    with pytest.raises(RuntimeError, match="not available on this machine"):
        native.linear_one(torch.randn(1, 4), torch.randn(2, 4))
    if not {"avx2", "fma"} <= native.cpu_flags():
        pytest.skip("not an AVX2 CPU: the build is not even tried")
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path)  # nothing built there yet, and the compiler fails

    def fail(*args, **kwargs):
        raise OSError("no compiler here")

    monkeypatch.setattr(cpp_extension, "load", fail)
    with pytest.warns(RuntimeWarning, match="could not be built .*no compiler here"):
        assert native._build() is None
