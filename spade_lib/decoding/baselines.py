"""Hugging Face ``generate`` as a side-by-side baseline: plain, and assisted (``assistant_model=``).

Plain: ``target.generate(input_ids, max_new_tokens, do_sample=not greedy, temperature, top_k, top_p)``; assisted: the
same with ``assistant_model=draft`` and, for the call, ``num_assistant_tokens = gamma``, ``num_assistant_tokens_schedule
= "constant"``, ``assistant_confidence_threshold = 0`` (HF's defaults, 20 tokens, heuristic, 0.4, differ from SPADE's).
A feature head cannot be an assistant (HF drafts from tokens alone): :func:`assistant_model` resolves a draft name to
the pair's draft model and refuses heads and model-free drafters. HF samples from the *global* torch RNG, seeded by
``torch.manual_seed(seed)`` (reproducible, not draw for draw SPADE's streams); only new tokens and wall time come back.

**Cross-tokenizer** (``target_tokenizer=``, ``assistant_tokenizer=``: both or neither), by ``do_sample``:

- greedy: ``AssistedCandidateGeneratorDifferentTokenizers`` (Universal Assisted Generation, text re-encoding, longest
  common diagonal) keeps candidates while they equal the target's argmax: **exact** (tests/test_hf_crossvocab.py).
- sampling: ``UniversalSpeculativeDecodingGenerator`` + ``AssistantToTargetTranslator`` (TLI, Timor et al. 2025,
  arXiv 2502.05202) is lossless, HF's code **not**: it prunes the assistant's LM head to the intersection, column ``j``
  being token ``overlap[j]`` in ``get_vocab()`` order, but ``get_target_logits`` writes in ascending assistant-id
  order; unless ``get_vocab()`` iterates in id order (a fast tokenizer's: a per-process random hash map) ``q`` is
  permuted and ``min(1, p(x) / q(x))`` uses the wrong ``q(x)`` (``test_usd_sampling_law``). ``prune_lm_head=False``
  installs HF's unpruned, id-ordered translator (exact; full draft LM head, off-intersection tokens suppressed).
- HF refuses equal ``vocab_size`` (one tokenizer, it assumes: ``test_hf_refuses_equal_vocab_sizes``).

Pruning edits ``lm_head`` and input embeddings *in place* and HF caches translators per tokenizer pair, so under
sampling HF gets a copy of the draft pruned once per ``(assistant, target_tokenizer, assistant_tokenizer)`` outside the
timing, its translator installed before each call (:func:`_usd_assistant`); the caller's draft is never changed
(``test_usd_leaves_the_callers_draft_alone``). A draft whose weights change later needs :func:`clear_usd_copies`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import torch

from spade_lib.decoding.common import GenerationResult, _check_budget
from spade_lib.decoding.decode import _eos_set
from spade_lib.decoding.drafts.drafters import drafter_kind
from spade_lib.decoding.model.adapter import as_token_tensor, context_limit
from spade_lib.devices import clock
from spade_lib.sampling import SamplingConfig

__all__ = ["hf_generate", "hf_sampling_kwargs", "assistant_model", "check_assistant_name", "clear_usd_copies"]


def hf_sampling_kwargs(sampling: SamplingConfig) -> dict:
    """``generate`` keyword arguments that apply ``sampling`` (greedy when temperature is 0)."""
    if not isinstance(sampling, SamplingConfig):
        raise ValueError(f"sampling: expected a SamplingConfig, got {type(sampling).__name__}")
    if sampling.greedy:
        return {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
    return {"do_sample": True, "temperature": float(sampling.temperature), "top_k": int(sampling.top_k),
            "top_p": float(sampling.top_p)}


def _refuse_head(name: str, what: str):
    raise ValueError(f"draft: {name!r} is {what}; HF assisted generation (method 'hf_assisted', assistant_model=) "
                     "cannot use a feature head: it calls the assistant's own generate on tokens, and a head drafts "
                     "from the target's hidden states. Run it with method 'spade' (same draft), or give "
                     "hf_assisted one of the pair's draft models")


def check_assistant_name(name: str) -> None:
    """Refuse a draft name that can never be an HF assistant, without a pair: a registered drafter (one whose
    declared kind reads the target's features named as such, ``"eagle"`` / ``"medusa"``; ``"ngram"``,
    ``"null"``: no model)."""
    kind = drafter_kind(name)  # None: not a registered drafter
    if kind is not None and kind.head:
        _refuse_head(name, "a feature-head drafter (EAGLE / Medusa)")
    if kind is not None:
        raise ValueError(f"draft: {name!r} is not available for method 'hf_assisted', which needs a draft model "
                         "(for prompt lookup use method 'hf' with spade_lib.decoding.baselines instead)")


def assistant_model(pair, name: str) -> torch.nn.Module:
    """The pair's draft model ``name`` for HF assisted generation; a clear ``ValueError`` for a feature head
    (``pair.heads[name]``, ``"eagle"``, ``"medusa"``), a model-free drafter or an unknown name."""
    check_assistant_name(name)
    drafts = getattr(pair, "drafts", {}) or {}
    heads = getattr(pair, "heads", {}) or {}
    if name in drafts:
        return drafts[name]
    if name in heads:
        _refuse_head(name, f"a feature head of pair {getattr(pair, 'name', '?')!r} ({type(heads[name]).__name__})")
    raise ValueError(f"draft: pair {getattr(pair, 'name', '?')!r} has draft models {sorted(drafts)}, not {name!r}")


# (assistant, target_tokenizer, assistant_tokenizer, prune, model HF gets, translator): the latest few, by identity
_USD_COPIES: list[tuple] = []
_USD_KEEP = 2


def clear_usd_copies() -> None:
    """Forget the pruned draft copies kept for HF's sampled cross-tokenizer generation (see the module
    docstring), e.g. after changing a draft's weights."""
    _USD_COPIES.clear()


def _usd_assistant(assistant, target, target_tokenizer, assistant_tokenizer, prune: bool = True):
    """The model HF's ``UniversalSpeculativeDecodingGenerator`` gets, with its translator installed in HF's
    translator cache (so ``generate`` finds this model's translator, not another's): a copy of ``assistant``
    that the translator prunes (``prune``, what ``generate`` does), or ``assistant`` itself with HF's
    unpruned translator (which does not touch the model)."""
    from weakref import WeakKeyDictionary

    from transformers.generation.candidate_generator import AssistantToTargetTranslator, AssistantVocabTranslatorCache

    for entry in _USD_COPIES:
        if (entry[0] is assistant and entry[1] is target_tokenizer and entry[2] is assistant_tokenizer
                and entry[3] == prune):
            work, translator = entry[4], entry[5]
            break
    else:
        work = copy.deepcopy(assistant) if prune else assistant
        translator = AssistantToTargetTranslator(  # as generate builds it, prune_lm_head=True there
            target_tokenizer, assistant_tokenizer, target.config.get_text_config().vocab_size,
            assistant_model=work, assistant_prune_lm_head=prune)
        _USD_COPIES.insert(0, (assistant, target_tokenizer, assistant_tokenizer, prune, work, translator))
        del _USD_COPIES[_USD_KEEP:]
    AssistantVocabTranslatorCache._cache.setdefault(target_tokenizer, WeakKeyDictionary())[
        assistant_tokenizer] = translator
    return work


class _AssistedKwargsNotice(logging.Filter):
    """Drops one transformers notice that its *own* assisted generation raises: the candidate generator calls
    the assistant's ``generate`` with a ``generation_config`` and ``min_new_tokens`` / ``max_new_tokens``
    together (transformers 5.24 ``candidate_generator.py``), which ``generate`` calls deprecated. SPADE passes
    no ``generation_config``; the notice says nothing about this call, and every other message passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "together with generation-related" not in record.getMessage()


logging.getLogger("transformers.generation.utils").addFilter(_AssistedKwargsNotice())


def _pad_id(model: torch.nn.Module) -> int:
    for source in (getattr(model, "generation_config", None), model.config):
        pad = getattr(source, "pad_token_id", None)
        if isinstance(pad, int):
            return pad
    return 0  # batch size 1: padding never happens, generate only wants an id


@torch.inference_mode()
def hf_generate(target: torch.nn.Module, prompt_ids, max_new_tokens: int, *,
                sampling: SamplingConfig = SamplingConfig(), assistant: torch.nn.Module | None = None,
                gamma: int = 4, seed: int = 0, tokenizer=None,
                eos_token_id: int | Sequence[int] | None = None, target_tokenizer=None,
                assistant_tokenizer=None, prune_lm_head: bool = True) -> GenerationResult:
    """Run HF ``generate`` (assisted when ``assistant`` is given) and time it; see the module docstring.

    ``target_tokenizer`` and ``assistant_tokenizer`` (both, with ``assistant``) select HF's cross-tokenizer
    generators: UAG when greedy (exact), USD when sampling (not exact in transformers 5.24 with its pruned
    assistant head, ``prune_lm_head=True`` as ``generate`` does; exact with ``False``, see above).
    ``tokenizer`` only decodes the result's text."""
    _check_budget(max_new_tokens)
    if (target_tokenizer is None) != (assistant_tokenizer is None):
        given, missing = (("target_tokenizer", "assistant_tokenizer") if assistant_tokenizer is None
                          else ("assistant_tokenizer", "target_tokenizer"))
        raise ValueError(f"{missing}: cross-tokenizer assisted generation needs both tokenizers; only {given} "
                         "was given")
    if not isinstance(prune_lm_head, bool):
        raise ValueError(f"prune_lm_head: must be True or False, got {prune_lm_head!r}")
    if target_tokenizer is not None and assistant is None:
        raise ValueError("assistant: target_tokenizer / assistant_tokenizer were given without an assistant model")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma: must be an integer >= 1, got {gamma!r}")
    device = next(target.parameters()).device
    prompt = as_token_tensor(prompt_ids, device)
    if prompt.numel() == 0:
        raise ValueError("prompt_ids: empty prompt")
    limit = context_limit(target)
    if limit is not None and prompt.numel() > limit:
        raise ValueError(f"prompt_ids: {prompt.numel()} tokens exceed the context limit of {limit} positions")
    eos = sorted(_eos_set(target, eos_token_id))
    kwargs = dict(hf_sampling_kwargs(sampling), max_new_tokens=max_new_tokens,
                  attention_mask=torch.ones(1, prompt.numel(), dtype=torch.long, device=device),
                  eos_token_id=eos, pad_token_id=eos[0] if eos else _pad_id(target))  # [] disables EOS
    if limit is not None:
        kwargs["max_new_tokens"] = min(max_new_tokens, limit - prompt.numel())
    saved = None
    if assistant is not None and not hasattr(assistant, "generate"):
        _refuse_head(type(assistant).__name__, "not a causal LM with generate (a feature head?)")
    if assistant is not None and target_tokenizer is not None:
        kwargs["tokenizer"], kwargs["assistant_tokenizer"] = target_tokenizer, assistant_tokenizer
        if not sampling.greedy:  # USD prunes the assistant in place: give HF a pruned copy (or no pruning)
            assistant = _usd_assistant(assistant, target, target_tokenizer, assistant_tokenizer, prune_lm_head)
    if assistant is not None:
        saved = copy.deepcopy(assistant.generation_config)
        assistant.generation_config.num_assistant_tokens = gamma
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0
        kwargs["assistant_model"] = assistant
    try:
        torch.manual_seed(seed)
        t0 = clock(device)
        out = target.generate(prompt[None], **kwargs) if kwargs["max_new_tokens"] > 0 else prompt[None]
        t1 = clock(device)
    finally:
        if saved is not None:
            assistant.generation_config = saved
    tokens = out[0, prompt.numel():].tolist()
    stop = "eos" if tokens and tokens[-1] in eos else (
        "max_new_tokens" if len(tokens) == max_new_tokens else "context_limit")
    result = GenerationResult(tokens, int(prompt.numel()), stop, [], {"total": t1 - t0}, seed=seed)
    if tokenizer is not None:
        result.text = tokenizer.decode(tokens)
    return result
