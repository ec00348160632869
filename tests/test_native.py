"""spade_lib.decoding.model.native: the kernels equal their torch formulation for every row count (products with
and without the RMSNorm prologue, gain, gate, bias and residual; attention with rotation and cache write
under the causal and a tree's ancestor mask, grouped and not, K and head-dim tails), a row's result does not
depend on the rows beside it (bit for bit), bad input is refused by name, and the kernels step aside where
they cannot be built (or fail loudly where SPADE_NATIVE_REQUIRED=1)."""

from __future__ import annotations

import functools
import os

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from spade_lib import devices, paths
from spade_lib.decoding.model import native
from spade_lib.decoding.model.lean import LeanForward

needs_native = pytest.mark.skipif(not native.available(),
                                  reason="SPADE's native kernels do not build here (no AVX2/FMA, compiler or ninja)")
# every tile shape of either build (AVX2: 4 weight rows x 1..3 input rows, a group's three tiles blocked at 7-9 rows;
# AVX-512: 4 x 1..6, and 1..3 weight rows at a block's end), balanced row groups (7 = 4 + 3, 13 = 5 + 4 + 4)
ROWS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17]


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def stored(w: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``w`` as the kernel reads it in ``dtype`` (fp32; bf16; int8 with its scale per row, zoo.narrow) and the
    exact fp32 values of that weight: ``(wq, scale or None, exact)``."""
    if dtype == torch.int8:
        from spade_lib.zoo.narrow import quantize_int8

        w8, scale = quantize_int8(w)
        return w8, scale, w8.float() * scale[:, None]
    wq = w.to(dtype)
    return wq, None, wq.float()


# bf16 and int8: a draft in half or a quarter of the bytes, each weight widened exactly (int8: a scale per row)
NARROW = [torch.float32, torch.bfloat16, torch.int8]


@needs_native
@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,k", [(1, 8), (7, 20), (70, 150), (576, 576), (1001, 37)])  # K % 32, % 16, % 8 tails; odd N
def test_linear_equals_its_torch_formulation_for_every_row_count(n, k, threads, dtype):
    g = torch.Generator().manual_seed(n + k)
    w, b, gain = torch.randn(n, k, generator=g), torch.randn(n, generator=g), torch.randn(k, generator=g)
    wq, scale, w = stored(w, dtype)  # the weights as the kernel reads them; the references multiply their exact values
    lin = functools.partial(native.linear, scale=scale)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        close = lambda got, ref: torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)  # noqa: E731
        for rows in ROWS:
            x, xx, r = (torch.randn(rows, k, generator=g), torch.randn(rows, 2 * k, generator=g),
                        torch.randn(rows, n, generator=g))
            u = F.silu(xx[:, :k]) * xx[:, k:]
            close(lin(x, wq), F.linear(x, w))
            close(lin(x, wq, b, r), r + F.linear(x, w, b))
            close(lin(x, wq, eps=1e-5), F.linear(F.rms_norm(x, (k,), None, 1e-5), w))
            close(lin(x, wq, b, eps=1e-5, gain=gain), F.linear(F.rms_norm(x, (k,), gain, 1e-5), w, b))
            close(lin(xx, wq, b, r, eps=1e-6, gated=True), r + F.linear(F.rms_norm(u, (k,), None, 1e-6), w, b))
    finally:
        torch.set_num_threads(before)


@needs_native
@pytest.mark.parametrize("dtype", NARROW)
def test_a_rows_product_does_not_depend_on_the_rows_beside_it(dtype):
    g = torch.Generator().manual_seed(3)
    (w, scale, _), b = stored(torch.randn(333, 576, generator=g), dtype), torch.randn(333, generator=g)
    for rows in ROWS:
        x, r = torch.randn(rows, 1152, generator=g), torch.randn(rows, 333, generator=g)
        block = native.linear(x, w, b, r, eps=1e-5, gated=True, scale=scale)
        for i in range(rows):
            assert torch.equal(native.linear(x[i:i + 1], w, b, r[i:i + 1], eps=1e-5, gated=True, scale=scale),
                               block[i:i + 1])


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,k", [(3, 8), (7, 20), (70, 150), (576, 576), (1001, 37)])  # N % 4 rows past the groups
def test_packed_weights_give_the_unpacked_products_bit_for_bit(n, k, threads):
    """``pack`` only moves the weights (the same shape, every value kept) and ``linear(..., packed=True)`` then
    sums each output in the unpacked order: equal results, not merely close, for every row count and option."""
    g = torch.Generator().manual_seed(n * k)
    w, b, gain = torch.randn(n, k, generator=g), torch.randn(n, generator=g), torch.randn(k, generator=g)
    p = native.pack(w)
    assert p.shape == w.shape and torch.equal(p.flatten().sort().values, w.flatten().sort().values)
    assert n < 4 or not torch.equal(p, w)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in ROWS:
            x, xx, r = (torch.randn(rows, k, generator=g), torch.randn(rows, 2 * k, generator=g),
                        torch.randn(rows, n, generator=g))
            for args, kw in (((x,), {}), ((x, b, r), {}), ((x, b), {"eps": 1e-5, "gain": gain}),
                             ((xx, b, r), {"eps": 1e-6, "gated": True})):
                assert torch.equal(native.linear(*args[:1], p, *args[1:], packed=True, **kw),
                                   native.linear(*args[:1], w, *args[1:], **kw)), (rows, kw)
    finally:
        torch.set_num_threads(before)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,k", [(7, 20), (70, 150), (576, 576), (96, 1100)])
def test_one_row_gives_the_same_products_read_one_or_four_weight_rows_a_tile(n, k, threads):
    """``short_row`` only says how one row reads row-major weights (rows shorter than it: one weight row a tile,
    else four): every output is summed in the canonical order either way, so the results are equal, not merely
    close, with every option; a negative ``short_row`` is refused by name."""
    g = torch.Generator().manual_seed(n + k)
    w, b, gain = torch.randn(n, k, generator=g), torch.randn(n, generator=g), torch.randn(k, generator=g)
    x, xx, r = torch.randn(1, k, generator=g), torch.randn(1, 2 * k, generator=g), torch.randn(1, n, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for args, kw in (((x,), {}), ((x, b, r), {}), ((x, b), {"eps": 1e-5, "gain": gain}),
                         ((xx, b, r), {"eps": 1e-6, "gated": True})):
            one, four = (native.linear(*args[:1], w, *args[1:], short_row=s, **kw) for s in (k + 1, 0))
            assert torch.equal(one, four), kw
            assert torch.equal(native.linear(*args[:1], w, *args[1:], **kw), one if k < native.SHORT_ROW else four)
    finally:
        torch.set_num_threads(before)
    with pytest.raises(RuntimeError, match="short_row: must be >= 0 floats, got -1"):
        native.linear(x, w, short_row=-1)


def test_module_weights_are_kept_until_a_parameter_changes():
    """A head's prepared weights are built once, rebuilt after an in-place edit (an optimiser step, a
    ``load_state_dict``) or a new tensor, and never kept for a module made under inference mode."""
    builds = []
    lin = torch.nn.Linear(8, 4)

    def build():
        builds.append(1)
        return {"w": lin.weight.detach().clone()}

    first = native.module_weights(lin, build)
    assert native.module_weights(lin, build) is first and len(builds) == 1
    with torch.no_grad():
        lin.weight.add_(1.0)
    again = native.module_weights(lin, build)
    assert len(builds) == 2 and torch.equal(again["w"], lin.weight.detach())
    lin.weight = torch.nn.Parameter(torch.zeros(4, 8))
    native.module_weights(lin, build)
    assert len(builds) == 3
    with torch.inference_mode():
        frozen = torch.nn.Linear(8, 4)
    native.module_weights(frozen, build)
    native.module_weights(frozen, build)
    assert len(builds) == 5 and "_native_weights" not in frozen.__dict__


def _reference_attention(qkv, kv, start, cos, sin, heads, tree_from, ancestors, window=None, qk_norm=None):
    """``(out [k, H hd], cache after)`` of the torch formulation (``window``: a token at position ``p`` sees
    cached positions ``> p - window``; ``qk_norm = (q_gain, k_gain, eps)``: heads RMS-normed before rotation)."""
    k, kv_heads, hd = qkv.shape[0], kv.shape[1], kv.shape[3]
    x = qkv.view(k, heads + 2 * kv_heads, hd)
    if qk_norm is not None:
        q_gain, k_gain, eps = qk_norm
        x = torch.cat([torch.nn.functional.rms_norm(x[:, :heads], (hd,), q_gain, eps),
                       torch.nn.functional.rms_norm(x[:, heads:heads + kv_heads], (hd,), k_gain, eps),
                       x[:, heads + kv_heads:]], dim=1)
    ref_kv = kv.clone()
    ref_kv[0, :, start:start + k] = rope(x[:, heads:heads + kv_heads], cos[:, None], sin[:, None]).transpose(0, 1)
    ref_kv[1, :, start:start + k] = x[:, heads + kv_heads:].transpose(0, 1)
    q = rope(x[:, :heads], cos[:, None], sin[:, None])
    end, grp = start + k, heads // kv_heads
    seen = torch.zeros(k, end, dtype=torch.bool)
    for i in range(k):
        if ancestors is None:
            seen[i, :start + i + 1] = True
            pos = start + i
        else:
            seen[i, :tree_from], seen[i, tree_from:] = True, ancestors[i]
            pos = tree_from - 1 + int(ancestors[i].sum())
        if window is not None:  # cached slots are positions; a tree's own rows are nearer than the window
            seen[i, :max(0, min(tree_from if ancestors is not None else end, pos - window + 1))] = False
    out = torch.empty(k, heads, hd)
    for i in range(k):
        for h in range(heads):
            s = (ref_kv[0, h // grp, :end] @ q[i, h]).masked_fill(~seen[i], float("-inf")).softmax(-1)
            out[i, h] = s @ ref_kv[1, h // grp, :end]
    return out.reshape(k, heads * hd), ref_kv


@needs_native
@pytest.mark.parametrize("heads,kv_heads,hd,start,k,tree", [
    (9, 3, 64, 200, 1, False), (4, 4, 16, 0, 1, False), (8, 2, 32, 37, 5, False), (9, 3, 64, 0, 6, False),
    (8, 2, 32, 100, 17, True), (6, 1, 256, 20, 4, True), (4, 4, 16, 9, 1, True), (4, 2, 20, 30, 9, True)])
def test_attend_rotates_writes_the_cache_and_attends_under_either_mask(heads, kv_heads, hd, start, k, tree):
    g = torch.Generator().manual_seed(heads * 100 + start + k)
    cap = 256
    qkv = torch.randn(k, (heads + 2 * kv_heads) * hd, generator=g)
    kv = torch.randn(2, kv_heads, cap, hd, generator=g)
    ang = torch.rand(k, hd // 2, generator=g) * 6
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    tree_from, ancestors = start, None
    if tree:  # earlier tree rows already cached from tree_from; each row sees itself and a random subset
        tree_from = max(0, start - 3)
        ancestors = torch.rand(k, start + k - tree_from, generator=g) < 0.5
        ancestors[torch.arange(k), start - tree_from + torch.arange(k)] = True
    ref, ref_kv = _reference_attention(qkv, kv, start, cos, sin, heads, tree_from, ancestors)
    out = native.attend(qkv, kv, start, cos, sin, heads, tree_from, ancestors)
    torch.testing.assert_close(kv, ref_kv, rtol=0, atol=1e-6)  # only the new slots changed
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@needs_native
@pytest.mark.parametrize("start,k,tree,window", [
    (40, 1, False, 16), (40, 6, False, 16), (3, 6, False, 16), (30, 5, True, 8), (12, 1, False, 13), (60, 3, True, 64)])
def test_attend_with_a_sliding_window_and_qk_norm_equals_its_torch_formulation(start, k, tree, window):
    """Gemma-3's attention: a window over the cached positions (the cut moves with each row's position, a tree
    row's being its depth) and each query and key head RMS-normed with its own gain before rotation."""
    g = torch.Generator().manual_seed(start * 10 + k)
    heads, kv_heads, hd = 4, 1, 32
    qkv = torch.randn(k, (heads + 2 * kv_heads) * hd, generator=g) * 3
    kv = torch.randn(2, kv_heads, 128, hd, generator=g)
    ang = torch.rand(k, hd // 2, generator=g) * 6
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    qk_norm = (torch.rand(hd, generator=g) + 0.5, torch.rand(hd, generator=g) + 0.5, 1e-6)
    tree_from, ancestors = start, None
    if tree:
        tree_from = start - 2
        ancestors = torch.rand(k, start + k - tree_from, generator=g) < 0.5
        ancestors[torch.arange(k), start - tree_from + torch.arange(k)] = True
    ref, ref_kv = _reference_attention(qkv, kv, start, cos, sin, heads, tree_from, ancestors, window, qk_norm)
    out = native.attend(qkv, kv, start, cos, sin, heads, tree_from, ancestors, window=window, qk_norm=qk_norm)
    torch.testing.assert_close(kv, ref_kv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    full, _ = _reference_attention(qkv, kv.clone(), start, cos, sin, heads, tree_from, ancestors, None, qk_norm)
    assert (start + k <= window) == torch.allclose(full, ref, atol=1e-5)  # the window cut something iff it should


@needs_native
@pytest.mark.parametrize("tree", [False, True])
def test_q_scale_equals_queries_scaled_before_and_leaves_the_cache_alone(tree):
    """``q_scale`` (queries of weights held in place, not folded) gives the attention of queries scaled
    before the call; keys and values are cached unscaled either way."""
    g = torch.Generator().manual_seed(11)
    heads, kv_heads, hd, start, k, s = 6, 2, 32, 20, 4, 32 ** -0.5
    qkv = torch.randn(k, (heads + 2 * kv_heads) * hd, generator=g)
    kv = torch.randn(2, kv_heads, 64, hd, generator=g)
    ang = torch.rand(k, hd // 2, generator=g) * 6
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    ancestors = None
    if tree:
        ancestors = torch.rand(k, k, generator=g) < 0.5
        ancestors[torch.arange(k), torch.arange(k)] = True
    scaled = qkv.clone()
    scaled[:, :heads * hd] *= s
    kv_a, kv_b = kv.clone(), kv.clone()
    want = native.attend(scaled, kv_a, start, cos, sin, heads, start, ancestors)
    got = native.attend(qkv, kv_b, start, cos, sin, heads, start, ancestors, q_scale=s)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(kv_a, kv_b)
    plain = native.attend(qkv, kv.clone(), start, cos, sin, heads, start, ancestors)
    assert not torch.allclose(plain, want, atol=1e-3)  # the scale changes the softmax: the test can fail


@needs_native
def test_a_causal_rows_attention_is_the_one_token_attention_bit_for_bit():
    g = torch.Generator().manual_seed(5)
    heads, kv_heads, hd, start, k = 9, 3, 64, 40, 6
    qkv = torch.randn(k, (heads + 2 * kv_heads) * hd, generator=g)
    kv = torch.randn(2, kv_heads, 128, hd, generator=g)
    ang = torch.rand(k, hd // 2, generator=g) * 6
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    alone = kv.clone()
    block = native.attend(qkv, kv, start, cos, sin, heads)
    for i in range(k):  # one token at a time, as the autoregressive loop feeds them
        one = native.attend(qkv[i:i + 1].contiguous(), alone, start + i, cos[i:i + 1].contiguous(),
                            sin[i:i + 1].contiguous(), heads)
        assert torch.equal(one[0], block[i])
    assert torch.equal(alone, kv)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("fmas", [1, 2, 7, 17, 28, 29, 32])  # one accumulator a FMA up to REGS - 4, then shared
@pytest.mark.parametrize("n", [5, 16, 1001, 70_000])  # shorter than a chunk, one chunk, a tail, many threads' blocks
def test_stream_fma_sums_every_weight_fmas_times(fmas, n, threads):
    """bench_rows' stream floor reads every weight once and executes ``fmas`` FMAs on it: its sum is
    ``fmas * sum(w^2)`` whatever the prefetch distance, thread count or tail."""
    w = torch.randn(n, generator=torch.Generator().manual_seed(n))
    want = fmas * float((w.double() ** 2).sum())
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for ahead in (0, 2048):
            assert native.stream_fma(w.view(-1, 1) if n % 2 else w, fmas, ahead) == pytest.approx(want, rel=1e-5)
    finally:
        torch.set_num_threads(old)
    with pytest.raises(RuntimeError, match="fmas: must be 1 .. 32, got 33"):
        native.stream_fma(w, 33)
    with pytest.raises(RuntimeError, match="ahead: must be >= 0 floats, got -1"):
        native.stream_fma(w, 1, -1)
    with pytest.raises(RuntimeError, match="w: must be a contiguous float32"):
        native.stream_fma(w.double(), 1)


@needs_native
def test_bad_input_is_refused_by_name():
    w = torch.randn(8, 16)
    with pytest.raises(RuntimeError, match="x: must hold rows of 16"):
        native.linear(torch.randn(1, 15), w)
    with pytest.raises(RuntimeError, match="x: must hold rows of 32"):
        native.linear(torch.randn(1, 16), w, gated=True)
    with pytest.raises(RuntimeError, match="w: must be a contiguous float32"):
        native.linear(torch.randn(1, 8), w.t())
    for bad in (w.to(torch.bfloat16).t(), w.to(torch.bfloat16)):  # bf16: row-major and contiguous, never packed
        with pytest.raises(RuntimeError, match="w: bfloat16 weights must be a contiguous row-major \\(not packed\\)"):
            native.linear(torch.randn(1, bad.shape[1]), bad, packed=bad.is_contiguous())
    w8, scale = w.to(torch.int8), torch.ones(8)
    with pytest.raises(RuntimeError, match="w: int8 weights must be a contiguous row-major \\(not packed\\)"):
        native.linear(torch.randn(1, 16), w8, packed=True, scale=scale)
    for weights, sc in ((w8, None), (w, scale)):  # int8 takes its scales, fp32 none
        with pytest.raises(RuntimeError, match="scale: int8 weights take one fp32 scale per weight row"):
            native.linear(torch.randn(1, 16), weights, scale=sc)
    with pytest.raises(RuntimeError, match="scale: must hold 8 values \\(one per weight row\\), got 7"):
        native.linear(torch.randn(1, 16), w8, scale=torch.ones(7))
    with pytest.raises(RuntimeError, match="scale: must be a contiguous float32"):
        native.linear(torch.randn(1, 16), w8, scale=torch.ones(8, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="residual: must hold 2 x 8"):
        native.linear(torch.randn(2, 16), w, residual=torch.randn(1, 8))
    with pytest.raises(RuntimeError, match="gain: must hold 16"):
        native.linear(torch.randn(2, 16), w, eps=1e-5, gain=torch.randn(15))
    with pytest.raises(RuntimeError, match="x: must be a contiguous float32"):
        native.linear(torch.randn(1, 16, dtype=torch.float64), w)
    with pytest.raises(RuntimeError, match="w: must be \\[N, K\\], got 1 dims"):
        native.pack(torch.randn(16))
    with pytest.raises(RuntimeError, match="w: must be a contiguous float32"):
        native.pack(w.t())
    kv = torch.zeros(2, 2, 8, 4)
    with pytest.raises(RuntimeError, match="must fit the capacity 8"):
        native.attend(torch.zeros(2, 6 * 4), kv, 7, torch.ones(2, 4), torch.zeros(2, 4), 2)
    with pytest.raises(RuntimeError, match="qkv: must hold rows of"):
        native.attend(torch.zeros(5 * 4), kv, 0, torch.ones(1, 4), torch.zeros(1, 4), 2)
    with pytest.raises(RuntimeError, match="cos, sin: must hold 2 x head_dim"):
        native.attend(torch.zeros(2, 6 * 4), kv, 0, torch.ones(1, 4), torch.zeros(1, 4), 2)
    with pytest.raises(RuntimeError, match="q_gain, k_gain: must hold head_dim = 4"):
        native.attend(torch.zeros(1, 6 * 4), kv, 0, torch.ones(1, 4), torch.zeros(1, 4), 2,
                      qk_norm=(torch.ones(3), torch.ones(3), 1e-6))
    with pytest.raises(ValueError, match="window: must be >= 1"):
        native.attend(torch.zeros(1, 6 * 4), kv, 0, torch.ones(1, 4), torch.zeros(1, 4), 2, window=0)
    with pytest.raises(RuntimeError, match="tree_from: the tree's 3 rows must end at slot 4"):
        native.attend(torch.zeros(2, 6 * 4), kv, 2, torch.ones(2, 4), torch.zeros(2, 4), 2, 0,
                      torch.ones(2, 3, dtype=torch.bool))


def _tiny(heads=4, kv_heads=2):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=heads, num_key_value_heads=kv_heads,
                                        max_position_embeddings=64, initializer_range=0.2)).eval()


@needs_native
@pytest.mark.parametrize("kv_heads", [2, 4])  # grouped-query and multi-head attention
def test_the_lean_forward_on_native_kernels_equals_hf_and_its_blocks_equal_its_single_steps(kv_heads):
    model = _tiny(kv_heads=kv_heads)
    ids = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = model(ids[None], use_cache=False).logits[0]
        lean = LeanForward(model, 64, kernels="native")
        assert lean.native_attention and lean.kernel_names == {"one": "native", "many": "native"}
        steps = torch.cat([lean.forward(ids[:1])] + [lean.forward(ids[i:i + 1]) for i in range(1, 12)])
        torch.testing.assert_close(steps, ref, rtol=1e-4, atol=1e-4)
        lean.reset()
        block = torch.cat([lean.forward(ids[:5]), lean.forward(ids[5:9]), lean.forward(ids[9:])])
        assert torch.equal(block, steps)  # verification sees exactly the autoregressive loop's logits
        lean.reset()
        lean.forward(ids[:5])
        lean.native_attention = False  # the torch formulation of the same forward, on the same cache
        torch.testing.assert_close(lean.forward(ids[5:9]), ref[5:9], rtol=1e-4, atol=1e-4)
        assert not LeanForward(model, 64, kernels="legacy").native_attention  # the before/after reference


@needs_native
def test_a_tree_on_native_kernels_scores_each_path_as_the_chain_would():
    model = _tiny()
    g = torch.Generator().manual_seed(2)
    prefix, tree = torch.randint(0, 96, (6,), generator=g), torch.randint(0, 96, (5,), generator=g)
    parents = [-1, 0, 0, 1, 2]  # node i's parent; its path is the chain of its ancestors
    anc = torch.zeros(5, 5, dtype=torch.bool)
    for i, p in enumerate(parents):
        anc[i, i] = True
        while p >= 0:
            anc[i, p], p = True, parents[p]
    with torch.inference_mode():
        lean = LeanForward(model, 64, kernels="native")
        lean.forward(prefix)
        got = lean.forward(tree, ancestors=anc)
        hidden = lean.forward(tree[:1], hidden_layers=(2,))  # after the tree; only checks the call works
        assert hidden[0].shape == (1, 96) and hidden[1][2].shape == (1, 32)
        for i in range(5):
            path = [j for j in range(5) if anc[i, j]]
            lean.rollback(6)
            chain = lean.forward(tree[path])
            assert torch.equal(chain[-1], got[i])  # bit for bit: the tree's row is its path's last row


def test_native_kernels_step_aside_where_they_cannot_be_built(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setenv("SPADE_NATIVE", "0")
    assert not native.available()
    monkeypatch.delenv("SPADE_NATIVE")
    monkeypatch.setattr(native, "_MODULE", [None])  # tried before and not built: the kernels refuse, by name
    with pytest.raises(RuntimeError, match="not available on this machine"):
        native.linear(torch.randn(1, 4), torch.randn(2, 4))
    if not {"avx2", "fma"} <= devices.cpu().flags:
        pytest.skip("not an AVX2 CPU: the build is not even tried")
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path)  # nothing built there yet, and the compiler fails

    def fail(*args, **kwargs):
        raise OSError("no compiler here")

    monkeypatch.setattr(cpp_extension, "load", fail)
    monkeypatch.setenv("SPADE_NATIVE_REQUIRED", "0")
    with pytest.warns(RuntimeWarning, match="could not be built .*no compiler here"):
        assert native._build() is None
    monkeypatch.setenv("SPADE_NATIVE_REQUIRED", "1")  # make test sets it: a broken build fails the tests
    with pytest.raises(RuntimeError, match="SPADE_NATIVE_REQUIRED=1"):
        native._build()


@pytest.mark.skipif(not {"avx2", "fma"} <= devices.cpu().flags, reason="not an AVX2/FMA CPU: nothing to build")
def test_the_native_kernels_build_on_an_avx2_machine():
    """Where the CPU has AVX2 and FMA a failed build is a defect, not a skip (the tests above would all skip)."""
    assert native.available(), "SPADE's native kernels did not build on an AVX2/FMA machine"


def test_the_products_are_built_for_avx512_where_the_cpu_has_it(monkeypatch):
    """``isa()`` follows the CPU's flags unless ``SPADE_NATIVE_ISA`` asks for the other build; a bad request is
    refused by name; the two builds are cached apart (their keys differ)."""
    monkeypatch.delenv("SPADE_NATIVE_ISA", raising=False)
    monkeypatch.setattr(devices, "cpu", lambda: devices.CpuInfo("test", flags=frozenset({"avx2", "fma", "avx512f"})))
    assert native.isa() == "avx512"
    wide = native._key()
    monkeypatch.setenv("SPADE_NATIVE_ISA", "avx2")
    assert native.isa() == "avx2" and native._key() != wide
    monkeypatch.setenv("SPADE_NATIVE_ISA", "sse")
    with pytest.raises(ValueError, match="SPADE_NATIVE_ISA: must be one of"):
        native.isa()
    monkeypatch.setattr(devices, "cpu", lambda: devices.CpuInfo("test", flags=frozenset({"avx2", "fma"})))
    monkeypatch.delenv("SPADE_NATIVE_ISA")
    assert native.isa() == "avx2"
    monkeypatch.setenv("SPADE_NATIVE_ISA", "avx512")
    with pytest.raises(ValueError, match="SPADE_NATIVE_ISA: 'avx512' asked for on a CPU without AVX-512F"):
        native.isa()


_OTHER_BUILD = """
import torch
from spade_lib.decoding.model import native
assert native.available() and native.isa() == "avx2", native.isa()
g = torch.Generator().manual_seed(11)
w, b, x = torch.randn(333, 150, generator=g), torch.randn(333, generator=g), torch.randn(13, 300, generator=g)
block = native.linear(x, w, b, eps=1e-5, gated=True)
assert all(torch.equal(native.linear(x[i:i + 1], w, b, eps=1e-5, gated=True), block[i:i + 1]) for i in range(13))
assert torch.equal(native.linear(x, native.pack(w), b, eps=1e-5, gated=True, packed=True), block)
torch.save(block, {out!r})
"""


@needs_native
@pytest.mark.slow
@pytest.mark.skipif("avx512f" not in devices.cpu().flags, reason="no AVX-512 here: the AVX2 build is the only one")
@pytest.mark.skipif(os.environ.get("SPADE_NATIVE_ISA", "auto") != "auto", reason="SPADE_NATIVE_ISA chose this process's build")
def test_on_an_avx512_cpu_the_avx2_build_runs_too_and_agrees(tmp_path):
    """The AVX2 build (``SPADE_NATIVE_ISA=avx2``, a subprocess: one build a process) keeps its rows independent
    of the rows beside them and equals this process's AVX-512 products to fp32 summation order."""
    import subprocess
    import sys

    out = tmp_path / "avx2.pt"
    env = {**os.environ, "SPADE_NATIVE_ISA": "avx2", "SPADE_NATIVE_REQUIRED": "1"}
    subprocess.run([sys.executable, "-c", _OTHER_BUILD.format(out=str(out))], env=env, check=True, timeout=600)
    assert native.isa() == "avx512"
    g = torch.Generator().manual_seed(11)
    w, b, x = torch.randn(333, 150, generator=g), torch.randn(333, generator=g), torch.randn(13, 300, generator=g)
    torch.testing.assert_close(torch.load(out), native.linear(x, w, b, eps=1e-5, gated=True), rtol=1e-5, atol=1e-5)
