"""A draft model held in fewer bytes: its linear weights rounded to bf16 or int8, everything else shared.

A draft step on a CPU streams the draft's weights from memory, so its cost ``c`` (a draft step over a target
step) is about the ratio of the bytes the two read; holding the draft's matrices in bf16 (2 bytes a weight) or
int8 (1 byte, and a scale per row) cuts its bytes and ``c`` with them. Only the draft changes: the target and the
verification stay fp32, so the output of speculative decoding is the target's exactly as before (greedy: equal
tokens; sampling: the rule accepts with the probabilities of the draft that proposed, whatever that draft is), and
what the rounding costs shows up where it belongs, in the acceptance rate.

:func:`narrow_twin` makes the rounded model: each ``nn.Linear`` of the layers and the LM head becomes a
:class:`WidenedLinear` holding, for ``"bf16"``, ``bf16(W)`` (round to nearest even), for ``"int8"``, ``W8`` and a
scale per weight row, ``s_n = max_k |W_nk| / 127``, ``W8_nk = round(W_nk / s_n)`` (symmetric; ``|W - s W8| <= s /
2``), and computing ``y = x widen(W)^T + b`` (int8: ``widen(W) = s[:, None] * W8``; ``widen`` of a bf16 or an int8
exact) in the input's dtype. The embedding, norms, biases, rotary tables and configuration are shared with (or
copied from) the fp32 model, which is left as it was. Its Hugging Face forward is the reference function of the
rounded model; SPADE's lean forward reads the narrow weights in place with the native kernel
(:mod:`spade_lib.decoding.model.lean`, ``weight_dtype``) and agrees with it to fp32 rounding.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from spade_lib.decoding.model.kernels import SCALE
from spade_lib.zoo.loading import shared_copy

__all__ = ["FORMATS", "WidenedLinear", "narrow_twin", "quantize_int8"]

FORMATS = {"bf16": torch.bfloat16, "int8": torch.int8}  # the narrow weight formats (two bytes and one a weight)


class WidenedLinear(nn.Linear):
    """``nn.Linear`` with its weight stored narrow: ``y = x widen(W)^T + b`` in ``x``'s dtype (bf16: ``widen``
    exact; int8: ``s[:, None] * W8`` with the buffer ``kernels.SCALE``). A subclass of ``nn.Linear`` (an FR-Spec
    ``SubsetLMHead``) is widened as a class deriving from both, so its own forward runs around this product."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.to(x.dtype)
        scale = getattr(self, SCALE, None)
        if scale is not None:
            w = w * scale.to(x.dtype)[:, None]
        return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))


_CLASSES: dict[type, type] = {nn.Linear: WidenedLinear}  # a linear class -> its widened class


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W8, s)`` for a fp32 ``w [N, K]``: ``s_n = max_k |w_nk| / 127`` (1 for an all-zero row), ``W8 =
    round(w / s[:, None])`` in ``[-127, 127]`` (int8), so ``|w - s W8| <= s / 2`` elementwise."""
    amax = w.detach().abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax)).float()
    w8 = torch.round(w.detach() / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return w8.contiguous(), scale.contiguous()


def _widened(linear: nn.Linear, fmt: str) -> nn.Linear:
    """A copy of ``linear`` (its class widened: :class:`WidenedLinear`) holding its weight in ``fmt``; its bias
    and buffers shared."""
    cls = type(linear)
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Widened{cls.__name__}", (cls, WidenedLinear), {"__module__": __name__})
    out = shared_copy(linear)
    out.__class__ = _CLASSES[cls]
    with torch.no_grad():
        if fmt == "bf16":
            out.weight = nn.Parameter(linear.weight.detach().to(FORMATS[fmt]), requires_grad=False)
        else:
            w8, scale = quantize_int8(linear.weight)
            out.weight = nn.Parameter(w8, requires_grad=False)
            out.register_buffer(SCALE, scale)
    return out


def _twin(module: nn.Module, fmt: str) -> nn.Module:
    """``module`` with every ``nn.Linear`` below it replaced by a :func:`_widened` copy; every other module a
    :func:`spade_lib.zoo.loading.shared_copy`, its parameters and buffers shared."""
    if isinstance(module, nn.Linear):
        return _widened(module, fmt)
    twin = shared_copy(module)
    for name, child in module._modules.items():
        if child is not None:
            twin._modules[name] = _twin(child, fmt)
    return twin


def narrow_twin(model: nn.Module, fmt: str) -> nn.Module:
    """``model`` (a causal LM with fp32 weights) with the linear weights of its layers and LM head held in ``fmt``
    (:data:`FORMATS`; :class:`WidenedLinear`), sharing its embedding, norms, biases and buffers; its own
    configuration (a deep copy). ``model`` is unchanged. New memory a linear weight: 2 bytes (bf16; ~0.78 GB for
    Qwen2.5-Coder-0.5B with a 32 k-token head) or 1 byte and 4 bytes a row (int8; ~0.39 GB)."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt: must be one of {list(FORMATS)}, got {fmt!r}")
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"model: a {type(model).__name__} has no nn.Linear weights to hold in {fmt}")
    bad = sorted({str(m.weight.dtype) for m in linears} - {"torch.float32"})
    if bad:
        raise ValueError(f"model: narrow_twin rounds fp32 weights, found {bad}")
    twin = _twin(model, fmt)
    twin.config = copy.deepcopy(model.config)
    return twin
