"""One definition per concept: a toy acceptance rule and a toy stop policy, each registered in one
place, work in ``verify``, in a ``run_suite`` run with options, and in ``replay`` with no other edit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from spade_lib import rules
from spade_lib.decoding.drafts import policies
from spade_lib.decoding.records import STEP_KEYS
from spade_lib.runs import trace
from spade_lib.verify import verify
from spade_lib.whatif import replay


def _half_exact(inputs, scale):
    """A lossy toy rule: accept with ``scale * min(1, p(x)/q(x))`` (residual max(0, p - q))."""
    p_x, q_x = inputs["p_x"], inputs["q_x"]
    return scale * torch.where(q_x > 0, (p_x / q_x).clamp(max=1.0), (p_x > 0).to(p_x.dtype))


@pytest.fixture(scope="module")
def toys():
    rule = rules.register_rule(rules.Rule(
        "toy_scaled", _half_exact, ("p_x", "q_x"), lossless=False,
        options=(rules.Option("scale", 0.5, 0.0, 1.0, min_open=True),), exactness="exact, pathwise"))

    @policies.register_policy("toy_digits")
    @dataclass(frozen=True)
    class Digits(policies.Policy):
        """Stop when a digit of the draft's confidence is a multiple of ``modulus``: a deterministic
        mix of stops whatever the draft's confidences (the tiny draft's are nearly all equal).
        No vectorised form: replay uses the base class's row-by-row ``keep_mask``."""

        modulus: int = 3
        max_gamma: int = 3
        needs_signals = True

        def keep_drafting(self, q_top_prob: float, h_q: float) -> bool:
            return int(q_top_prob * 1e7) % self.modulus != 0

    yield rule, Digits
    rules.unregister_rule("toy_scaled")
    policies.unregister_policy("toy_digits")
    # the teardown removes exactly what the fixture registered: nothing leaks into later tests
    assert "toy_scaled" not in rules.rule_names() and "toy_digits" not in policies.policy_names()


def test_toy_rule_in_verify(toys):
    gen = torch.Generator().manual_seed(0)
    p = (2 * torch.randn(64, 4, 9, generator=gen, dtype=torch.float64)).softmax(-1)
    q = (2 * torch.randn(64, 3, 9, generator=gen, dtype=torch.float64)).softmax(-1)
    x = torch.multinomial(q.reshape(-1, 9), 1, generator=gen).reshape(64, 3)
    u = torch.rand(64, 3, generator=gen, dtype=torch.float64)
    exact = verify(p, q, x, uniforms=u)
    toy = verify(p, q, x, mode="toy_scaled", uniforms=u, scale=0.25)
    torch.testing.assert_close(toy.accept_prob, 0.25 * exact.accept_prob)
    assert (toy.n_accepted <= exact.n_accepted).all()
    assert "toy_scaled" in rules.rule_names() and rules.lossless_map()["toy_scaled"] is False
    with pytest.raises(ValueError, match="scale"):
        verify(p, q, x, mode="toy_scaled", scale=1.5)


def test_toy_policy_by_name(toys):
    _, cls = toys
    pol = policies.get_policy("toy_digits", modulus=2)
    assert isinstance(pol, cls) and pol.max_gamma == 3 and pol.keep_drafting(0.1234567, 0.0)
    with pytest.raises(ValueError, match="policy_options"):
        policies.get_policy("toy_digits", nope=1)


def test_toy_rule_and_policy_in_run_suite_and_replay(toys, tmp_path):
    from spade_lib.bench import default_suite
    from spade_lib.runs.config import RunConfig
    from spade_lib.runs.runner import run_suite
    from spade_lib.runs.trace import read_trace
    from spade_lib.zoo.pairs import load_pair

    pair = load_pair("tiny")
    suite = default_suite(tokenizer="tiny", n_per_category=1)
    config = RunConfig(mode="toy_scaled", mode_options={"scale": 0.8}, policy="toy_digits",
                       policy_options={"modulus": 3}, max_gamma=4, temperature=1.0,
                       max_new_tokens=24, warmup=0, max_prompt_tokens=64)
    assert config.make_policy() == toys[1](modulus=3, max_gamma=4)
    assert RunConfig(**{**config.to_dict(), "mode_options": {"scale": 0.7}}).hash != config.hash
    with pytest.raises(ValueError, match="scale"):
        RunConfig(mode="toy_scaled", mode_options={"scale": 2.0})
    tr = read_trace(run_suite(pair, suite, config, tmp_path / "run", progress=False))
    assert list(tr.columns)[:len(trace.trace_columns())] == trace.trace_columns()
    assert tr["gamma"].max() <= 4 and len(tr) > 0

    # the rule: replaying it on its own trace reproduces every decision
    got = replay.replay_decisions(tr, "toy_scaled", params={"toy_scaled": {"scale": 0.8}})
    tr_sorted = tr.sort_values(STEP_KEYS + ["pos"], kind="stable").reset_index(drop=True)
    for col in ("reached", "accepted", "n_accepted"):
        np.testing.assert_array_equal(got[col].to_numpy(), tr_sorted[col].to_numpy())
    cf = replay.counterfactual(tr, rules=["toy_scaled", "exact"], params={"toy_scaled": {"scale": 0.8}})
    assert set(cf["rule"]) == {"toy_scaled", "exact"}
    assert "toy_scaled" in rules.rule_names() and rules.get_rule("toy_scaled").needs == ("p_x", "q_x", "uniform")

    # the policy: its replay form gives back the draft length it chose in every recorded step
    # (a block ends where the policy stopped, at max_gamma, or at the budget)
    pol = config.make_policy()
    steps, g = replay.blocks_used(tr, pol)
    np.testing.assert_array_equal(g, steps["gamma"].to_numpy())
    out = replay.replay_stop_rule(tr, pol, c=0.1)
    assert out["policy"].iloc[0] == "toy_digits" and 1 <= out["g_mean"].iloc[0] <= 4
    assert (steps["gamma"] < 4).any() and (steps["gamma"] == 4).any()  # the policy both stopped and ran on
