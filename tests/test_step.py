"""spade_lib.decoding.step, the verify + commit step single and batched decoding share: ``R`` rows at once
equal ``R`` one-row steps (a row's draws never depend on its batch mates), the one-row step equals a
plain :func:`spade_lib.verify.verify` on the row's generators, and the commit cuts at EOS and budget."""

from __future__ import annotations

import pytest
import torch

from spade_lib import rules
from spade_lib.decoding import records
from spade_lib.decoding.common import seed_streams
from spade_lib.decoding.step import Step, commit
from spade_lib.verify import verify


def random_block(R=4, g=3, V=13, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits_p = 2 * torch.randn(R, g + 1, V, generator=gen, dtype=torch.float64)
    q_logits = 2 * torch.randn(R, g, V, generator=gen, dtype=torch.float64)
    p, q = logits_p.softmax(-1), q_logits.softmax(-1)
    x = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(R, g)
    return logits_p, p, x, q, q_logits


@pytest.mark.parametrize("mode", rules.rule_names())
def test_rows_together_equal_rows_alone(mode):
    logits_p, p, x, q, q_logits = random_block()
    R = x.shape[0]
    step = Step(mode, {}, greedy=False, full=True, topk=2)
    together = step.verify(logits_p, p, x, q, q_logits, [seed_streams(10 + r, "cpu") for r in range(R)])
    for r in range(R):
        alone = step.verify(logits_p[r:r + 1], p[r:r + 1], x[r:r + 1], q[r:r + 1], q_logits[r:r + 1],
                            [seed_streams(10 + r, "cpu")])
        assert int(together.n_accepted[r]) == int(alone.n_accepted[0])
        assert int(together.next_token[r]) == int(alone.next_token[0])
        assert torch.equal(together.table[r].nan_to_num(-1), alone.table[0].nan_to_num(-1))
        assert together.topk[r] == alone.topk[0]


def test_one_row_is_verify_on_the_row_generators():
    logits_p, p, x, q, q_logits = random_block(R=1, seed=3)
    v = Step("exact", {}, greedy=False, full=True, topk=0).verify(logits_p, p, x, q, q_logits,
                                                                  [seed_streams(5, "cpu")])
    s = seed_streams(5, "cpu")
    ref = verify(p, q, x, mode="exact", generator=s["accept"], residual_generator=s["residual"])
    assert torch.equal(v.n_accepted, ref.n_accepted) and torch.equal(v.next_token, ref.next_token)
    names, table = records.position_stats(records.StatInputs(logits_p, p, x, q, q_logits, ref))
    assert v.names == names and torch.equal(v.table.nan_to_num(-1), table.nan_to_num(-1))
    assert v.topk is None


def test_commit_reads_each_row_and_cuts_at_eos_and_budget():
    logits_p, p, x, q, q_logits = random_block(R=3, g=3, seed=1)
    x = torch.tensor([[4, 5, 6], [7, 8, 9], [1, 2, 3]])
    n = torch.tensor([3, 1, 2])
    y = torch.tensor([10, 11, 12])
    step = Step("exact", {}, greedy=False, full=True, topk=0)
    v = step.verify(logits_p[:2], p[:2], x[:2], q[:2], q_logits[:2], [seed_streams(r, "cpu") for r in range(2)])
    facts = commit(n, y, x, [((0, 2), v)], budgets=(10, 10, 2), eos=frozenset({5}))
    assert [f.drafted for f in facts] == [[4, 5, 6], [7], [1, 2]]
    assert [f.emitted for f in facts] == [[4, 5], [7, 11], [1, 2]]  # EOS 5 ends row 0; row 2's budget is 2
    assert [f.hit_eos for f in facts] == [True, False, False]
    assert [(f.n, f.next_token) for f in facts] == [(3, 10), (1, 11), (2, 12)]
    assert facts[1].stats is None
    for r, j in ((0, 0), (2, 1)):  # the verdict's rows 0 and 1 carried to rows 0 and 2
        for c, name in enumerate(v.names):
            assert facts[r].stats[name] == pytest.approx(v.table[j, c].tolist(), nan_ok=True)


@pytest.mark.parametrize("greedy", [False, True])
def test_plain_step_rows_together_equal_rows_alone(greedy):
    _, p, _, _, _ = random_block(R=4, seed=2)
    step = Step("greedy" if greedy else "exact", {}, greedy=greedy, full=False, topk=0)
    together = step.plain(p[:, 0], [seed_streams(r, "cpu") for r in range(4)])
    alone = [int(step.plain(p[r:r + 1, 0], [seed_streams(r, "cpu")])) for r in range(4)]
    assert together.tolist() == alone
    if greedy:
        assert alone == p[:, 0].argmax(-1).tolist()
