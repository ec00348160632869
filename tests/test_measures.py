"""Distribution measures: closed forms on worked examples, identities, shapes, edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from spade_lib.measures import alpha, distribution_stats, entropy, kl, tv


def test_worked_example():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    assert alpha(p, q).item() == pytest.approx(0.7)
    assert tv(p, q).item() == pytest.approx(0.3)
    assert kl(p, q).item() == pytest.approx(0.5 * math.log(2.5) + 0.2 * math.log(0.4))
    assert entropy(p).item() == pytest.approx(-sum(v * math.log(v) for v in (0.5, 0.3, 0.2)))


def test_alpha_is_one_minus_tv_per_position():
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(4, 5, 30, generator=gen, dtype=torch.float64).softmax(-1)
    q = torch.randn(4, 5, 30, generator=gen, dtype=torch.float64).softmax(-1)
    a = alpha(p, q)
    assert a.shape == (4, 5)
    torch.testing.assert_close(a, 1 - tv(p, q))
    assert (kl(p, q) >= 0).all() and (entropy(p) <= math.log(30) + 1e-12).all()


def test_edge_cases():
    one_hot = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    uniform = torch.full((3,), 1 / 3, dtype=torch.float64)
    other = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    assert alpha(one_hot, one_hot).item() == 1.0 and tv(one_hot, one_hot).item() == 0.0
    assert alpha(one_hot, other).item() == 0.0 and tv(one_hot, other).item() == 1.0
    assert entropy(one_hot).item() == 0.0
    assert entropy(uniform).item() == pytest.approx(math.log(3))
    assert kl(one_hot, other).item() == math.inf  # p has mass where q has none
    assert kl(uniform, uniform).item() == pytest.approx(0.0, abs=1e-15)
    assert kl(one_hot, uniform).item() == pytest.approx(math.log(3))


def test_distribution_stats_bundles_everything():
    gen = torch.Generator().manual_seed(1)
    p = torch.randn(3, 7, generator=gen).softmax(-1)
    q = torch.randn(3, 7, generator=gen).softmax(-1)
    stats = distribution_stats(p, q)
    assert set(stats) == {"alpha", "tv", "kl", "h_p", "h_q"}
    torch.testing.assert_close(stats["h_q"], entropy(q))
    assert all(v.shape == (3,) for v in stats.values())


def test_validation():
    with pytest.raises(ValueError, match="same shape"):
        alpha(torch.ones(2, 3) / 3, torch.ones(2, 4) / 4)
    with pytest.raises(ValueError, match="q must be"):
        tv(torch.ones(3) / 3, [1 / 3] * 3)
    with pytest.raises(ValueError, match="p must be"):
        entropy(torch.tensor([1, 0]))


def test_tau_is_the_mean_of_n_plus_one_with_and_without_the_bonus():
    """The one tau against its plain definition over per-step accepted counts, as numbers and per group."""
    import numpy as np
    import pandas as pd

    from spade_lib.measures import tau

    n = [2, 3, 0, 0, 4, 1, 1]
    assert tau(sum(n), len(n)) == sum(k + 1 for k in n) / len(n)
    assert tau(sum(n), len(n), with_bonus=False) == sum(n) / len(n)
    assert math.isnan(tau(0, 0))
    per_group = tau(pd.Series([5, 0, 6]), pd.Series([3, 2, 4]))
    assert isinstance(per_group, pd.Series)
    assert per_group.tolist() == [8 / 3, 1.0, 10 / 4]
    assert tau(np.array([5, 6]), np.array([3, 4]), with_bonus=False).tolist() == [5 / 3, 6 / 4]
