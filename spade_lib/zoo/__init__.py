"""Embedded draft/target pairs built offline from the pinned transformers sources, and real HF pairs.

``load_pair("tiny")`` / ``load_pair("default")`` build (once, cached) and load an embedded pair;
``load_pair(target=..., draft=...)`` loads a real one; ``load_tokenizer(name)`` gives an embedded
pair's tokenizer alone. Modules: ``corpus`` (text), ``tokenizer`` (BPE), ``configs`` (recipes),
``data``, ``train``, ``evaluate`` (alpha, perplexity, costs), ``cache`` (lock + atomic build),
``build``, ``pairs``; the real pair ``load_pair("smollm2")``: ``smollm2`` (GGUF conversion, pair),
``distill`` (its drafts), ``frspec`` (the frequent-token draft head), ``early_exit`` (early-exit alpha).

``Pair``, ``load_pair``, ``load_tokenizer`` and ``pair_names`` are imported lazily, so that
``spade_lib.zoo.corpus`` and ``spade_lib.zoo.configs`` stay cheap to import (no torch).
"""

from spade_lib.zoo.configs import PAIRS, PairConfig, get_config

_LAZY = {"Pair", "load_pair", "load_tokenizer", "pair_names", "REAL_PAIRS"}
_LAZY_EARLY_EXIT = {"early_exit_alpha", "hf_early_exit_generate"}

__all__ = ["PAIRS", "Pair", "PairConfig", "REAL_PAIRS", "early_exit_alpha", "get_config", "hf_early_exit_generate",
           "load_pair", "load_tokenizer", "pair_names"]


def __getattr__(name: str):
    if name in _LAZY:
        from spade_lib.zoo import pairs

        return getattr(pairs, name)
    if name in _LAZY_EARLY_EXIT:
        from spade_lib.zoo import early_exit

        return getattr(early_exit, name)
    raise AttributeError(f"module 'spade_lib.zoo' has no attribute {name!r}")
