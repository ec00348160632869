"""The lean forward for B sequences (spade_lib.decoding.model.lean_batch) against the Hugging Face batched forward
(BatchLM): the same logits on left-padded prompts and on decode steps, for a Llama and a Gemma-3 with sliding
windows and a Qwen2 with q/k/v biases and an untied head, and a Qwen2 draft held in bf16 / int8 through a prefill
beyond BIG_ROWS; batched greedy AR on it equals single-sequence decoding row by row."""

from __future__ import annotations

import pytest
import torch

from spade_lib.decoding.batch import BatchLM, left_pad
from spade_lib.decoding.decode import AutoregressiveDecoder
from spade_lib.decoding.model.adapter import CausalLMAdapter
from spade_lib.decoding.model.lean_batch import LeanBatch
from spade_lib.sampling import SamplingConfig
from tests.test_decode import llama
from tests.test_zoo_gemma3 import lively_gemma3


def lively_qwen2(seed: int = 0):
    """A tiny Qwen2 as the Qwen2.5-Coder pair's models are built: biases on q/k/v (random here: a zero bias tests
    nothing), an untied LM head, grouped-query attention (4 query heads over 2 KV heads), RoPE base 1e6."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         rope_theta=1e6, tie_word_embeddings=False, initializer_range=0.2,
                                         use_sliding_window=False)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.copy_(torch.randn(proj.bias.shape, generator=g) * 0.5)
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    return model


def _prompts(vocab: int, lengths=(5, 1, 12, 8)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab - 4, (n,), generator=g) for n in lengths]


@pytest.mark.parametrize("in_place", [False, True], ids=["packed", "in_place"])
@pytest.mark.parametrize("make", [lambda: llama(layers=2), lambda: lively_gemma3(0), lambda: lively_qwen2(0)],
                         ids=["llama", "gemma3", "qwen2"])
def test_logits_equal_the_hf_batched_forward_on_padded_prompts_and_steps(make, in_place, monkeypatch):
    """Packed copies (a small model's default) or the module's own tensors (``SPADE_WEIGHTS_ONCE=1``, a large
    model's default): the batch on the lean weights gives the Hugging Face batched forward's logits."""
    monkeypatch.setenv("SPADE_WEIGHTS_ONCE", "1" if in_place else "0")
    model = make()
    adapter = CausalLMAdapter(model, max_length=64)
    assert adapter.lean is not None and adapter.lean.in_place == in_place
    prompts = _prompts(int(model.config.vocab_size))
    ids, valid = left_pad(prompts, adapter.device)
    hf, lean = BatchLM(CausalLMAdapter(model, max_length=64, backend="hf"), len(prompts), "t"), \
        LeanBatch(adapter.lean, len(prompts))
    a, b = hf.forward(ids, valid, keep=0), lean.forward(ids, valid, keep=0)
    assert b.shape == a.shape
    assert torch.allclose(a[valid], b[valid], atol=1e-4, rtol=1e-4)  # the pads' rows are nobody's logits
    g = torch.Generator().manual_seed(1)
    for step in range(20):  # past the Gemma window (8): sliding layers drop the oldest positions
        nxt = torch.randint(0, int(model.config.vocab_size) - 4, (len(prompts), 1), generator=g)
        ones = torch.ones_like(nxt, dtype=torch.bool)
        a, b = hf.forward(nxt, ones, keep=1), lean.forward(nxt, ones, keep=1)
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), step
        if step == 10:  # rows leave the batch
            hf.select(torch.tensor([0, 2, 3])), lean.select([0, 2, 3])
            prompts = prompts[:1] + prompts[2:]
    assert lean.length.tolist() == [int(p.numel()) + 20 for p in prompts]


@pytest.mark.parametrize("in_place", [False, True], ids=["packed", "in_place"])
@pytest.mark.parametrize("make", [lambda: lively_gemma3(1), lambda: lively_qwen2(1)], ids=["gemma3", "qwen2"])
def test_batched_greedy_on_the_lean_weights_equals_single_decoding(make, in_place, monkeypatch):
    """Three ragged rows and a fourth (lengths 5, 1, 12, 8) decoded as one batch equal each row decoded alone,
    on packed copies and in place (the batch runs :class:`LeanBatch` either way, not the Hugging Face batch)."""
    monkeypatch.setenv("SPADE_WEIGHTS_ONCE", "1" if in_place else "0")
    model = make()
    dec = AutoregressiveDecoder(CausalLMAdapter(model, max_length=64), sampling=SamplingConfig(temperature=0),
                                eos_token_id=[])
    assert dec.target.lean is not None and dec.target.lean.in_place == in_place
    ran, forward = [], LeanBatch.forward
    monkeypatch.setattr(LeanBatch, "forward", lambda self, *a, **k: ran.append(1) or forward(self, *a, **k))
    prompts = [p.tolist() for p in _prompts(int(model.config.vocab_size))]
    batch = dec.generate_batch(prompts, 16, seed=0)
    assert ran  # the batch ran on the lean weights
    for r, p in zip(batch, prompts):
        assert r.tokens == dec.generate(p, 16, seed=0).tokens


def test_bad_input_is_refused():
    adapter = CausalLMAdapter(llama(layers=1), max_length=16)
    with pytest.raises(TypeError, match="lean"):
        LeanBatch(object(), 2)
    with pytest.raises(ValueError, match="n_rows"):
        LeanBatch(adapter.lean, 0)
    lb = LeanBatch(adapter.lean, 2)
    with pytest.raises(ValueError, match="ids, valid"):
        lb.forward(torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1, dtype=torch.bool), keep=1)
    with pytest.raises(ValueError, match="context limit"):
        lb.forward(torch.zeros(2, 17, dtype=torch.long), torch.ones(2, 17, dtype=torch.bool), keep=1)


def test_truncate_forgets_the_last_slots_as_if_they_never_ran():
    """LeanBatch.truncate (the batch study's rollback of a timed AR step): a step after truncating equals the same
    step on a batch that never took the forgotten one; bad slot counts are refused by name."""
    adapter = CausalLMAdapter(lively_qwen2(2), max_length=64)
    prompts = _prompts(96, (4, 2, 6))
    ids, valid = left_pad(prompts, adapter.device)
    a, b = LeanBatch(adapter.lean, 3), LeanBatch(adapter.lean, 3)
    a.forward(ids, valid, keep=1), b.forward(ids, valid, keep=1)
    s0, length = a.slots, a.length.clone()
    nxt = torch.tensor([[5], [6], [7]])
    ones = torch.ones_like(nxt, dtype=torch.bool)
    a.forward(torch.tensor([[9], [9], [9]]), ones, keep=1)
    a.truncate(s0)
    assert a.slots == s0 and torch.equal(a.length, length)
    torch.testing.assert_close(a.forward(nxt, ones, keep=1), b.forward(nxt, ones, keep=1))
    with pytest.raises(ValueError, match="slots"):
        a.truncate(a.slots + 1)


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_a_narrow_draft_batches_prefills_beyond_big_rows_on_its_bulk_kernel(fmt):
    """A draft held in bf16 / int8 (:mod:`spade_lib.zoo.narrow`) in a batch: a prefill block of more than ``BIG_ROWS``
    rows runs on the in-place forward's bulk kernel (the weights widened, int8 scaled), not on ``F.linear`` over the
    raw narrow weights; its logits are the HF batched forward's, and so are the steps after it."""
    from spade_lib.decoding.model import native
    from spade_lib.decoding.model.lean_batch import BIG_ROWS
    from spade_lib.zoo.narrow import narrow_twin

    if not native.available():
        pytest.skip("SPADE's native kernels do not build here: narrow weights run on the HF forward")
    twin = narrow_twin(lively_qwen2(2), fmt)
    adapter = CausalLMAdapter(twin, max_length=64)
    assert adapter.lean is not None and adapter.lean.in_place
    prompts = _prompts(int(twin.config.vocab_size), lengths=(20, 30, 25))
    ids, valid = left_pad(prompts, adapter.device)
    assert ids.numel() > BIG_ROWS
    hf, lean = BatchLM(CausalLMAdapter(twin, max_length=64, backend="hf"), len(prompts), "t"), \
        LeanBatch(adapter.lean, len(prompts))
    a, b = hf.forward(ids, valid, keep=0), lean.forward(ids, valid, keep=0)
    assert torch.allclose(a[valid], b[valid], atol=1e-4, rtol=1e-4)
    nxt = torch.tensor([[3], [5], [7]])
    ones = torch.ones_like(nxt, dtype=torch.bool)
    assert torch.allclose(hf.forward(nxt, ones, keep=1), lean.forward(nxt, ones, keep=1), atol=1e-4, rtol=1e-4)
