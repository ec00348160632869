"""A draft model held in half the bytes: its linear weights rounded to bfloat16, everything else shared.

A draft step on a CPU streams the draft's weights from memory, so its cost ``c`` (a draft step over a target
step) is about the ratio of the bytes the two read; rounding the draft's matrices to bf16 halves its bytes and
about halves ``c``. Only the draft changes: the target and the verification stay fp32, so the output of
speculative decoding is the target's exactly as before (greedy: equal tokens; sampling: the rule accepts with
the probabilities of the draft that proposed, whatever that draft is), and what the rounding costs shows up where
it belongs, in the acceptance rate.

:func:`bf16_twin` makes the rounded model: each ``nn.Linear`` of the layers and the LM head becomes a
:class:`WidenedLinear` holding ``bf16(W)`` (round to nearest even) and computing ``y = x widen(W)^T + b`` with
``widen`` exact (a bf16 is the high half of an fp32), in the input's dtype; the embedding, norms, biases, rotary
tables and configuration are shared with (or copied from) the fp32 model, which is left as it was. Its Hugging Face
forward is therefore the reference function of the rounded model; SPADE's lean forward reads the bf16 weights in
place with the native kernel (:mod:`spade_lib.decoding.model.lean`, ``weight_dtype``) and agrees with it to fp32
rounding.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from spade_lib.zoo.loading import shared_copy

__all__ = ["WidenedLinear", "bf16_twin"]


class WidenedLinear(nn.Linear):
    """``nn.Linear`` with its weight stored in bf16: ``y = x widen(W)^T + b`` in ``x``'s dtype (``widen``: exact).
    A subclass of ``nn.Linear`` (an FR-Spec ``SubsetLMHead``) is widened as a class deriving from both, so its own
    forward runs around this product."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)


_CLASSES: dict[type, type] = {nn.Linear: WidenedLinear}  # a linear class -> its widened class


def _widened(linear: nn.Linear) -> nn.Linear:
    """A copy of ``linear`` (its class widened: :class:`WidenedLinear`) holding ``bf16(linear.weight)``; its bias
    and buffers shared."""
    cls = type(linear)
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Widened{cls.__name__}", (cls, WidenedLinear), {"__module__": __name__})
    out = shared_copy(linear)
    out.__class__ = _CLASSES[cls]
    with torch.no_grad():
        out.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
    return out


def _twin(module: nn.Module) -> nn.Module:
    """``module`` with every ``nn.Linear`` below it replaced by a :func:`_widened` copy; every other module a
    :func:`spade_lib.zoo.loading.shared_copy`, its parameters and buffers shared."""
    if isinstance(module, nn.Linear):
        return _widened(module)
    twin = shared_copy(module)
    for name, child in module._modules.items():
        if child is not None:
            twin._modules[name] = _twin(child)
    return twin


def bf16_twin(model: nn.Module) -> nn.Module:
    """``model`` (a causal LM with fp32 weights) with the linear weights of its layers and LM head held in bf16
    (:class:`WidenedLinear`), sharing its embedding, norms, biases and buffers; its own configuration (a deep
    copy). ``model`` is unchanged. New memory: two bytes per linear weight (~0.78 GB for Qwen2.5-Coder-0.5B with
    a 32 k-token head)."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"model: a {type(model).__name__} has no nn.Linear weights to hold in bf16")
    bad = sorted({str(m.weight.dtype) for m in linears} - {"torch.float32"})
    if bad:
        raise ValueError(f"model: bf16_twin rounds fp32 weights, found {bad}")
    twin = _twin(model)
    twin.config = copy.deepcopy(model.config)
    return twin
