"""Cache-safe adapter over any Hugging Face causal LM: prefill, extend by k tokens, roll back.

Speculative decoding runs the target on ``gamma + 1`` tokens, then drops the rejected drafts' key/value states.
:class:`CausalLMAdapter` owns one model's KV cache (``transformers.DynamicCache``) and its length as a plain ``int``:

- ``extend(ids)`` feeds ``k`` tokens at positions ``length .. length + k - 1`` (explicit ``position_ids``: absolute
  and rotary models alike) and returns logits ``[k, V]``, row ``i`` the next-token distribution after ``ids[i]``;
- ``rollback(n)`` crops to the first ``n`` tokens: ``crop(-(length - n))`` (transformers 5.x: ``-m`` drops m tokens).

Invariant: after any extends and rollbacks the cache equals a fresh prefill of the kept tokens (tests/test_adapter.py).
**Trees** (:mod:`spade_lib.decoding.drafts.tree`): ``extend(ids, parents=...)`` feeds the rows as a forest, row ``i`` attending
to the cache and its own path (``parents[i]``, an earlier row or ``-1``: child of the last cached token) at position
``length + depth[i]``, via a 4-D additive mask ``[1, 1, k, length + k]`` (0 or the dtype's min) and explicit
``position_ids``: row ``i``'s logits are a causal forward of its path. With ``tree_from=S`` the rows cached from ``S``
are earlier nodes of the tree (``parents`` indexes them, then the fed rows; ``-1``: child of the token at ``S - 1``),
so a draft model evaluates one level per forward. ``keep(slots, start=L)`` commits an increasing subset of the rows
fed from ``L``, moved to ``L, L + 1, ..`` (again a fresh prefill's cache). ``extend(ids, hidden_layers=(l, ..))`` also
returns those layers' hidden states (HF ``output_hidden_states`` indexing; negative from the end) in an
:class:`ExtendOutput`; without ``parents`` / ``hidden_layers`` it is the plain causal path. Uncroppable caches
(recurrent states, an overrun sliding window) raise ``ValueError``; device- and dtype-agnostic.
**Backends** (``backend=``): ``"hf"`` the model's forward with a ``DynamicCache``; ``"lean"``
:class:`spade_lib.decoding.model.lean.LeanForward`, the same function from the weights with a preallocated cache (rollback
sets an integer) and without the per-call module, mask and cache bookkeeping that dominates a small draft's forward;
``"auto"`` (default) ``"lean"`` where it covers the model and agrees with one HF forward, else ``"hf"``. Lean fuses
(copies) weights at build: build a new adapter after changing a model's weights, dtype or device.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from spade_lib.decoding.model.lean import lean_forward
from spade_lib.decoding.model.masks import ancestor_mask
from spade_lib.validate import check_token_ids

__all__ = ["CausalLMAdapter", "ExtendOutput", "as_token_tensor", "context_limit", "BACKENDS"]

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


@dataclass
class ExtendOutput:
    """What :meth:`CausalLMAdapter.extend` returns when hidden states were asked for."""

    logits: torch.Tensor               # [k, V] ([1, V] with last_only)
    hidden: dict[int, torch.Tensor]    # layer (as asked) -> [k, H]: every fed row, whatever last_only


def _check_parents(parents, k: int) -> list[int]:
    """``parents`` (ints or a 1-D integer tensor) of ``k`` tree rows as a host list; ``-1 <= parents[i] < i``."""
    if isinstance(parents, torch.Tensor):
        if parents.dim() != 1 or parents.dtype.is_floating_point or parents.dtype == torch.bool:
            raise ValueError(f"parents: expected a 1-D integer tensor, got shape {tuple(parents.shape)}, "
                             f"dtype {parents.dtype}")
        parents = parents.tolist()
    elif isinstance(parents, (str, bytes)) or not isinstance(parents, Sequence):
        raise ValueError(f"parents: expected a list of ints or a 1-D tensor, got {type(parents).__name__}")
    ps = list(parents)
    if len(ps) != k:
        raise ValueError(f"parents: {len(ps)} entries for {k} tree rows (the cached ones since tree_from, then "
                         "the fed ones)")
    for i, p in enumerate(ps):
        if isinstance(p, bool) or not isinstance(p, int) or not -1 <= p < i:
            raise ValueError(f"parents: row {i} has parent {p!r}; need an int with -1 <= parents[i] < i "
                             "(an earlier row, or -1: a child of the last cached token)")
    return ps


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
        text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.hidden_size: int | None = getattr(text, "hidden_size", None)
        self.n_layers: int | None = getattr(text, "num_hidden_layers", None)
        self._has_attention_mask = "attention_mask" in params
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
                             "(see spade_lib.decoding.model.lean.SUPPORTED), use backend='hf' or 'auto'")
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
    def extend(self, ids: torch.Tensor, *, last_only: bool = False, parents: Sequence[int] | torch.Tensor | None = None,
               tree_from: int | None = None, hidden_layers: Sequence[int] = ()) -> torch.Tensor | ExtendOutput:
        """Feed ``ids`` (1-D long tensor on ``self.device``); return their logits ``[k, V]``
        (``[1, V]`` for the last position only when ``last_only``).

        ``parents``: feed the rows as a tree (module docstring; ``-1 <= parents[i] < i``, read on the host).
        ``tree_from``: the cache position where that tree's rows began (default: ``length``, a new tree);
        ``parents`` then has ``length - tree_from + k`` entries, the cached tree rows' and the fed rows'.
        ``hidden_layers``: also return every fed row's hidden state at these layers, as an
        :class:`ExtendOutput`. With neither, this is the plain causal extend."""
        k = int(ids.shape[-1])
        if k == 0:
            raise ValueError("ids: nothing to feed (0 tokens)")
        self.check_fits(k)
        if tree_from is not None and parents is None:
            raise ValueError("tree_from: only with parents (it says where the tree's rows began)")
        if parents is not None or hidden_layers:
            return self._extend_tree(ids.view(k), last_only, parents, hidden_layers, tree_from)
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

    def _check_layers(self, hidden_layers) -> tuple[int, ...]:
        if isinstance(hidden_layers, (str, bytes)) or not isinstance(hidden_layers, Sequence):
            raise ValueError(f"hidden_layers: expected a sequence of ints, got {type(hidden_layers).__name__}")
        n = self.n_layers
        for i in hidden_layers:
            if isinstance(i, bool) or not isinstance(i, int) or (n is not None and not -(n + 1) <= i <= n):
                raise ValueError(f"hidden_layers: {i!r} is not a hidden-state index of a {n}-layer model "
                                 f"(0: embeddings .. {n}: after the final norm)")
        return tuple(hidden_layers)

    def _extend_tree(self, ids: torch.Tensor, last_only: bool, parents, hidden_layers,
                     tree_from: int | None = None) -> torch.Tensor | ExtendOutput:
        """The extend with a tree mask and/or hidden states (see :meth:`extend`)."""
        k = int(ids.shape[0])
        layers = self._check_layers(hidden_layers)
        anc = depth = None
        S = self.length if tree_from is None else tree_from
        if parents is not None:
            if isinstance(S, bool) or not isinstance(S, int) or not 0 <= S <= self.length:
                raise ValueError(f"tree_from: must be an int in [0, {self.length}] (a cached position), got {tree_from!r}")
            ps = _check_parents(parents, self.length - S + k)
            # [k, M]: the fed rows' ancestors among the M tree rows (cached since S, then fed)
            anc = ancestor_mask(torch.tensor(ps, dtype=torch.long, device=self.device))[-k:]
            depth = anc.sum(dim=-1) - 1
        if self.lean is not None:
            out = self.lean.forward(ids, last_only=last_only, ancestors=anc, tree_from=S, hidden_layers=layers)
            self.length += k
            return ExtendOutput(*out) if layers else out
        kwargs = {self._cache_kw: self.cache, "use_cache": True}
        if anc is not None:
            if not (self._has_position_ids and self._has_attention_mask):
                raise ValueError(f"parents: {type(self.model).__name__}.forward must take position_ids and "
                                 "attention_mask to score a tree")
            if any(getattr(layer, "is_sliding", False) for layer in self.cache.layers):
                raise ValueError("parents: a sliding-window cache counts slots, not positions; trees are not supported")
            L = self.length
            mask = torch.zeros(1, 1, k, L + k, device=self.device, dtype=self.dtype)
            mask[0, 0, :, S:] = torch.where(anc, 0.0, torch.finfo(self.dtype).min)
            kwargs["attention_mask"] = mask
            kwargs["position_ids"] = (S + depth)[None]
        elif self._has_position_ids:
            kwargs["position_ids"] = torch.arange(self.length, self.length + k, device=self.device)[None]
        if self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 1 if last_only else 0
        if layers:
            kwargs["output_hidden_states"] = True
        out = self.model(ids.view(1, k), **kwargs)
        self.length += k
        logits = out.logits[0]
        logits = logits[-1:] if last_only else logits
        if not layers:
            return logits
        return ExtendOutput(logits, {i: out.hidden_states[i][0] for i in layers})

    @torch.inference_mode()
    def keep(self, slots: Sequence[int] | torch.Tensor, *, start: int) -> None:
        """Keep the first ``start`` cached tokens and the rows ``start + slots`` (``slots`` increasing, each
        below ``length - start``), moved to the positions ``start, start + 1, ..``; the rest is dropped.
        After a tree extend from ``start`` keep the root and the accepted path (``[0, 1 + i, ..]``): the
        cache then equals a fresh prefill of the kept tokens. A prefix ``0 .. m-1`` is a rollback."""
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= self.length:
            raise ValueError(f"start: must be an int in [0, {self.length}], got {start!r}")
        s = slots.tolist() if isinstance(slots, torch.Tensor) else list(slots)
        k = self.length - start
        if any(isinstance(j, bool) or not isinstance(j, int) for j in s) or any(
                not 0 <= j < k for j in s) or any(a >= b for a, b in zip(s, s[1:])):
            raise ValueError(f"slots: must be increasing ints in [0, {k}) (rows fed after start={start}), got {s}")
        m = len(s)
        if s == list(range(m)):
            self.rollback(start + m)
            return
        idx = torch.tensor(s, dtype=torch.long, device=self.device) + start
        if self.lean is not None:
            self.lean.keep(start, idx)
            self.length = start + m
            return
        if any(getattr(layer, "is_sliding", False) for layer in self.cache.layers):
            raise ValueError("slots: a sliding-window cache can only be rolled back (keep a prefix)")
        for layer in self.cache.layers:  # DynamicLayer: keys, values [1, kv_heads, length, head_dim]
            layer.keys[:, :, start:start + m] = layer.keys.index_select(2, idx)
            layer.values[:, :, start:start + m] = layer.values.index_select(2, idx)
        self.cache.crop(start + m - self.length)
        self.length = start + m

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
