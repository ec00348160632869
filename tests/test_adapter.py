"""The cache-safe adapter: extend/rollback leave exactly the states of a fresh prefill, on several
architecture families; clear errors for uncroppable caches, context overruns and bad arguments."""

import pytest
import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MambaConfig,
                          MambaForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from spade_lib.decoding.adapter import CausalLMAdapter, as_token_tensor, context_limit

V = 96


def llama(dtype=torch.float32):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        initializer_range=0.2)).to(dtype).eval()


def gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                      bos_token_id=0, eos_token_id=0, initializer_range=0.2)).eval()


def qwen2():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        initializer_range=0.2)).eval()


FAMILIES = {"llama": llama, "gpt2": gpt2, "qwen2": qwen2}
LEAN = {"llama", "qwen2"}  # families the lean forward covers


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model(request):
    return FAMILIES[request.param]()


@pytest.fixture(params=["auto", "hf"])
def backend(request):
    return request.param


def full_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_random_extend_rollback_sequence_matches_fresh_prefill(model, backend):
    """Any interleaving of extends and rollbacks gives the logits of a cache-free forward on the kept text,
    through the Hugging Face forward and (auto, where covered) the lean one."""
    rng = torch.Generator().manual_seed(1)
    a = CausalLMAdapter(model, backend=backend)
    assert a.backend == ("lean" if backend == "auto" and type(model).__name__.lower().startswith(tuple(LEAN))
                         else "hf")
    kept: list[int] = []
    for _ in range(12):
        k = int(torch.randint(1, 6, (1,), generator=rng))
        new = torch.randint(0, V, (k,), generator=rng).tolist()
        logits = a.extend(torch.tensor(new))
        kept += new
        assert logits.shape == (k, V) and a.length == len(kept)
        torch.testing.assert_close(logits, full_logits(model, kept)[-k:], rtol=1e-4, atol=1e-5)
        drop = int(torch.randint(0, k + 1, (1,), generator=rng))  # reject a suffix of what was just fed
        a.rollback(len(kept) - drop)
        kept = kept[:len(kept) - drop]
        assert a.length == len(kept) == (a.lean.length if a.lean is not None else a.cache.get_seq_length())


def test_backend_choice():
    assert CausalLMAdapter(gpt2()).backend == "hf"
    assert CausalLMAdapter(llama(), backend="lean").backend == "lean"
    with pytest.raises(ValueError, match="backend"):
        CausalLMAdapter(gpt2(), backend="lean")
    with pytest.raises(ValueError, match="backend"):
        CausalLMAdapter(llama(), backend="fast")


def test_lean_buffers_grow_and_respect_the_context_limit():
    """The lean KV buffers start small and double; feeding past the limit is refused."""
    from spade_lib.decoding.lean import LeanForward

    m = llama()
    lean = LeanForward(m, 64)
    lean._alloc(4)  # force growth during the sequence
    ids = torch.randint(0, V, (40,), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        got = torch.cat([lean.forward(ids[i:i + 3]) for i in range(0, 39, 3)] + [lean.forward(ids[39:])])
    torch.testing.assert_close(got, full_logits(m, ids.tolist()), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="context limit"), torch.inference_mode():
        lean.forward(torch.zeros(25, dtype=torch.long))


def test_sliding_window_cache_rolls_back_past_the_window():
    """Sliding-window layers keep their past (``activate_past_recording``) so a crop can undo a step."""
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     use_sliding_window=True, sliding_window=6, max_window_layers=0)).eval()
    a = CausalLMAdapter(m)
    assert all(layer.is_sliding for layer in a.cache.layers)
    ids = torch.randint(0, V, (30,), generator=torch.Generator().manual_seed(0)).tolist()
    full = full_logits(m, ids)
    a.extend(torch.tensor(ids[:10]))
    a.extend(torch.tensor(ids[10:15]))
    a.rollback(12)
    torch.testing.assert_close(a.extend(torch.tensor(ids[12:20])), full[12:20], rtol=1e-4, atol=1e-5)
    a.rollback(17)
    torch.testing.assert_close(a.extend(torch.tensor(ids[17:])), full[17:], rtol=1e-4, atol=1e-5)


def test_prefill_resets_and_returns_last_logits(model):
    a = CausalLMAdapter(model)
    a.extend(torch.tensor([1, 2, 3]))
    last = a.prefill(torch.tensor([4, 5, 6, 7]))
    assert a.length == 4 and last.shape == (V,)
    torch.testing.assert_close(last, full_logits(model, [4, 5, 6, 7])[-1], rtol=1e-4, atol=1e-5)
    only = a.extend(torch.tensor([8, 9]), last_only=True)
    torch.testing.assert_close(only[0], full_logits(model, [4, 5, 6, 7, 8, 9])[-1], rtol=1e-4, atol=1e-5)


def test_context_limit(model):
    a = CausalLMAdapter(model)
    assert a.max_length == context_limit(model) == 64
    a.extend(torch.zeros(64, dtype=torch.long))  # exactly at the limit
    with pytest.raises(ValueError, match="context limit"):
        a.extend(torch.zeros(1, dtype=torch.long))
    b = CausalLMAdapter(model, max_length=8)
    assert b.max_length == 8
    with pytest.raises(ValueError, match="context limit"):
        b.extend(torch.zeros(9, dtype=torch.long))


def test_bad_arguments(model):
    a = CausalLMAdapter(model)
    a.extend(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="length"):
        a.rollback(4)
    with pytest.raises(ValueError, match="length"):
        a.rollback(-1)
    with pytest.raises(ValueError, match="ids"):
        a.extend(torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="max_length"):
        CausalLMAdapter(model, max_length=0)


def test_refuses_a_model_whose_cache_cannot_be_cropped():
    torch.manual_seed(0)
    mamba = MambaForCausalLM(MambaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, state_size=4)).eval()
    with pytest.raises(ValueError, match="cannot be cropped"):
        CausalLMAdapter(mamba)


def test_refuses_a_model_without_a_cache_argument():
    class NoCache(torch.nn.Module):
        config = LlamaConfig()

        def forward(self, input_ids):
            return input_ids

    with pytest.raises(ValueError, match="KV cache"):
        CausalLMAdapter(NoCache())
    with pytest.raises(ValueError, match="model"):
        CausalLMAdapter(object())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["hf", "lean"])
def test_half_precision(dtype, backend):
    m = llama(dtype)
    a = CausalLMAdapter(m, backend=backend)
    assert a.dtype == dtype and a.device == torch.device("cpu")
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    a.extend(torch.tensor(ids[:5]))
    a.extend(torch.tensor(ids[5:]))
    a.rollback(6)
    logits = a.extend(torch.tensor(ids[6:]))
    assert logits.dtype == dtype
    ref = full_logits(m, ids)[-2:]
    assert (logits.float() - ref.float()).abs().max() < 0.1  # same text, rounding-level differences only


def test_as_token_tensor():
    assert as_token_tensor([1, 2], "cpu").tolist() == [1, 2]
    assert as_token_tensor(torch.tensor([[1, 2]]), "cpu").tolist() == [1, 2]
    assert as_token_tensor(torch.tensor([1, 2], dtype=torch.int32), "cpu").dtype == torch.long
    with pytest.raises(ValueError, match="batch size"):
        as_token_tensor(torch.zeros(2, 3, dtype=torch.long), "cpu")
    with pytest.raises(ValueError, match="integers"):
        as_token_tensor(torch.zeros(3), "cpu")
    with pytest.raises(ValueError, match="prompt_ids"):
        as_token_tensor(5, "cpu")


def test_lean_forward_covers_the_frspec_draft_and_matches_its_hf_forward():
    from spade_lib.zoo.frspec import FRSpecLlamaConfig, FRSpecLlamaForCausalLM

    torch.manual_seed(0)
    cfg = FRSpecLlamaConfig(head_vocab=24, vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                            initializer_range=0.2)
    model = FRSpecLlamaForCausalLM(cfg).eval()
    model.set_head_tokens(torch.randperm(V)[:24])
    lean, hf = CausalLMAdapter(model), CausalLMAdapter(model, backend="hf")
    assert lean.backend == "lean" and hf.backend == "hf"
    ids = torch.randint(0, V, (9,), generator=torch.Generator().manual_seed(1))
    for a in (lean, hf):
        a.prefill(ids[:5])
    got, ref = lean.extend(ids[5:]), hf.extend(ids[5:])
    assert got.shape == ref.shape == (4, V)
    assert torch.equal(torch.isfinite(got), torch.isfinite(ref)) and int(torch.isfinite(got[0]).sum()) == 24
    torch.testing.assert_close(got[torch.isfinite(got)], ref[torch.isfinite(ref)], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(lean.extend(ids[:1], last_only=True), hf.extend(ids[:1], last_only=True),
                               rtol=1e-4, atol=1e-4)
