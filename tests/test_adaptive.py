"""Adaptive gamma: the choice follows theory.optimal_gamma at the running estimate, uses past steps only,
and decoding with it stays exact (greedy equals autoregressive; the same seed replays)."""

import pytest
import torch

from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
from spade_lib.decoding.drafts.adaptive import AdaptiveGamma
from spade_lib.sampling import SamplingConfig
from spade_lib.theory import optimal_gamma


def test_gamma_follows_the_cost_model_and_the_evidence():
    pol = AdaptiveGamma(c=0.05, verify_cost=1.2, max_gamma=8, prior_alpha=0.6, prior_weight=4, decay=1.0)
    for a in (0.0, 0.3, 0.6, 0.9, 1.0):
        assert pol.gamma_at(a) == optimal_gamma(a, 0.05, 8, verify_cost=1.2)
    st = pol.start()
    assert st.gamma() == pol.gamma_at(0.6)
    for _ in range(20):
        st.observe(st.gamma(), 0)  # every draft rejected: alpha_hat falls, so does gamma
    low = st.gamma()
    assert st.alpha < 0.2 and low == 1
    for _ in range(40):
        st.observe(st.gamma(), st.gamma())  # all accepted
    assert st.alpha > 0.8 and st.gamma() > low
    st.observe(0, 0)  # a plain target step changes nothing
    assert st.history[-1] > 0


def test_bad_arguments():
    for kw in ({"c": -1}, {"max_gamma": 0}, {"verify_cost": (1.0, 1.1)}, {"decay": 0}, {"prior_alpha": 2},
               {"prior_weight": 0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            AdaptiveGamma(**kw)


def test_decoding_with_adaptive_gamma_is_exact(tiny):
    ids = tiny.tokenizer("The little cat")["input_ids"]
    pol = AdaptiveGamma(c=0.1, verify_cost=tuple(1 + 0.1 * g for g in range(1, 7)), max_gamma=6)
    greedy = SpeculativeDecoder(tiny.target, tiny.draft, policy=pol, sampling=SamplingConfig(temperature=0),
                                record="light")
    out = greedy.generate(ids, 40)
    ar = AutoregressiveDecoder(tiny.target, sampling=SamplingConfig(temperature=0))
    assert out.tokens == ar.generate(ids, 40).tokens
    assert len(set(out.gammas[:-1])) >= 1 and max(out.gammas) <= 6
    sampled = SpeculativeDecoder(tiny.target, tiny.draft, policy=pol, sampling=SamplingConfig(temperature=1),
                                 record="light")
    a, b = sampled.generate(ids, 30, seed=3), sampled.generate(ids, 30, seed=3)
    assert a.tokens == b.tokens and a.gammas == b.gammas


@pytest.mark.slow
def test_adaptive_sampling_distribution_equals_target_only_sampling(record_property):
    """Gamma depends on the previous step's outcome (2 after acceptance, 1 after a rejection), and the
    joint of the first 3 tokens still equals target-only sampling's (chi-square against enumeration)."""
    from spade_lib.exactness import counts_chi_square_pvalue
    from tests.test_decode import TEMP, VOCAB, ToyLM, exact_joint, perturbed, sample_counts

    target = ToyLM(VOCAB, seed=0)
    draft = perturbed(target, 0.5)
    sampling = SamplingConfig(temperature=TEMP)
    pol = AdaptiveGamma(c=0.2, verify_cost=1.0, max_gamma=2, prior_alpha=0.6, prior_weight=1.0, decay=1.0)
    assert pol.gamma_at(0.6) == 2 and pol.gamma_at(0.3) == 1
    dec = SpeculativeDecoder(target, draft, policy=pol, sampling=sampling, record="light")
    counts, _ = sample_counts(dec, [2], 1500)
    p = counts_chi_square_pvalue(counts, exact_joint(target, [2], sampling))
    record_property("p_value_adaptive", p)
    assert p > 1e-3


@pytest.fixture(scope="module")
def tiny():
    from spade_lib.zoo.pairs import load_pair

    return load_pair("tiny")
