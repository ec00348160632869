"""Token streams and batches for training and evaluation.

Documents are encoded and concatenated into one stream, each followed by ``<|endoftext|>`` (id 0),
so a model learns document boundaries. Training batches are ``batch_size`` windows of ``seq_len + 1``
tokens at uniformly random offsets drawn from a seeded ``torch.Generator``; evaluation uses the first
``n`` non-overlapping windows of the held-out stream, so every model sees exactly the same tokens.
"""

from __future__ import annotations

import torch

from spade_lib.zoo.corpus import Document


def encode_documents(tokenizer, docs: list[Document]) -> torch.Tensor:
    """One int64 stream: the tokens of every document, each followed by the eos id."""
    eos = tokenizer.eos_token_id
    # documents are longer than the models' context on purpose: windows are cut later, so no length warning
    encoded = tokenizer([d.text for d in docs], add_special_tokens=False, verbose=False)["input_ids"]
    stream = [t for ids in encoded for t in (*ids, eos)]
    return torch.tensor(stream, dtype=torch.long)


def random_batch(stream: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """``(batch_size, seq_len + 1)`` windows at random offsets (inputs are ``[:, :-1]``, labels ``[:, 1:]``)."""
    if len(stream) < seq_len + 2:
        raise ValueError(f"stream: {len(stream)} tokens is too short for seq_len {seq_len}")
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=generator)
    return stream[starts[:, None] + torch.arange(seq_len + 1)]


def eval_windows(stream: torch.Tensor, n_windows: int, seq_len: int) -> torch.Tensor:
    """The first ``n_windows`` non-overlapping ``(seq_len + 1)``-token windows (fewer if the stream is short)."""
    n = min(n_windows, (len(stream) - 1) // seq_len)
    if n < 1:
        raise ValueError(f"stream: {len(stream)} tokens holds no window of seq_len {seq_len}")
    return torch.stack([stream[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)])
