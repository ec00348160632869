"""TLI is lossless, a naive re-encoding rule is not: exact enumeration in fp64 on synthetic vocabularies."""
import pytest
import torch

from spade_lib.decoding.crossvocab import emitted_law, intersection_map, naive_emitted_law, tli_distribution

# the same strings tokenised differently: "ab" merges in the target, splits in the draft; "cd" the reverse
TARGET = {"a": 0, "b": 1, "ab": 2, "c": 3, "e": 4}
DRAFT = {"a": 0, "b": 1, "c": 2, "cd": 3, "d": 4, "e": 5}


def test_tli_emitted_law_is_target():
    g = torch.Generator().manual_seed(0)
    d_ids, t_ids = intersection_map(DRAFT, TARGET)
    assert sorted(t_ids.tolist()) == [0, 1, 3, 4]
    for _ in range(50):
        p = torch.rand(len(TARGET), generator=g, dtype=torch.float64).softmax(-1)
        q = (3 * torch.rand(len(DRAFT), generator=g, dtype=torch.float64)).softmax(-1)
        law = emitted_law(p, tli_distribution(q, d_ids, t_ids, len(TARGET)))
        assert torch.allclose(law, p, atol=1e-12, rtol=0)


def test_naive_rule_is_lossy():
    g = torch.Generator().manual_seed(1)
    to_target = torch.tensor([TARGET["a"], TARGET["b"], TARGET["c"], TARGET["c"], TARGET["e"], TARGET["e"]])
    worst = 0.0
    for _ in range(50):
        p = torch.rand(len(TARGET), generator=g, dtype=torch.float64).softmax(-1)
        q = (3 * torch.rand(len(DRAFT), generator=g, dtype=torch.float64)).softmax(-1)
        worst = max(worst, float((naive_emitted_law(p, q, to_target) - p).abs().sum()) / 2)
    assert worst > 0.01


def test_no_intersection_refused():
    with pytest.raises(ValueError, match="draft_vocab"):
        intersection_map({"x": 0}, {"y": 0})
