"""The HF generate wrapper: plain and assisted greedy decoding agree with SPADE's decoder; the
assistant's generation config is restored; sampling replays with the seed."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spade_lib.decoding.baselines import hf_generate, hf_sampling_kwargs
from spade_lib.decoding.decode import SpeculativeDecoder
from spade_lib.sampling import SamplingConfig

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=48, initializer_range=0.3, bos_token_id=0,
                      eos_token_id=0, pad_token_id=0)
    target = LlamaForCausalLM(cfg).eval()
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2 * p.std())
    return target, draft


@pytest.mark.parametrize("gamma", [1, 4])
def test_plain_and_assisted_greedy_equal_spade(pair, gamma):
    target, draft = pair
    before = copy.deepcopy(draft.generation_config.to_dict())
    for prompt in ([5], [7, 8, 9, 10, 11]):
        plain = hf_generate(target, prompt, 24, sampling=GREEDY)
        assisted = hf_generate(target, prompt, 24, sampling=GREEDY, assistant=draft, gamma=gamma)
        ours = SpeculativeDecoder(target, draft, gamma=gamma, sampling=GREEDY).generate(prompt, 24)
        assert plain.tokens == assisted.tokens == ours.tokens
        assert plain.stop_reason == ours.stop_reason
        assert plain.steps == [] and plain.accept_lengths == [] and plain.timing["total"] > 0
    assert draft.generation_config.to_dict() == before  # the assistant's config is restored


def test_sampling_replays_with_the_seed(pair):
    target, draft = pair
    s = SamplingConfig(temperature=0.9, top_k=20, top_p=0.95)
    a = hf_generate(target, [3, 4], 16, sampling=s, assistant=draft, gamma=3, seed=11)
    b = hf_generate(target, [3, 4], 16, sampling=s, assistant=draft, gamma=3, seed=11)
    assert a.tokens == b.tokens
    c = hf_generate(target, [3, 4], 16, sampling=s, seed=11)
    assert c.tokens == hf_generate(target, [3, 4], 16, sampling=s, seed=11).tokens


def test_eos_and_context_limit(pair):
    target, _ = pair
    free = hf_generate(target, [9], 20, sampling=GREEDY, eos_token_id=[])
    stop = free.tokens[5]
    out = hf_generate(target, [9], 20, sampling=GREEDY, eos_token_id=stop)
    assert out.tokens == free.tokens[:free.tokens.index(stop) + 1] and out.stop_reason == "eos"
    default = hf_generate(target, [9], 20, sampling=GREEDY)  # the config's EOS, id 0
    assert default.tokens == (free.tokens[:free.tokens.index(0) + 1] if 0 in free.tokens else free.tokens)
    near = hf_generate(target, list(range(1, 45)), 10, sampling=GREEDY, eos_token_id=[])
    assert len(near.tokens) == 4 and near.stop_reason == "context_limit"
    assert hf_generate(target, list(range(1, 49)), 5, sampling=GREEDY).tokens == []


def test_sampling_kwargs_and_bad_arguments(pair):
    target, _ = pair
    assert hf_sampling_kwargs(GREEDY)["do_sample"] is False
    assert hf_sampling_kwargs(SamplingConfig(0.7, 5, 0.9)) == {"do_sample": True, "temperature": 0.7, "top_k": 5,
                                                               "top_p": 0.9}
    with pytest.raises(ValueError, match="sampling"):
        hf_sampling_kwargs({"temperature": 1.0})
    with pytest.raises(ValueError, match="gamma"):
        hf_generate(target, [1], 4, gamma=0)
    with pytest.raises(ValueError, match="prompt_ids"):
        hf_generate(target, [], 4)
    with pytest.raises(ValueError, match="prompt_ids"):
        hf_generate(target, list(range(49)), 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        hf_generate(target, [1], -2)


def test_assisted_generation_refuses_a_feature_head_by_name():
    import types

    from spade_lib.decoding import baselines
    from tests.test_eagle import make_head, tiny_target

    target = tiny_target()
    head = make_head(target)
    pair = types.SimpleNamespace(name="toy", target=target, drafts={"small": target}, heads={"e3": head})
    assert baselines.assistant_model(pair, "small") is target
    for name in ("e3", "eagle", "medusa"):
        with pytest.raises(ValueError, match=f"draft: '{name}' is a feature.*cannot use a feature head"):
            baselines.assistant_model(pair, name)
    with pytest.raises(ValueError, match="needs a draft model"):
        baselines.assistant_model(pair, "ngram")
    with pytest.raises(ValueError, match="has draft models"):
        baselines.assistant_model(pair, "nope")
    with pytest.raises(ValueError, match="cannot use a feature head"):
        baselines.hf_generate(target, [1, 2, 3], 2, assistant=head)


def test_only_the_assisted_kwargs_notice_is_dropped():
    """transformers' own assisted generation calls the assistant's ``generate`` with a ``generation_config`` and
    new-token counts together, and ``generate`` logs a deprecation notice about that into every executed
    notebook; the baselines module drops that one notice on its logger and lets every other message through."""
    import logging

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger = logging.getLogger("transformers.generation.utils")
    handler = Keep(level=logging.DEBUG)
    logger.addHandler(handler)
    try:
        logger.warning("Passing `generation_config` together with generation-related arguments=({'max_new_tokens'}) "
                       "is deprecated")
        logger.warning("some other generation notice")
    finally:
        logger.removeHandler(handler)
    assert seen == ["some other generation notice"]
