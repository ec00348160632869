"""Sampling warpers: logits -> the adjusted distribution that speculative decoding must preserve.

Speculative sampling is exact only for the distribution both models are *actually* sampled from, so
the same warpers must be applied, in the same order, to the target's logits (giving ``p``) and to
the draft's logits (giving ``q``). Shipped samplers have broken this silently (HF transformers
#32867, #47932; vLLM #9834); SPADE computes both with the one function :func:`adjust`.

For logits ``z`` over a vocabulary of size ``V`` and a :class:`SamplingConfig`:

1. temperature ``T > 0``:  ``z <- z / T`` (for ``T < 1`` computed as ``(z - max z) / T``, which cannot
   overflow however small ``T`` is);
2. top-k ``k > 0``:        keep ``{v : z_v >= z_(k)}`` where ``z_(k)`` is the k-th largest logit
   (ties with the k-th value are kept, as in HF's ``TopKLogitsWarper``);
3. top-p ``0 < P < 1``:    sort the survivors by probability (descending, ties by lower index),
   keep the shortest prefix whose mass reaches ``P``, i.e. token ``j`` in sorted order is kept iff
   the mass strictly before it is ``< P`` (the top token is always kept);
4. renormalise: ``softmax`` over the kept tokens.

``T == 0`` is greedy: the adjusted distribution is one-hot at ``argmax z`` (ties: lowest index, as
``torch.argmax``); top-k and top-p are then irrelevant. Everything is computed in ``dtype``
(float32 by default, float64 for exactness tests) and works on any leading shape ``[..., V]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spade_lib.validate import ArgumentTypeError, check_dtype

_MIN_TEMPERATURE = float(torch.finfo(torch.float32).tiny)


@dataclass(frozen=True)
class SamplingConfig:
    """How logits are turned into a sampling distribution (applied identically to target and draft)."""

    temperature: float = 1.0  # 0 = greedy (one-hot argmax); otherwise logits are divided by it
    top_k: int = 0            # keep the k most likely tokens; 0 = off
    top_p: float = 1.0        # keep the smallest most-likely set with mass >= top_p; 1 = off

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if 0 < t < _MIN_TEMPERATURE:  # would round to 0 in float32, and z / 0 is NaN
            raise ValueError(f"temperature: must be 0 (greedy) or >= {_MIN_TEMPERATURE:g} (the smallest normal "
                             f"float32), got {t!r}")
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {k!r}")
        tp = self.top_p
        if isinstance(tp, bool) or not isinstance(tp, (int, float)) or not (0.0 < tp <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {tp!r}")

    @property
    def greedy(self) -> bool:
        """True when sampling degenerates to argmax (temperature 0)."""
        return self.temperature == 0


def _check_logits(logits: torch.Tensor) -> None:
    """Checks of ``validate=True`` (the ``validate=False`` hot path skips them all)."""
    if not isinstance(logits, torch.Tensor):
        raise ArgumentTypeError(f"logits: must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.is_floating_point():  # integer / bool logits: softmax and the warpers would misbehave
        raise ArgumentTypeError(f"logits: must be a floating-point tensor, got {logits.dtype}")
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits: must have shape [..., V] with V >= 1, got {tuple(logits.shape)}")
    if torch.isnan(logits).any():
        raise ValueError("logits: contain NaN")
    if torch.isposinf(logits).any():
        raise ValueError("logits: contain +inf")
    if logits.numel() and torch.isneginf(logits).all(dim=-1).any():
        raise ValueError("logits: have a row that is -inf everywhere (no token left to sample)")


def _one_hot_argmax(logits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    probs = torch.zeros(logits.shape, dtype=dtype, device=logits.device)
    return probs.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)


def adjust_logits(
    logits: torch.Tensor,
    config: SamplingConfig,
    dtype: torch.dtype = torch.float32,
    *,
    validate: bool = True,
) -> torch.Tensor:
    """Warped logits in ``dtype``: temperature, then top-k, then top-p; removed tokens are ``-inf``.

    ``softmax`` of the result is :func:`adjust`'s distribution. Greedy gives ``0`` at the argmax
    and ``-inf`` elsewhere.
    """
    if not isinstance(config, SamplingConfig):
        raise ArgumentTypeError(f"config: must be a SamplingConfig, got {type(config).__name__}")
    check_dtype("dtype", dtype)  # an integer dtype would truncate the distribution (cheap: checked always)
    if validate:
        _check_logits(logits)
    if config.greedy:
        return torch.log(_one_hot_argmax(logits, dtype))
    z = logits.to(dtype)
    if config.temperature < 1.0:
        # z / T overflows (inf - inf = NaN in softmax) for a tiny T; shifting each row by its max first
        # keeps every entry <= 0 and changes nothing else (softmax is shift-invariant): as T -> 0 the
        # distribution tends to the uniform one over the tied argmax, never to NaN
        z = z - z.amax(dim=-1, keepdim=True)
    if config.temperature != 1.0:
        z = z / config.temperature
    vocab = z.shape[-1]
    if 0 < config.top_k < vocab:
        kth = torch.topk(z, config.top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, -math.inf)
    if config.top_p < 1.0:
        z_sorted, order = torch.sort(z, dim=-1, descending=True, stable=True)
        cum = z_sorted.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = torch.zeros_like(cum, dtype=torch.bool)
        remove_sorted[..., 1:] = cum[..., :-1] >= config.top_p  # mass strictly before; top token stays
        remove = torch.empty_like(remove_sorted).scatter_(-1, order, remove_sorted)
        z = z.masked_fill(remove, -math.inf)
    return z


def adjust(
    logits: torch.Tensor,
    config: SamplingConfig,
    dtype: torch.dtype = torch.float32,
    *,
    validate: bool = True,
) -> torch.Tensor:
    """The adjusted sampling distribution ``[..., V]`` (rows sum to 1) for ``logits`` under ``config``, in
    ``dtype`` (a floating-point one)."""
    if isinstance(config, SamplingConfig) and config.greedy:
        check_dtype("dtype", dtype)
        if validate:
            _check_logits(logits)
        return _one_hot_argmax(logits, dtype)
    return adjust_logits(logits, config, dtype, validate=validate).softmax(dim=-1)
