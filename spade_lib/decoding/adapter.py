"""Cache-safe adapter over any Hugging Face causal LM: prefill, extend by k tokens, roll back.

Speculative decoding runs the target on ``gamma + 1`` tokens at once and then throws away the key/value
states of the rejected drafts. :class:`CausalLMAdapter` owns one model's KV cache
(``transformers.DynamicCache``) and keeps its length in a plain ``int``:

- ``extend(ids)`` feeds ``k`` new tokens at absolute positions ``length .. length + k - 1`` and returns
  the logits at each of them, ``[k, V]`` (row ``i`` is the next-token distribution after ``ids[i]``);
- ``rollback(n)`` crops the cache back to its first ``n`` tokens with the cache's own
  ``crop(-(length - n))`` (transformers 5.x: a *negative* argument = number of tokens to remove).

After any sequence of extends and rollbacks the cache holds exactly the states that a fresh prefill of the
kept tokens would (``tests/test_adapter.py`` compares the logits). Position ids are passed explicitly
(``arange(length, length + k)``), so models with absolute (GPT-2) and rotary (Llama, Qwen2) positions
behave the same. A model whose cache cannot be cropped (recurrent / linear-attention states, a sliding
window already overrun) is refused with a ``ValueError``. The adapter is device- and dtype-agnostic: it
feeds tokens on the model's device and returns logits in the model's dtype.

Backends (``backend=``): ``"hf"`` calls the model's own forward with a ``DynamicCache`` as above;
``"lean"`` runs :class:`spade_lib.decoding.lean.LeanForward` — the same function computed from the model's
weights with a preallocated KV cache (rollback is setting an integer), without the per-call module,
mask and cache bookkeeping that dominates a small draft's forward; ``"auto"`` (default) takes
``"lean"`` whenever it covers the model and agrees with one Hugging Face forward, else ``"hf"``.
The lean forward fuses (copies) the projection weights when the adapter is built: build a new adapter
after changing a model's weights, dtype or device.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from spade_lib.validate import check_token_ids
from spade_lib.decoding.lean import lean_forward

__all__ = ["CausalLMAdapter", "as_token_tensor", "context_limit", "BACKENDS"]

BACKENDS = ("auto", "hf", "lean")


def context_limit(model: torch.nn.Module) -> int | None:
    """The model's maximum number of positions (``max_position_embeddings`` / ``n_positions``), if any."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def as_token_tensor(ids, device: torch.device | str, *, name: str = "prompt_ids") -> torch.Tensor:
    """``ids`` (list of ints, 1-D tensor, or ``[1, L]`` tensor) as a 1-D ``long`` tensor on ``device``."""
    if isinstance(ids, torch.Tensor):
        t = ids
        if t.dim() == 2:
            if t.shape[0] != 1:
                raise ValueError(f"{name}: batch size must be 1, got shape {tuple(t.shape)}")
            t = t[0]
        if t.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor of token ids, got shape {tuple(t.shape)}")
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError(f"{name}: token ids must be integers, got dtype {t.dtype}")
        return t.to(device=device, dtype=torch.long)
    values = check_token_ids(name, ids)  # refuses a str (text, not ids), floats, bools, negatives
    return torch.tensor(values, dtype=torch.long, device=device)


class CausalLMAdapter:
    """One causal LM and its KV cache (batch size 1).

    ``max_length`` caps the number of positions fed (default: the model config's context limit).
    ``backend``: ``"auto"``, ``"hf"`` or ``"lean"`` (module docstring); the one in use is ``self.backend``.
    """

    def __init__(self, model: torch.nn.Module, *, max_length: int | None = None, backend: str = "auto"):
        if backend not in BACKENDS:
            raise ValueError(f"backend: must be one of {BACKENDS}, got {backend!r}")
        if not hasattr(model, "config") or not callable(model):
            raise ValueError(f"model: expected a Hugging Face causal LM, got {type(model).__name__}")
        params = inspect.signature(model.forward).parameters
        if "cache" in params:  # transformers >= 5.x
            self._cache_kw = "cache"
        elif "past_key_values" in params:
            self._cache_kw = "past_key_values"
        else:
            raise ValueError(f"model: {type(model).__name__}.forward takes no KV cache argument")
        self._has_position_ids = "position_ids" in params
        self._has_logits_to_keep = "logits_to_keep" in params
        self.model = model
        first = next(model.parameters())
        self.device: torch.device = first.device
        self.dtype: torch.dtype = first.dtype
        limit = context_limit(model)
        if max_length is not None:
            if max_length < 1:
                raise ValueError(f"max_length: must be >= 1, got {max_length}")
            limit = max_length if limit is None else min(limit, max_length)
        self.max_length: int | None = limit
        self.vocab_size: int = int(model.get_output_embeddings().weight.shape[0]) \
            if model.get_output_embeddings() is not None else int(model.config.get_text_config().vocab_size)
        self.cache = self._new_cache()
        if not self.cache.is_croppable:
            raise ValueError(
                f"model: the KV cache of {type(model).__name__} cannot be cropped (recurrent or linear-attention "
                "states); speculative decoding needs to roll back rejected tokens"
            )
        self.length = 0  # tokens currently in the cache
        self.lean = None
        if backend != "hf" and limit is not None:
            self.lean = lean_forward(model, limit)
        if backend == "lean" and self.lean is None:
            raise ValueError(f"backend: the lean forward does not cover {type(model).__name__} "
                             "(see spade_lib.decoding.lean.SUPPORTED), use backend='hf' or 'auto'")
        self.backend = "hf" if self.lean is None else "lean"
        if self.lean is not None:
            self.cache = None  # the lean forward keeps its own buffers

    def _new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
            cache.activate_past_recording()  # keep states beyond the window so that crop can undo them
        return cache

    def reset(self) -> None:
        """Drop the cache (start a new prompt)."""
        if self.lean is not None:
            self.lean.reset()
        else:
            self.cache = self._new_cache()
        self.length = 0

    def check_fits(self, n_new: int) -> None:
        if self.max_length is not None and self.length + n_new > self.max_length:
            raise ValueError(
                f"context limit: {self.length} cached + {n_new} new tokens exceed the model's "
                f"{self.max_length} positions"
            )

    @torch.inference_mode()
    def extend(self, ids: torch.Tensor, *, last_only: bool = False) -> torch.Tensor:
        """Feed ``ids`` (1-D long tensor on ``self.device``); return their logits ``[k, V]``
        (``[1, V]`` for the last position only when ``last_only``)."""
        k = int(ids.shape[-1])
        if k == 0:
            raise ValueError("ids: nothing to feed (0 tokens)")
        self.check_fits(k)
        if self.lean is not None:
            logits = self.lean.forward(ids.view(k), last_only=last_only)
            self.length += k
            return logits
        kwargs = {self._cache_kw: self.cache, "use_cache": True}
        if self._has_position_ids:
            kwargs["position_ids"] = torch.arange(self.length, self.length + k, device=self.device)[None]
        if self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 1 if last_only else 0
        out = self.model(ids.view(1, k), **kwargs)
        self.length += k
        logits = out.logits[0]
        return logits[-1:] if last_only else logits

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Reset, then feed ``ids``; return the logits at the last position ``[V]``."""
        self.reset()
        return self.extend(ids, last_only=True)[0]

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens (the cache's own ``crop``)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length: must be in [0, {self.length}], got {length}")
        if length == self.length:
            return
        if self.lean is not None:
            self.lean.rollback(length)
            self.length = length
            return
        if not self.cache.is_croppable:
            raise ValueError(f"model: the KV cache of {type(self.model).__name__} can no longer be cropped")
        self.cache.crop(length - self.length)  # negative: number of tokens to remove
        self.length = length
