"""Draft-length policies: validation, stopping rules, statelessness."""

import dataclasses
import math

import pytest

from spade_lib.decoding.drafts.policies import ConfidenceThreshold, EntropyThreshold, FixedGamma, Policy, as_policy


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


def test_start_hook_stateless_by_default_and_adaptive_is_a_registered_stateful_policy():
    from spade_lib.decoding.drafts.adaptive import AdaptiveGamma
    from spade_lib.decoding.drafts.policies import PolicyState, get_policy, policy_names, step_cap

    for p in (FixedGamma(3), ConfidenceThreshold(), EntropyThreshold()):
        assert p.start() is None and step_cap(p, None) == p.max_gamma
    assert "adaptive" in policy_names()
    pol = get_policy("adaptive", c=0.05, verify_cost=[1.0] * 6, max_gamma=6)  # a JSON list stays hashable
    assert isinstance(pol, AdaptiveGamma) and pol.name == "adaptive" and hash(pol) == hash(dataclasses.replace(pol))
    a, b = pol.start(), pol.start()
    assert isinstance(a, PolicyState) and a is not b  # one fresh state per generation (per batch row)
    assert step_cap(pol, a) == a.gamma() == pol.gamma_at(pol.prior_alpha)
    for _ in range(10):
        a.observe(step_cap(pol, a), 0)
    assert step_cap(pol, a) == 1 and step_cap(pol, b) == pol.gamma_at(pol.prior_alpha)  # states are separate

    class Broken(PolicyState):
        def gamma(self):
            return 7

    with pytest.raises(ValueError, match=r"\[1, 6\]"):
        step_cap(pol, Broken())
    with pytest.raises(ValueError, match="stateful"):
        pol.replay_gamma(None)


def test_run_config_takes_the_adaptive_policy_by_name():
    from spade_lib.decoding.drafts.adaptive import AdaptiveGamma
    from spade_lib.runs.config import RunConfig

    c = RunConfig(policy="adaptive", max_gamma=5, device="cpu",
                  policy_options={"c": 0.1, "verify_cost": [1.0, 1.1, 1.2, 1.3, 1.4], "decay": 0.8})
    assert c.make_policy() == AdaptiveGamma(c=0.1, verify_cost=(1.0, 1.1, 1.2, 1.3, 1.4), max_gamma=5, decay=0.8)
    assert c.hash == RunConfig(**c.to_dict()).hash
    with pytest.raises(ValueError, match="decay"):
        RunConfig(policy="adaptive", device="cpu", policy_options={"decay": 0})
    with pytest.raises(ValueError, match="policy_options"):
        RunConfig(policy="adaptive", device="cpu", policy_options={"threshold": 0.3})
