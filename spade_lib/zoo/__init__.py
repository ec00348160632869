"""Embedded draft/target pairs built offline from the Python standard library, and real HF pairs.

``load_pair("tiny")`` / ``load_pair("default")`` build (once, cached) and load an embedded pair;
``load_pair(target=..., draft=...)`` loads a real one; ``load_tokenizer(name)`` gives an embedded
pair's tokenizer alone. Modules: ``corpus`` (text), ``tokenizer`` (BPE), ``configs`` (recipes),
``data``, ``train``, ``evaluate`` (alpha, perplexity, costs), ``cache`` (lock + atomic build),
``build``, ``pairs``.
"""

from spade_lib.zoo.configs import PAIRS, PairConfig, get_config
from spade_lib.zoo.pairs import Pair, load_pair, load_tokenizer, pair_names

__all__ = ["PAIRS", "Pair", "PairConfig", "get_config", "load_pair", "load_tokenizer", "pair_names"]
