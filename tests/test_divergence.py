"""compare_greedy: first difference, the target's margin there, near-tie vs bug."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spade_lib.decoding.studies.divergence import TIE_THRESHOLDS, compare_greedy, first_difference


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, initializer_range=0.3)
    return LlamaForCausalLM(cfg).eval()


def logits_after(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2], [1, 2, 3]) is None  # compared over the common length
    assert first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert first_difference([], [4]) is None


def test_identical(model):
    d = compare_greedy([3, 4], [3, 4, 5], model, [1, 2])
    assert d.classification == "identical" and d.first_index is None and d.logit_margin is None


def test_runner_up_is_a_near_tie_only_within_the_threshold(model):
    prompt = [7, 8, 9]
    z = logits_after(model, prompt)
    top = torch.topk(z, 2)
    t1, t2 = top.indices.tolist()
    margin = (top.values[0] - top.values[1]).item()
    a, b = [t1], [t2]
    d = compare_greedy(a, b, model, prompt, tie_threshold=margin + 1e-4)
    assert (d.first_index, d.a_token, d.b_token, d.target_top1, d.target_top2) == (0, t1, t2, t1, t2)
    assert d.logit_margin == pytest.approx(margin, abs=1e-5) and d.token_gap == pytest.approx(margin, abs=1e-5)
    assert d.classification == "near_tie"
    assert compare_greedy(a, b, model, prompt, tie_threshold=margin / 2).classification == "bug"


def test_divergence_later_in_the_continuation_uses_the_shared_prefix(model):
    prompt = [1, 2]
    r0 = int(logits_after(model, prompt).argmax())
    r1 = int(logits_after(model, prompt + [r0]).argmax())
    worst = int(logits_after(model, prompt + [r0]).argmin())
    d = compare_greedy([r0, r1, 5], [r0, worst, 5], model, prompt)
    assert d.first_index == 1 and d.target_top1 == r1 and d.classification == "bug"


def test_exact_tie_is_a_near_tie_at_the_default_threshold(model):
    tied = LlamaForCausalLM(model.config).eval()
    tied.load_state_dict(model.state_dict())
    prompt = [4, 5, 6]
    best = int(logits_after(tied, prompt).argmax())
    other = (best + 1) % 64
    with torch.no_grad():
        tied.lm_head.weight[other] = tied.lm_head.weight[best]  # two tokens with identical logits
    d = compare_greedy([best], [other], tied, prompt)
    assert d.tie_threshold == TIE_THRESHOLDS[torch.float32]
    assert d.token_gap == 0.0 and d.classification == "near_tie"


def test_default_threshold_follows_the_dtype(model):
    half = LlamaForCausalLM(model.config).to(torch.bfloat16).eval()
    d = compare_greedy([1], [2], half, [3])
    assert d.tie_threshold == TIE_THRESHOLDS[torch.bfloat16] == 0.25


def test_bad_arguments(model):
    with pytest.raises(ValueError, match="tie_threshold"):
        compare_greedy([1], [2], model, [3], tie_threshold=-1.0)
    with pytest.raises(ValueError, match="prompt_ids"):
        compare_greedy([1], [2], model, [])


def test_classify_greedy_counts_every_class_and_names_the_mismatches(model):
    from spade_lib.decoding.studies.divergence import CLASSES, classify_greedy

    prompt = [3, 7, 11]
    z = logits_after(model, prompt)
    top = torch.topk(z, 2).indices.tolist()
    worst = int(torch.argmin(z))
    cases = [("same", [top[0], 5], [top[0], 5], prompt),
             ("tie", [top[0]], [top[1]], prompt),   # the runner-up: a near tie at a wide threshold
             ("bug", [top[0]], [worst], prompt)]    # the least likely token: a bug at any sane threshold
    gap = float(z[top[0]] - z[top[1]])
    counts, found = classify_greedy(cases, model, tie_threshold=gap + 1e-6)
    assert list(counts) == list(CLASSES) and counts == {"identical": 1, "near_tie": 1, "bug": 1}
    assert [key for key, _ in found] == ["tie", "bug"]
    ref = compare_greedy([top[0]], [worst], model, prompt, tie_threshold=gap + 1e-6)
    assert found[1][1] == ref
    assert ref.describe() == (f"bug at token 0 (logit gap {ref.token_gap:.2e}, threshold {gap + 1e-6:g})")
    assert found[0][1].describe().startswith("near_tie at token 0 (logit gap ")
    assert compare_greedy([1], [1], model, prompt).describe() == "identical"
    assert classify_greedy([], model) == ({"identical": 0, "near_tie": 0, "bug": 0}, [])
