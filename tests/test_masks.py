"""The attention masks every forward composes (spade_lib.decoding.model.masks), against explicit loops."""

import torch

from spade_lib.decoding.model import masks


def _explicit(q_pos, key_pos, window=None):
    return torch.tensor([[s <= p and (window is None or s > p - window) for s in key_pos] for p in q_pos])


def test_causal_and_window_match_the_definition():
    q, keys = torch.tensor([3, 4, 5]), torch.arange(6)
    assert masks.causal(q, keys).tolist() == _explicit(q.tolist(), keys.tolist()).tolist()
    both = masks.causal(q, keys) & masks.in_window(q, keys, 2)
    assert both.tolist() == _explicit(q.tolist(), keys.tolist(), window=2).tolist()
    assert both.sum(dim=-1).tolist() == [2, 2, 2]  # a window of 2: the query and the key before it


def test_batched_shapes_broadcast_per_row():
    q = torch.tensor([[2, 3], [0, 1]])                 # [R=2, k=2]
    keys = torch.tensor([[0, 1, 2, 3], [0, 0, 0, 1]])  # [R=2, S=4]
    out = masks.causal(q, keys)
    assert out.shape == (2, 2, 4)
    for r in range(2):
        assert out[r].tolist() == _explicit(q[r].tolist(), keys[r].tolist()).tolist()


def test_additive_form_and_fill():
    seen = torch.tensor([[True, False], [True, True]])
    inf = masks.additive(seen, torch.float32)
    assert inf.tolist() == [[0.0, float("-inf")], [0.0, 0.0]]
    low = masks.additive(seen, torch.float16, torch.finfo(torch.float16).min)
    assert low.dtype == torch.float16 and low[0, 1].item() == torch.finfo(torch.float16).min


def test_causal_additive_rows_after_a_cache():
    assert masks.causal_additive(1, 5, torch.float32, "cpu") is None  # one row sees everything
    m = masks.causal_additive(3, 2, torch.float32, "cpu")
    assert m.shape == (1, 1, 3, 5)
    assert (m[0, 0] == 0).tolist() == _explicit([2, 3, 4], list(range(5))).tolist()


def test_ancestor_mask_is_the_transitive_closure():
    parents = torch.tensor([-1, 0, 0, 1, 3, -1])
    want = torch.zeros(6, 6, dtype=torch.bool)
    for i in range(6):
        j = i
        while j >= 0:
            want[i, j] = True
            j = int(parents[j])
    assert masks.ancestor_mask(parents).tolist() == want.tolist()
    assert masks.ancestor_mask(torch.zeros(0, dtype=torch.long)).shape == (0, 0)
