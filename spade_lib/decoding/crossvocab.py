"""Speculative verification across vocabularies: token-level intersection (TLI).

Timor et al., "Lossless Speculative Decoding Algorithms for Heterogeneous Vocabularies" (ICML 2025,
arXiv 2502.05202). The draft has vocabulary ``V_q`` and the target ``V_p``; ``I`` is the set of strings that
are one token in both. TLI drafts from

    q_I(x) = q(x) / sum_{y in I} q(y)   for x in I,   0 elsewhere,

mapped to target ids, and verifies with the standard rule (accept with ``min(1, p(x)/q_I(x))``, else draw
from ``norm(max(p - q_I, 0))``). Since ``q_I`` is a distribution over target tokens, the emitted token has
law exactly ``p`` (Leviathan et al. 2023, Theorem 1). A careless implementation drafts from the full ``q``
and rejects with ``p(x)/q(x)`` over target ids reached by re-encoding; its output law is not ``p``
(``naive_emitted_law``; the test shows the gap). Still to build: SLEM greedy drafter, SLRS (see the report).
"""
from __future__ import annotations

import torch


def intersection_map(draft_vocab: dict[str, int], target_vocab: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft ids, target ids) of the strings that are one token in both vocabularies, by string."""
    if not draft_vocab or not target_vocab:
        raise ValueError("draft_vocab/target_vocab: must be non-empty")
    common = sorted(set(draft_vocab) & set(target_vocab))
    if not common:
        raise ValueError("draft_vocab: no string is a token of both vocabularies")
    return (torch.tensor([draft_vocab[s] for s in common]), torch.tensor([target_vocab[s] for s in common]))


def tli_distribution(q: torch.Tensor, draft_ids: torch.Tensor, target_ids: torch.Tensor,
                     target_size: int) -> torch.Tensor:
    """q restricted to the intersection, renormalised, as a distribution over target ids (last dim)."""
    mass = q[..., draft_ids]
    total = mass.sum(-1, keepdim=True)
    if bool((total <= 0).any()):
        raise ValueError("q: no mass on the vocabulary intersection")
    out = q.new_zeros(q.shape[:-1] + (target_size,))
    out[..., target_ids] = mass / total
    return out


def emitted_law(p: torch.Tensor, q_target: torch.Tensor) -> torch.Tensor:
    """Exact law of the emitted token of one verification step with draft law ``q_target`` over target ids."""
    accept = torch.minimum(torch.ones_like(p), torch.where(q_target > 0, p / q_target.clamp_min(1e-300), 1.0))
    accepted = q_target * accept
    residual = (p - q_target).clamp_min(0)
    rej = 1 - accepted.sum(-1, keepdim=True)
    z = residual.sum(-1, keepdim=True)
    return accepted + torch.where(z > 0, rej * residual / z.clamp_min(1e-300), 0.0)


def naive_emitted_law(p: torch.Tensor, q: torch.Tensor, to_target: torch.Tensor) -> torch.Tensor:
    """The lossy rule: draft id d from the full q, propose target id ``to_target[d]`` (first token of its
    re-encoding), accept with ``min(1, p(t)/q(d))``, else draw from ``norm(max(p - q_on_target, 0))``."""
    q_t = torch.zeros_like(p).index_add_(-1, to_target, q)  # pushed-forward mass, used only for the residual
    accept = torch.minimum(torch.ones_like(q), p[..., to_target] / q.clamp_min(1e-300))
    accepted = torch.zeros_like(p).index_add_(-1, to_target, q * accept)
    residual = (p - q_t).clamp_min(0)
    rej = 1 - accepted.sum(-1, keepdim=True)
    z = residual.sum(-1, keepdim=True)
    return accepted + torch.where(z > 0, rej * residual / z.clamp_min(1e-300), 0.0)
