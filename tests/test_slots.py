"""The slot book of a batched cache (spade_lib/decoding/model/slots.py): rollback, keep, select and tidy move the
mask, positions and lengths as the batched decoders expect, and hand the keys and values the same moves."""

from __future__ import annotations

import pytest
import torch

from spade_lib.decoding.model import slots
from spade_lib.decoding.model.slots import Slots


class Book(Slots):
    """A cache whose 'keys' are the slots' own positions, so every hook's move can be read back."""

    def __init__(self, mask, pos):
        super().__init__(len(mask), "cpu")
        self.mask, self.pos = torch.tensor(mask), torch.tensor(pos)
        self.length = self.mask.sum(dim=-1)
        self.kv = self.pos.clone()
        self.calls = []

    def _select_kv(self, rows):
        self.calls.append(("select", rows.tolist()))
        self.kv = self.kv[rows]

    def _crop_kv(self, last):
        self.calls.append(("crop", last))
        self.kv = self.kv[:, :last]

    def _gather_kv(self, idx):
        self.calls.append(("gather", idx.tolist()))
        self.kv = self.kv.gather(1, idx)


def test_rollback_keeps_each_rows_first_valid_slots():
    b = Book([[0, 1, 1, 1, 1], [1, 1, 0, 1, 1]], [[0, 0, 1, 2, 3], [0, 1, 1, 2, 3]])
    b.rollback(torch.tensor([2, 3]))
    assert b.mask.tolist() == [[0, 1, 1, 0, 0], [1, 1, 0, 1, 0]] and b.length.tolist() == [2, 3]


def test_keep_holds_the_slots_before_the_block_and_each_rows_path():
    b = Book([[1, 1, 1, 1, 1, 1], [1, 0, 1, 1, 1, 0]], [[0, 1, 2, 3, 3, 4], [0, 0, 1, 2, 2, 0]])
    b.keep([[0, 2, 3], [0, 1]], start=2)
    assert b.mask.tolist() == [[1, 1, 1, 0, 1, 1], [1, 0, 1, 1, 0, 0]] and b.length.tolist() == [5, 3]
    with pytest.raises(ValueError, match="slots: 1 lists for 2 rows"):
        b.keep([[0]], start=2)


def test_select_moves_rows_and_their_keys():
    b = Book([[1, 1], [1, 0], [0, 1]], [[0, 1], [0, 0], [0, 0]])
    b.select([2, 0])
    assert b.mask.tolist() == [[0, 1], [1, 1]] and b.length.tolist() == [1, 2] and b.calls == [("select", [2, 0])]
    assert b.kv.tolist() == b.pos.tolist()


def test_tidy_crops_trailing_holes_then_compacts_in_order(monkeypatch):
    b = Book([[0, 1, 0, 1, 0, 0], [1, 0, 1, 0, 0, 0]], [[0, 0, 1, 1, 2, 2], [0, 1, 1, 2, 2, 2]])
    monkeypatch.setattr(slots, "COMPACT_SLACK", 10)
    b.tidy()  # 6 slots, 2 valid each: cropped to 4, not compacted under the slack
    assert b.calls == [("crop", 4)] and b.slots == 4
    monkeypatch.setattr(slots, "COMPACT_SLACK", -10)
    b.calls.clear()
    b.tidy()  # compacted: each row's valid slots, in order, right-aligned into 2 slots
    assert b.calls == [("gather", [[1, 3], [0, 2]])]
    assert b.mask.tolist() == [[1, 1], [1, 1]] and b.pos.tolist() == [[0, 1], [0, 1]] and b.kv.tolist() == b.pos.tolist()


def test_the_hooks_are_required():
    b = Slots(2, "cpu")
    with pytest.raises(NotImplementedError):
        b.select([0])
