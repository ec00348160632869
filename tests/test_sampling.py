"""Sampling warpers: validated config, HF's warpers as the reference, greedy, shapes and dtypes."""

from __future__ import annotations

import math

import pytest
import torch

from spade_lib.sampling import SamplingConfig, adjust, adjust_logits


def hf_reference(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """transformers' own warpers, in the same order (temperature, top-k, top-p)."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    z = logits.clone()
    ids = torch.zeros(z.shape[0], 1, dtype=torch.long)
    if cfg.temperature != 1.0:
        z = TemperatureLogitsWarper(cfg.temperature)(ids, z)
    if cfg.top_k:
        z = TopKLogitsWarper(cfg.top_k)(ids, z)
    if cfg.top_p < 1.0:
        z = TopPLogitsWarper(cfg.top_p)(ids, z)
    return z.softmax(-1)


CONFIGS = [
    SamplingConfig(),
    SamplingConfig(temperature=0.7),
    SamplingConfig(temperature=1.6, top_k=5),
    SamplingConfig(top_p=0.9),
    SamplingConfig(temperature=0.8, top_k=20, top_p=0.85),
    SamplingConfig(temperature=1.2, top_k=3, top_p=0.5),
    SamplingConfig(top_k=100),  # larger than the vocabulary: no-op
]


@pytest.mark.slow  # imports transformers (several seconds on 2 shared cores)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_matches_hf_warpers(cfg):
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(64, 50, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(adjust(logits, cfg, torch.float64), hf_reference(logits, cfg),
                               atol=1e-12, rtol=0)


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    torch.testing.assert_close(adjust(logits, SamplingConfig(temperature=0.5), torch.float64),
                               (logits / 0.5).softmax(-1))


def test_top_k_keeps_k_largest_and_ties():
    logits = torch.tensor([[0.1, 3.0, 2.0, 2.0, -1.0]])
    probs = adjust(logits, SamplingConfig(top_k=2))
    assert (probs > 0).tolist() == [[False, True, True, True, False]]  # the tie at the k-th value stays
    assert (adjust(logits, SamplingConfig(top_k=1)) > 0).sum() == 1


def test_top_p_keeps_smallest_set_reaching_mass():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64)
    logits = probs.log()
    kept = lambda top_p: (adjust(logits, SamplingConfig(top_p=top_p), torch.float64) > 0).sum().item()
    assert [kept(t) for t in (0.3, 0.49, 0.51, 0.79, 0.81, 0.96, 1.0)] == [1, 1, 2, 2, 3, 4, 4]
    torch.testing.assert_close(adjust(logits, SamplingConfig(top_p=0.7), torch.float64),
                               torch.tensor([[0.625, 0.375, 0.0, 0.0]], dtype=torch.float64))


def test_top_p_ties_prefer_lower_index():
    logits = torch.zeros(1, 4)
    probs = adjust(logits, SamplingConfig(top_p=0.5))
    assert probs.tolist() == [[0.5, 0.5, 0.0, 0.0]]


def test_greedy_is_one_hot_argmax_lowest_index():
    logits = torch.tensor([[1.0, 5.0, 5.0, 2.0], [0.0, -1.0, 0.0, 0.0]])
    probs = adjust(logits, SamplingConfig(temperature=0.0, top_k=3, top_p=0.5))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    assert SamplingConfig(temperature=0).greedy and not SamplingConfig().greedy
    warped = adjust_logits(logits, SamplingConfig(temperature=0))
    assert torch.equal(warped.softmax(-1), probs)


def test_leading_shapes_dtypes_and_masked_logits():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 4, 17, generator=gen)
    logits[..., 0] = -math.inf  # a caller's mask survives
    cfg = SamplingConfig(temperature=0.9, top_k=7, top_p=0.9)
    p32 = adjust(logits, cfg)
    p64 = adjust(logits, cfg, torch.float64)
    assert p32.shape == logits.shape and p32.dtype == torch.float32 and p64.dtype == torch.float64
    torch.testing.assert_close(p64.sum(-1), torch.ones(2, 3, 4, dtype=torch.float64))
    assert (p64[..., 0] == 0).all()
    assert ((p64 > 0).sum(-1) <= 7).all()
    torch.testing.assert_close(p32.double(), p64, atol=1e-6, rtol=0)
    flat = adjust(logits.reshape(-1, 17), cfg, torch.float64).reshape(logits.shape)
    assert torch.equal(flat, p64)  # rows are independent


def test_bfloat16_logits_are_computed_in_float32():
    logits = torch.randn(4, 9).to(torch.bfloat16)
    probs = adjust(logits, SamplingConfig(temperature=0.7))
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, (logits.float() / 0.7).softmax(-1))


@pytest.mark.parametrize("kwargs,match", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_logits_validation():
    cfg = SamplingConfig()
    with pytest.raises(ValueError, match="NaN"):
        adjust(torch.tensor([[0.0, math.nan]]), cfg)
    with pytest.raises(ValueError, match=r"\+inf"):
        adjust(torch.tensor([[0.0, math.inf]]), cfg)
    with pytest.raises(ValueError, match="-inf everywhere"):
        adjust(torch.full((2, 3), -math.inf), cfg)
    with pytest.raises(TypeError, match=r"^logits: must be a floating-point tensor, got torch.int64$"):
        adjust(torch.tensor([[1, 2]]), cfg)
    for dtype in (torch.int32, torch.bool, torch.uint8):
        for c in (cfg, SamplingConfig(temperature=0), SamplingConfig(top_k=1, top_p=0.5)):
            with pytest.raises(ValueError, match=rf"^logits: must be a floating-point tensor, got {dtype}$"):
                adjust(torch.ones(1, 3, dtype=dtype), c)
            with pytest.raises(ValueError, match=r"^logits: .*floating-point"):
                adjust_logits(torch.ones(1, 3, dtype=dtype), c)
    with pytest.raises(TypeError, match=r"^logits: must be a torch.Tensor"):
        adjust([[0.0, 1.0]], cfg)
    with pytest.raises(ValueError, match="config"):
        adjust(torch.zeros(1, 2), {"temperature": 1.0})
    with pytest.raises(ValueError, match="NaN"):
        adjust(torch.tensor([[0.0, math.nan]]), SamplingConfig(temperature=0))


@pytest.mark.parametrize("config", [SamplingConfig(temperature=0), SamplingConfig(temperature=0.7, top_k=3)],
                         ids=["greedy", "sampled"])
def test_dtype_must_be_a_floating_point_torch_dtype(config):
    """Issue 57: ``adjust(..., dtype=torch.int64)`` at T = 0 returned an integer "probability" tensor (and at
    T > 0 a softmax in an integer dtype): the dtype is checked wherever it is taken, validate=False too."""
    logits = torch.randn(2, 6)
    for fn in (adjust, adjust_logits):
        for validate in (True, False):
            with pytest.raises(TypeError, match=r"dtype: must be a floating-point torch.dtype .*torch.int64"):
                fn(logits, config, dtype=torch.int64, validate=validate)
            with pytest.raises(TypeError, match="dtype: must be a torch.dtype, got 'float32'"):
                fn(logits, config, dtype="float32", validate=validate)
    assert adjust(logits, config, dtype=torch.float64).dtype == torch.float64
