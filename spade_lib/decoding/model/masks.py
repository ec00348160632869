"""Attention masks, defined once for every forward: which keys a query row sees.

A query at absolute position ``p`` sees a key at position ``s`` iff

- the key is a real token (``key_valid``: not a hole of a ragged batch),
- ``s <= p`` (causal: :func:`causal`), and
- in a sliding-window layer of width ``w``, ``s > p - w`` (:func:`in_window`).

A draft tree's node sees the cache before the tree and its own path: :func:`ancestor_mask` (``M[i, j]`` iff ``j``
is ``i`` or one of its ancestors); its keys inside the block are slots, not positions, so a tree composes
:func:`ancestor_mask` with :func:`in_window` only. A query always sees its own slot. Boolean masks are True where
seen (``F.scaled_dot_product_attention``'s convention); :func:`additive` turns one into the additive form the
attention kernels add to their scores (``0`` where seen, ``fill`` elsewhere: ``-inf`` or the dtype's minimum).
The lean forward (:mod:`~spade_lib.decoding.model.lean`), its batched form (``lean_batch``), the batched HF path
(:mod:`spade_lib.decoding.batch`) and the EAGLE head compose their masks from these.
"""

from __future__ import annotations

import torch

__all__ = ["additive", "ancestor_mask", "causal", "in_window", "causal_additive"]


def causal(q_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
    """``[..., k, S]`` bool: key ``s`` at or before query ``p`` (``q_pos [..., k]``, ``key_pos [..., S]``)."""
    return key_pos[..., None, :] <= q_pos[..., :, None]


def in_window(q_pos: torch.Tensor, key_pos: torch.Tensor, window: int) -> torch.Tensor:
    """``[..., k, S]`` bool: key ``s`` within the sliding window of query ``p``, ``s > p - window``."""
    return key_pos[..., None, :] > q_pos[..., :, None] - window


def additive(seen: torch.Tensor, dtype: torch.dtype, fill: float = float("-inf")) -> torch.Tensor:
    """The additive form of the boolean mask ``seen``: ``0`` where True, ``fill`` elsewhere, in ``dtype``."""
    return torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(~seen, fill)


def causal_additive(m: int, past: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """``[1, 1, m, past + m]``: ``m`` new rows after ``past`` cached ones, row ``i`` seeing keys ``<= past + i``
    (``None`` for one row, which sees everything)."""
    if m == 1:
        return None
    keys = torch.arange(past + m, device=device)
    return additive(causal(past + torch.arange(m, device=device), keys), dtype)[None, None]


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """``M [N, N]`` bool, ``M[i, j]`` iff ``j`` is ``i`` or an ancestor of ``i`` (``parents [N]``, ``-1`` =
    child of the root). Transitive closure of ``I + A`` (``A[i, parents[i]] = 1``) by repeated squaring:
    ``ceil(log2 N)`` boolean products on the device, no host sync."""
    n = int(parents.shape[0])
    m = torch.eye(n, dtype=torch.bool, device=parents.device)
    if n == 0:
        return m
    has = parents >= 0
    m[torch.arange(n, device=parents.device)[has], parents[has]] = True
    reach = 1
    while reach < n:  # m covers ancestors up to 2 * reach generations up after each squaring
        m = (m.to(torch.float32) @ m.to(torch.float32)) > 0
        reach *= 2
    return m
