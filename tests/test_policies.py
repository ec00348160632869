"""Draft-length policies: validation, stopping rules, statelessness."""

import dataclasses
import math

import pytest

from spade_lib.decoding.policies import ConfidenceThreshold, EntropyThreshold, FixedGamma, Policy, as_policy


def test_fixed_gamma_never_stops_early():
    p = FixedGamma(3)
    assert p.max_gamma == 3 and p.gamma == 3
    assert not p.needs_signals
    assert all(p.keep_drafting(t, h) for t, h in [(0.0, 10.0), (1.0, 0.0)])


def test_confidence_threshold_stops_below_threshold():
    p = ConfidenceThreshold(threshold=0.4, max_gamma=6)
    assert p.needs_signals and p.max_gamma == 6
    assert p.keep_drafting(0.4, 5.0)       # at the threshold: keep going
    assert not p.keep_drafting(0.39, 0.0)  # below: stop
    assert ConfidenceThreshold().threshold == 0.4 and ConfidenceThreshold().max_gamma == 20  # HF defaults
    assert ConfidenceThreshold(threshold=0.0).keep_drafting(0.0, 1.0)


def test_entropy_threshold_stops_above_threshold():
    p = EntropyThreshold(threshold=1.0, max_gamma=5)
    assert p.keep_drafting(0.1, 1.0)
    assert not p.keep_drafting(0.9, 1.01)
    assert EntropyThreshold(threshold=math.inf).keep_drafting(0.0, 1e9)


def test_policies_are_frozen_and_hashable():
    for p in (FixedGamma(2), ConfidenceThreshold(), EntropyThreshold()):
        assert isinstance(p, Policy)
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.max_gamma = 9  # type: ignore[misc]
        assert hash(p) == hash(dataclasses.replace(p))


@pytest.mark.parametrize("make, arg", [
    (lambda: FixedGamma(0), "gamma"),
    (lambda: FixedGamma(2.5), "gamma"),
    (lambda: FixedGamma(True), "gamma"),
    (lambda: ConfidenceThreshold(threshold=1.5), "threshold"),
    (lambda: ConfidenceThreshold(max_gamma=0), "max_gamma"),
    (lambda: EntropyThreshold(threshold=-0.1), "threshold"),
    (lambda: EntropyThreshold(threshold=math.nan), "threshold"),
    (lambda: as_policy(), "gamma/policy"),
    (lambda: as_policy(2, FixedGamma(2)), "gamma/policy"),
    (lambda: as_policy(policy="fixed"), "policy"),
])
def test_bad_arguments_name_the_argument(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


def test_as_policy():
    assert as_policy(gamma=3) == FixedGamma(3)
    c = ConfidenceThreshold(0.3, 8)
    assert as_policy(policy=c) is c
