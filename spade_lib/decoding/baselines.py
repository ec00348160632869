"""Hugging Face ``generate`` as a side-by-side baseline: plain, and assisted (``assistant_model=``).

A thin wrapper, so that SPADE's decoder can be compared with what practitioners actually run:

- plain: ``target.generate(input_ids, max_new_tokens, do_sample=not greedy, temperature, top_k, top_p)``;
- assisted: the same with ``assistant_model=draft`` and, on the assistant's generation config for the
  duration of the call, ``num_assistant_tokens = gamma``, ``num_assistant_tokens_schedule = "constant"``
  and ``assistant_confidence_threshold = 0`` (HF's defaults, 20 tokens with a heuristic schedule and a
  0.4 threshold, would make it a different algorithm from a fixed-gamma SPADE run).

A feature head (EAGLE, Medusa: ``pair.heads``, or the drafters ``"eagle"`` / ``"medusa"``) cannot be an
assistant: HF's assisted generation runs ``assistant_model.generate`` on the tokens alone, and a head
drafts from the target's hidden states. :func:`assistant_model` resolves a run's draft name to the
pair's draft model and refuses a head (or a model-free drafter) by name.

HF samples from the *global* torch RNG: the wrapper calls ``torch.manual_seed(seed)`` first, so a run is
reproducible but not comparable draw for draw with SPADE's separate streams. Only the new tokens and
the wall time come back (``GenerationResult`` with no steps: HF does not expose accepted counts).

Cross-tokenizer assisted generation (``target_tokenizer=`` and ``assistant_tokenizer=``, passed to HF as
``tokenizer=`` / ``assistant_tokenizer=``; both or neither). transformers 5.24 picks the generator by
``do_sample``, and the two are not equally exact (tests/test_hf_crossvocab.py):

- greedy (``do_sample=False``): ``AssistedCandidateGeneratorDifferentTokenizers`` (Universal Assisted
  Generation: decode the context to text, re-encode it for the assistant, align with the longest common
  diagonal, and the same for the assistant's new tokens). The verifier keeps candidates while they equal the
  target's argmax, so the output is the target's greedy output whatever is proposed: **exact**
  (``test_uag_greedy_equals_target_greedy``, token for token).
- sampling (``do_sample=True``): ``UniversalSpeculativeDecodingGenerator`` with ``AssistantToTargetTranslator``
  (token-level intersection, TLI, Timor et al. 2025, arXiv 2502.05202). The algorithm is lossless, HF's
  implementation is **not**: ``generate`` always prunes the assistant's LM head to the intersection
  (``assistant_prune_lm_head=True``). Pruned column ``j`` is assistant token ``overlap[j]``, with ``overlap``
  in the iteration order of ``assistant_tokenizer.get_vocab()``, and ``get_target_ids`` maps a sampled ``j``
  through that order; but ``get_target_logits`` writes the pruned logits onto the target ids of the
  intersection in *ascending assistant id* order. Unless ``get_vocab()`` iterates in id order the draft's
  ``q`` is attached to the wrong target tokens (a permutation), and the rejection rule
  ``min(1, p(x) / q(x))`` then uses a ``q(x)`` that is not the probability ``x`` was proposed with. A fast
  tokenizer's ``get_vocab()`` is a Rust hash map, its order random per process: the output law is wrong,
  by a different amount in every process. ``test_usd_sampling_law`` (first two tokens, T = 1, gamma 3)
  rejects it by chi-square with a vocabulary iterated in reverse id order (p = 1e-169, N = 300) and accepts
  the same generator with one iterated in id order (p = 0.67, N = 1000: then TLI as implemented is exact),
  on the same models, prompt and tokenizers (a plain fast tokenizer, hash-ordered, gave p = 7e-29 at
  N = 300 in one process). HF's translator *without* pruning maps both sides in id order and is exact
  (p = 0.69, N = 1000, reverse-ordered): ``prune_lm_head=False`` installs that translator in HF's cache
  before the call, a lossless USD baseline that leaves the draft as it is (at the cost of the full draft
  LM head and a suppression of the tokens outside the intersection at each draft step).
- HF refuses cross-tokenizer generation when the two models have the same ``vocab_size`` (it takes that to
  mean one tokenizer: ``test_hf_refuses_equal_vocab_sizes``), and needs both tokenizers otherwise.

The pruning replaces the assistant's ``lm_head`` and input embeddings *in place*, and HF caches the
translator per tokenizer pair (a weak-keyed cache), so a second model with the same tokenizers would meet a
translator built for another one. Under sampling the wrapper therefore hands HF a copy of the draft, made
and pruned once per ``(assistant, target_tokenizer, assistant_tokenizer)`` outside the timed region
(:func:`_usd_assistant`), and installs that copy's translator in HF's cache before each call: the caller's
draft is never changed (``test_usd_leaves_the_callers_draft_alone``). The copy (and a translator) is
taken at the first sampled call; a draft whose weights change later needs :func:`clear_usd_copies`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import torch

from spade_lib.decoding.adapter import as_token_tensor, context_limit
from spade_lib.decoding.common import GenerationResult, _check_budget
from spade_lib.decoding.decode import _eos_set
from spade_lib.decoding.drafters import drafter_kind
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
