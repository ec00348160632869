"""The cache-safe adapter: extend/rollback leave exactly the states of a fresh prefill, on several
architecture families; clear errors for uncroppable caches, context overruns and bad arguments."""

import pytest
import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MambaConfig,
                          MambaForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from spade_lib.decoding.model.adapter import CausalLMAdapter, as_token_tensor, context_limit

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
    from spade_lib.decoding.model.lean import LeanForward

    m = llama()
    lean = LeanForward(m, 64)
    lean._alloc(4)  # force growth during the sequence
    ids = torch.randint(0, V, (40,), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        got = torch.cat([lean.forward(ids[i:i + 3]) for i in range(0, 39, 3)] + [lean.forward(ids[39:])])
    torch.testing.assert_close(got, full_logits(m, ids.tolist()), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="context limit"), torch.inference_mode():
        lean.forward(torch.zeros(25, dtype=torch.long))


def test_lean_weight_bytes_count_each_product_and_the_head_never_the_embedding_table():
    """What a decoding step streams: the projections (with biases and int8 scales) and the LM head, each once;
    the embedding table only where it is the (tied) head; norms and rotary buffers never."""
    from spade_lib.decoding.model.lean import LeanForward
    from spade_lib.zoo.narrow import narrow_twin

    def expected(m):
        named = dict(m.named_parameters(remove_duplicate=True)) | dict(m.named_buffers())
        keep = [t for n, t in named.items() if "_proj." in n or n.startswith("lm_head.")
                or (n == "model.embed_tokens.weight" and m.config.tie_word_embeddings)]
        return sum(t.numel() * t.element_size() for t in keep)

    untied = qwen2()  # q/k/v biases, an untied head
    torch.manual_seed(0)
    tied = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)).eval()
    int8 = narrow_twin(untied, "int8")  # int8 matrices, one fp32 scale a row
    embed = V * 32 * 4
    for m in (untied, tied, int8):
        got = LeanForward(m, 32).weight_bytes()
        assert got == expected(m), type(m).__name__
    assert LeanForward(untied, 32).weight_bytes() < sum(p.numel() * 4 for p in untied.parameters()) - embed + 1
    assert LeanForward(tied, 32).weight_bytes() > embed  # the tied table is read as the head
    assert LeanForward(int8, 32).weight_bytes() < LeanForward(untied, 32).weight_bytes() / 2


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


# ---------------------------------------------------------------------------------------------
# trees, keep, hidden states


TREE_BACKENDS = ["hf", "lean"]
PARENTS = [-1, 0, 0, 1, -1, 3, 2, 4]  # a forest of fed rows: -1 = child of the last cached token


def tree_adapter(model, backend):
    if backend == "lean" and not type(model).__name__.lower().startswith(tuple(LEAN)):
        pytest.skip("the lean forward covers Llama-family models only")
    return CausalLMAdapter(model, backend=backend)


def path_of(parents, i):
    from spade_lib.decoding.drafts.tree import path_of

    return path_of(parents, i)


def full_forward(model, ids, **kwargs):
    with torch.no_grad():
        return model(torch.tensor([ids]), **kwargs)


@pytest.mark.parametrize("backend", TREE_BACKENDS)
def test_tree_extend_equals_a_causal_forward_of_each_path(model, backend):
    """Row i of a tree-masked extend has the logits of a cache-free forward of prefix + the path of i."""
    a = tree_adapter(model, backend)
    rng = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, V, (5,), generator=rng).tolist()
    a.extend(torch.tensor(prefix))
    new = torch.randint(0, V, (len(PARENTS),), generator=rng)
    logits = a.extend(new, parents=PARENTS)
    assert logits.shape == (len(PARENTS), V) and a.length == 5 + len(PARENTS)
    for i in range(len(PARENTS)):
        path = [int(new[j]) for j in path_of(PARENTS, i)]
        torch.testing.assert_close(logits[i], full_logits(model, prefix + path)[-1], rtol=1e-4, atol=1e-5)
    chain = CausalLMAdapter(model, backend=backend)  # a chain given as parents is the causal extend
    chain.extend(torch.tensor(prefix))
    torch.testing.assert_close(chain.extend(new, parents=list(range(-1, len(PARENTS) - 1))),
                               full_logits(model, prefix + new.tolist())[-len(PARENTS):], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", TREE_BACKENDS)
def test_a_tree_fed_level_by_level_equals_a_causal_forward_of_each_path(model, backend):
    """``tree_from``: the tree's rows fed in three extends (its levels; one a single row), each row seeing
    the cache before the tree and only its own ancestors after it; then keep commits a path as usual."""
    a = tree_adapter(model, backend)
    rng = torch.Generator().manual_seed(7)
    prefix = torch.randint(0, V, (5,), generator=rng).tolist()
    a.extend(torch.tensor(prefix))
    start = a.length
    new = torch.randint(0, V, (len(PARENTS),), generator=rng)
    levels = [(0, 3), (3, 4), (4, len(PARENTS))]  # rows 0-2, then row 3, then rows 4-7 (PARENTS is topological)
    logits = torch.cat([a.extend(new[i:j], parents=PARENTS[:j], tree_from=start) for i, j in levels])
    assert a.length == start + len(PARENTS)
    for i in range(len(PARENTS)):
        path = [int(new[j]) for j in path_of(PARENTS, i)]
        torch.testing.assert_close(logits[i], full_logits(model, prefix + path)[-1], rtol=1e-4, atol=1e-5)
    slots = path_of(PARENTS, 6)
    a.keep(slots, start=start)
    kept = prefix + [int(new[j]) for j in slots]
    more = torch.randint(0, V, (2,), generator=rng)
    torch.testing.assert_close(a.extend(more), full_logits(model, kept + more.tolist())[-2:], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="parents"):  # the cached tree rows' parents must be given too
        a.extend(new[:2], parents=[-1, 0], tree_from=start)
    with pytest.raises(ValueError, match="tree_from"):
        a.extend(new[:1], tree_from=start)


@pytest.mark.parametrize("backend", TREE_BACKENDS)
def test_keep_leaves_the_cache_of_a_fresh_prefill(model, backend):
    """After a tree extend, keeping the rows of one path (any increasing subset of a path's rows) leaves the
    cache a fresh prefill of the kept tokens would: the next extend's logits say so."""
    rng = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, V, (4,), generator=rng).tolist()
    new = torch.randint(0, V, (len(PARENTS),), generator=rng)
    for node in (5, 6, 2, 4, 0, -1):
        a = tree_adapter(model, backend)
        a.extend(torch.tensor(prefix))
        a.extend(new, parents=PARENTS)
        slots = path_of(PARENTS, node)
        a.keep(slots, start=len(prefix))
        kept = prefix + [int(new[j]) for j in slots]
        assert a.length == len(kept)
        more = torch.randint(0, V, (3,), generator=rng)
        torch.testing.assert_close(a.extend(more), full_logits(model, kept + more.tolist())[-3:], rtol=1e-4, atol=1e-5)
        a.rollback(len(kept) - 1)  # and a later rollback / tree extend still works from there
        torch.testing.assert_close(a.extend(more[:2], parents=[-1, -1]),
                                   torch.stack([full_logits(model, kept[:-1] + [int(t)])[-1] for t in more[:2]]),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", TREE_BACKENDS)
def test_hidden_states_equal_hf_output_hidden_states(model, backend):
    """Hidden states of every fed row, indexed as HF's output_hidden_states (0 embeddings, i layer i, the
    last after the final norm), causal and tree-masked."""
    a = tree_adapter(model, backend)
    n = model.config.get_text_config().num_hidden_layers
    layers = (0, 1, n, -1)
    rng = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V, (9,), generator=rng).tolist()
    ref = full_forward(model, ids, output_hidden_states=True).hidden_states
    first = a.extend(torch.tensor(ids[:6]), last_only=True, hidden_layers=layers)
    rest = a.extend(torch.tensor(ids[6:]), hidden_layers=layers)
    assert first.logits.shape == (1, V) and rest.logits.shape == (3, V)
    for i in layers:
        assert first.hidden[i].shape == (6, a.hidden_size)
        torch.testing.assert_close(torch.cat([first.hidden[i], rest.hidden[i]]), ref[i][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(rest.logits, full_logits(model, ids)[-3:], rtol=1e-4, atol=1e-5)
    a.rollback(4)
    new = torch.randint(0, V, (len(PARENTS),), generator=rng)
    out = a.extend(new, parents=PARENTS, hidden_layers=(1, -1))
    for i in range(len(PARENTS)):
        path = ids[:4] + [int(new[j]) for j in path_of(PARENTS, i)]
        r = full_forward(model, path, output_hidden_states=True)
        torch.testing.assert_close(out.logits[i], r.logits[0, -1], rtol=1e-4, atol=1e-5)
        for layer in (1, -1):
            torch.testing.assert_close(out.hidden[layer][i], r.hidden_states[layer][0, -1], rtol=1e-4, atol=1e-5)


def test_tree_extend_on_the_embedded_pair_target():
    """The same reference on the embedded tiny pair's target (a trained Llama), through every backend it has."""
    from spade_lib.zoo.pairs import load_pair

    target = load_pair("tiny").target
    rng = torch.Generator().manual_seed(6)
    vocab = target.config.vocab_size
    prefix = torch.randint(0, vocab, (7,), generator=rng).tolist()
    new = torch.randint(0, vocab, (len(PARENTS),), generator=rng)
    for backend in TREE_BACKENDS:
        a = CausalLMAdapter(target, backend=backend)
        a.extend(torch.tensor(prefix))
        out = a.extend(new, parents=PARENTS, hidden_layers=(-1,))
        for i in range(len(PARENTS)):
            path = prefix + [int(new[j]) for j in path_of(PARENTS, i)]
            r = full_forward(target, path, output_hidden_states=True)
            torch.testing.assert_close(out.logits[i], r.logits[0, -1], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(out.hidden[-1][i], r.hidden_states[-1][0, -1], rtol=1e-4, atol=1e-4)
        a.keep(path_of(PARENTS, 6), start=len(prefix))
        kept = prefix + [int(new[j]) for j in path_of(PARENTS, 6)]
        torch.testing.assert_close(a.extend(new[:2]), full_logits(target, kept + new[:2].tolist())[-2:],
                                   rtol=1e-4, atol=1e-4)


def test_tree_and_keep_arguments_are_checked(model):
    a = CausalLMAdapter(model, backend="hf")
    a.extend(torch.tensor([1, 2, 3]))
    for bad in ([-1, 1], [0, -1], [-1], [-1, 0.5], "ab"):
        with pytest.raises(ValueError, match="parents"):
            a.extend(torch.tensor([4, 5]), parents=bad)
    n = model.config.get_text_config().num_hidden_layers
    for bad in ((n + 1,), (-(n + 2),), (True,), 1):
        with pytest.raises(ValueError, match="hidden_layers"):
            a.extend(torch.tensor([4]), hidden_layers=bad)
    assert a.length == 3
    a.extend(torch.tensor([4, 5, 6]), parents=[-1, -1, 1])
    for bad in ([1, 0], [0, 3], [-1], [0, 0], [True]):
        with pytest.raises(ValueError, match="slots"):
            a.keep(bad, start=3)
    for bad in (7, -1, 2.0):
        with pytest.raises(ValueError, match="start"):
            a.keep([0], start=bad)
    a.keep(torch.tensor([1, 2]), start=3)
    assert a.length == 5
    a.keep([], start=5)
    assert a.length == 5
