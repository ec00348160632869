"""Held-out agreement by depth: against a plain-Python reference that drives the real drafters position by
position, and the held-out data's separation from the heads' training data."""

import pytest
import torch

from spade_lib.decoding.drafts.drafters import TargetView
from spade_lib.decoding.drafts.medusa import MedusaHead
from spade_lib.decoding.drafts.policies import FixedGamma
from spade_lib.intervals import binomial_ci
from spade_lib.sampling import SamplingConfig
from spade_lib.zoo.head_data import Sequences, extract
from spade_lib.zoo.head_eval import agreement_by_depth, evaluate_head, format_table, proposals
from tests.test_eagle import V, hidden_at, make_head, tiny_target

D = 3


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def medusa_head(target):
    torch.manual_seed(2)
    head = MedusaHead.from_target(target, draft_token_ids=torch.randperm(V)[:48], num_heads=4)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return head


def greedy_text(target, prompt, n):
    out = target.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0,
                          eos_token_id=None, temperature=None, top_k=None, top_p=None)
    return out[0].tolist()


def drafter_chain(head, target, seq, t, depth):
    """The drafter's greedy chain after observing ``x_0 .. x_t`` (next token ``x_{t+1}``), as in decoding."""
    drafter = head.drafter()
    drafter.reset(torch.tensor(seq[:t + 1]), V)
    hidden = hidden_at(target, seq[:t + 1], drafter.hidden_layers)
    drafter.observe(TargetView(torch.tensor(seq[:t + 1]), 0, hidden, seq[t + 1]))
    return drafter.propose(depth, FixedGamma(gamma=depth), SamplingConfig(temperature=0), None).tokens.tolist()


@pytest.mark.parametrize("kind", ["eagle3", "eagle1", "medusa"])
def test_proposals_are_the_drafters_greedy_chain_at_every_position(target, kind):
    head = medusa_head(target) if kind == "medusa" else make_head(target, kind)
    seq = greedy_text(target, [5, 9, 33, 2, 17, 40], 8)
    m = len(seq) - D
    layers = tuple(head.config.feature_layers) if kind != "medusa" else (head.config.feature_layer,)
    data = extract(target, Sequences([torch.tensor(seq)], [6], ["generation"]), layers, top_k=1,
                   feature_dtype=torch.float32)
    y = proposals(head, data.feats[0][:m], data.seqs[0][1:m + 1], D)
    assert y.tolist() == [drafter_chain(head, target, seq, t, D) for t in range(m)]
    # the labels are the target's greedy tokens: on its own continuation, the next token
    greedy = data.topi[0][:, 0].tolist()
    assert greedy[5:-1] == seq[6:]


def test_agreement_counts_against_a_python_reference(target, monkeypatch):
    """Counts, conditional alpha, reach and the scopes, with designed proposals (the target's greedy tokens,
    a seeded third of them wrong) against counting by hand."""
    from spade_lib.zoo import head_eval

    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, V, (n,), generator=gen) for n in (14, 9, 3)]  # the last is too short for D
    starts = [5, 0, 1]
    data = extract(target, Sequences(seqs, starts, ["generation", "window", "generation"]), (8,), top_k=1,
                   feature_dtype=torch.float32)
    wrong = {}

    def fake(head, features, next_tokens, depth):
        j = next(i for i, s in enumerate(data.seqs) if s.numel() - depth == features.shape[0])
        g = data.topi[j][:, 0].long()
        y = torch.stack([g[d: d + features.shape[0]] for d in range(1, depth + 1)], dim=1)
        flip = torch.rand(y.shape, generator=gen) < 0.33
        wrong[j] = flip
        return torch.where(flip, (y + 1) % V, y)

    monkeypatch.setattr(head_eval, "proposals", fake)
    got = agreement_by_depth(None, data, D)
    for scope in ("all", "generated"):
        rows = []
        for j, flip in wrong.items():
            for t in range(flip.shape[0]):
                if scope == "all" or (starts[j] > 0 and t >= starts[j] - 2):
                    rows.append([not bool(f) for f in flip[t]])
        n = len(rows)
        agree = [sum(r[d] for r in rows) for d in range(D)]
        accepted = [sum(all(r[: d + 1]) for r in rows) for d in range(D)]
        t = got[scope]
        assert t["n"].tolist() == [n] * D and t["agree"].tolist() == agree and t["accepted"].tolist() == accepted
        assert t["reached"].tolist() == [n] + accepted[:-1]
        assert t["alpha"].tolist() == pytest.approx([k / r for k, r in zip(accepted, [n] + accepted[:-1])])
        low, high = binomial_ci(agree, [n] * D)
        assert t["top1_low"].tolist() == pytest.approx(list(low)) and t["top1_high"].tolist() == pytest.approx(list(high))
        assert got["mean_accepted"][scope] == pytest.approx(sum(accepted) / n)
        assert 0 < accepted[-1] < accepted[0] < n  # the conditional structure is exercised
    assert "alpha" in format_table(got) and sorted(wrong) == [0, 1]


def test_evaluate_head_caps_medusa_depth_at_its_heads(target):
    seqs = Sequences([torch.arange(2, 20)], [4], ["generation"])
    got = evaluate_head(target, medusa_head(target), seqs, depth=6)
    assert got["depth"] == 4 and len(got["all"]) == 4 and got["tokens"] == 18
    with pytest.raises(ValueError, match="depth"):
        agreement_by_depth(make_head(target), None, 0)


def test_heldout_texts_share_nothing_with_the_heads_teacher_data():
    from spade_lib.zoo.head_data import HeadDataConfig, corpus_texts
    from spade_lib.zoo.head_eval import HELDOUT_DATA, heldout_texts

    prompts, documents = heldout_texts(HELDOUT_DATA)
    train_prompts, train_documents = corpus_texts(HeadDataConfig(n_prompts=10_000))  # every training prompt
    assert len(prompts) == HELDOUT_DATA.n_prompts and documents
    assert not set(prompts) & set(train_prompts) and not set(documents) & set(train_documents)


def test_non_finite_features_are_refused_by_sequence_and_row(target):
    """Issue 57: a NaN feature made NaN draft logits whose argmax is a silent, wrong proposal (counted as a
    disagreement); the evaluation refuses it, naming the tensor (the sequence's features) and the row."""
    head = medusa_head(target)
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, V, (n,), generator=gen) for n in (10, 12)]
    data = extract(target, Sequences(seqs, [0, 4], ["window", "generation"]), head.feature_layers, top_k=1,
                   feature_dtype=torch.float32)
    assert agreement_by_depth(head, data, D)["all"]["n"].iloc[0] > 0
    data.feats[1][5, 3] = float("nan")
    with pytest.raises(ValueError, match=r"^data.feats\[1\]: holds NaN at row 5 "):
        agreement_by_depth(head, data, D)
    data.feats[1][5, 3] = float("inf")
    with pytest.raises(ValueError, match=r"^data.feats\[1\]: holds inf at row 5 "):
        agreement_by_depth(head, data, D)
