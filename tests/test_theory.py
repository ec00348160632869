"""Closed-form theory: Leviathan et al. (2023) Table 1 and Eq. 1, limits, and Monte-Carlo agreement."""

from __future__ import annotations

import numpy as np
import pytest

from spade_lib.theory import expected_tokens, free_draft_limit, ops_overhead, optimal_gamma, speedup


@pytest.mark.parametrize("alpha,gamma,tokens,ops", [(0.8, 5, 3.69, 1.63), (0.9, 10, 6.86, 1.60)])
def test_leviathan_table_1(alpha, gamma, tokens, ops):
    assert round(expected_tokens(alpha, gamma), 2) == tokens
    assert round(ops_overhead(alpha, gamma, 0.0), 2) == ops


def test_expected_tokens_limits_and_broadcasting():
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1 - 1e-12, 4) == pytest.approx(5.0)
    np.testing.assert_allclose(expected_tokens(0.5, np.array([1, 2, 3])), [1.5, 1.75, 1.875])
    np.testing.assert_allclose(expected_tokens(1.0, np.array([1, 2])), [2.0, 3.0])


def test_per_position_form():
    rates = [0.9, 0.8, 0.5]
    assert expected_tokens(rates) == pytest.approx(1 + 0.9 + 0.72 + 0.36)
    assert expected_tokens(rates, 2) == pytest.approx(1 + 0.9 + 0.72)
    assert expected_tokens([0.7] * 6) == pytest.approx(expected_tokens(0.7, 6))
    np.testing.assert_allclose(expected_tokens(np.array([[0.5, 0.5], [1.0, 1.0]])), [1.75, 3.0])
    assert speedup(rates, None, 0.1) == pytest.approx(expected_tokens(rates) / 1.3)
    with pytest.raises(ValueError, match="gamma"):
        expected_tokens(rates, 4)


def test_expected_tokens_matches_simulation():
    rng = np.random.default_rng(0)
    alpha, gamma = 0.7, 4
    accepted = rng.random((200_000, gamma)) < alpha
    n = np.cumprod(accepted, axis=1).sum(axis=1)
    assert (n + 1).mean() == pytest.approx(expected_tokens(alpha, gamma), abs=0.01)


def test_speedup():
    assert speedup(0.8, 5, 0.0) == pytest.approx(expected_tokens(0.8, 5))
    assert speedup(0.8, 5, 0.1) == pytest.approx(expected_tokens(0.8, 5) / 1.5)
    assert speedup(0.8, 5, 0.1, verify_cost=1.3) == pytest.approx(expected_tokens(0.8, 5) / 1.8)
    grid = speedup(0.8, np.arange(1, 4)[:, None], np.array([0.0, 0.1]))
    assert grid.shape == (3, 2)
    assert speedup(0.0, 3, 0.1) < 1  # nothing accepted: speculation costs time


def test_optimal_gamma():
    gammas = np.arange(1, 33)
    for alpha, c in [(0.8, 0.05), (0.6, 0.2), (0.95, 0.01), (0.9, 0.1)]:
        best = optimal_gamma(alpha, c)
        assert best == gammas[np.argmax(speedup(alpha, gammas, c))]
    assert optimal_gamma(1.0, 0.0, max_gamma=16) == 16
    assert optimal_gamma(0.0, 0.1) == 1
    assert optimal_gamma([0.9, 0.9, 0.1, 0.1], 0.05) == 2
    costs = 1 + 0.2 * np.arange(1, 9)  # verify cost growing with gamma favours shorter drafts
    assert optimal_gamma(0.8, 0.02, max_gamma=8, verify_cost=costs) < optimal_gamma(0.8, 0.02, max_gamma=8)


def test_free_draft_limit_bounds_speedup():
    assert free_draft_limit(0.75) == pytest.approx(4.0)
    assert free_draft_limit(1.0) == np.inf
    np.testing.assert_allclose(free_draft_limit(np.array([0.0, 0.5])), [1.0, 2.0])
    assert speedup(0.75, 200, 0.0) == pytest.approx(4.0)
    assert speedup(0.75, 10, 0.0) < free_draft_limit(0.75)


def test_ops_overhead():
    assert ops_overhead(1.0, 4, 0.0) == pytest.approx(1.0)  # everything accepted: no waste
    assert ops_overhead(0.0, 4, 0.1) == pytest.approx(4 * 0.1 + 4 + 1)


@pytest.mark.parametrize("call,match", [
    (lambda: expected_tokens(1.2, 3), "alpha"),
    (lambda: expected_tokens(0.5, -1), "gamma"),
    (lambda: speedup(0.5, 0, 0.1), "gamma"),
    (lambda: expected_tokens(0.5, 2.5), "gamma"),
    (lambda: expected_tokens(0.5), "gamma is required"),
    (lambda: speedup(0.5, 3, -0.1), "c must"),
    (lambda: speedup(0.5, 3, 0.1, verify_cost=0), "verify_cost"),
    (lambda: ops_overhead(0.5, 3, -1), "c_hat"),
    (lambda: optimal_gamma(0.5, 0.1, max_gamma=0), "max_gamma"),
    (lambda: optimal_gamma(0.5, [0.1, 0.2]), "c must"),
    (lambda: free_draft_limit(float("nan")), "alpha"),
])
def test_validation(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("call,name", [
    (lambda: expected_tokens("0.8", 4), "alpha"),
    (lambda: expected_tokens(True, 4), "alpha"),
    (lambda: expected_tokens(np.array([True, False])), "alpha"),
    (lambda: expected_tokens(0.8, "4"), "gamma"),
    (lambda: expected_tokens(0.8, True), "gamma"),
    (lambda: speedup("0.8", 4, 0.1), "alpha"),
    (lambda: speedup(0.8, 4, "0.1"), "c"),
    (lambda: speedup(0.8, 4, 0.1, verify_cost=True), "verify_cost"),
    (lambda: optimal_gamma(True, 0.1), "alpha"),
    (lambda: optimal_gamma(0.8, "0.1"), "c"),
    (lambda: optimal_gamma(0.8, 0.1, verify_cost="1.2"), "verify_cost"),
    (lambda: ops_overhead(0.8, 4, False), "c_hat"),
    (lambda: free_draft_limit("0.5"), "alpha"),
])
def test_str_and_bool_are_refused_by_name(call, name):
    with pytest.raises(TypeError, match=rf"^{name}: must be"):
        call()


def test_arrays_of_floats_still_work():
    np.testing.assert_allclose(expected_tokens(np.array([0.5, 0.8]), 2), 1 + 0.5 + 0.4)
    np.testing.assert_allclose(expected_tokens([0.5, 0.8], np.float64(2.0)), 1 + 0.5 + 0.4)
    np.testing.assert_allclose(speedup(np.float32(0.8), np.array([1, 2]), [0.1, 0.1]),
                               [speedup(0.8, 1, 0.1), speedup(0.8, 2, 0.1)], rtol=1e-6)
    assert optimal_gamma(np.array([0.9, 0.8, 0.1]), 0.05) == 2


def test_cost_model_takes_a_number_or_a_callable():
    from spade_lib.theory import linear_verify_cost, step_cost, verify_cost_at

    r = linear_verify_cost(1.5, 4)
    assert r(4) == pytest.approx(1.5) and r(0) == 1.0
    assert step_cost(4, 0.1, r) == pytest.approx(0.4 + 1.5)
    np.testing.assert_allclose(step_cost(np.array([2, 4]), 0.1, r), [0.2 + 1.25, 0.4 + 1.5])
    np.testing.assert_allclose(verify_cost_at(r, np.arange(1, 4)), [r(1), r(2), r(3)])
    assert speedup(0.8, 4, 0.1, verify_cost=r) == pytest.approx(speedup(0.8, 4, 0.1, verify_cost=1.5))
    grid = np.arange(1, 9)
    assert optimal_gamma(0.8, 0.02, max_gamma=8, verify_cost=r) == \
        optimal_gamma(0.8, 0.02, max_gamma=8, verify_cost=np.array([r(g) for g in grid]))
    with pytest.raises(ValueError, match="verify_cost"):
        step_cost(2, 0.1, lambda g: 0.0)


def test_verify_cost_curve_is_the_one_interpolation_of_r():
    """r(g) from measured points: the points themselves, r(0) = 1, linear between, the last two points' line
    beyond; one point is linear_verify_cost's line through (0, 1)."""
    from spade_lib.theory import linear_verify_cost, verify_cost_curve

    r = verify_cost_curve({1: 1.1, 2: 1.3, "4": 1.9})  # JSON keys are strings
    assert [r(g) for g in (0, -1, 1, 2, 4)] == pytest.approx([1.0, 1.0, 1.1, 1.3, 1.9])
    assert r(3) == pytest.approx(1.6) and r(6) == pytest.approx(1.9 + 2 * 0.3)
    one, line = verify_cost_curve({4: 1.5}), linear_verify_cost(1.5, 4)
    assert [one(g) for g in range(9)] == pytest.approx([line(g) for g in range(9)])
    assert [line(g) for g in (2, 8)] == pytest.approx([1.25, 2.0])
    for bad in ({}, {0: 1.2}, {2: 0.0}, {2: float("nan")}):
        with pytest.raises(ValueError, match="points"):
            verify_cost_curve(bad)


def test_expected_tokens_of_a_step_that_drafts_nothing_is_one():
    assert expected_tokens(0.7, 0) == 1.0 and expected_tokens(1.0, 0) == 1.0
    np.testing.assert_allclose(expected_tokens(0.5, np.array([0, 1, 2])), [1.0, 1.5, 1.75])


def test_overhead_is_one_more_cost_per_step():
    from spade_lib.theory import step_cost

    # tau / (gamma c + r(gamma) + o): the default o = 0 is the unchanged model
    assert speedup(0.8, 4, 0.1, verify_cost=1.2) == speedup(0.8, 4, 0.1, verify_cost=1.2, overhead=0.0)
    assert speedup(0.8, 4, 0.1, verify_cost=1.2, overhead=0.3) == pytest.approx(expected_tokens(0.8, 4) / (0.4 + 1.2 + 0.3))
    assert step_cost(4, 0.1, lambda g: 1 + 0.1 * g, overhead=0.25) == pytest.approx(0.4 + 1.4 + 0.25)
    np.testing.assert_allclose(step_cost(np.array([1, 2]), 0.5, 1.0, overhead=0.5), [2.0, 2.5])
    with pytest.raises(ValueError, match="overhead"):
        speedup(0.8, 4, 0.1, overhead=-0.1)
    # a per-step cost favours longer blocks: the optimum moves up (alpha 0.7, c 0.2: 3 without, 4 with o = 1)
    assert optimal_gamma(0.7, 0.2) < optimal_gamma(0.7, 0.2, overhead=1.0)
    with pytest.raises(ValueError, match="overhead"):
        optimal_gamma(0.7, 0.2, overhead=[1.0, 2.0])
