"""What the decoders share: their results, seeded random streams and input checks (their clock is
:func:`spade_lib.devices.clock`).

:class:`GenerationResult` (with its :class:`StepInfo` per verification step) is what
:class:`~spade_lib.decoding.decode.SpeculativeDecoder`, :class:`~spade_lib.decoding.decode.AutoregressiveDecoder`,
the batched loops of :mod:`spade_lib.decoding.batch` and the HF baselines return; its
:meth:`~GenerationResult.records` are the trace's rows (the names of :mod:`spade_lib.decoding.records`).
:func:`seed_streams` gives the three independent generators of a generation (draft sampling,
acceptance uniforms, residual/bonus sampling) from one seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from spade_lib import measures
from spade_lib.decoding.records import rows

__all__ = ["GenerationResult", "StepInfo", "STREAMS", "seed_streams"]

STREAMS = ("draft", "accept", "residual")


def seed_streams(seed: int, device: torch.device | str) -> dict[str, torch.Generator]:
    """Independent generators for draft sampling, acceptance uniforms and residual/bonus sampling."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: must be an integer >= 0, got {seed!r}")
    states = np.random.SeedSequence(int(seed)).spawn(len(STREAMS))
    return {name: torch.Generator(device=device).manual_seed(int(s.generate_state(1, np.uint64)[0] >> 1))
            for name, s in zip(STREAMS, states)}


@dataclass
class StepInfo:
    """Step-level facts of one verification step."""

    gamma: int            # tokens drafted
    n_accepted: int       # accepted drafts
    next_token: int       # residual / bonus token
    emitted: int          # tokens appended to the output (n + 1, or fewer when truncated)
    abs_pos: int          # tokens emitted before this step
    draft_stop: str       # why drafting stopped: "max_gamma", "policy", "no_match" or "budget"
    t_draft: float = float("nan")
    t_verify: float = float("nan")
    t_overhead: float = float("nan")
    stats: dict[str, list] | None = None  # per-position statistics by column name, each [gamma] (record=True only)
    topk: list[Any] | None = None     # record_topk > 0: [p_ids, p_probs, q_ids, q_probs], each [gamma][k]
    tree: dict[str, list[int]] | None = None  # a tree step: records.TREE_COLUMNS per node, each [gamma] (None: a chain)
    draft_costs: dict[str, float] | None = None  # the drafter's own account of the step (Drafter.step_costs; None: none kept)


@dataclass
class GenerationResult:
    """Output of one generation: the new tokens, step-level info, timings and token-level records."""

    tokens: list[int]                  # new token ids (prompt excluded)
    prompt_length: int
    stop_reason: str                   # "eos", "max_new_tokens" or "context_limit"
    steps: list[StepInfo] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)  # prefill, draft, verify, overhead, total (s)
    text: str | None = None
    seed: int = 0

    @property
    def n_steps(self) -> int:
        """Target verification calls after the prefill (= tokens for autoregressive decoding)."""
        return len(self.steps)

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def accept_lengths(self) -> list[int]:
        """``n + 1`` per step, the verification's outcome before truncation (``spade_lib.runs.metrics``)."""
        return [s.n_accepted + 1 for s in self.steps]

    @property
    def tau(self) -> float:
        """Mean accepted length ``mean_s (n_s + 1)`` over this generation's steps (:func:`spade_lib.measures.tau`,
        the one definition): tokens per target forward before truncation; NaN without steps."""
        return float(measures.tau(sum(s.n_accepted for s in self.steps), self.n_steps))

    @property
    def emitted_lengths(self) -> list[int]:
        """Tokens each step actually appended (``accept_lengths`` truncated by EOS / ``max_new_tokens``)."""
        return [s.emitted for s in self.steps]

    @property
    def gammas(self) -> list[int]:
        return [s.gamma for s in self.steps]

    def records(self) -> list[dict[str, Any]]:
        """One dict per drafted token with exactly the trace columns (minus prompt_id/category/sample);
        plus ``p_topk_ids``, ``p_topk_probs``, ``q_topk_ids``, ``q_topk_probs`` when recorded
        (built by :func:`spade_lib.decoding.records.rows` from the column registry)."""
        return rows(self.steps)


def _check_budget(max_new_tokens: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: must be an integer >= 0, got {max_new_tokens!r}")


def _check_prompt(prompt: torch.Tensor, limit: int | None, vocab_size: int | None = None) -> None:
    if prompt.numel() == 0:
        raise ValueError("prompt_ids: empty prompt (at least one token, e.g. BOS, is needed to condition on)")
    if limit is not None and prompt.numel() > limit:
        raise ValueError(f"prompt_ids: {prompt.numel()} tokens exceed the context limit of {limit} positions")
    if vocab_size is not None and (int(prompt.min()) < 0 or int(prompt.max()) >= vocab_size):
        bad = int(prompt.min()) if int(prompt.min()) < 0 else int(prompt.max())
        raise ValueError(f"prompt_ids: token ids must lie in [0, {vocab_size}) (the vocabulary), got {bad}")


def _truncate(emitted: list[int], budget: int, eos: frozenset[int]) -> tuple[list[int], bool]:
    """Cut ``emitted`` after the first EOS and to ``budget`` tokens; also return whether EOS was hit."""
    for i, t in enumerate(emitted[:budget]):
        if t in eos:
            return emitted[:i + 1], True
    return emitted[:budget], False
