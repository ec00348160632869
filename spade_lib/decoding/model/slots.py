"""The slot book of a batched KV cache: which of ``R`` rows' ``S`` cache slots hold a committed token, and where.

A batched cache appends as many slots to every row at once; a row with fewer tokens (left padding, a shorter
draft, a rejected tail, a tree's other branches) gets *holes*. :class:`Slots` keeps, for ``R`` rows,

- ``mask [R, S]`` (1 = a valid slot), ``pos [R, S]`` (the position of each slot), ``length [R]`` (valid slots),

and the bookkeeping every batched cache shares: :meth:`~Slots.rollback` (keep each row's first ``l_r`` valid
slots), :meth:`~Slots.keep` (after a tree: the slots before the block and each row's root and accepted path),
:meth:`~Slots.select` (a subset of the rows) and :meth:`~Slots.tidy` (crop the slots that are holes in every
row at the end; when ``S > 2 max_r l_r +`` :data:`COMPACT_SLACK`, gather every row's valid slots, in order,
right-aligned). A subclass holds the keys and values and moves them in three hooks, ``_select_kv(rows)``,
``_crop_kv(last)`` and ``_gather_kv(idx)`` (``idx [R, width]``: the slots each row keeps, in order). The two caches:
:class:`~spade_lib.decoding.model.lean_batch.LeanBatch` (the lean weights) and
:class:`~spade_lib.decoding.batch.BatchLM` (HF's forward, ``DynamicCache``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["COMPACT_SLACK", "Slots"]

COMPACT_SLACK = 16  # a batched cache is compacted when its slots exceed 2 x (longest row) + this


class Slots:
    """``mask``, ``pos`` and ``length`` of ``n_rows`` rows on ``device`` (module docstring)."""

    def __init__(self, n_rows: int, device):
        self.device = device
        self.mask = torch.zeros(n_rows, 0, dtype=torch.long, device=device)   # [R, S] 1 = valid slot
        self.pos = torch.zeros(n_rows, 0, dtype=torch.long, device=device)    # [R, S] position of a slot
        self.length = torch.zeros(n_rows, dtype=torch.long, device=device)    # [R] valid slots per row

    @property
    def slots(self) -> int:
        return int(self.mask.shape[1])

    def rollback(self, length: torch.Tensor) -> None:
        """Keep each row's first ``length[r]`` valid slots (``length [R]``); the later ones become holes."""
        self.mask = self.mask * (self.mask.cumsum(dim=-1) <= length[:, None])
        self.length = length.clone()

    def keep(self, slots: Sequence[Sequence[int]], *, start: int) -> None:
        """Keep each row's slots before ``start`` and its block slots ``start + slots[r]`` (increasing; after a
        tree: the root and the accepted path, at consecutive positions); every other block slot becomes a hole."""
        R = self.mask.shape[0]
        if len(slots) != R:
            raise ValueError(f"slots: {len(slots)} lists for {R} rows")
        block = torch.zeros(R, self.slots - start, dtype=torch.long, device=self.device)
        rows = torch.tensor([r for r, s in enumerate(slots) for _ in s], dtype=torch.long, device=self.device)
        cols = torch.tensor([j for s in slots for j in s], dtype=torch.long, device=self.device)
        block[rows, cols] = 1
        self.mask = torch.cat([self.mask[:, :start], self.mask[:, start:] * block], dim=1)
        self.length = self.mask.sum(dim=-1)

    def select(self, rows: torch.Tensor | Sequence[int]) -> None:
        """Keep only these rows of the batch."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        self._select_kv(rows)
        self.mask, self.pos, self.length = self.mask[rows], self.pos[rows], self.length[rows]

    def tidy(self) -> None:
        """Crop the slots that are holes in every row at the end; compact when holes dominate (module docstring)."""
        used = self.mask.any(dim=0)
        last = int(used.nonzero().max()) + 1 if bool(used.any()) else 0
        if last < self.slots:
            self._crop_kv(last)
            self.mask, self.pos = self.mask[:, :last], self.pos[:, :last]
        width = int(self.length.max()) if self.length.numel() else 0
        if self.slots > 2 * width + COMPACT_SLACK:
            self._compact(width)

    def _compact(self, width: int) -> None:
        """Gather every row's valid slots, in order, right-aligned into ``width`` slots."""
        R, S = self.mask.shape
        order = torch.arange(S, device=self.device).expand(R, S)
        key = torch.where(self.mask.bool(), order, order - S)  # holes sort first, valid slots keep their order
        idx = key.argsort(dim=-1, stable=True)[:, S - width:]   # [R, width]
        self._gather_kv(idx)
        self.mask, self.pos = self.mask.gather(1, idx), self.pos.gather(1, idx)

    def _select_kv(self, rows: torch.Tensor) -> None:
        raise NotImplementedError

    def _crop_kv(self, last: int) -> None:
        raise NotImplementedError

    def _gather_kv(self, idx: torch.Tensor) -> None:
        raise NotImplementedError
