"""Self-speculative early exit, measured: the target's own first ``k`` layers as a draft.

The early-exit draft after layer ``k`` of an ``L``-layer target reuses the target's final norm and head
on the hidden state ``h_k``: ``q_k = softmax(W norm(h_k) / T)``. On teacher-forced text (every position
conditioned on the true prefix), with ``p = softmax(W norm(h_L) / T)`` the target's distribution:

- ``alpha_k(T) = mean_t sum_v min(p_t(v), q_{k,t}(v))`` (Leviathan et al.'s acceptance rate), and
- ``alpha_k(0) = mean_t [argmax q_{k,t} = argmax p_t]`` (greedy acceptance).

Its cost ratio is roughly ``c ~ k / L`` plus the head. Without training (no adapter) the shallow hidden
states are far from the deep ones, so alpha stays low until ``k`` is close to ``L``, where ``c`` is
close to 1: nothing to gain. ``hf_early_exit_generate`` runs Hugging Face's own self-speculative
baseline (``generate(assistant_early_exit=k)``) for comparison.

:func:`early_exit_sweep` asks whether shipping one would pay: per exit layer ``k``, the cost ratio from
parameter counts ``c_k = (k * layer + head) / (L * layer + head)`` (:func:`layer_cost_ratio`), and at
``T = 0`` and ``T = 1`` the best draft length and its predicted speedup
``max_gamma E[tokens](alpha_k, gamma) / (gamma c_k + r(gamma) + o)`` (:func:`spade_lib.theory.speedup`;
``o`` the decoding loop's per-step overhead from the pair's cost table, 0 by default: the paper's model);
:func:`best_layer` picks the layer with the highest prediction and :func:`sweep_lines` says it in words
(notebook 03 prints them; the draft is not timed, so they are predictions, never verdicts).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from spade_lib import measures, theory


@torch.no_grad()
def early_exit_alpha(pair, texts: Sequence[str] | Sequence[Sequence[int]], layers: Sequence[int] | None = None, *,
                     temperatures: Sequence[float] = (1.0,), max_tokens: int = 256):
    """Teacher-forced acceptance of the early-exit draft after each of ``layers`` (default: 1..L-1).

    ``texts``: strings (tokenised as they are) or token-id lists; each is cut to ``max_tokens``.
    Returns a ``pandas.DataFrame`` with one row per layer: ``layer``, ``c_layers`` (= layer / L, the
    layer share of the cost), ``alpha_T0`` (top-1 agreement) and ``alpha_T<t>`` per temperature,
    ``n_positions``."""
    import pandas as pd

    target, tok = pair.target, pair.tokenizer
    n_layers = int(target.config.num_hidden_layers)
    layers = list(range(1, n_layers)) if layers is None else [int(k) for k in layers]
    bad = [k for k in layers if not 1 <= k <= n_layers]
    if bad:
        raise ValueError(f"layers: must lie in [1, {n_layers}], got {bad}")
    if not texts:
        raise ValueError("texts: give at least one text")
    if max_tokens < 2:
        raise ValueError(f"max_tokens: must be >= 2, got {max_tokens}")
    head, norm = target.get_output_embeddings(), target.model.norm
    dev = next(target.parameters()).device
    agree = {k: 0.0 for k in layers}
    acc = {(k, t): 0.0 for k in layers for t in temperatures}
    n = 0
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False) if isinstance(text, str) else list(text)
        ids = torch.tensor(ids[:max_tokens], device=dev)[None]
        if ids.shape[1] < 2:
            continue
        out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
        p_logits = out.logits[0].float()
        for k in layers:
            q_logits = p_logits if k == n_layers else head(norm(out.hidden_states[k]))[0].float()
            agree[k] += (q_logits.argmax(-1) == p_logits.argmax(-1)).sum().item()
            for t in temperatures:
                acc[(k, t)] += measures.alpha(torch.softmax(p_logits / t, -1),
                                              torch.softmax(q_logits / t, -1)).sum().item()
        n += ids.shape[1]
    if n == 0:
        raise ValueError("texts: every text is shorter than 2 tokens")
    rows = []
    for k in layers:
        row = {"layer": k, "c_layers": k / n_layers, "alpha_T0": agree[k] / n}
        row.update({f"alpha_T{t:g}": acc[(k, t)] / n for t in temperatures})
        rows.append({**row, "n_positions": n})
    return pd.DataFrame(rows)


@torch.no_grad()
def hf_early_exit_generate(model, input_ids: torch.Tensor, exit_layer: int, *, max_new_tokens: int = 64,
                           num_assistant_tokens: int = 4, **generate_kwargs) -> torch.Tensor:
    """Hugging Face's self-speculative decoding: ``model.generate(assistant_early_exit=exit_layer)``.

    Greedy unless ``do_sample=True`` is passed; a constant schedule of ``num_assistant_tokens`` drafts."""
    n_layers = int(model.config.num_hidden_layers)
    if not 1 <= exit_layer < n_layers:
        raise ValueError(f"exit_layer: must lie in [1, {n_layers - 1}], got {exit_layer}")
    gc = model.generation_config
    old = (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold)
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = \
        num_assistant_tokens, "constant", 0.0
    try:
        generate_kwargs.setdefault("do_sample", False)
        return model.generate(input_ids, assistant_early_exit=exit_layer, max_new_tokens=max_new_tokens,
                              **generate_kwargs)
    finally:
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = old


def supports_early_exit(model) -> bool:
    """Whether ``model`` is a Llama-family causal LM with an exit to take: ``model.model.layers``,
    a final ``model.model.norm`` and more than one layer."""
    inner = getattr(model, "model", None)
    return hasattr(inner, "norm") and hasattr(inner, "layers") and model.config.num_hidden_layers > 1


def layer_cost_ratio(model, layers: Sequence[int]) -> np.ndarray:
    """``c_k = (k * layer + head) / (L * layer + head)`` per exit layer ``k``: the early-exit draft's
    forward over the target's, from parameter counts (``layer``: one decoder layer's, ``head``: the
    output embedding's)."""
    n_layers = int(model.config.num_hidden_layers)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    head = model.get_output_embeddings().weight.numel()
    return (np.asarray(layers) * layer + head) / (n_layers * layer + head)


def early_exit_sweep(pair, texts: Sequence[str] | Sequence[Sequence[int]], verify_cost: Callable[[int], float], *,
                     max_gamma: int = 8, max_tokens: int = 512, overhead: float = 0.0):
    """Whether an untrained early-exit draft would pay on ``pair``, layer by layer (module docstring).

    ``texts`` as in :func:`early_exit_alpha` (e.g. a run's prompts + continuations); ``verify_cost`` is
    ``r(gamma)``, the cost of a ``gamma + 1``-token target forward over a one-token one; ``overhead`` is the
    loop's per-step cost ``o`` in target steps (:func:`spade_lib.runs.costs.loop_overhead`). Returns
    :func:`early_exit_alpha`'s table (``alpha_T0``, ``alpha_T1``; exit layers ``1 .. L-1``) with ``c``
    (:func:`layer_cost_ratio`) and, for ``T0`` and ``T1``, ``gamma_T*`` (the best draft length up to
    ``max_gamma``, :func:`spade_lib.theory.optimal_gamma`) and ``predicted_T*`` (its speedup)."""
    n_layers = int(pair.target.config.num_hidden_layers)
    ee = early_exit_alpha(pair, texts, temperatures=[1.0], max_tokens=max_tokens)
    ee["c"] = layer_cost_ratio(pair.target, ee["layer"])
    for t in ("T0", "T1"):
        best_g = [theory.optimal_gamma(a, c, max_gamma=max_gamma, verify_cost=verify_cost, overhead=overhead)
                  for a, c in zip(ee[f"alpha_{t}"], ee["c"])]
        ee[f"gamma_{t}"] = best_g
        ee[f"predicted_{t}"] = [float(theory.speedup(a, g, c, verify_cost=verify_cost, overhead=overhead))
                                for a, g, c in zip(ee[f"alpha_{t}"], best_g, ee["c"])]
    return ee[ee["layer"] < n_layers]


def best_layer(sweep):
    """The row of an :func:`early_exit_sweep` table with the highest predicted speedup at either
    temperature (the first such layer on a tie), with ``predicted`` (that speedup) added."""
    if len(sweep) == 0:
        raise ValueError("sweep: an empty early-exit table (a target of one layer has no exit to take)")
    best = sweep[["predicted_T0", "predicted_T1"]].max(axis=1)
    row = sweep.loc[best.idxmax()].copy()
    row["predicted"] = float(best.max())
    return row


def sweep_lines(sweep, n_texts: int, n_layers: int) -> list[str]:
    """Notebook 03's sentences about an :func:`early_exit_sweep` table measured on ``n_texts`` texts of an
    ``n_layers``-layer target: alpha at ``T = 0`` from the shallowest to the deepest exit, and the best layer
    by :func:`best_layer`, said to be a prediction (the draft is not timed)."""
    best = best_layer(sweep)
    lines = []
    lines.append(f"early exit on {int(best['n_positions'])} teacher-forced positions of {n_texts} greedy generations: "
                 f"alpha at T=0 from {sweep['alpha_T0'].iloc[0]:.2f} (layer {int(sweep['layer'].iloc[0])}) to "
                 f"{sweep['alpha_T0'].iloc[-1]:.2f} (layer {int(sweep['layer'].iloc[-1])} of {n_layers})")
    lines.append(f"best layer by predicted speedup: {int(best['layer'])} (alpha {best['alpha_T0']:.2f} at T=0, "
                 f"{best['alpha_T1']:.2f} at T=1; c = {best['c']:.2f}) -> predicted {best['predicted']:.2f}x at its "
                 "best gamma (not timed: a prediction, not a verdict; SPADE ships no early-exit draft, HF's "
                 "assistant_early_exit is the baseline to time it against)")
    return lines
