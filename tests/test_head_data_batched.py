"""The heads' teacher generations decoded by SPADE's batched decoder (``head_data.generations``,
``generator="spade"``) against Hugging Face ``generate`` (``"hf"``, the former way) on the same prompts: the
same greedy answers, cut after the same eos, for a Llama and for a Gemma-3 with sliding windows (ragged
prompts, answers past the window); and the facts a data entry records about its generation."""

import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spade_lib.zoo.head_data import GENERATORS, HeadDataConfig, generations, teacher_sequences

from test_zoo_gemma3 import VOCAB, WINDOW, lively_gemma3, periodic_prompt, tiny_tokenizer


def tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_spade_generations_are_hf_generates(family):
    model = tiny_llama() if family == "llama" else lively_gemma3()
    prompts = [periodic_prompt(n, seed=i) for i, n in enumerate((3, 2 * WINDOW + 1, 9, 3 * WINDOW, 1))]
    cfg = HeadDataConfig(gen_tokens=2 * WINDOW + 4, gen_batch=3)
    hf = generations(model, prompts, dataclasses.replace(cfg, generator="hf"), pad_id=VOCAB - 1)
    ours = generations(model, prompts, cfg, pad_id=VOCAB - 1)
    assert [s.tolist() for s in ours.seqs] == [s.tolist() for s in hf.seqs]
    assert ours.starts == [len(p) for p in prompts] and ours.kinds == ["generation"] * len(prompts)
    # an eos that the answers use: both cut after its first occurrence (answers of fewer than 2 tokens dropped)
    answers = [s[a:].tolist() for s, a in zip(hf.seqs, hf.starts)]
    eos = answers[1][3]
    cut = [p + a[: a.index(eos) + 1] if eos in a else p + a for p, a in zip(prompts, answers)]
    expect = [c for c, p in zip(cut, prompts) if len(c) - len(p) >= 2]
    hf = generations(model, prompts, dataclasses.replace(cfg, generator="hf"), pad_id=VOCAB - 1, eos_ids={eos})
    ours = generations(model, prompts, cfg, pad_id=VOCAB - 1, eos_ids={eos})
    assert [s.tolist() for s in ours.seqs] == [s.tolist() for s in hf.seqs] == expect


def test_the_data_facts_record_the_generation():
    cfg = HeadDataConfig(n_prompts=4, gen_tokens=12, gen_batch=2, n_windows=2, window=8, bos=True)
    texts = [" ".join(f"t{i}" for i in periodic_prompt(n, seed=n)[1:]) for n in (5, 9, 12, 20)]
    seqs, facts = teacher_sequences(lively_gemma3(), tiny_tokenizer(), cfg, prompts=texts, documents=texts * 2)
    g = facts["generation"]
    assert g["decoder"] == GENERATORS["spade"] and g["batch_size"] == 2 and g["prompts"] == 4
    assert g["tokens"] == facts["generated_tokens"] > 0 and g["seconds"] > 0 and g["cpu_seconds"] > 0
    assert g["tokens_per_minute"] == pytest.approx(60 * g["tokens"] / g["seconds"])
    assert all(int(s[0]) == VOCAB - 3 for s in seqs.seqs)  # <bos> before every prompt and window
    with pytest.raises(ValueError, match="generator"):
        HeadDataConfig(generator="vllm")
