"""A Llama draft whose LM head covers only a frequent subset of the vocabulary (FR-Spec, Zhao et al. 2025).

The head computes logits for the ``head_vocab`` token ids in ``head_token_ids`` (the most frequent
tokens of the target's own text) and the forward returns logits over the **full** vocabulary ``V``
with ``-inf`` everywhere else, so the draft's distribution is

    q(v) = softmax(W h)_j   if v = head_token_ids[j],      q(v) = 0 otherwise.

Speculative sampling stays exact: a token with ``q = 0`` is never drafted, and the residual
``max(0, p - q)`` gives those tokens back their full target mass ``p``. The cost of the head drops
from ``V x d`` to ``head_vocab x d`` multiply-adds per token (the target's head is ~20 % of
SmolLM2-135M).

The class is a real Hugging Face model: ``FRSpecLlamaConfig`` (``model_type = "spade_frspec_llama"``)
and ``FRSpecLlamaForCausalLM`` are registered with ``AutoConfig`` / ``AutoModelForCausalLM`` when this
module is imported (``spade_lib.zoo.smollm2.load_smollm2`` imports it), so ``AutoModelForCausalLM.from_pretrained``
loads a saved draft from its safetensors folder without ``trust_remote_code``. The token ids are a
persistent buffer saved with the weights.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast

from spade_lib.decoding.heads import scatter_vocab

MODEL_TYPE = "spade_frspec_llama"


class FRSpecLlamaConfig(LlamaConfig):
    """``LlamaConfig`` plus ``head_vocab``: the number of token ids the LM head scores."""

    model_type = MODEL_TYPE

    def __init__(self, head_vocab: int = 8192, **kwargs):
        kwargs["tie_word_embeddings"] = False  # the head has fewer rows than the embedding
        super().__init__(**kwargs)
        self.head_vocab = int(head_vocab)


class FRSpecLlamaForCausalLM(LlamaForCausalLM):
    """``LlamaForCausalLM`` with a ``head_vocab x d`` head scattered into ``-inf``-filled full-vocabulary logits."""

    config_class = FRSpecLlamaConfig
    _tied_weights_keys = {}

    def __init__(self, config: FRSpecLlamaConfig):
        super().__init__(config)
        if not 0 < config.head_vocab <= config.vocab_size:
            raise ValueError(f"head_vocab: must be in [1, vocab_size={config.vocab_size}], got {config.head_vocab}")
        self.lm_head = nn.Linear(config.hidden_size, config.head_vocab, bias=False)
        self.register_buffer("head_token_ids", torch.arange(config.head_vocab, dtype=torch.long), persistent=True)
        self.post_init()

    def set_head_tokens(self, token_ids: torch.Tensor) -> None:
        """Set which vocabulary ids the head scores (distinct, in ``[0, vocab_size)``)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
        if ids.numel() != self.config.head_vocab or ids.unique().numel() != ids.numel():
            raise ValueError(f"token_ids: need {self.config.head_vocab} distinct ids, got {ids.numel()} "
                             f"({ids.unique().numel()} distinct)")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise ValueError(f"token_ids: ids must lie in [0, {self.config.vocab_size})")
        self.head_token_ids.copy_(ids.to(self.head_token_ids.device))

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the head's ``head_vocab`` tokens only (training uses these)."""
        return self.lm_head(hidden)

    def scatter_full(self, small: torch.Tensor) -> torch.Tensor:
        """``[..., head_vocab]`` logits -> ``[..., vocab_size]`` with ``-inf`` off the head's tokens."""
        return scatter_vocab(small, self.head_token_ids, self.config.vocab_size)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                labels=None, use_cache=None, logits_to_keep=0, **kwargs) -> CausalLMOutputWithPast:
        if labels is not None:
            raise ValueError("labels: FRSpecLlamaForCausalLM computes no loss; train on head_logits")
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             cache=cache, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        hidden = outputs.last_hidden_state
        if isinstance(logits_to_keep, int):
            hidden = hidden[:, -logits_to_keep:, :] if logits_to_keep else hidden
        else:
            hidden = hidden[:, logits_to_keep, :]
        logits = self.scatter_full(self.lm_head(hidden))
        return CausalLMOutputWithPast(logits=logits, cache=outputs.cache, hidden_states=outputs.hidden_states,
                                      attentions=outputs.attentions)


AutoConfig.register(MODEL_TYPE, FRSpecLlamaConfig, exist_ok=True)
AutoModelForCausalLM.register(FRSpecLlamaConfig, FRSpecLlamaForCausalLM, exist_ok=True)
