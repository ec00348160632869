"""Distances between the target distribution ``p`` and the draft distribution ``q``, and the one
definition of the mean accepted length ``tau``.

All functions reduce over the last (vocabulary) dimension and keep every leading dimension, so a
``[B, gamma, V]`` pair gives per-position ``[B, gamma]`` values. Logarithms are natural (nats).

- acceptance rate  ``alpha(p, q) = sum_x min(p(x), q(x))``  (Leviathan et al. 2023, Def. 3.1):
  the probability that exact speculative sampling accepts a draft ``x ~ q``;
- total variation  ``TV(p, q) = 1/2 sum_x |p(x) - q(x)|``, and ``alpha = 1 - TV``;
- Kullback-Leibler ``KL(p || q) = sum_x p(x) log(p(x) / q(x))`` with ``0 log 0 = 0`` (``+inf`` where
  ``p > 0 = q``);
- entropy          ``H(p) = -sum_x p(x) log p(x)``;
- mean accepted length ``tau`` (:func:`tau`): tokens emitted per verification step.

``tau`` is defined here, in the lowest layer, because every layer that reports it imports this one:
``decoding.common.GenerationResult.tau``, ``runs.metrics``, ``diagnose``, ``whatif`` and the
benchmarks (``decoding`` sits below ``runs``, so a definition in ``runs.metrics`` could not serve it).
"""

from __future__ import annotations

import numpy as np
import torch


def _check_pair(p: torch.Tensor, q: torch.Tensor) -> None:
    for name, t in (("p", p), ("q", q)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point torch.Tensor")
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")


def alpha(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Acceptance rate ``sum_x min(p, q)`` of exact speculative sampling, over the last dim."""
    _check_pair(p, q)
    return torch.minimum(p, q).sum(dim=-1)


def tv(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total variation distance ``1/2 sum_x |p - q|`` over the last dim."""
    _check_pair(p, q)
    return 0.5 * (p - q).abs().sum(dim=-1)


def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` in nats over the last dim (``+inf`` where ``p`` has mass outside ``q``'s support)."""
    _check_pair(p, q)
    return (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(dim=-1)


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy ``H(p)`` in nats over the last dim."""
    if not isinstance(p, torch.Tensor) or not p.is_floating_point():
        raise ValueError("p must be a floating-point torch.Tensor")
    return -torch.xlogy(p, p).sum(dim=-1)


def distribution_stats(p: torch.Tensor, q: torch.Tensor) -> dict[str, torch.Tensor]:
    """All measures at once: ``{"alpha", "tv", "kl", "h_p", "h_q"}``, each of shape ``p.shape[:-1]``."""
    _check_pair(p, q)
    return {"alpha": alpha(p, q), "tv": tv(p, q), "kl": kl(p, q), "h_p": entropy(p), "h_q": entropy(q)}


def tau(accepted, steps, *, with_bonus: bool = True):
    """Mean accepted length from totals: ``accepted = sum_s N_s`` accepted drafts over ``steps = S``
    verification steps (numbers, or arrays / Series of per-group totals, elementwise).

    A step drafts ``gamma`` tokens, accepts a prefix of ``N_s`` of them and then emits one more token
    (the residual sample at the first rejection, or the *bonus* token when all were accepted), so:

    - ``tau = (sum_s N_s + S) / S = mean_s (N_s + 1)`` (``with_bonus=True``, *the* ``tau``: tokens
      emitted per target forward, Spec-Bench's mean ``accept_lengths``; the speedup if drafting and
      verifying were free);
    - ``tau_no_bonus = sum_s N_s / S = mean_s N_s`` (``with_bonus=False``: accepted drafts per step).

    Which steps ``S`` counts names the variant: ``tau`` counts every verification step of the
    generations (a run's summary, :class:`~spade_lib.decoding.common.GenerationResult`); a trace has
    rows only for the steps that drafted at least one token, so over a trace this is
    ``tau_drafting_steps`` (steps that drafted nothing, ``N_s = 0``, left out: >= ``tau``, equal when
    every step drafted). Block efficiency (Chen et al., 2023) is this ratio over the tokens actually
    emitted (after ``max_new_tokens`` / EOS truncation), ``accepted = new_tokens - S``. ``S = 0``
    gives NaN. One division of the exact total (correctly rounded for integer counts).
    """
    tokens = accepted + steps if with_bonus else accepted
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.true_divide(tokens, steps)
