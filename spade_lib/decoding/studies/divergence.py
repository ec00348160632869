"""Greedy-divergence diagnosis: is a mismatch between two greedy decodes a numeric near-tie or a bug?

Greedy speculative decoding is exactly the target's greedy decode *in exact arithmetic*. In floating
point, the target's logits for one position differ by rounding between a 1-token forward and a
``gamma + 1``-token verification forward (different kernel shapes and reduction orders); in bf16/fp16
that can flip the argmax where the top two logits are nearly equal.

:func:`compare_greedy` finds the first index ``i`` where the continuations ``a`` and ``b`` differ (over
their common length), recomputes the target's logits ``z`` at that position from a fresh, cache-free
forward on ``prompt + a[:i]`` (the shared prefix), and classifies:

- ``"identical"``: no differing position;
- ``"near_tie"``: both tokens are within ``tie_threshold`` logits of the best,
  ``max(z_top1 - z_{a_i}, z_top1 - z_{b_i}) <= tie_threshold`` — a rounding-level disagreement;
- ``"bug"``: otherwise (a token the target clearly does not prefer was emitted).

Default thresholds (logit units, by the model's dtype; :data:`TIE_THRESHOLDS`): float32 ``1e-3``
(batched-vs-single rounding is ~1e-5 there), float16 ``0.05``, bfloat16 ``0.25`` (8 mantissa bits: a
relative error of 2^-8 on logits of size ~10-30, compounded over layers). They are heuristics; pass
``tie_threshold=`` to override.

:func:`classify_greedy` runs :func:`compare_greedy` over many cases (a run's generations against the
baseline's, batched rows against single ones) and counts the classes; :meth:`Divergence.describe` words a
mismatch.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import torch

from spade_lib.decoding.model.adapter import as_token_tensor

__all__ = ["Divergence", "CLASSES", "classify_greedy", "compare_greedy", "first_difference", "TIE_THRESHOLDS"]

TIE_THRESHOLDS: dict[torch.dtype, float] = {torch.float32: 1e-3, torch.float64: 1e-6, torch.float16: 0.05,
                                            torch.bfloat16: 0.25}
CLASSES = ("identical", "near_tie", "bug")  # compare_greedy's classifications


@dataclass(frozen=True)
class Divergence:
    """Where and why two greedy continuations differ."""

    first_index: int | None        # first differing position in the continuation (None: identical)
    a_token: int | None            # a[first_index]
    b_token: int | None            # b[first_index]
    target_top1: int | None        # target's argmax at that position (fresh forward)
    target_top2: int | None        # its runner-up
    logit_margin: float | None     # z_top1 - z_top2
    token_gap: float | None        # max(z_top1 - z_a, z_top1 - z_b): how far the worse token is from the best
    classification: str            # "identical", "near_tie" or "bug"
    tie_threshold: float

    def describe(self) -> str:
        """``"<classification> at token <i> (logit gap <gap>, threshold <t>)"``, or ``"identical"``."""
        if self.first_index is None:
            return self.classification
        return (f"{self.classification} at token {self.first_index} (logit gap {self.token_gap:.2e}, "
                f"threshold {self.tie_threshold:g})")


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ, over their common length (else None)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


@torch.inference_mode()
def compare_greedy(a_tokens: Sequence[int], b_tokens: Sequence[int], target: torch.nn.Module, prompt_ids, *,
                   tie_threshold: float | None = None) -> Divergence:
    """Compare two greedy continuations of ``prompt_ids`` by ``target``; see the module docstring."""
    param = next(target.parameters())
    if tie_threshold is None:
        tie_threshold = TIE_THRESHOLDS.get(param.dtype, 0.25)
    if not tie_threshold >= 0:
        raise ValueError(f"tie_threshold: must be >= 0, got {tie_threshold!r}")
    a, b = [int(t) for t in a_tokens], [int(t) for t in b_tokens]
    i = first_difference(a, b)
    if i is None:
        return Divergence(None, None, None, None, None, None, None, "identical", tie_threshold)
    prompt = as_token_tensor(prompt_ids, param.device)
    if prompt.numel() == 0:
        raise ValueError("prompt_ids: empty prompt")
    ids = torch.cat([prompt, torch.tensor(a[:i], dtype=torch.long, device=param.device)])
    z = target(ids[None], use_cache=False).logits[0, -1].float()
    top = torch.topk(z, 2)
    z1, z2 = top.values.tolist()
    t1, t2 = top.indices.tolist()
    gap = max(z1 - z[a[i]].item(), z1 - z[b[i]].item())
    kind = "near_tie" if gap <= tie_threshold else "bug"
    return Divergence(i, a[i], b[i], t1, t2, z1 - z2, gap, kind, tie_threshold)


def classify_greedy(cases: Iterable[tuple[Hashable, Sequence[int], Sequence[int], Sequence[int]]],
                    target: torch.nn.Module, *, tie_threshold: float | None = None
                    ) -> tuple[dict[str, int], list[tuple[Hashable, Divergence]]]:
    """:func:`compare_greedy` on each case ``(key, a_tokens, b_tokens, prompt_ids)``, in order. Returns the
    count of each class (:data:`CLASSES`, every one present) and ``(key, divergence)`` of every case that is
    not identical."""
    counts = dict.fromkeys(CLASSES, 0)
    found = []
    for key, a, b, ids in cases:
        d = compare_greedy(a, b, target, ids, tie_threshold=tie_threshold)
        counts[d.classification] += 1
        if d.classification != "identical":
            found.append((key, d))
    return counts, found
