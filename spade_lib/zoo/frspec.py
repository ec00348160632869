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

:func:`trim_head` does the same to any loaded ``*ForCausalLM`` in place (Llama, Gemma-3, ...; a draft, never
the target): its LM head becomes :class:`SubsetLMHead`, the rows ``token_ids`` of its output matrix copied
(so a tied embedding stays whole and untouched), whose forward scatters through
:func:`spade_lib.decoding.model.heads.scatter_vocab`, and the model carries ``head_token_ids``, which the lean
forward (``decoding.model.lean``) honours the same way. Nothing is saved: trim after loading. :func:`trimmed_twin`
trims a second model that shares every other module with the first (both drafts, the body held once).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast

from spade_lib.decoding.model.heads import scatter_vocab
from spade_lib.zoo.loading import shared_copy

__all__ = ["FRSpecLlamaConfig", "FRSpecLlamaForCausalLM", "SubsetLMHead", "trim_head", "trimmed_twin"]

MODEL_TYPE = "spade_frspec_llama"


class SubsetLMHead(nn.Linear):
    """An LM head over ``Vd`` token ids of a ``V``-token vocabulary: ``weight [Vd, H]`` (row ``j`` scores
    ``token_ids[j]``), forward ``[..., H] -> [..., V]`` logits with ``-inf`` off ``token_ids``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, token_ids: torch.Tensor, vocab_size: int):
        super().__init__(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device,
                         dtype=weight.dtype)
        with torch.no_grad():
            self.weight.copy_(weight)
            if bias is not None:
                self.bias.copy_(bias)
        self.register_buffer("token_ids", token_ids.to(weight.device), persistent=False)
        self.vocab_size = int(vocab_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return scatter_vocab(super().forward(hidden), self.token_ids, self.vocab_size)


def trim_head(model, token_ids) -> nn.Module:
    """Trim ``model``'s LM head to ``token_ids`` in place (module docstring) and return ``model``: its logits
    are then the full model's on ``token_ids`` and ``-inf`` elsewhere, so its ``q`` is FR-Spec's, ``q = 0``
    off the subset (still lossless as a draft).

    ``token_ids``: distinct ids in ``[0, V)`` (sorted here); a model whose head is already trimmed is trimmed
    again from its remaining rows only, and one with final logit soft-capping is refused (``-inf`` would
    come out as ``-cap``)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, nn.Linear):
        raise ValueError(f"model: a causal LM with a linear LM head expected, got {type(model).__name__}")
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(text, "final_logit_softcapping", None) is not None:
        raise ValueError("model: final_logit_softcapping is set; a trimmed head's -inf would be soft-capped to -cap")
    v = int(text.vocab_size)
    ids = torch.as_tensor(token_ids, dtype=torch.long).flatten().sort().values
    if ids.numel() == 0 or ids.unique().numel() != ids.numel() or ids.min() < 0 or ids.max() >= v:
        raise ValueError(f"token_ids: need distinct ids in [0, {v}), got {ids.numel()} "
                         f"({ids.unique().numel()} distinct)")
    if isinstance(head, SubsetLMHead):  # trimmed before: pick from the rows it still has
        have = head.token_ids.cpu()
        rows = torch.searchsorted(have, ids).clamp(max=have.numel() - 1)
        if not torch.equal(have[rows], ids):
            raise ValueError("token_ids: the head is already trimmed and lacks some of these ids")
    elif getattr(model, "head_token_ids", None) is not None:
        raise ValueError(f"model: a {type(model).__name__} scores a subset of its own (head_token_ids); "
                         "set its tokens instead (FRSpecLlamaForCausalLM.set_head_tokens)")
    else:
        rows = ids
    dev = head.weight.device
    with torch.no_grad():
        weight = head.weight[rows.to(dev)].clone()
        bias = None if head.bias is None else head.bias[rows.to(dev)].clone()
    model.set_output_embeddings(SubsetLMHead(weight, bias, ids, v))
    for config in {id(model.config): model.config, id(text): text}.values():
        config.tie_word_embeddings = False  # the head is a copy of some rows now: never tie it back
    if "head_token_ids" in dict(model.named_buffers(recurse=False)):
        model.head_token_ids = ids.to(dev)
    else:
        model.register_buffer("head_token_ids", ids.to(dev), persistent=False)
    return model


def trimmed_twin(model, token_ids) -> nn.Module:
    """A second model that is ``model`` with its LM head trimmed to ``token_ids`` (:func:`trim_head`), sharing every
    other module, parameter and buffer with ``model`` (the body's weights held once: only the ``|token_ids| x d``
    head rows are new); ``model`` is left as it was. Its own configuration (a deep copy) and module tables mean a
    change of one model's head never reaches the other."""
    twin = shared_copy(model)
    twin.config = copy.deepcopy(model.config)
    return trim_head(twin, token_ids)


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
