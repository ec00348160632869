"""Embedded draft/target pairs built offline from the pinned transformers sources, and real HF pairs.

``load_pair("tiny")`` / ``load_pair("default")`` build (once, cached) and load an embedded pair;
``load_pair(target=..., draft=...)`` loads a real one; ``load_tokenizer(name)`` gives an embedded
pair's tokenizer alone. Modules: ``corpus`` (text), ``tokenizer`` (BPE), ``configs`` (recipes),
``data``, ``train``, ``evaluate`` (alpha, perplexity, costs), ``cache`` (lock + atomic build),
``build``, ``loading`` (a target and its drafts through the Auto classes), ``pairs``; the real pair
``load_pair("smollm2")``: ``smollm2`` (GGUF conversion, pair), ``distill`` (its drafts), ``frspec``
(the frequent-token draft head), ``early_exit`` (early-exit alpha). Draft heads that read the target's
hidden states (EAGLE-3, an EAGLE-1 variant, Medusa-1; the modules themselves are
``spade_lib.decoding.drafts.eagle`` / ``.medusa``): ``heads`` (recipes, cached builds, storage), ``head_data``
(teacher sequences, features, soft labels), ``head_train`` (losses, training, held-out figures),
``speculators_format`` (vLLM's speculators EAGLE-3 folders, both ways).

The package itself imports only ``configs`` (``PAIRS``, ``PairConfig``, ``get_config``), so that
``spade_lib.zoo.corpus`` and ``spade_lib.zoo.configs`` stay cheap to import (no torch); ``load_pair``,
``load_tokenizer``, ``pair_names`` are in ``spade_lib.zoo.pairs``, ``early_exit_alpha`` in
``spade_lib.zoo.early_exit``.
"""

from spade_lib.zoo.configs import PAIRS, PairConfig, get_config

__all__ = ["PAIRS", "PairConfig", "get_config"]
