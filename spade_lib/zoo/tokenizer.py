"""Byte-level BPE tokenizer of the embedded pairs, trained with HF ``tokenizers``.

Byte-level BPE (GPT-2 style): text is mapped to bytes, every byte is an initial symbol, and the most
frequent adjacent pair is merged repeatedly until ``vocab_size`` symbols exist (merges seen fewer than
``min_frequency`` times are not made). Any string round-trips through encode/decode.

``<|endoftext|>`` is id 0 and serves as bos, eos and pad. The tokenizer is saved as a fast tokenizer
(``tokenizer.json`` + ``tokenizer_config.json``) and loaded back with ``AutoTokenizer.from_pretrained``,
like any hub tokenizer.
"""

from __future__ import annotations

import random
from pathlib import Path

from spade_lib.zoo.configs import TokenizerConfig
from spade_lib.zoo.corpus import Document

EOT = "<|endoftext|>"


def select_documents(docs: list[Document], max_chars: int | None, seed: int) -> list[Document]:
    """All of ``docs``, or a seeded-shuffle slice of them holding at most ``max_chars`` characters
    (the last document is cut)."""
    if max_chars is None:
        return list(docs)
    if max_chars < 1:
        raise ValueError(f"max_chars must be positive or None, got {max_chars}")
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    out, left = [], max_chars
    for i in order:
        if left <= 0:
            break
        d = docs[i]
        out.append(Document(d.name, d.kind, d.text[:left]))
        left -= len(out[-1].text)
    return out


def train_tokenizer(texts: list[str], config: TokenizerConfig):
    """Train a byte-level BPE tokenizer and wrap it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if config.vocab_size < 257 + 1:
        raise ValueError(f"vocab_size must exceed 257 (256 bytes + {EOT}), got {config.vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(EOT) == 0
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOT, eos_token=EOT, pad_token=EOT, unk_token=None,
        model_max_length=1024,
    )


def build_tokenizer(out_dir: Path, docs: list[Document], config: TokenizerConfig) -> dict:
    """Train on ``docs`` (sliced per ``config``) and save into ``out_dir``; return manifest facts."""
    texts = [d.text for d in select_documents(docs, config.max_chars, config.seed)]
    tok = train_tokenizer(texts, config)
    tok.save_pretrained(out_dir)
    return {"vocab_size": len(tok), "train_chars": sum(map(len, texts)), "n_train_documents": len(texts)}
