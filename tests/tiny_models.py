"""Tiny random models the decoding tests share (not a test module): a Llama of a few thousand parameters
and a perturbed copy of it as a draft that agrees often but not always."""

from __future__ import annotations

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def llama(vocab=128, seed=0, layers=2, hidden=32, init=0.3, max_pos=64):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=max_pos,
                      initializer_range=init, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def perturbed(model, scale, seed=1):
    """A draft that agrees with ``model`` often but not always: its weights plus Gaussian noise."""
    d = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().nan_to_num(0.0))
    return d
